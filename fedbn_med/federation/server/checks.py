"""Checks on the numbers and names a site reports, before the server uses any of them.

A reply's weights are checked by :func:`fedbn_med.rounds.check_reply`; this module checks
what travels with them: the example count that weights the average, and the metric
names that go to MLflow (which refuses some names and would end the tracking thread).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

__all__ = ["MAX_EXAMPLES", "metrics_reason", "num_examples_reason"]

#: More training examples than any site of this project holds; a larger count is a lie
#: that would let one site outweigh all others in the average.
MAX_EXAMPLES = 10**9
# What MLflow accepts as a metric name (letters, digits, "_-./ " and spaces), kept short.
_METRIC = re.compile(r"[A-Za-z0-9][A-Za-z0-9_\-.]{0,99}")


def num_examples_reason(value: object) -> str | None:
    """Return why a reported number of training examples is refused, or None."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return f"it reports num-examples {value!r} (expected a number)"
    if not math.isfinite(value) or value != int(value) or not 1 <= value <= MAX_EXAMPLES:
        return (f"it reports num-examples {value!r} (expected a whole number from 1 to "
                f"{MAX_EXAMPLES})")
    return None


def metrics_reason(sections: Mapping[str, Mapping[str, object]]) -> str | None:
    """Return why a reply's metric names or values are refused, or None.

    ``sections`` maps a section (``metrics``, ``eval``) to its metrics.
    """
    for section, metrics in sections.items():
        for name, value in metrics.items():
            if not isinstance(name, str) or not _METRIC.fullmatch(name):
                return (f"its {section} section names a metric {str(name)[:60]!r} (expected "
                        "letters, digits, '_', '-', '.'; at most 100 characters)")
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                return f"its {section} metric '{name}' is {type(value).__name__}, not a number"
    return None
