"""Read and validate PCP ``.1D`` ROI time-series files, one by one or a site at a time.

A site's files are read through nilearn's own loader (:func:`_read_site_series`), then
checked here, so that a malformed file is reported with its path and the reason and
skipped rather than breaking the whole site.
"""

from __future__ import annotations

import logging
import re
import warnings
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from fedbn_med.tasks.abide.data.atlas import HO_LABELS

__all__ = ["MIN_VOLUMES", "ROI_COUNTS", "DataFileError", "read_roi_time_series"]

logger = logging.getLogger(__name__)

# Column counts known for certain; other atlases are checked against the file header.
ROI_COUNTS: dict[str, int] = {"rois_ho": 111, "rois_cc200": 200}
MIN_VOLUMES = 10
# A header line longer than this is not one of a PCP atlas (cc400's is about 3 kB).
_MAX_HEADER_CHARS = 1 << 20
#: The series the last site's read parsed and checked, by file (path, size, mtime): the
#: window features read the same files next, and take each from here once instead of
#: parsing its text again (half of a site's first preparation was parsing). One site's.
_JUST_READ: dict[tuple[str, int, int], tuple[np.ndarray, tuple[str, ...]]] = {}


def _file_key(path: Path) -> tuple[str, int, int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return str(path.resolve()), stat.st_size, stat.st_mtime_ns


class DataFileError(ValueError):
    """A data file exists but cannot be used; the message names the file and the reason.

    Parameters
    ----------
    path : str or pathlib.Path
        The offending file.
    reason : str
        What is wrong with it, and what was expected.
    """

    def __init__(self, path: str | Path, reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


def read_roi_time_series(
    path: str | Path, *, n_rois: int | None = None
) -> tuple[np.ndarray, tuple[str, ...]]:
    """Read and validate one PCP ``.1D`` ROI time-series file.

    Parameters
    ----------
    path : str or pathlib.Path
        The ``.1D`` file: an optional ``#<label>`` header line, then one row of
        whitespace-separated numbers per volume.
    n_rois : int or None, default=None
        Expected number of columns; None accepts what the header announces.

    Returns
    -------
    data : numpy.ndarray
        ``float64`` array ``(n_volumes, n_rois)``.
    labels : tuple of str
        ROI labels from the header (without ``#``), empty when there is no header.

    Raises
    ------
    FileNotFoundError
        If the file does not exist.
    DataFileError
        If it is empty, has no or too few data rows, rows of unequal or unexpected
        length, text where numbers belong, or NaN/Inf values.
    """
    path = Path(path)
    key = _file_key(path)
    just_read = _JUST_READ.pop(key, None) if key is not None else None
    if just_read is not None and (n_rois is None or just_read[0].shape[1] == n_rois):
        return just_read  # the site's read checked it a moment ago, unchanged since
    labels = _read_header(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # numpy's "input contained no data"
            data = np.loadtxt(path, comments="#", dtype=np.float64, ndmin=2)
    except ValueError as exc:
        # numpy's message quotes the offending text: say only where it is, since the
        # file may be a link to anything (issue 44: /etc/passwd's first line was quoted)
        text = str(exc)
        where = re.search(r"(at )?row \d+(, column \d+)?|line \d+", text)
        place = f" ({where.group(0).removeprefix('at ')})" if where else ""
        if "number of columns changed" in text:
            reason = f"rows have unequal numbers of values{place}."
        else:
            reason = f"text where numbers belong{place}."
        raise DataFileError(path, reason) from None
    return _check_series(path, data, labels, n_rois), labels


def _read_header(path: Path) -> tuple[str, ...]:
    """Return the header labels of a ``.1D`` file; raise if it is missing or empty."""
    if not path.is_file():
        raise FileNotFoundError(f"ROI time-series file not found: {path}")
    if path.stat().st_size == 0:
        raise DataFileError(path, "the file is empty (0 bytes); expected a '#<label>' header "
                            "line and one row of numbers per volume.")
    with path.open(encoding="utf-8", errors="replace") as handle:
        first = handle.readline(_MAX_HEADER_CHARS + 1)
    if first.startswith("#") and len(first) > _MAX_HEADER_CHARS:
        raise DataFileError(path, f"the header line is longer than {_MAX_HEADER_CHARS:,} "
                            "characters; expected one '#<label>' per ROI column.")
    return tuple(tok.lstrip("#") for tok in first.split()) if first.startswith("#") else ()


def _check_series(
    path: Path, data: np.ndarray, labels: tuple[str, ...], n_rois: int | None
) -> np.ndarray:
    """Validate a parsed ``.1D`` array (shape, header agreement, finiteness)."""
    if data.size == 0:
        raise DataFileError(path, "no data rows after the header; expected one row per volume.")
    if data.ndim == 1:  # numpy's loadtxt squeezes a single row
        data = data[np.newaxis, :]
    n_volumes, n_columns = data.shape
    expected = n_rois if n_rois is not None else (len(labels) or None)
    if expected is not None and n_columns != expected:
        raise DataFileError(
            path, f"rows have {n_columns} values; expected {expected} (one per ROI)."
        )
    if labels and len(labels) != n_columns:
        raise DataFileError(
            path, f"the header names {len(labels)} ROIs but rows have {n_columns} values."
        )
    if n_volumes < MIN_VOLUMES:
        raise DataFileError(
            path, f"only {n_volumes} volume(s); at least {MIN_VOLUMES} are needed to estimate "
            "correlations."
        )
    finite = np.isfinite(data)
    if not finite.all():
        row, col = np.argwhere(~finite)[0]
        raise DataFileError(
            path, f"{int((~finite).sum())} NaN/Inf value(s) (first at volume {row + 1}, "
            f"ROI column {col}); expected finite numbers."
        )
    return data


def _fetch_with_nilearn(
    root: Path, site_ids: tuple[str, ...], file_ids: list[str], options: Mapping[str, object]
) -> list[np.ndarray]:
    """Read the given subjects' ROI files through nilearn's ``fetch_abide_pcp``."""
    from nilearn.datasets import fetch_abide_pcp

    derivative = str(options["derivative"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # numpy's "input contained no data"
        bunch = fetch_abide_pcp(
            data_dir=str(root),
            pipeline=str(options["pipeline"]),
            band_pass_filtering=bool(options["band_pass_filtering"]),
            global_signal_regression=bool(options["global_signal_regression"]),
            derivatives=[derivative],
            quality_checked=bool(options["quality_checked"]),
            verbose=0,
            SITE_ID=list(site_ids),
            FILE_ID=list(file_ids),
        )
    fetched = [str(f) for f in bunch["phenotypic"]["FILE_ID"]]
    if fetched != file_ids:
        raise RuntimeError(
            f"nilearn's fetch_abide_pcp selected other subjects than the checked files for "
            f"SITE_ID {', '.join(site_ids)}: expected {len(file_ids)}, got {len(fetched)}."
        )
    return [np.asarray(ts, dtype=np.float64) for ts in bunch[derivative]]


def _reference_labels(
    derivative: str, headers: Mapping[int, tuple[str, ...]], n_rois: int | None
) -> tuple[tuple[str, ...], str]:
    """Return the ROI labels every header must match, and where they come from.

    ``rois_ho`` takes them from the Harvard-Oxford atlas the package ships; another
    derivative takes the header most files share (of the expected length, when known),
    so that no single file, the first one included, decides for the others.
    """
    if derivative == "rois_ho":
        return tuple(str(label) for label in HO_LABELS), "the Harvard-Oxford atlas (rois_ho)"
    votes = Counter(h for h in headers.values()
                    if h and (n_rois is None or len(h) == n_rois))
    if not votes:
        return (), ""
    labels, count = votes.most_common(1)[0]
    return labels, f"the header {count} of the site's files share"


def _read_site_series(
    root: Path,
    selected: pd.DataFrame,
    site_ids: tuple[str, ...],
    options: Mapping[str, object],
) -> tuple[list[int], list[np.ndarray], tuple[str, ...], list[tuple[str, str]]]:
    """Return the usable rows, their series, the ROI labels and the skipped files."""
    n_rois = ROI_COUNTS.get(str(options["derivative"]))
    paths = [Path(p) for p in selected["path"]]
    file_ids = [str(f) for f in selected["FILE_ID"]]
    bad: dict[int, str] = {}
    headers: dict[int, tuple[str, ...]] = {}
    for i, path in enumerate(paths):
        try:
            headers[i] = _read_header(path)
        except DataFileError as exc:
            bad[i] = exc.reason
    labels, source = _reference_labels(str(options["derivative"]), headers, n_rois)
    for i, header in headers.items():
        # Refused before nilearn parses it: a forged header costs nothing to the others.
        if header and labels and header != labels:
            bad[i] = _header_mismatch(header, labels, source)
    candidates = [i for i in range(len(paths)) if i not in bad]
    series: list[np.ndarray] = []
    if candidates:
        try:
            # Fast path: nilearn parses every file once and the arrays are checked after.
            series = _fetch_with_nilearn(root, site_ids, [file_ids[i] for i in candidates],
                                         options)
        except ValueError:
            # A file nilearn cannot parse: find it (and any other) file by file.
            for i in candidates:
                try:
                    read_roi_time_series(paths[i], n_rois=n_rois)
                except DataFileError as exc:
                    bad[i] = exc.reason
            candidates = [i for i in candidates if i not in bad]
            series = (_fetch_with_nilearn(root, site_ids, [file_ids[i] for i in candidates],
                                          options) if candidates else [])
    good: list[int] = []
    checked: list[np.ndarray] = []
    for i, data in zip(candidates, series, strict=True):
        try:
            expected = n_rois or len(labels) or None
            checked_data = _check_series(paths[i], data, headers[i], expected)
        except DataFileError as exc:
            bad[i] = exc.reason
            continue
        checked.append(checked_data)
        good.append(i)
    _JUST_READ.clear()
    for i, data in zip(good, checked, strict=True):
        key = _file_key(paths[i])
        if key is not None:
            _JUST_READ[key] = (data, headers[i])
    skipped = [(str(paths[i]), bad[i]) for i in sorted(bad)]
    for file, reason in skipped:
        logger.warning("Skipping %s: %s", file, reason)
    return good, checked, labels, skipped


def _header_mismatch(header: tuple[str, ...], labels: tuple[str, ...], source: str) -> str:
    if len(header) != len(labels):
        return (f"the header names {len(header):,} ROIs; expected the {len(labels)} of "
                f"{source}.")
    first = next(k for k, (a, b) in enumerate(zip(header, labels, strict=True)) if a != b)
    return (f"its header names other ROIs (or another order) than {source}: column {first} "
            f"is {header[first][:40]!r}, expected {labels[first]!r}.")
