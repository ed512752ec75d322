"""Draw a site's phenotypic rows: diagnosis, age, sex, motion, quality control."""

from __future__ import annotations

import math

import numpy as np

from fedbn_med.tasks.abide.cohort.figures import SiteFigures
from fedbn_med.tasks.abide.cohort.signal import _Scanner, _site_seed
from fedbn_med.tasks.abide.data.layout import MISSING_VALUE, NO_FILENAME

__all__ = ["ZERO_ROI_SHARE"]

ZERO_ROI_SHARE = 0.06  # share of subjects with the real all-zero column of ROI 3455

_QC_PASS_COLUMNS = ("qc_rater_1", "qc_anat_rater_2", "qc_func_rater_2", "qc_anat_rater_3",
                    "qc_func_rater_3")
# How a subject fails nilearn's QC filter: (column, value, note), with probabilities.
_QC_FAILURES = (
    ("qc_rater_1", "fail", "head motion, ghosting"),
    ("qc_func_rater_3", "fail", None),
    ("qc_func_rater_2", "fail", None),
    ("qc_anat_rater_3", "fail", None),
    ("qc_rater_1", "maybe", "signal dropout, frontal"),
)
_QC_FAILURE_P = (0.4, 0.2, 0.15, 0.15, 0.1)


def _qc_values(rng: np.random.Generator, passes: bool) -> dict[str, object]:
    values: dict[str, object] = {
        "qc_rater_1": "OK",
        "qc_notes_rater_1": None,
        "qc_anat_rater_2": "maybe" if rng.random() < 0.15 else "OK",
        "qc_func_rater_2": "maybe" if rng.random() < 0.2 else "OK",
        "qc_anat_rater_3": "OK",
        "qc_func_rater_3": "OK",
    }
    if not passes:
        column, value, note = _QC_FAILURES[rng.choice(len(_QC_FAILURES), p=_QC_FAILURE_P)]
        values[column] = value
        if note is not None:
            values["qc_notes_rater_1"] = note
    return values


def _scaled(count: int, scale: float, minimum: int = 0) -> int:
    return max(minimum, round(count * scale)) if count else 0


def _site_rows(figures: SiteFigures, scanner: _Scanner, seed: int, scale: float,
               first_sub_id: int) -> list[dict[str, object]]:
    """Draw the phenotypic rows of one site (including no_filename rows)."""
    rng = np.random.default_rng([seed, _site_seed(figures.site_id), 2])
    groups = (  # (ASD, has file, passes QC, count)
        (True, True, True, _scaled(figures.n_asd_qc, scale, 2)),
        (True, True, False, _scaled(figures.n_asd - figures.n_asd_qc, scale)),
        (False, True, True, _scaled(figures.n_control_qc, scale, 2)),
        (False, True, False, _scaled(figures.n_control - figures.n_control_qc, scale)),
    )
    specs = [(asd, has_file, passes) for asd, has_file, passes, n in groups for _ in range(n)]
    n_no_file = _scaled(figures.n_no_filename, scale)
    specs += [(bool(rng.random() < 0.55), False, bool(rng.random() < 0.3))
              for _ in range(n_no_file)]
    order = rng.permutation(len(specs))
    with_file = [k for k in range(len(specs)) if specs[k][1]]
    n_zero = max(1, round(ZERO_ROI_SHARE * len(with_file)))
    zero_roi = set(rng.choice(with_file, size=n_zero, replace=False).tolist())
    rows: list[dict[str, object]] = []
    for position, k in enumerate(order):
        asd, has_file, passes = specs[k]
        sub_id = first_sub_id + position
        fd_median = scanner.fd_median[int(asd)] * (1.0 if passes else 1.6)
        mean_fd = float(np.clip(fd_median * math.exp(rng.normal(0.0, scanner.fd_log_sd)),
                                0.01, 1.5))
        age = float(np.clip(rng.normal(figures.age_mean, figures.age_sd),
                            figures.age_min, figures.age_max))
        dsm = int(rng.choice([1, 2, 3, MISSING_VALUE], p=[0.62, 0.2, 0.12, 0.06])) if asd else 0
        short = rng.random() < 0.12  # a few acquisitions end early
        n_volumes = scanner.n_volumes - (int(rng.integers(1, 5)) if short else 0)
        rows.append({
            "SUB_ID": sub_id,
            "SITE_ID": figures.site_id,
            "FILE_ID": f"{figures.file_prefix}_{sub_id:07d}" if has_file else NO_FILENAME,
            "DX_GROUP": 1 if asd else 2,
            "DSM_IV_TR": dsm,
            "AGE_AT_SCAN": round(age, 2),
            "SEX": 2 if rng.random() < figures.female_fraction else 1,
            "func_mean_fd": mean_fd,
            **_qc_values(rng, passes),
            "_index": k,
            "_zero_roi": k in zero_roi,
            "_n_volumes": n_volumes,
        })
    return rows
