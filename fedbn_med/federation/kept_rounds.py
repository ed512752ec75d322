"""A site's private layers of the round the federation selects, kept beside its state.

A run's result is its selected round (the lowest mean validation loss over the sites),
and the model that round's scores are of is that round's shared weights (the server
keeps them) with each site's private layers as they were then (normalisation layers
under FedBN): those never leave the site, so the site keeps them. Every message from the
server says which round is the best scored so far (``selected-round``); the site keeps
its private layers of that round and of its latest, one file each
(``<site>.round-<k>.safetensors`` beside its state file), and removes the others. The
round finally selected is always one of those two.

The server's claim is checked like anything else it sends: one that is not a whole
number refuses the message (:class:`~fedbn_med.federation.wire.TrainInstruction`), and a
round this site has not reached keeps the latest round only. A wrong claim can only make
the site keep the wrong one of its own files; nothing leaves the site.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from fedbn_med.checkpoint import save_tensors

if TYPE_CHECKING:
    import torch

__all__ = ["keep_rounds", "round_file"]

logger = logging.getLogger(__name__)


def round_file(state_path: Path, rnd: int) -> Path:
    """Return where a site keeps its private layers of round ``rnd``."""
    return state_path.with_name(f"{state_path.stem}.round-{rnd}{state_path.suffix}")


def keep_rounds(state_path: Path, private: Mapping[str, torch.Tensor], current: int,
                selected: object) -> list[int]:
    """Write ``private`` (the layers now, of round ``current``); keep ``selected``'s too.

    Returns the rounds kept. Nothing is written for a round before the first (0) or a
    strategy without private layers.
    """
    if current < 1 or not private:
        return []
    save_tensors(round_file(state_path, current), dict(private), {"round": current})
    keep = {current}
    if isinstance(selected, int) and not isinstance(selected, bool) and 1 <= selected <= current:
        keep.add(selected)
    elif selected not in (0, None):
        logger.warning("The server named round %r as selected, which site state %s cannot "
                       "have: only round %d's private layers are kept.", selected,
                       state_path, current)
    pattern = re.compile(re.escape(state_path.stem) + r"\.round-(\d+)" +
                         re.escape(state_path.suffix) + "$")
    for path in state_path.parent.iterdir():
        found = pattern.match(path.name)
        if found and int(found.group(1)) not in keep:
            path.unlink(missing_ok=True)
    return sorted(k for k in keep if round_file(state_path, k).exists())
