"""SCAFFOLD at a site: its control variate, the gradient correction, and the variate's update.

SCAFFOLD (Karimireddy et al., ICML 2020) corrects each local step by ``c - c_i``, the
server's control variate minus the site's, so that a site drifts less towards its own
optimum. The variates cover the exchanged trainable parameters only
(:meth:`fedbn_med.fl.strategies.Strategy.controlled_keys`): under FedBN+SCAFFOLD the BN
layers stay home and have none. After ``K`` local steps of learning rate ``lr`` a site
updates its variate with the paper's option II,

    c_i+ = c_i - c + (x - y) / (K * lr),

where ``x`` is the global model received and ``y`` the model the site sends (after
clipping and noise when client-level DP is on, so the variate is post-processing of
what was released and costs no privacy). The site sends ``c_i+ - c_i``; the server's
update of ``c`` is :func:`fedbn_med.fl.rounds.update_control`.

A site's variate is site state, saved with its BN layers after every round. At the site,
SCAFFOLD is a round hook (:class:`ScaffoldHook`) that the strategy supplies.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from fedbn_med.fl.hooks import HookedSite, RoundHook

__all__ = ["CONTROL_PREFIX", "ScaffoldHook", "SiteControl", "join_controls", "split_controls",
           "zero_controls"]

Weights = dict[str, torch.Tensor]

#: Prefix of control-variate tensors in a message or a saved state (``control/<key>``).
CONTROL_PREFIX = "control/"


def zero_controls(template: Mapping[str, torch.Tensor], keys: Iterable[str]) -> Weights:
    """Return zero control variates (float32, CPU) shaped as ``template[key]`` for ``keys``."""
    return {k: torch.zeros(template[k].shape, dtype=torch.float32) for k in sorted(keys)}


def join_controls(weights: Mapping[str, torch.Tensor], controls: Mapping[str, torch.Tensor]
                  ) -> Weights:
    """Return weights and prefixed control variates in one mapping (for one message)."""
    return {**weights, **{CONTROL_PREFIX + k: v for k, v in controls.items()}}


def split_controls(tensors: Mapping[str, torch.Tensor]) -> tuple[Weights, Weights]:
    """Return ``(weights, controls)`` from a mapping made by :func:`join_controls`."""
    weights: Weights = {}
    controls: Weights = {}
    for key, value in tensors.items():
        if key.startswith(CONTROL_PREFIX):
            controls[key[len(CONTROL_PREFIX):]] = value
        else:
            weights[key] = value
    return weights, controls


class SiteControl:
    """A site's control variate ``c_i`` and the last change it sent.

    Parameters
    ----------
    template : mapping of str to tensor
        The model's state (shapes of the controlled keys).
    keys : iterable of str
        The controlled keys.
    """

    def __init__(self, template: Mapping[str, torch.Tensor], keys: Iterable[str]) -> None:
        self.state = zero_controls(template, keys)
        self.delta: Weights = {}

    @property
    def keys(self) -> frozenset[str]:
        """Return the controlled keys."""
        return frozenset(self.state)

    def correction(self, server: Mapping[str, torch.Tensor] | None) -> Weights:
        """Return ``c - c_i`` per key (``-c_i`` where the server sent no variate yet)."""
        server = server or {}
        unknown = sorted(set(server) - set(self.state))
        if unknown:
            raise ValueError(f"The server sent control variates for keys this site does not "
                             f"control: {unknown[:5]}.")
        out: Weights = {}
        for key, own in self.state.items():
            glob = server.get(key)
            if glob is not None and tuple(glob.shape) != tuple(own.shape):
                raise ValueError(f"The server's control variate '{key}' has shape "
                                 f"{tuple(glob.shape)}, expected {tuple(own.shape)}.")
            out[key] = (-own if glob is None else glob.to(torch.float32) - own)
        return out

    def update(self, start: Mapping[str, torch.Tensor], sent: Mapping[str, torch.Tensor],
               server: Mapping[str, torch.Tensor] | None, steps: int, lr: float) -> Weights:
        """Apply option II after ``steps`` local steps; store and return ``c_i+ - c_i``."""
        server = server or {}
        delta: Weights = {}
        for key, own in self.state.items():
            if steps < 1:
                delta[key] = torch.zeros_like(own)
                continue
            drift = (start[key].double() - sent[key].double()) / (steps * lr)
            glob = server.get(key)
            # c_i+ - c_i = (x - y) / (K lr) - c
            delta[key] = (drift - (0.0 if glob is None else glob.double())).to(torch.float32)
        for key, change in delta.items():
            self.state[key] = self.state[key] + change
        self.delta = delta
        return delta

    def load(self, state: Mapping[str, torch.Tensor]) -> None:
        """Restore a saved variate; its keys must be the controlled keys."""
        if set(state) != set(self.state):
            raise ValueError(f"A saved control variate holds keys {sorted(state)[:5]}, "
                             f"expected {sorted(self.state)[:5]}.")
        for key, value in state.items():
            if tuple(value.shape) != tuple(self.state[key].shape):
                raise ValueError(f"A saved control variate '{key}' has shape "
                                 f"{tuple(value.shape)}, expected "
                                 f"{tuple(self.state[key].shape)}.")
            self.state[key] = value.detach().to("cpu", torch.float32).clone()


class ScaffoldHook(RoundHook):
    """SCAFFOLD at a site: correct every step by ``c - c_i``; update ``c_i`` after the round.

    Parameters
    ----------
    template : mapping of str to tensor
        The model's state (shapes of the controlled keys).
    keys : iterable of str
        The controlled keys (:meth:`fedbn_med.fl.strategies.Strategy.controlled_keys`).
    lr : float
        The site's learning rate (option II divides the drift by steps times ``lr``).
    """

    def __init__(self, template: Mapping[str, torch.Tensor], keys: Iterable[str],
                 lr: float) -> None:
        self.control = SiteControl(template, keys)
        self.lr = float(lr)
        self._start: Weights = {}
        self._server: Weights = {}
        self._corrections: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._steps = 0

    def begin(self, site: HookedSite, rnd: int, server: Mapping[str, torch.Tensor]) -> None:
        """Hold the received weights and the server's variate; prepare the corrections."""
        self._start = site.shared_weights()
        self._steps = 0
        self._server = dict(server or {})
        params = dict(site.model.named_parameters())
        self._corrections = [(params[k], c.to(site.device))
                             for k, c in self.control.correction(self._server).items()]

    @torch.no_grad()
    def after_backward(self, scale: float) -> None:
        """Count a local step and add ``c - c_i`` (times ``scale``) to its gradients."""
        self._steps += 1
        for param, correction in self._corrections:
            if param.grad is not None:
                param.grad.add_(correction, alpha=scale)

    def end(self, site: HookedSite, rnd: int, sent: Weights,
            metrics: dict[str, float]) -> Weights:
        """Update the site's variate from what it sends (after DP, when DP is on)."""
        self.control.update(self._start, sent, self._server, self._steps, self.lr)
        return sent

    def state(self) -> tuple[Weights, dict[str, object]]:
        """Return the site's variate, as ``control/<key>`` tensors."""
        return {CONTROL_PREFIX + k: v.clone() for k, v in self.control.state.items()}, {}

    def load(self, tensors: Mapping[str, torch.Tensor], meta: Mapping[str, object]) -> None:
        """Restore a saved variate (tensors without the prefix are left alone)."""
        _, controls = split_controls(tensors)
        if controls:
            self.control.load(controls)
