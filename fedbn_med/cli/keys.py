"""Create a consortium's CA, the server certificate and one key pair per site.

    python pipelines/consortium_keys.py --out keys/ --server-host fl.consortium.example
        --sites NYU,UM,UCLA --counts NYU=120,UM=80,UCLA=60

``--counts`` registers each site's number of training examples with its key
(``counts.json``): the server then weighs a site by at most that count, whatever it claims.

Then on the server: ``--serve --tls-dir keys/`` registers every site's public key; each
site gets its ``<SITE>.key`` and ``ca.pem`` (the command prints who gets what).
"""

from __future__ import annotations

import argparse
import sys

from fedbn_med.cli.argtypes import absolute_path

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """Return the key tool's parser."""
    p = argparse.ArgumentParser(prog="consortium_keys.py", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=absolute_path, required=True,
                   help="a new, empty folder (it ignores itself in git)")
    p.add_argument("--server-host", action="append", required=True,
                   help="name or IP the sites dial (repeat for several)")
    p.add_argument("--sites", required=True, help="comma-separated site names")
    p.add_argument("--days", type=int, default=365, help="validity of the certificates (365)")
    p.add_argument("--counts", default=None,
                   help="SITE=N,...: each site's training examples, registered with its key")
    return p


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, write the files, print the handout."""
    args = build_parser().parse_args(argv)
    from fedbn_med.federation.consortium import create_consortium, parse_counts

    sites = [s.strip() for s in args.sites.split(",") if s.strip()]
    try:
        counts = None if args.counts is None else parse_counts(args.counts)
        files = create_consortium(args.out, args.server_host, sites, days=args.days,
                                  counts=counts)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"Wrote the consortium's files to {args.out}. Hand them out as follows:\n")
    print(files.handout())
    return 0
