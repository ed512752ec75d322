"""Import this first to pin the numeric code path: ``import fedbn_med.numerics.pinned``.

Importing :mod:`fedbn_med` changes nothing process-wide; an entry script (the command
line, a pipeline, a benchmark, the test suite) opts in by importing this module before
numpy, torch or anything that loads them, so that one command gives one set of numbers
(see :mod:`fedbn_med.numerics`; ``FEDBN_MED_NUMERICS=native`` still turns it off).
"""

from __future__ import annotations

from fedbn_med.numerics import pin

__all__ = ["PINNED_NOW"]

#: The variables this import set (empty when the user's own, or native, stood).
PINNED_NOW = pin()
