"""What Flower carries for us: one JSON value in the run config, one in the node config.

The run config holds ``{"fedbn-med": "<json>"}`` with the :class:`~fedbn_med.spec.RunSpec`
(what to train) and the :class:`ServerSettings` (how the server runs it); a site's node
config holds ``{"fedbn-med": "<json>"}`` with its :class:`NodeSettings`. Each is parsed
and validated once, by :func:`read_run_config` and :meth:`NodeSettings.from_node_config`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedbn_med.spec import RUN_CONFIG_KEY, RunSpec

__all__ = ["NodeSettings", "ServerSettings", "read_run_config", "run_config"]

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _load_json(cfg: Mapping[str, object], what: str) -> dict[str, Any]:
    text = cfg.get(RUN_CONFIG_KEY)
    if not isinstance(text, str) or not text:
        raise ValueError(f"The {what} has no '{RUN_CONFIG_KEY}' entry (a JSON object); got "
                         f"keys {sorted(cfg)}.")
    try:
        values = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"The {what}'s '{RUN_CONFIG_KEY}' entry is not valid JSON: {err}.") \
            from err
    if not isinstance(values, dict):
        raise ValueError(f"The {what}'s '{RUN_CONFIG_KEY}' entry must be a JSON object.")
    return values


def _fields_from(cls: type, values: Mapping[str, Any], what: str) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ValueError(f"Unknown {what} field(s) {', '.join(unknown)}. Valid: "
                         f"{', '.join(sorted(names))}.")
    return dict(values)


@dataclass(frozen=True)
class ServerSettings:
    """How the server runs a federation (not hyper-parameters of training).

    Attributes
    ----------
    workdir : Path
        Checkpoints, results and the progress log.
    tracking_uri : str
        MLflow store ("" means the default store).
    federation_id : str
        Names this federation; sites keep their state under it.
    min_sites : int
        Rounds go on with at least this many sites (0: every site of the run).
    wait_timeout, round_timeout : float
        Seconds to wait for the sites to connect, and for one round's replies.
    experiment : str
        MLflow experiment ("" means the task's own).
    resume : bool
        Continue from the last global checkpoint.
    allow_join : bool
        Accept sites outside the run's sites that connect during the run.
    input_shape : tuple of int
        Shape of one example; empty means the run spec's.
    """

    workdir: Path
    tracking_uri: str = ""
    federation_id: str = "default"
    min_sites: int = 0
    wait_timeout: float = 120.0
    round_timeout: float = 600.0
    experiment: str = ""
    resume: bool = False
    allow_join: bool = False
    input_shape: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "workdir", Path(self.workdir))
        object.__setattr__(self, "input_shape", tuple(int(d) for d in self.input_shape))
        if not str(self.workdir):
            raise ValueError("The server settings must name a workdir.")
        if not isinstance(self.federation_id, str) or not _NAME.fullmatch(self.federation_id):
            raise ValueError(f"federation_id must be 1-64 letters, digits, '-' or '_' (it names "
                             f"a folder at every site), got {self.federation_id!r}.")
        if not isinstance(self.min_sites, int) or self.min_sites < 0:
            raise ValueError(f"min_sites must be an integer >= 0, got {self.min_sites!r}.")
        for name in ("wait_timeout", "round_timeout"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}.")

    def needed(self, n_sites: int) -> int:
        """Return how many sites a round needs (``min_sites``, or every site when 0)."""
        return self.min_sites if self.min_sites > 0 else n_sites

    def to_dict(self) -> dict[str, Any]:
        """Return plain JSON-able values."""
        out = dataclasses.asdict(self)
        out["workdir"] = str(self.workdir)
        out["input_shape"] = list(self.input_shape)
        return out

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> ServerSettings:
        """Build validated settings from :meth:`to_dict` values."""
        values = _fields_from(cls, values, "server setting")
        if "workdir" not in values:
            raise ValueError("The server settings must name a 'workdir' for checkpoints and "
                             "results.")
        return cls(**values)


def run_config(spec: RunSpec, server: ServerSettings) -> dict[str, str]:
    """Return the Flower run config that carries ``spec`` and ``server``."""
    return {RUN_CONFIG_KEY: json.dumps({"run": spec.to_dict(), "server": server.to_dict()},
                                       sort_keys=True)}


def read_run_config(cfg: Mapping[str, object]) -> tuple[RunSpec, ServerSettings]:
    """Parse and validate Flower's run config into the run spec and the server settings."""
    values = _load_json(cfg, "run config")
    missing = sorted({"run", "server"} - set(values))
    if missing:
        raise ValueError(f"The run config's '{RUN_CONFIG_KEY}' entry lacks {missing}.")
    return RunSpec.from_dict(values["run"]), ServerSettings.from_dict(values["server"])


@dataclass(frozen=True)
class NodeSettings:
    """A site node's own settings (its Flower node config).

    Attributes
    ----------
    site : str
        The site this node serves.
    state_dir : Path
        Where the site keeps its private state.
    data_dir : Path or None
        The site's data root (None: its site file, else the built-in data).
    device : str
        ``"auto"``, ``"cpu"`` or ``"cuda:N"``.
    """

    site: str
    state_dir: Path
    data_dir: Path | None = None
    device: str = "auto"

    def __post_init__(self) -> None:
        if not isinstance(self.site, str) or not self.site:
            raise ValueError("The node config must name its site (e.g. site='UCLA').")
        if not str(self.state_dir):
            raise ValueError(f"The node config of site '{self.site}' must name a state_dir.")
        object.__setattr__(self, "state_dir", Path(self.state_dir))
        if self.data_dir is not None:
            object.__setattr__(self, "data_dir", Path(self.data_dir))

    def to_node_config(self) -> dict[str, str]:
        """Return the node config that carries these settings."""
        values = dataclasses.asdict(self)
        values["state_dir"] = str(self.state_dir)
        values["data_dir"] = None if self.data_dir is None else str(self.data_dir)
        return {RUN_CONFIG_KEY: json.dumps(values, sort_keys=True)}

    @classmethod
    def from_node_config(cls, cfg: Mapping[str, object]) -> NodeSettings:
        """Parse and validate Flower's node config of a site."""
        return cls(**_fields_from(cls, _load_json(cfg, "node config"), "node setting"))
