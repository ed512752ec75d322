"""Put ``benchmarks/`` on the import path, for the research studies run as scripts.

A study here imports the shared plumbing one folder up (``_common``, ``_sweep``,
``_plots``, ``_published``): ``python benchmarks/research/<study>.py`` puts only this
folder on ``sys.path``, so each study imports this module first.
"""

import sys
from pathlib import Path

_BENCHMARKS = str(Path(__file__).resolve().parents[1])
if _BENCHMARKS not in sys.path:
    sys.path.insert(1, _BENCHMARKS)
