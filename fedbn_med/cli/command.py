"""The ``fedbn-med`` command of an installed package: one word per tool.

    fedbn-med                          # the ABIDE main job (as pipelines/abide_fedbn.py)
    fedbn-med abide --serve ...        # hospital mode: the server (or --site NAME)
    fedbn-med mri | xray | histo ...   # the imaging tasks
    fedbn-med onboard --site USM ...   # onboard a new site (pipelines/onboard_site.py)
    fedbn-med keys --out keys/ ...     # a consortium's keys (pipelines/consortium_keys.py)
    fedbn-med rois | datalists ...     # bring your own scans

Each word takes the options of the pipeline it names; ``fedbn-med WORD --help`` lists them.
A task registered from outside (:func:`fedbn_med.register_task`, or the ``fedbn_med.tasks``
entry-point group) is a word too.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["COMMANDS", "main"]

#: word -> (what it does, the module whose ``main`` runs it)
COMMANDS = {
    "abide": ("FedBN on ABIDE I fMRI (the default)", "fedbn_med.cli"),
    "mri": ("FedBN on 3D brain MRI segmentation", "fedbn_med.cli"),
    "xray": ("FedBN on chest X-ray classification", "fedbn_med.cli"),
    "histo": ("FedBN on H&E nuclei segmentation (MoNuSeg layout)", "fedbn_med.cli"),
    "onboard": ("onboard a site that took no part in training", "fedbn_med.cli.onboard"),
    "keys": ("create a consortium's CA, server certificate and site keys", "fedbn_med.cli.keys"),
    "rois": ("turn a site's 4D fMRI into ROI series", "fedbn_med.cli.rois"),
    "datalists": ("turn an imaging dataset into MONAI datalists", "fedbn_med.cli.datalists"),
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"  {word:<{width}}  {what}" for word, (what, _) in COMMANDS.items())
    return (f"usage: fedbn-med [WORD] [options]\n\nWORD (default abide):\n{rows}\n\n"
            "A registered task's name is a word too. fedbn-med WORD --help lists the "
            "options of each.")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the tool the first word names (default: the ABIDE pipeline); return its code."""
    import importlib

    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        print(_usage())
        return 0
    word = args.pop(0) if args and not args[0].startswith("-") else "abide"
    from fedbn_med.tasks import task_names

    if word not in COMMANDS and word in task_names():  # a task registered from outside
        from fedbn_med.cli import main as run_task

        return int(run_task(args, task=word))
    if word not in COMMANDS:
        print(f"fedbn-med: unknown word '{word}'. Valid: {', '.join(COMMANDS)}.\n\n{_usage()}",
              file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[word][1])
    if module.__name__ == "fedbn_med.cli":
        return int(module.main(args, task=word))
    result = module.main(args)
    return result if isinstance(result, int) else 0
