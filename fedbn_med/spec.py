"""The run spec: every setting of one federated run, typed, frozen and validated once.

A :class:`RunSpec` is built at the boundary (the command line, a benchmark, a test) and
travels unchanged from there: to the in-process driver as an object, and to the Flower
ServerApp and every site as one JSON string under a single run-config key
(:data:`RUN_CONFIG_KEY`). Every default lives here or in the task's own
``fedbn_med/tasks/<task>/settings.py`` (what differs between tasks: the sites, the rounds,
the batch size, the learning rate, and the task's own settings class), nowhere else.

Example::

    spec = RunSpec.for_task("abide", rounds=50, strategy="fedavg")
    text = spec.to_json()                      # what Flower carries
    assert RunSpec.from_json(text) == spec
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar, Protocol

from fedbn_med.fl.privacy import UpdatePrivacy
from fedbn_med.fl.registry import get_strategy
from fedbn_med.fl.strategies import Strategy
from fedbn_med.fl.weighting import WEIGHTINGS
from fedbn_med.tasks import TASK_NAMES, get_task, settings_module_name

__all__ = [
    "BN_INITS",
    "RUN_CONFIG_KEY",
    "TASK_NAMES",
    "RunSpec",
    "TaskSettings",
    "settings_module",
    "task_defaults",
]

#: The one Flower run-config (and node-config) key that carries our JSON.
RUN_CONFIG_KEY = "fedbn-med"



class TaskSettings(Protocol):
    """What a task's settings class provides (a frozen dataclass, validated on creation)."""

    task: ClassVar[str]

    def input_shape(self) -> tuple[int, ...]:
        """Return the shape of one example the task's network takes."""
        ...


def settings_module(task: str) -> ModuleType:
    """Return the task's settings module (light: no torch, no MONAI).

    A built-in task's is ``fedbn_med.tasks.<task>.settings``; a registered task names its
    own (:attr:`fedbn_med.tasks.Task.settings`) or takes :mod:`fedbn_med.tasks.generic`.
    """
    if not isinstance(task, str) or task not in TASK_NAMES:
        raise ValueError(f"Unknown task '{task}'. Valid tasks: {', '.join(TASK_NAMES)}.")
    return importlib.import_module(settings_module_name(task))


def task_defaults(task: str) -> dict[str, Any]:
    """Return the run settings in which ``task`` differs from the generic defaults.

    Each task's ``settings.py`` holds ``DEFAULTS`` (for example the sites, the rounds, the
    batch size and the learning rate) and ``Settings``, its own settings class.
    """
    module = settings_module(task)
    defaults = dict(module.DEFAULTS)
    if "sites" not in defaults and getattr(module.Settings, "task", "") == "generic":
        sites = get_task(task).sites  # an outside task without settings: its own sites
        if sites:
            defaults["sites"] = tuple(sites)
    return {**defaults, "settings": module.Settings()}


#: Where BN running statistics may start (``RunSpec.bn_init``).
BN_INITS = ("data", "default")


def _positive_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}.")


def _default_settings() -> TaskSettings:
    return settings_module("abide").Settings()


