"""Client-level differential privacy on what leaves a site: clip the update, add noise.

Each round a site computes its update (the exchanged weights it trained minus the global
weights it received), scales it down to L2 norm at most ``C`` (``clip``) and adds Gaussian
noise of standard deviation ``sigma * C`` (``noise`` is ``sigma``) to every coordinate,
then sends ``global + noisy update``. The server never sees a clean update. BN layers
never leave a site under FedBN, so they need no noise.

The privacy spent is Opacus's RDP accountant (:class:`opacus.accountants.RDPAccountant`,
through :mod:`fedbn_med.fl.accountant`): one Gaussian mechanism of noise multiplier
``sigma`` per round, with sampling rate 1 (every site releases an update in every round
it takes part in; nothing is subsampled, so there is no amplification by sampling). The
guarantee is client-level: it bounds what the released updates reveal about whether a
site's data, any or all of its patients, went into them (add/remove of the site's
contribution).

The noise comes from a generator seeded from the operating system's secret randomness
(:mod:`secrets`), never from the run's seed: the server knows the run's seed, and noise
it could regenerate would protect nothing.

A site may demand more privacy than the run asks for in its own TOML file
(:class:`SitePrivacy`): its noise is a floor and its delta a ceiling that the server's
settings cannot lower or raise (:func:`resolve_privacy`).

A site's spending does not restart with a new federation: :class:`PrivacyLedger` keeps,
in the site's own state folder, every release of every federation it took part in, and
the site refuses a run (or a round) that would take the composed epsilon above the
ceiling of its site file (``dp_epsilon_max``).
"""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fedbn_med.fl.accountant import (
    MAX_NOISE,
    SAMPLE_RATE,
    check_delta,
    epsilon,
    noise_for_epsilon,
)
from fedbn_med.fl.dp_terms import replace_one_epsilon, warn_if_large

if TYPE_CHECKING:  # torch is imported where noise is drawn: the run spec stays light
    import torch

    Weights = dict[str, torch.Tensor]

__all__ = [
    "MAX_NOISE",
    "SAMPLE_RATE",
    "PrivacyLedger",
    "SitePrivacy",
    "UpdatePrivacy",
    "clip_and_noise",
    "epsilon",
    "noise_for_epsilon",
    "resolve_privacy",
]

def _finite_number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}.")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}.")
    return float(value)


def clip_and_noise(update: Mapping[str, torch.Tensor], clip: float, noise: float,
                   generator: torch.Generator | None = None) -> tuple[Weights, float]:
    """Return the update clipped to L2 norm ``clip`` plus N(0, (noise*clip)^2), and its norm.

    The norm is over every tensor together (the update as one vector), in float64. The
    returned norm is the clean one: it stays at the site.
    """
    import torch

    total = sum(float(torch.sum(t.double() ** 2)) for t in update.values())
    norm = total ** 0.5
    scale = min(1.0, clip / norm) if norm > 0 else 1.0
    out: Weights = {}
    for key, tensor in update.items():
        noisy = tensor.double() * scale
        if noise > 0:
            noisy = noisy + noise * clip * torch.randn(tensor.shape, generator=generator,
                                                       dtype=torch.float64)
        out[key] = noisy
    return out, norm


@dataclass(frozen=True)
class UpdatePrivacy:
    """Client-level DP settings of one site: clip norm, noise multiplier, delta.

    Attributes
    ----------
    clip : float
        L2 norm ``C`` every update is scaled down to.
    noise : float
        Noise multiplier ``sigma``: each coordinate gets N(0, (sigma C)^2). A run
        refuses 0 (:meth:`check`), which gives an infinite epsilon; the mechanism itself
        accepts it, which the tests use.
    delta : float
        The delta of the reported (epsilon, delta).
    seeded : bool
        Draw the noise from the run's seed (:func:`fedbn_med.fl.dp_terms.noise_generator`)
        for experiments that must repeat: NOT private, and labelled so wherever the
        epsilon is shown.
    """

    clip: float
    noise: float
    delta: float = 1e-5
    seeded: bool = False

    def __post_init__(self) -> None:
        clip = _finite_number("dp_clip", self.clip)
        noise = _finite_number("dp_noise", self.noise)
        delta = _finite_number("dp_delta", self.delta)
        if clip <= 0:
            raise ValueError(f"dp_clip must be a positive norm, got {self.clip!r}.")
        if not 0 <= noise <= MAX_NOISE:
            raise ValueError(f"dp_noise must be a noise multiplier from 0 to {MAX_NOISE:g}, "
                             f"got {self.noise!r}.")
        check_delta(delta)
        object.__setattr__(self, "clip", clip)
        object.__setattr__(self, "noise", noise)
        object.__setattr__(self, "delta", delta)

    def epsilon(self, releases: int) -> float:
        """Return the epsilon after ``releases`` rounds."""
        return epsilon(self.noise, releases, self.delta)

    def check(self, rounds: int, who: str = "This run") -> float:
        """Return the epsilon of ``rounds`` rounds; raise ``ValueError`` when it is infinite."""
        if self.noise == 0:
            raise ValueError(
                f"{who} would release updates with dp_noise = 0: epsilon is infinite (the "
                "clipped update is sent in the clear). Give a noise multiplier > 0 such as "
                "--dp-noise 1.0, or leave out --dp-clip and --dp-noise to run without DP.")
        eps = self.epsilon(rounds)
        if not math.isfinite(eps):
            raise ValueError(
                f"{who}: the RDP accountant gives epsilon = {eps} for dp_noise = "
                f"{self.noise:g} over {rounds} rounds at dp_delta = {self.delta:g}; raise "
                "--dp-noise or lower --rounds.")
        warn_if_large(eps, who, seeded=self.seeded, replace_one=replace_one_epsilon(
            [(self.noise, SAMPLE_RATE, rounds)], self.delta))
        return eps

    def privatize(self, sent: Mapping[str, torch.Tensor], start: Mapping[str, torch.Tensor],
                  generator: torch.Generator | None = None,
                  nonnegative: Collection[str] = ()) -> Weights:
        """Return ``start + clip_and_noise(sent - start)``, key by key, in ``sent``'s dtypes.

        Integer tensors (BN's ``num_batches_tracked`` under FedAvg) carry no update: the
        received value is sent back. The ``nonnegative`` keys (BN running variances, shared
        under FedAvg: :func:`fedbn_med.fl.partition.bn_variance_keys`) are clamped at 0
        after the noise: noise can make a variance negative, and a negative variance turns
        the model's output into NaN. The clamp is post-processing of the noisy release, so
        it costs no privacy.
        """
        import torch

        floats = [k for k in sent if sent[k].dtype.is_floating_point]
        update = {k: sent[k].double() - start[k].double() for k in floats}
        if generator is None:
            generator = torch.Generator().manual_seed(secrets.randbits(63))
        noisy, _ = clip_and_noise(update, self.clip, self.noise, generator)
        out: Weights = {}
        for key, tensor in sent.items():
            if key in noisy:
                value = start[key].double() + noisy[key]
                if key in nonnegative:
                    value = value.clamp_min(0.0)
                out[key] = value.to(tensor.dtype)
            else:
                out[key] = start[key].clone().to(tensor.dtype)
        return out


