"""MkDocs hook: the command-line reference is generated from the parsers themselves.

A page line ``<!-- cli:NAME -->`` is replaced by the ``--help`` of that command, so the
reference cannot drift from the code.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_MARK = re.compile(r"^<!-- cli:(?P<name>[a-z_]+) -->$", re.MULTILINE)


def _help(name: str) -> str:
    script = ROOT / "pipelines" / f"{name}.py"
    if not script.is_file():
        raise ValueError(f"docs: <!-- cli:{name} --> names no pipelines/{name}.py")
    done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True,
                          text=True, timeout=120, cwd=ROOT,
                          env={"COLUMNS": "100", "PATH": "", "PYTHONPATH": str(ROOT)})
    if done.returncode != 0:
        raise ValueError(f"docs: pipelines/{name}.py --help failed: {done.stderr[-500:]}")
    return done.stdout


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ANN001, ARG001
    """Replace each ``<!-- cli:NAME -->`` line with that pipeline's ``--help``."""
    return _MARK.sub(lambda m: f"```text\n{_help(m['name'])}```", markdown)
