"""Print what a site is about to approve: a run spec, as the site will see it, and its hash.

A site that pins its runs lists the hashes it approved in its site file::

    approved_specs = ["3f5c...e1"]

and refuses any other run, naming both hashes. Before approving, its operator reads the
spec the consortium sent (a JSON file, :meth:`fedbn_med.spec.RunSpec.to_json`)::

    python -m fedbn_med.federation.approve run_spec.json

which prints each setting of the site's view of it (no path of the server's) and the
hash to pin. A site may pin the app too (``approved_apps``): the SHA-256 of the FAB that
``flwr build`` writes, which the site node computes from the bytes it receives::

    python -m fedbn_med.federation.approve --fab fedbn-med.fab
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["describe", "main"]


def describe(spec_json: str) -> tuple[str, str]:
    """Return ``(text, hash)``: the site's view of a run spec, one setting a line, and its hash.

    Raises
    ------
    ValueError
        When the text is not a valid run spec (the error says what is wrong).
    """
    from fedbn_med.federation.audit import run_spec_hash
    from fedbn_med.federation.config import site_view
    from fedbn_med.spec import RunSpec

    try:
        values = json.loads(spec_json)
    except json.JSONDecodeError as err:
        raise ValueError(f"not JSON (line {err.lineno}, column {err.colno})") from None
    spec = site_view(RunSpec.from_dict(values))
    plain = spec.to_dict()
    width = max(len(k) for k in plain)
    lines = [f"  {key:<{width}}  {json.dumps(plain[key], sort_keys=True)}"
             for key in sorted(plain)]
    return "\n".join(lines), run_spec_hash(plain)


def main(argv: Sequence[str] | None = None) -> int:
    """Print a run spec as a site sees it (or an app's FAB) and the hash to pin."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", type=Path, nargs="?", help="the run spec, as JSON")
    parser.add_argument("--fab", type=Path, default=None, help="an app's FAB (flwr build)")
    args = parser.parse_args(argv)
    if args.fab is not None:
        try:
            digest = hashlib.sha256(args.fab.read_bytes()).hexdigest()
        except OSError as err:
            print(f"error: {args.fab}: {err.strerror}", file=sys.stderr)
            return 2
        print(f"App {args.fab} ({args.fab.stat().st_size} bytes). To approve it, add to the "
              f"site file:\napproved_apps = [\"{digest}\"]")
    if args.spec is None:
        return 0 if args.fab is not None else 2
    try:
        text, digest = describe(args.spec.read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError) as err:
        print(f"error: {args.spec}: {err}", file=sys.stderr)
        return 2
    print(f"Run spec {args.spec}, as a site sees it:\n{text}\n\nTo approve it, add to the "
          f"site file:\napproved_specs = [\"{digest}\"]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
