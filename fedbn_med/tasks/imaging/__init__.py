"""What the imaging tasks (:mod:`fedbn_med.tasks.mri`, :mod:`fedbn_med.tasks.xray`) share.

``synth`` builds the offline built-in sites, ``readers`` and ``dicom_io`` decode
NIfTI/DICOM/PNG and datalists, ``datasets`` turns a site's datalist into cached MONAI
datasets, ``trainer`` holds :class:`~fedbn_med.tasks.imaging.trainer.ImageObjective`, the batching
a site trainer uses on these datasets (each task adds its loss and scores in its
``objective``), ``site_files`` reads
``sites/<task>/*.toml``, and ``settings`` holds the settings both tasks share.
"""

from __future__ import annotations