@dataclass(frozen=True)
class SitePrivacy:
    """What a site's own file demands: a noise floor, a delta ceiling, its own clip norm.

    Attributes
    ----------
    noise : float or None
        The least noise multiplier this site releases with.
    delta : float or None
        The largest delta this site accepts.
    clip : float or None
        This site's clip norm (replaces the run's).
    """

    noise: float | None = None
    delta: float | None = None
    clip: float | None = None

    @property
    def demands(self) -> bool:
        """Return whether the site asks for DP at all."""
        return self.noise is not None or self.clip is not None


def resolve_privacy(run: UpdatePrivacy | None, site: SitePrivacy | None,
                    site_name: str = "the site") -> UpdatePrivacy | None:
    """Return a site's effective DP settings: the run's, never less private than its file's.

    Noise is the larger of the two, delta the smaller; the site's clip norm, when it sets
    one, replaces the run's. A site that demands DP in a run without DP turns it on for
    itself, and then needs its own clip norm.
    """
    if site is None or not site.demands:
        return run
    clip = site.clip if site.clip is not None else (run.clip if run is not None else None)
    if clip is None:
        raise ValueError(
            f"Site file of {site_name} sets dp_noise but no dp_clip, and the run has no "
            "--dp-clip: a noise multiplier needs a clip norm (add dp_clip = 1.0 to the file).")
    noise = max(run.noise if run is not None else 0.0, site.noise or 0.0)
    deltas = [d for d in (run.delta if run is not None else None, site.delta) if d is not None]
    return UpdatePrivacy(clip=clip, noise=noise, delta=min(deltas) if deltas else 1e-5,
                         seeded=run.seeded if run is not None else False)


History = list[tuple[float, float, int]]


class PrivacyLedger:
    """One site's DP spending over every federation, in a JSON file of its own folder.

    The file maps each federation id to its accountant history (noise multiplier,
    sample rate, releases), as the site's state of that federation holds it; the epsilon
    spent is the RDP composition of all of them. A damaged file is an error, never a
    fresh start: a ledger read as empty would let the budget restart.

    Parameters
    ----------
    path : Path
        The ledger file (``<state_dir>/<site>.dp_ledger.json``).
    site : str
        The site it belongs to (named in errors).
    """

    def __init__(self, path: Path, site: str) -> None:
        self.path = Path(path)
        self.site = site
        self.federations: dict[str, History] = self._read()

    def _read(self) -> dict[str, History]:
        if not self.path.exists():
            return {}
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
            return {str(fid): [(float(s), float(q), int(n)) for s, q, n in history]
                    for fid, history in dict(raw["federations"]).items()}
        except (OSError, ValueError, TypeError, KeyError) as err:
            raise ValueError(
                f"Privacy ledger {self.path} of site {self.site} is damaged ({err}); expected "
                '{"federations": {ID: [[noise, sample_rate, releases], ...]}}. Restore it '
                "from a backup: the site will not start its budget again from zero.") from None

    def history(self, exclude: str | None = None) -> History:
        """Return every federation's releases, but ``exclude``'s."""
        return [step for fid, steps in sorted(self.federations.items()) if fid != exclude
                for step in steps]

    def spent(self, delta: float, extra: Sequence[tuple[float, float, int]] = (),
              exclude: str | None = None) -> float:
        """Return the epsilon of everything recorded (but ``exclude``) plus ``extra``."""
        steps = [*self.history(exclude), *extra]
        if not any(n for _, _, n in steps):
            return 0.0
        return epsilon(0.0, 0, delta, steps)

    def record(self, federation_id: str, history: Sequence[tuple[float, float, int]]) -> None:
        """Set one federation's releases and write the ledger atomically."""
        from fedbn_med.checkpoint import write_text_atomic

        self.federations[federation_id] = [(float(s), float(q), int(n)) for s, q, n in history]
        write_text_atomic(self.path, json.dumps(
            {"site": self.site, "federations": {k: [list(h) for h in v]
                                                for k, v in self.federations.items()}},
            indent=1))
