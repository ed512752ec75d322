"""The precision at which a site's figures leave it, the same on every engine.

A score depends on the site's private layers, so a site sends its scores and training
losses rounded to :data:`SCORE_DECIMALS` decimals, losses capped at :data:`MAX_LOSS`
(:func:`bounded`). The in-process engine records the very same figures, so one command
prints the same numbers over Flower as in one process.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

__all__ = ["MAX_LOSS", "SCORE_DECIMALS", "bounded", "bounded_fit"]

#: Decimals a score or a training loss leaves the site with.
SCORE_DECIMALS = 4
#: The largest loss a site reports; above it, the value says only "at least this".
MAX_LOSS = 100.0


def bounded(metrics: Mapping[str, float]) -> dict[str, float]:
    """Return scores as they leave a site: rounded, losses capped at :data:`MAX_LOSS`.

    Examples
    --------
    >>> bounded({"val_acc": 0.518518, "train_loss": 250.0})
    {'val_acc': 0.5185, 'train_loss': 100.0}
    """
    out = {}
    for key, value in metrics.items():
        value = float(value)
        if key.endswith("loss") and math.isfinite(value):
            value = min(value, MAX_LOSS)
        out[key] = round(value, SCORE_DECIMALS) if math.isfinite(value) else value
    return out


def bounded_fit(fit: Mapping[str, float]) -> dict[str, float]:
    """Return a round's training metrics as they leave a site: its training loss bounded.

    The training loss is a score of the model the site trained from (in training mode);
    the other entries (example counts, DP figures) are sent as they are.
    """
    out = dict(fit)
    if "train_loss" in out:
        out.update(bounded({"train_loss": out["train_loss"]}))
    return out
