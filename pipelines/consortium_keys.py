#!/usr/bin/env python
"""Create a consortium's CA, the server certificate and one key pair per site.

    python pipelines/consortium_keys.py --out keys/ --server-host fl.consortium.example
        --sites NYU,UM,UCLA

Then on the server: ``--serve --tls-dir keys/`` registers every site's public key; each
site gets its ``<SITE>.key`` and ``ca.pem`` (the command prints who gets what).
"""

import sys

from fedbn_med.cli.keys import main

if __name__ == "__main__":
    sys.exit(main())
