"""Read one site's TOML file, the part every task's site configuration shares.

Each task parses its own keys (``fedbn_med.tasks.<task>.sites`` or ``site_files``); the
folder of site files, the TOML reading with its refusal of unknown keys, path entries
resolved from the file's own folder, and the ``split_seed`` and ``device`` entries are
the same for all, and live here.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from fedbn_med.federation.names import check_name
from fedbn_med.fl.model_checks import DEFAULT_MAX_MODEL_SHIFT, DEFAULT_MAX_WEIGHT_ABS
from fedbn_med.tasks.site_training import TRAINING_BOUNDS, TrainingPolicy, _training_policy

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

if TYPE_CHECKING:
    from fedbn_med.fl.privacy import SitePrivacy

__all__ = ["COMMON_KEYS", "DEFAULT_MAX_MESSAGE_MB", "DEFAULT_MAX_SCORES",
           "DEFAULT_MESSAGE_TIMEOUT_S", "DP_KEYS", "MIN_DP_CLIP", "MAX_DP_DELTA", "SitePolicy",
           "TRAINING_BOUNDS", "TrainingPolicy",
           "read_site_file", "secure_aggregation", "share_private_layers", "site_path",
           "site_policy", "site_privacy", "site_seed_and_device", "sites_dir"]

#: A site file's client-level DP entries: a noise floor, a delta ceiling, its clip norm.
DP_KEYS = frozenset({"dp_noise", "dp_delta", "dp_clip"})
#: Keys every task's site file may hold: the site's own privacy policy.
COMMON_KEYS = frozenset({"share_private_layers", "dp_epsilon_max", "max_scores_per_run",
                         "max_message_mb", "message_timeout_s", "max_weight_abs",
                         "max_model_shift", "training", "approved_specs",
                         "approved_apps", "secure_aggregation"})
#: Scores (evaluations) a site sends per federation run unless its file says otherwise.
DEFAULT_MAX_SCORES = 500
#: The most MiB of one message from the server a site downloads unless its file says
#: otherwise (the largest shipped network, DenseNet121, is about 27 MiB).
DEFAULT_MAX_MESSAGE_MB = 512
#: Seconds a site waits for a message's contents to arrive before it refuses the message.
DEFAULT_MESSAGE_TIMEOUT_S = 60.0
#: The smallest clip norm a site file may set: below it, an update is all noise, or the
#: accountant's arithmetic loses its meaning (``5e-324`` was accepted before issue 44).
MIN_DP_CLIP = 1e-6
#: The largest delta a site file may set: well below 1/n for any site's n examples.
MAX_DP_DELTA = 1e-3
#: numpy's and torch's generators take seeds below 2**32.
_MAX_SEED = 2**32 - 1


def sites_dir() -> Path:
    """Return the folder of site files: ``$FEDBN_MED_SITES``, else the package's own.

    The package ships the default site files (``fedbn_med/sites/``; a clone also reaches
    them as ``sites/``). A hospital that installed the package keeps its own folder and
    points ``FEDBN_MED_SITES`` at it.
    """
    env = os.environ.get("FEDBN_MED_SITES")
    return Path(env).expanduser() if env else Path(__file__).resolve().parent.parent / "sites"


def read_site_file(path: Path, valid_keys: set[str]) -> dict[str, object]:
    """Read a site TOML file, refusing broken TOML and unknown keys."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"Site file {path} is not valid TOML: {err}.") from err
    valid_keys = set(valid_keys) | COMMON_KEYS
    unknown = set(raw) - valid_keys
    if unknown:
        raise ValueError(
            f"Site file {path} has unknown keys {sorted(unknown)}. "
            f"Valid keys: {sorted(valid_keys)}."
        )
    check_name(path.stem, f"Site file {path}: a site's name")
    if "name" in raw and raw["name"] != path.stem:
        raise ValueError(f"Site file {path} says name = {raw['name']!r}, but its file names "
                         f"site '{path.stem}'; they must match.")
    for key in ("share_private_layers", "secure_aggregation"):
        if not isinstance(raw.get(key, False), bool):
            raise ValueError(f"Site file {path}: '{key}' must be true or false, "
                             f"got {raw[key]!r}.")
    return raw


def share_private_layers(site: str, task: str = "abide") -> bool:
    """Return the site file's privacy policy: may its private (BN) layers leave? (default no)."""
    return _flag(site, task, "share_private_layers")


def secure_aggregation(site: str, task: str = "abide") -> bool:
    """Return the site file's policy: may it send its update under SecAgg+? (default no)."""
    return _flag(site, task, "secure_aggregation")


