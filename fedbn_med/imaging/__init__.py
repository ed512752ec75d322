"""Imaging federations: brain MRI segmentation and X-ray classification with MONAI.

``synth`` builds the offline built-in sites, ``readers`` decodes NIfTI/DICOM/PNG and
datalists, ``trainer`` holds the MONAI-dataset site trainers, and ``mri``/``xray``
register the tasks ``"mri"`` and ``"xray"`` (see :mod:`fedbn_med.tasks`).
"""

from __future__ import annotations
