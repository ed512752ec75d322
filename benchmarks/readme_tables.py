"""Check or rewrite the results tables of README.md and docs/ from ``benchmarks/published/``.

Every block ``<!-- results:KEY -->`` ... ``<!-- /results:KEY -->`` of README.md and of the
docs' pages is rendered from ``benchmarks/published/KEY/`` (written by a benchmark's
``--publish``).

    python benchmarks/readme_tables.py --check    # exit 1, listing every stale block
    python benchmarks/readme_tables.py --write    # re-render every block
"""

from __future__ import annotations

import fedbn_med.numerics.pinned  # noqa: F401  (first: it fixes the numeric code path before numpy loads)

# isort: split
import argparse
from collections.abc import Sequence

from _published import (
    PUBLISHED_DIR,
    blocks,
    check_comparison,
    check_hashes,
    load_meta,
    pages_text,
    render_block,
    rewrite_readme,
)


def problems(readme_text: str) -> list[str]:
    """Return every way the README's results blocks differ from the published files."""
    found = blocks(readme_text)
    out = []
    for key, body in found.items():
        try:
            meta = load_meta(key)
        except (FileNotFoundError, ValueError) as err:
            out.append(str(err))
            continue
        out.extend(check_hashes(key))
        if body != render_block(key):
            out.append(f"Results block '{key}' differs from benchmarks/published/{key}/ "
                       f"(run python benchmarks/readme_tables.py --write)")
        if meta.get("check") == "comparison":
            out.extend(check_comparison(key))
    # a folder that a docs results page renders (benchmarks/results_pages.py) is checked
    # there: its hashes and its figures here, its page by results_pages.py --check
    from results_pages import PAGES

    on_pages = {key for key, _ in PAGES.values()}
    for key in sorted(on_pages - set(found)):
        if (PUBLISHED_DIR / key).is_dir():
            out.extend(check_hashes(key))
            if load_meta(key).get("check") == "comparison":
                out.extend(check_comparison(key))
    if PUBLISHED_DIR.is_dir():
        for folder in sorted(p for p in PUBLISHED_DIR.iterdir() if p.is_dir()):
            if folder.name not in found and folder.name not in on_pages:
                out.append(f"benchmarks/published/{folder.name}/ has no README block "
                           f"<!-- results:{folder.name} --> and no docs results page "
                           "(benchmarks/results_pages.py)")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Check (default) or rewrite the README's results blocks."""
    parser = argparse.ArgumentParser(prog="benchmarks/readme_tables.py",
                                     description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="report stale blocks (default)")
    mode.add_argument("--write", action="store_true", help="re-render every block")
    args = parser.parse_args(argv)
    if args.write:
        rewrite_readme()
    issues = problems(pages_text())
    for line in issues:
        print(line)
    if not issues:
        print(f"{len(blocks(pages_text()))} results blocks (README.md and docs/) match "
              f"benchmarks/published/")
    return 1 if issues else 0


if __name__ == "__main__":
    raise SystemExit(main())
