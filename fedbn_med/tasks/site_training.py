"""What a site's ``[training]`` table decides: how the site trains, whatever it is asked.

Read with the rest of a site file by :func:`fedbn_med.tasks.site_toml.site_policy`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass

__all__ = ["TRAINING_BOUNDS", "TrainingPolicy"]

#: What a site's ``[training]`` table may decide, with the bounds a site without one keeps:
#: a server's value outside them is refused (``lr = 1e-12`` in an operator's run spec).
TRAINING_BOUNDS: dict[str, tuple[float, float]] = {
    "lr": (1e-6, 1.0), "weight_decay": (0.0, 1.0), "dropout": (0.0, 0.9),
    "local_epochs": (1, 100), "batch_size": (2, 4096)}
#: The optimisers a site may name (those of :mod:`fedbn_med.training.optim`).
_OPTIMISERS = ("sgd", "adam")


@dataclass(frozen=True)
class TrainingPolicy:
    """How a site trains, whatever a run spec or a train message asks.

    Each setting is pinned (the site trains with its own value) or bounded (the run's
    value is taken only within the bounds; outside them the run is refused). A site file
    says so in its ``[training]`` table, for example::

        [training]
        optimizer = "adam"          # pinned
        lr = [1e-4, 1e-2]           # bounds
        weight_decay = 1e-4
        dropout = [0.3, 0.7]
        local_epochs = [1, 5]
        batch_size = [16, 64]

    Attributes
    ----------
    pinned : dict of str to value
        Settings the site fixes (``optimizer``, ``lr``, ``weight_decay``, ``dropout``,
        ``local_epochs``, ``batch_size``).
    bounds : dict of str to (low, high)
        Closed bounds on the other numeric settings (default :data:`TRAINING_BOUNDS`).
    optimizers : tuple of str
        The optimisers the site accepts when it pins none.
    path : Path or None
        The site file these came from.
    """

    pinned: dict[str, object] = field(default_factory=dict)
    bounds: dict[str, tuple[float, float]] = field(
        default_factory=lambda: dict(TRAINING_BOUNDS))
    optimizers: tuple[str, ...] = _OPTIMISERS
    path: Path | None = None

    def value(self, name: str, asked: object) -> object:
        """Return the value of setting ``name`` the site trains with when ``asked``.

        Raises
        ------
        PermissionError
            When ``asked`` lies outside the site's bounds (the message names both).
        """
        if name in self.pinned:
            return self.pinned[name]
        where = self.path or "its defaults"
        if name == "optimizer":
            if asked not in self.optimizers:
                raise PermissionError(
                    f"The site trains only with optimizers {', '.join(self.optimizers)} "
                    f"([training] in {where}); the run asks for {asked!r}.")
            return asked
        low, high = self.bounds[name]
        if isinstance(asked, bool) or not isinstance(asked, (int, float)) or not (
                low <= asked <= high):
            raise PermissionError(
                f"The site trains with {name} from {low:g} to {high:g} ([training] in "
                f"{where}); the run asks for {name} = {asked!r}.")
        return asked

    def apply(self, spec: Any) -> Any:
        """Return the run spec ``spec`` with this site's training settings in it.

        ``optimizer`` and ``weight_decay`` live in the task's settings when the task
        has them (ABIDE); a task without them trains with its own optimiser, and a site
        file that pins or bounds them for such a task is refused.
        """
        changes: dict[str, object] = {}
        for name in ("lr", "dropout", "local_epochs", "batch_size"):
            changes[name] = self.value(name, getattr(spec, name))
        for name in ("optimizer", "weight_decay"):
            if hasattr(spec.settings, name):
                changes[name] = self.value(name, getattr(spec.settings, name))
            elif name in self.pinned:
                raise ValueError(f"Site file {self.path}: [training] sets {name!r}, which "
                                 f"task '{spec.task}' does not take (it trains with its "
                                 "own optimiser).")
        changed = {k: v for k, v in changes.items()
                   if v != getattr(spec, k, getattr(spec.settings, k, None))}
        return spec.replace(**changed) if changed else spec


def _training_policy(raw: object, path: Path) -> TrainingPolicy:
    if raw is None:
        return TrainingPolicy(path=path)
    if not isinstance(raw, dict):
        raise ValueError(f"Site file {path}: 'training' must be a table ([training]), got "
                         f"{raw!r}.")
    valid = {*TRAINING_BOUNDS, "optimizer"}
    unknown = sorted(set(raw) - valid)
    if unknown:
        raise ValueError(f"Site file {path}: [training] has unknown keys {unknown}. Valid "
                         f"keys: {sorted(valid)}.")
    pinned: dict[str, object] = {}
    bounds = dict(TRAINING_BOUNDS)
    optimizers = _OPTIMISERS
    for name, value in raw.items():
        if name == "optimizer":
            names = value if isinstance(value, list) else [value]
            if not names or not all(n in _OPTIMISERS for n in names):
                raise ValueError(f"Site file {path}: [training] optimizer must be one of "
                                 f"{', '.join(_OPTIMISERS)} or a list of them, got "
                                 f"{value!r}.")
            if isinstance(value, list):
                optimizers = tuple(names)
            else:
                pinned[name] = value
            continue
        low, high = TRAINING_BOUNDS[name]
        whole = name in ("local_epochs", "batch_size")
        kind = int if whole else (int, float)

        def ok(v: object) -> bool:
            return (not isinstance(v, bool) and isinstance(v, kind)  # noqa: B023
                    and math.isfinite(v) and low <= v <= high)  # noqa: B023

        if isinstance(value, list) and len(value) == 2 and all(ok(v) for v in value) \
                and value[0] <= value[1]:
            bounds[name] = (value[0], value[1])
        elif ok(value):
            pinned[name] = value
        else:
            what = "a whole number" if whole else "a number"
            raise ValueError(f"Site file {path}: [training] {name} must be {what} from "
                             f"{low:g} to {high:g}, or [low, high] within those, got "
                             f"{value!r}.")
    return TrainingPolicy(pinned=pinned, bounds=bounds, optimizers=optimizers, path=path)