def _flag(site: str, task: str, key: str) -> bool:
    check_name(site, why="it names the site's file")
    for path in (sites_dir() / f"{site}.toml", sites_dir() / task / f"{site}.toml"):
        if path.is_file():
            try:
                raw = tomllib.loads(path.read_text(encoding="utf-8"))
            except tomllib.TOMLDecodeError as err:
                raise ValueError(f"Site file {path} is not valid TOML: {err}.") from err
            value = raw.get(key, False)
            if not isinstance(value, bool):
                raise ValueError(f"Site file {path}: '{key}' must be true or "
                                 f"false, got {value!r}.")
            return value
    return False


def site_privacy(raw: dict[str, object], path: Path) -> SitePrivacy | None:
    """Return what the site file demands of client-level DP, or None when it says nothing.

    ``dp_noise`` is a floor on the noise multiplier and ``dp_delta`` a ceiling on delta
    that the server cannot lower or raise; ``dp_clip`` is the site's own clip norm.
    """
    from fedbn_med.fl.privacy import SitePrivacy, UpdatePrivacy

    values: dict[str, float] = {}
    for key in sorted(DP_KEYS & set(raw)):
        value = raw[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"Site file {path}: '{key}' must be a number, got {value!r}.")
        values[key[3:]] = float(value)
    if not values:
        return None
    clip, delta = values.get("clip"), values.get("delta")
    if clip is not None and not (MIN_DP_CLIP <= clip <= 1e6):
        raise ValueError(f"Site file {path}: 'dp_clip' must be from {MIN_DP_CLIP:g} to 1e6 (the "
                         f"norm each update is clipped to), got {clip!r}.")
    if delta is not None and not (0 < delta <= MAX_DP_DELTA):
        raise ValueError(f"Site file {path}: 'dp_delta' must be above 0 and at most "
                         f"{MAX_DP_DELTA:g} (well below 1/n for a site's n examples), got "
                         f"{delta!r}.")
    try:  # each value validated as a run's would be (clip > 0, delta in (0, 1), ...)
        UpdatePrivacy(clip=values.get("clip", 1.0), noise=values.get("noise", 1.0),
                      delta=values.get("delta", 1e-5))
    except (ValueError, TypeError) as err:
        raise ValueError(f"Site file {path}: {err}") from None
    return SitePrivacy(**values)


def site_path(raw: dict[str, object], key: str, path: Path) -> Path | None:
    """Return a path entry resolved from the site file's folder (None when empty)."""
    value = raw.get(key, "")
    if not isinstance(value, str):
        raise ValueError(f"Site file {path}: '{key}' must be a string, got {value!r}.")
    if not value:
        return None
    resolved = Path(value).expanduser()
    return resolved if resolved.is_absolute() else (path.parent / resolved).resolve()


