#!/usr/bin/env python
"""Create a consortium's CA, the server certificate and one key pair per site.

    python pipelines/consortium_keys.py --out keys/ --server-host fl.consortium.example
        --sites NYU,UM,UCLA --counts NYU=120,UM=80,UCLA=60

``--counts`` registers each site's number of training examples with its key
(``counts.json``): the server then weighs a site by at most that count, whatever it claims.

Then on the server: ``--serve --tls-dir keys/`` registers every site's public key; each
site gets its ``<SITE>.key`` and ``ca.pem`` (the command prints who gets what).
"""

import sys

from fedbn_med.cli.keys import main

if __name__ == "__main__":
    sys.exit(main())