@dataclass(frozen=True)
class RunSpec:
    """Every setting of a federated run.

    Attributes
    ----------
    task : str
        ``"abide"`` (connectivity, the paper's setting), ``"mri"`` or ``"xray"``.
    strategy : str
        A name from :data:`fedbn_med.fl.registry.STRATEGIES`.
    mu : float or None
        Proximal weight (FedProx, FedBN+prox); None is the strategy's default.
    rounds, local_epochs, batch_size : int
        Communication rounds, local epochs per round, examples per batch.
    lr, dropout : float
        SGD learning rate; dropout of the ABIDE network (0.5: chosen on validation by
        ``benchmarks/research/defaults_sweep.py`` on shared real ABIDE sites).
    seed, fold, n_folds : int
        Base seed (model initialisation, shuffling); the test fold of ``n_folds``.
    sites : tuple of str
        The sites of the federation, by name.
    data_dir : Path or None
        A data root for every site; None means each site's own file, else the built-in data.
    device : str
        ``"auto"`` (each site's own setting, else a local GPU when present), ``"cpu"``,
        ``"cuda:N"``.
    settings : TaskSettings
        The task's own settings (ABIDE: the built-in cohort's site effect; imaging: image
        size, subjects, slices, caching).
    dp_clip, dp_noise : float or None
        Client-level DP (:mod:`fedbn_med.fl.privacy`): every site clips its update to norm
        ``dp_clip`` and adds Gaussian noise of std ``dp_noise * dp_clip``. Both or neither;
        a site's own file may demand more noise. A setting whose epsilon is infinite or
        undefined is refused.
    dp_delta : float
        The delta of the (epsilon, delta) each site reports.
    dp_seeded_noise : bool
        Draw the DP noise from the run's seed, so that an experiment repeats exactly:
        NOT private (anyone with the seed can subtract the noise), and labelled so.
    weighting : str
        How the server averages the shared weights: ``"samples"`` (by each site's
        training examples, FedAvg's rule) or ``"equal"`` (every site alike, as the FedBN
        paper's published code does).
    bn_init : str
        Where each site's BN running mean and variance start: ``"data"`` (one pass over
        the site's own training data with the initial model, before round 1) or
        ``"default"`` (PyTorch's 0 and 1). Training is standard BN training either way.
    threads : int
        Torch threads a site computes with on the CPU. Float sums split over threads
        round differently, so the thread count is part of a result's identity: the same
        spec gives the same numbers whatever ``OMP_NUM_THREADS`` or the machine's cores.
    """

    task: str = "abide"
    strategy: str = "fedbn"
    mu: float | None = None
    rounds: int = 100
    local_epochs: int = 1
    batch_size: int = 32
    lr: float = 3e-3
    dropout: float = 0.5
    seed: int = 0
    fold: int = 0
    n_folds: int = 5
    sites: tuple[str, ...] = ("NYU", "UM", "USM", "UCLA")
    data_dir: Path | None = None
    device: str = "auto"
    settings: Any = field(default_factory=_default_settings)
    dp_clip: float | None = None
    dp_noise: float | None = None
    dp_delta: float = 1e-5
    dp_seeded_noise: bool = False
    weighting: str = "samples"
    bn_init: str = "data"
    threads: int = 1

    def __post_init__(self) -> None:
        module = settings_module(self.task)
        if not isinstance(self.settings, module.Settings):
            raise TypeError(
                f"settings of a '{self.task}' run must be {module.Settings.__qualname__}, got "
                f"{type(self.settings).__name__}.")
        features = get_strategy(self.strategy, self.mu).features  # validates name and mu
        offered = getattr(module, "FEATURE_TRANSFORMS", ())
        if features is not None and features not in offered:
            raise ValueError(f"Strategy '{self.strategy}' harmonises input features "
                             f"({features}), which task '{self.task}' does not offer (its "
                             f"feature transforms: {', '.join(offered) or 'none'}).")
        for name, valid in (("weighting", WEIGHTINGS), ("bn_init", BN_INITS)):
            if getattr(self, name) not in valid:
                raise ValueError(f"{name} must be one of {', '.join(valid)}, got "
                                 f"{getattr(self, name)!r}.")
        for name in ("rounds", "local_epochs", "batch_size", "n_folds", "threads"):
            _positive_int(name, getattr(self, name))
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ValueError(f"seed must be an integer, got {self.seed!r}.")
        if not 0 <= self.seed <= 2**32 - 1:
            raise ValueError(f"seed must be from 0 to 2**32 - 1 ({2**32 - 1}), the seeds numpy's "
                             f"generators take, got {self.seed!r}.")
        if not isinstance(self.fold, int) or not 0 <= self.fold < self.n_folds:
            raise ValueError(f"fold must be in 0..{self.n_folds - 1}, got {self.fold!r}.")
        if not (isinstance(self.lr, (int, float)) and self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be a positive number, got {self.lr!r}.")
        if not (isinstance(self.dropout, (int, float)) and 0.0 <= self.dropout < 1.0):
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}.")
        if isinstance(self.sites, str) or not self.sites:
            raise ValueError(f"sites must name at least one site, got {self.sites!r}.")
        if len(set(self.sites)) != len(self.sites):
            raise ValueError(f"sites name a site twice: {', '.join(self.sites)}.")
        if self.data_dir is not None and not isinstance(self.data_dir, Path):
            object.__setattr__(self, "data_dir", Path(self.data_dir))
        object.__setattr__(self, "sites", tuple(str(s) for s in self.sites))
        self._check_privacy()

    def _check_privacy(self) -> None:
        if not isinstance(self.dp_seeded_noise, bool):
            raise ValueError(f"dp_seeded_noise must be true or false, got "
                             f"{self.dp_seeded_noise!r}.")
        if self.dp_clip is None and self.dp_noise is None:
            if self.dp_seeded_noise:
                raise ValueError("dp_seeded_noise seeds the noise of client-level DP, and "
                                 "this run has none: give --dp-clip and --dp-noise too, or "
                                 "leave out --dp-seeded-noise.")
            if self.dp_delta != 1e-5:
                UpdatePrivacy(clip=1.0, noise=1.0, delta=self.dp_delta)  # validates delta
            return
        if self.dp_clip is None or self.dp_noise is None:
            given, missing = (("dp_clip", "dp_noise") if self.dp_noise is None
                              else ("dp_noise", "dp_clip"))
            raise ValueError(f"Client-level DP needs both dp_clip and dp_noise; {given} was "
                             f"given without {missing} (--dp-clip C --dp-noise SIGMA).")
        strategy = self.strategy_obj()
        if strategy.pooled or not strategy.exchanges:
            raise ValueError(f"Client-level DP protects what leaves a site; strategy "
                             f"'{strategy.name}' sends no update. Choose a federated strategy "
                             "such as fedbn or fedavg, or leave out --dp-clip/--dp-noise.")
        privacy = self.privacy()
        assert privacy is not None
        privacy.check(self.rounds, who=f"This run ({self.rounds} rounds)")

    # -- construction --------------------------------------------------------------------
    @classmethod
    def for_task(cls, task: str = "abide", **changes: Any) -> RunSpec:
        """Return the spec of ``task`` with its defaults, then ``changes`` applied.

        ``changes`` may name fields of the task's settings class too (``image_size=32``);
        a name that is neither a run field nor a task setting raises ``ValueError``.
        """
        base = task_defaults(task)
        settings = base.pop("settings")
        strategy = changes.get("strategy")
        if isinstance(strategy, str) and ":" in strategy:  # "fedbn:linear": the network too
            name, _, model = strategy.partition(":")
            if not hasattr(settings, "model"):
                raise ValueError(f"Strategy '{strategy}' names a network after ':', and task "
                                 f"'{task}' has no choice of network; use '{name}'.")
            changes = {**changes, "strategy": name, "model": model}
        fields = {f.name for f in dataclasses.fields(cls)}
        setting_names = {f.name for f in dataclasses.fields(settings)}
        unknown = sorted(set(changes) - fields - setting_names)
        if unknown:
            raise ValueError(
                f"Unknown setting(s) {', '.join(unknown)} for task '{task}'. Valid: "
                f"{', '.join(sorted((fields | setting_names) - {'task', 'settings'}))}.")
        own = {k: v for k, v in changes.items() if k in setting_names and k not in fields}
        if own:
            settings = dataclasses.replace(settings, **own)
        run = {k: v for k, v in changes.items() if k in fields}
        return cls(task=task, **{**base, "settings": settings, **run})

    def replace(self, **changes: Any) -> RunSpec:
        """Return a copy with some settings changed (task settings by their names too)."""
        setting_names = {f.name for f in dataclasses.fields(self.settings)}
        own = {k: changes.pop(k) for k in list(changes) if k in setting_names}
        if own:
            changes["settings"] = dataclasses.replace(self.settings, **own)
        return dataclasses.replace(self, **changes)

    # -- derived -------------------------------------------------------------------------
    def strategy_obj(self) -> Strategy:
        """Return the strategy object."""
        return get_strategy(self.strategy, self.mu)

    def privacy(self) -> UpdatePrivacy | None:
        """Return the run's client-level DP settings, or None when DP is off."""
        if self.dp_clip is None or self.dp_noise is None:
            return None
        return UpdatePrivacy(clip=self.dp_clip, noise=self.dp_noise, delta=self.dp_delta,
                             seeded=self.dp_seeded_noise)

    @property
    def label(self) -> str:
        """Return the strategy's display name (``fedbn+prox(mu=0.01)``).

        A network other than the task's default follows a colon (``fedbn:linear``), as
        :meth:`for_task` reads it back.
        """
        model = getattr(self.settings, "model", None)
        default = getattr(task_defaults(self.task)["settings"], "model", None)
        suffix = f":{model}" if model is not None and model != default else ""
        return self.strategy_obj().label + suffix

    def input_shape(self) -> tuple[int, ...]:
        """Return the shape of one example the run's network takes."""
        # a task without settings of its own takes its default input shape
        return tuple(self.settings.input_shape()) or get_task(self.task).default_input_shape

    def params(self) -> dict[str, object]:
        """Return the settings as flat loggable parameters (MLflow)."""
        out = self.to_dict()
        settings = out.pop("settings")
        log_params = getattr(self.settings, "log_params", None)
        out.update(log_params() if log_params is not None else settings)
        out["sites"] = ",".join(self.sites)
        out["strategy_label"] = self.label
        return out

    # -- serialisation -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Return plain JSON-able values."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["sites"] = list(self.sites)
        out["data_dir"] = None if self.data_dir is None else str(self.data_dir)
        out["settings"] = dataclasses.asdict(self.settings)
        return out

    def to_json(self) -> str:
        """Return the spec as one JSON string (what the run config carries)."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> RunSpec:
        """Build a validated spec from :meth:`to_dict` values; unknown keys are refused."""
        if not isinstance(values, Mapping):
            raise TypeError(f"A run spec must be a JSON object, got {type(values).__name__}.")
        values = dict(values)
        task = str(values.get("task", "abide"))
        module = settings_module(task)
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - fields)
        if unknown:
            raise ValueError(f"Unknown run spec field(s) {', '.join(unknown)}. Valid: "
                             f"{', '.join(sorted(fields))}.")
        raw = values.pop("settings", {}) or {}
        if not isinstance(raw, Mapping):
            raise TypeError(f"'settings' must be a JSON object, got {type(raw).__name__}.")
        known = {f.name for f in dataclasses.fields(module.Settings)}
        bad = sorted(set(raw) - known)
        if bad:
            raise ValueError(f"Unknown setting(s) {', '.join(bad)} for task '{task}'. Valid: "
                             f"{', '.join(sorted(known))}.")
        values["settings"] = module.Settings(**raw)
        if "sites" in values:
            if not isinstance(values["sites"], (list, tuple)):
                raise TypeError(f"'sites' must be a list of names, got {values['sites']!r}.")
            values["sites"] = tuple(values["sites"])
        if values.get("data_dir") is not None:
            values["data_dir"] = Path(values["data_dir"])
        return cls(**values)

    @classmethod
    def from_json(cls, text: str) -> RunSpec:
        """Parse :meth:`to_json` output; malformed text raises ``ValueError``."""
        try:
            values = json.loads(text)
        except (TypeError, json.JSONDecodeError) as err:
            raise ValueError(f"The run spec is not valid JSON: {err}.") from err
        return cls.from_dict(values)
