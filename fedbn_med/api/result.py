"""The typed result of one federation, whatever the engine that ran it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["FederationResult"]


@dataclass(frozen=True)
class FederationResult:
    """One federated run's metrics, its selected round and where its weights are.

    Attributes
    ----------
    strategy : str
        The strategy's label (``fedbn``, ``fedbn+prox(mu=0.01)``).
    sites : tuple of str
        The sites, in the run's order.
    rows : tuple of dict
        One row per (round, site): ``{"round", "site", "num_examples", "train_loss",
        "val_<metric>", "test_<metric>", ...}``.
    selected_round : int
        The round the run reports: the task's validation rule (the lowest mean validation
        loss over the sites); no test split takes part in choosing it.
    last_round : int
        The run's last round.
    selected, last : dict
        Each site's metrics at those rounds.
    table : str
        The per-site markdown table of the selected round, the last round beside it.
    shared_weights : str or None
        Where the selected round's shared weights are: a safetensors file, or an MLflow
        artifact URI (``runs:/<id>/model/selected``, a tracked comparison's run, which
        writes no file); None when nothing is shared (SingleSet) or an untracked
        comparison's run.
    kept_weights : dict of str to Path
        Each site's layers that never leave it (its BN layers under FedBN) at the selected
        round, as safetensors files (empty when no site keeps a layer, and for a
        comparison's runs in this process, which write no file).
    run_id : str or None
        The MLflow parent run (None when the run was not tracked).
    tracking_uri : str or None
        The MLflow store of ``run_id``.
    engine : str
        ``"inprocess"`` or ``"flower"``.
    predictions : dict
        Each site's test predictions at the selected round
        (:class:`~fedbn_med.evaluation.cells.SitePredictions`): kept by a comparison's
        in-process runs of a task with subject-level cells (ABIDE), for the paired tests;
        empty otherwise.
    n_train, n_test : int
        With ``predictions``: the subjects of every site outside and inside the test fold.
    one_class : tuple of str
        Sites whose model predicts one class only at the selected round (binary tasks).
    """

    strategy: str
    sites: tuple[str, ...]
    rows: tuple[dict[str, Any], ...]
    selected_round: int
    last_round: int
    selected: dict[str, dict[str, float]]
    last: dict[str, dict[str, float]]
    table: str
    shared_weights: str | None = None
    kept_weights: dict[str, Path] = field(default_factory=dict)
    run_id: str | None = None
    tracking_uri: str | None = None
    engine: str = "inprocess"
    predictions: dict[str, Any] = field(default_factory=dict)
    n_train: int = 0
    n_test: int = 0
    one_class: tuple[str, ...] = ()

    def site_rounds(self, site: str) -> list[dict[str, Any]]:
        """Return one site's rows, round by round.

        Raises
        ------
        ValueError
            For a site the run does not have, naming the valid ones.
        """
        if site not in self.sites:
            raise ValueError(f"Unknown site '{site}'. Valid sites: {', '.join(self.sites)}.")
        return sorted((r for r in self.rows if r["site"] == site), key=lambda r: r["round"])

    def metric(self, name: str, *, at: str = "selected") -> dict[str, float]:
        """Return each site's ``name`` (``"test_dice"``) at the selected or last round.

        Raises
        ------
        ValueError
            When ``at`` is neither ``"selected"`` nor ``"last"``, or no site has ``name``.
        """
        if at not in ("selected", "last"):
            raise ValueError(f"at must be 'selected' or 'last', got {at!r}.")
        chosen = self.selected if at == "selected" else self.last
        out = {site: float(m[name]) for site, m in chosen.items() if name in m}
        if not out:
            known = sorted({k for m in chosen.values() for k in m})
            raise ValueError(f"No site reports '{name}'. Reported: {', '.join(known)}.")
        return out

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], sites: Sequence[str], *,
                     engine: str, shared_weights: str | None = None,
                     kept_weights: Mapping[str, Path] | None = None) -> FederationResult:
        """Return the result an engine's results dict (``results.json``) describes."""
        from fedbn_med.evaluation.report import one_class_sites

        selected = {s: dict(m) for s, m in values.get("selected", {}).items()}
        return cls(
            strategy=str(values["strategy"]), sites=tuple(sites),
            rows=tuple(dict(r) for r in values.get("rows", ())),
            selected_round=int(values.get("selected_round", 0)),
            last_round=int(values.get("last_round", 0)),
            selected=selected,
            last={s: dict(m) for s, m in values.get("final", {}).items()},
            table=str(values.get("table", "")), shared_weights=shared_weights,
            kept_weights=dict(kept_weights or {}),
            run_id=values.get("parent_run_id"), tracking_uri=values.get("tracking_uri"),
            engine=engine, one_class=one_class_sites(selected))
