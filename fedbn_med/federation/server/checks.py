"""Checks on the metrics a site reports, before the server hands them to MLflow.

A reply's weights and example count are checked by :mod:`fedbn_med.rounds`, for every
engine; this module checks what only the server takes from the network: the metric
names and values that go to MLflow (which refuses some names and would end the
tracking thread).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["metrics_reason"]

# What MLflow accepts as a metric name (letters, digits, "_-./ " and spaces), kept short.
_METRIC = re.compile(r"[A-Za-z0-9][A-Za-z0-9_\-.]{0,99}")


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
