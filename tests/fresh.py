"""What a piece of code leaves imported, run in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence


def modules_after(code: str, watched: Sequence[str]) -> list[str]:
    """Run ``code`` in a fresh interpreter; return those of ``watched`` it left imported.

    A module counts when its exact name is in ``sys.modules`` (a package is, as soon as
    any of its submodules is). ``code`` failing fails the calling test with its stderr.
    """
    report = ("import json, sys\n"
              f"print(json.dumps(sorted(m for m in {list(watched)!r} if m in sys.modules)))")
    done = subprocess.run([sys.executable, "-c", f"{code}\n{report}"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])