def site_seed_and_device(raw: dict[str, object], path: Path) -> tuple[int, str]:
    """Return the validated ``split_seed`` and ``device`` entries."""
    seed = raw.get("split_seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= _MAX_SEED:
        raise ValueError(
            f"Site file {path}: 'split_seed' must be an integer from 0 to 2**32 - 1 "
            f"({_MAX_SEED}), got {seed!r}."
        )
    device = raw.get("device", "auto")
    if not isinstance(device, str) or not (
        device in ("auto", "cpu", "cuda") or device.startswith("cuda:")
    ):
        raise ValueError(
            f"Site file {path}: 'device' must be 'auto', 'cpu', 'cuda' or 'cuda:N', "
            f"got {device!r}."
        )
    return seed, device


@dataclass(frozen=True)
class SitePolicy:
    """What a site's own file decides about what leaves it, whatever the server asks.

    Attributes
    ----------
    epsilon_max : float or None
        The most client-level DP epsilon this site spends, over every federation it takes
        part in (its ledger, :class:`fedbn_med.fl.privacy.PrivacyLedger`). None: no ceiling.
        With a ceiling, the site sends updates only under DP.
    max_scores : int
        The most evaluations (scores of a global model) it sends per federation run.
    max_message_bytes : int
        The most bytes of one message from the server it downloads (``max_message_mb``).
    message_timeout : float
        Seconds it waits for a message's contents before it refuses the message
        (``message_timeout_s``).
    max_weight_abs : float
        The largest absolute value it accepts in a global model (``max_weight_abs``).
    max_model_shift : float
        How far from its own last update a model it trains from or scores may lie
        (``max_model_shift``; :func:`fedbn_med.fl.model_checks.shift_reason`).
    training : TrainingPolicy
        How it trains (its ``[training]`` table).
    approved_specs : tuple of str or None
        The SHA-256 hashes of the run specs it runs (``approved_specs``; None: any).
    approved_apps : tuple of str or None
        The SHA-256 hashes of the apps (FABs) it runs (``approved_apps``; None: any).
    path : Path or None
        The site file these came from (None: no file, the defaults).
    """

    epsilon_max: float | None = None
    max_scores: int = DEFAULT_MAX_SCORES
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_MB << 20
    message_timeout: float = DEFAULT_MESSAGE_TIMEOUT_S
    max_weight_abs: float = DEFAULT_MAX_WEIGHT_ABS
    max_model_shift: float = DEFAULT_MAX_MODEL_SHIFT
    training: TrainingPolicy = field(default_factory=TrainingPolicy)
    approved_specs: tuple[str, ...] | None = None
    approved_apps: tuple[str, ...] | None = None
    path: Path | None = None


def _site_file(site: str, task: str) -> Path | None:
    check_name(site, why="it names the site's file")
    for path in (sites_dir() / f"{site}.toml", sites_dir() / task / f"{site}.toml"):
        if path.is_file():
            return path
    return None


def _hashes(value: object, key: str, path: Path) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not (isinstance(value, list) and all(
            isinstance(h, str) and len(h) == 64 and all(c in "0123456789abcdef" for c in h)
            for h in value)):
        raise ValueError(f"Site file {path}: '{key}' must be a list of SHA-256 hashes in hex "
                         "(as `python -m fedbn_med.federation.approve` prints them).")
    return tuple(value)


def site_policy(site: str, task: str = "abide") -> SitePolicy:
    """Return the site file's DP ceiling, scores per run, and bounds on server messages."""
    path = _site_file(site, task)
    if path is None:
        return SitePolicy()
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"Site file {path} is not valid TOML: {err}.") from err
    ceiling = raw.get("dp_epsilon_max")
    if ceiling is not None and (isinstance(ceiling, bool) or not isinstance(
            ceiling, (int, float)) or not math.isfinite(ceiling) or ceiling <= 0):
        raise ValueError(f"Site file {path}: 'dp_epsilon_max' must be a positive finite "
                         f"number (the most epsilon this site spends), got {ceiling!r}.")
    scores = raw.get("max_scores_per_run", DEFAULT_MAX_SCORES)
    if isinstance(scores, bool) or not isinstance(scores, int) or not 0 <= scores <= 10**6:
        raise ValueError(f"Site file {path}: 'max_scores_per_run' must be an integer from 0 "
                         f"to 1000000, got {scores!r}.")
    mb = raw.get("max_message_mb", DEFAULT_MAX_MESSAGE_MB)
    if isinstance(mb, bool) or not isinstance(mb, (int, float)) or not 1 <= mb <= 65536:
        raise ValueError(f"Site file {path}: 'max_message_mb' must be a number of MiB from 1 "
                         f"to 65536 (the largest message from the server this site "
                         f"downloads), got {mb!r}.")
    wait = raw.get("message_timeout_s", DEFAULT_MESSAGE_TIMEOUT_S)
    if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 0.5 <= wait <= 3600:
        raise ValueError(f"Site file {path}: 'message_timeout_s' must be a number of seconds "
                         f"from 0.5 to 3600, got {wait!r}.")
    bound = raw.get("max_weight_abs", DEFAULT_MAX_WEIGHT_ABS)
    if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not 1 <= bound <= 1e9:
        raise ValueError(f"Site file {path}: 'max_weight_abs' must be a number from 1 to 1e9 "
                         f"(the largest value it accepts in a global model), got {bound!r}.")
    shift = raw.get("max_model_shift", DEFAULT_MAX_MODEL_SHIFT)
    if isinstance(shift, bool) or not isinstance(shift, (int, float)) or not 0 < shift <= 2:
        raise ValueError(f"Site file {path}: 'max_model_shift' must be a number above 0 and "
                         f"at most 2, got {shift!r}.")
    approved = {key: _hashes(raw.get(key), key, path)
                for key in ("approved_specs", "approved_apps")}
    return SitePolicy(epsilon_max=None if ceiling is None else float(ceiling),
                      approved_specs=approved["approved_specs"],
                      approved_apps=approved["approved_apps"],
                      max_scores=scores, max_message_bytes=int(mb * (1 << 20)),
                      message_timeout=float(wait), max_weight_abs=float(bound),
                      max_model_shift=float(shift),
                      training=_training_policy(raw.get("training"), path), path=path)
