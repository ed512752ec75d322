"""What Flower carries for us: one JSON value in the run config, one in the node config.

Flower sends a run's config to every site. So what the launcher submits
(:func:`seal_run_config`) holds only what a site needs to train: the
:class:`~fedbn_med.spec.RunSpec` without any path (where a site's data lie is the site's
own decision) and the federation's id (which names the site's state folder). The
:class:`ServerSettings` (workdir, tracking URI, the node-to-site map) stay on the server's
host, in a file under ``$FLWR_HOME`` that the run config names by a random token only.

A site's node config holds ``{"fedbn-med": "<json>"}`` with its :class:`NodeSettings`.
Each is parsed and validated once: the server's view by :func:`read_run_config`, a site's
by :func:`read_site_config`, a node's by :meth:`NodeSettings.from_node_config`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedbn_med.federation.names import NAME_RULE, check_name, is_plain_name
from fedbn_med.spec import RUN_CONFIG_KEY, RunSpec

__all__ = ["APP_HASH_KEY", "NodeSettings", "ServerSettings", "read_run_config", "read_site_config",
           "run_config", "seal_run_config"]

#: The node-config key under which a site node hands its ClientApp the SHA-256 of the
#: run's FAB, as the node computed it from the bytes it received.
APP_HASH_KEY = "fedbn-med-app-hash"

#: Folder under ``$FLWR_HOME`` where sealed server settings wait for their ServerApp.
SEALED_DIR = "fedbn-med-server"
_TOKEN = re.compile(r"[0-9a-f]{32}")


def _check_federation_id(federation_id: object) -> None:
    # The server sends it and it names a folder at the site: refused unless plain.
    if not is_plain_name(federation_id):
        raise ValueError(f"Refused federation id {repr(federation_id)[:80]} from the server: "
                         f"expected {NAME_RULE}.")


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
        Rounds go on with at least this many sites (0: a majority of the run's sites).
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
    node_sites : dict of str to str
        Node ID (as text) to site name, from the consortium's key list: with node
        authentication a node's key says which site it is. Empty: no key list.
    registered_counts : dict of str to int
        Each site's training examples as registered with its key (the consortium's
        ``counts.json``): a site weighs at most this in an average. Empty: none.
    secagg : bool
        Aggregate every round with SecAgg+ (:mod:`fedbn_med.federation.server.secagg`):
        the server sees only the sum of the sites' updates.
    secagg_clip : float
        Under SecAgg, the range +-secagg_clip of every exchanged value (quantisation).
    secagg_max_norm : float
        Under SecAgg, the largest update norm a site sends (each site checks its own).
    started_ms : int
        When the command that started this federation began (milliseconds since the
        epoch): the MLflow runs start then, so that their duration counts the start-up.
        0: when the server opens them.
    """

    workdir: Path
    tracking_uri: str = ""
    federation_id: str = "default"
    min_sites: int = 0
    wait_timeout: float = 300.0
    round_timeout: float = 600.0
    experiment: str = ""
    resume: bool = False
    allow_join: bool = False
    input_shape: tuple[int, ...] = ()
    node_sites: dict[str, str] = dataclasses.field(default_factory=dict)
    registered_counts: dict[str, int] = dataclasses.field(default_factory=dict)
    secagg: bool = False
    secagg_clip: float = 8.0
    secagg_max_norm: float = 100.0
    started_ms: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "workdir", Path(self.workdir))
        object.__setattr__(self, "input_shape", tuple(int(d) for d in self.input_shape))
        if not str(self.workdir):
            raise ValueError("The server settings must name a workdir.")
        check_name(self.federation_id, "federation_id", "it names a folder at every site")
        if not isinstance(self.node_sites, dict) or not all(
                isinstance(n, str) and n.isdigit() and is_plain_name(s)
                for n, s in self.node_sites.items()):
            raise ValueError("node_sites must map node IDs (digits) to plain site names, got "
                             f"{self.node_sites!r}.")
        if not isinstance(self.registered_counts, dict) or not all(
                is_plain_name(s) and isinstance(n, int) and not isinstance(n, bool) and n >= 1
                for s, n in self.registered_counts.items()):
            raise ValueError("registered_counts must map plain site names to whole numbers "
                             f">= 1, got {self.registered_counts!r}.")
        if not isinstance(self.min_sites, int) or self.min_sites < 0:
            raise ValueError(f"min_sites must be an integer >= 0, got {self.min_sites!r}.")
        if not isinstance(self.started_ms, int) or isinstance(self.started_ms, bool) or (
                self.started_ms < 0):
            raise ValueError(f"started_ms must be a whole number >= 0 (milliseconds since "
                             f"the epoch), got {self.started_ms!r}.")
        if not isinstance(self.secagg, bool):
            raise ValueError(f"secagg must be true or false, got {self.secagg!r}.")
        for name in ("wait_timeout", "round_timeout", "secagg_clip", "secagg_max_norm"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number, got {value!r}.")

    def needed(self, n_sites: int) -> int:
        """Return how many sites a round needs: ``min_sites``, else a majority of the sites.

        The default (0) is a majority (more than half, and at least one): a round whose
        update from one site is refused, or whose site is down, goes on while most
        sites remain, and a minority can never make a round on its own.
        """
        return self.min_sites if self.min_sites > 0 else n_sites // 2 + 1

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
    """Return the run config that carries ``spec`` and ``server`` (before sealing).

    This is the server's view, as the launcher receives it; what Flower sends to the
    sites is :func:`seal_run_config` of it.
    """
    return {RUN_CONFIG_KEY: json.dumps({"run": spec.to_dict(), "server": server.to_dict()},
                                       sort_keys=True)}


def site_view(spec: RunSpec) -> RunSpec:
    """Return the spec as a site sees it: no path of the server's (``data_dir`` unset)."""
    return spec.replace(data_dir=None) if spec.data_dir is not None else spec


def seal_run_config(cfg: Mapping[str, object], flwr_home: Path) -> dict[str, str]:
    """Keep the server's settings on its host; return the run config the sites may see.

    The full config (spec and :class:`ServerSettings`) goes to a file only its owner can
    read, ``<flwr_home>/fedbn-med-server/<token>.json``; the returned config carries the
    site's view of the spec (:func:`site_view`), the federation id and that token. The
    ServerApp, which runs with the same ``$FLWR_HOME``, reads the file back
    (:func:`read_run_config`). A config already sealed is returned unchanged.
    """
    values = _load_json(cfg, "run config")
    if "server" not in values:
        return {RUN_CONFIG_KEY: str(cfg[RUN_CONFIG_KEY])}
    spec, server = read_run_config(cfg)
    token = secrets.token_hex(16)
    folder = Path(flwr_home) / SEALED_DIR
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = folder / f"{token}.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(str(cfg[RUN_CONFIG_KEY]))
    site = {"run": site_view(spec).to_dict(), "federation_id": server.federation_id,
            "server-token": token}
    return {RUN_CONFIG_KEY: json.dumps(site, sort_keys=True)}


def _sealed(token: object) -> dict[str, Any]:
    if not isinstance(token, str) or not _TOKEN.fullmatch(token):
        raise ValueError(f"The run config's server-token must be 32 hex digits, got {token!r}.")
    home = os.environ.get("FLWR_HOME")
    if not home:
        raise ValueError("The run config names sealed server settings, but FLWR_HOME is not "
                         "set in the ServerApp's environment (it says where they are).")
    path = Path(home) / SEALED_DIR / f"{token}.json"
    if not path.is_file():
        raise ValueError(f"The run config names server settings {path}, which do not exist "
                         "on this host (runs are submitted by the launcher, which writes "
                         "them).")
    return _load_json({RUN_CONFIG_KEY: path.read_text(encoding="utf-8")}, f"server file {path}")


def read_run_config(cfg: Mapping[str, object]) -> tuple[RunSpec, ServerSettings]:
    """Parse and validate the run config into the run spec and the server settings.

    Only the server can: a sealed config (:func:`seal_run_config`) is read back from the
    server's own file.
    """
    values = _load_json(cfg, "run config")
    if "server-token" in values and "server" not in values:
        values = _sealed(values["server-token"])
    missing = sorted({"run", "server"} - set(values))
    if missing:
        raise ValueError(f"The run config's '{RUN_CONFIG_KEY}' entry lacks {missing}.")
    return RunSpec.from_dict(values["run"]), ServerSettings.from_dict(values["server"])


def read_site_config(cfg: Mapping[str, object]) -> tuple[RunSpec, str]:
    """Return what a site takes from the run config: the spec (no path) and the federation id.

    Whatever else a config holds is ignored: a site's data lie where the site says, never
    where the run spec says.
    """
    values = _load_json(cfg, "run config")
    if "run" not in values:
        raise ValueError(f"The run config's '{RUN_CONFIG_KEY}' entry lacks ['run'].")
    server = values.get("server")
    federation_id = (server.get("federation_id", "default") if isinstance(server, dict)
                     else values.get("federation_id", "default"))
    _check_federation_id(federation_id)
    return site_view(RunSpec.from_dict(values["run"])), federation_id


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
    share_private : bool
        The site's own policy: may its private (normalisation) layers leave it? Set from
        its site file and command line, never from the server (default: no).
    secagg : bool
        The site's own policy: may it send its update under secure aggregation (SecAgg+),
        where the server checks only the sum of the sites' updates? (default: no)
    """

    site: str
    state_dir: Path
    data_dir: Path | None = None
    device: str = "auto"
    share_private: bool = False
    secagg: bool = False

    def __post_init__(self) -> None:
        check_name(self.site, "The node config's site", "e.g. site='UCLA'")
        for name in ("share_private", "secagg"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}.")
        if not str(self.state_dir):
            raise ValueError(f"The node config of site '{self.site}' must name a state_dir.")
        object.__setattr__(self, "state_dir", Path(self.state_dir))
        if self.data_dir is not None:
            object.__setattr__(self, "data_dir", Path(self.data_dir))

    def state_path(self, federation_id: str) -> Path:
        """Return where this site keeps its state of a federation, inside ``state_dir``.

        ``federation_id`` comes from the server: it must be a plain name, and the path
        is checked to stay under ``state_dir`` whatever it says.
        """
        _check_federation_id(federation_id)
        root = Path(self.state_dir).resolve()
        path = (root / federation_id / f"{self.site}.safetensors").resolve()
        if not path.is_relative_to(root):
            raise ValueError(f"Refused federation id {federation_id!r}: it leads outside "
                             f"{root}.")
        return path

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
