"""The one flwr release fedbn-med's use of Flower internals is written for.

Another raises ``ImportError`` when :mod:`._flwr_compat` is imported
(``FEDBN_MED_ANY_FLWR=1`` tries anyway, with a warning).
"""

from __future__ import annotations

import importlib.metadata
import os
import warnings

__all__ = ["FLWR_VERSION", "check_flwr_version"]

FLWR_VERSION = "1.42.0"


def check_flwr_version() -> None:
    """Raise ``ImportError`` unless the installed flwr is :data:`FLWR_VERSION`."""
    installed = importlib.metadata.version("flwr")
    if installed == FLWR_VERSION:
        return
    message = (f"fedbn-med needs flwr=={FLWR_VERSION} (it uses Flower internals, see "
               f"{__name__}), but flwr {installed} is installed. Install "
               f"flwr=={FLWR_VERSION}, or run tests/test_flwr_compat.py to see what changed.")
    if os.environ.get("FEDBN_MED_ANY_FLWR") == "1":
        warnings.warn(message + " Going on because FEDBN_MED_ANY_FLWR=1.", RuntimeWarning,
                      stacklevel=2)
        return
    raise ImportError(message)
