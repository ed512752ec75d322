"""MONAI transforms from a 4D BOLD image to PCP-style ROI time series.

The chain (:func:`scan_transforms`) works on a dictionary with the image path under
``"image"``, the confounds array (or None) under ``"confounds"`` and the TR in seconds
(or None) under ``"tr"``:

1. :class:`monai.transforms.LoadImaged` reads the 4D NIfTI as a ``MetaTensor``;
2. :class:`CheckBoldd` takes the TR (sidecar, header, else ``--tr``) and refuses what
   cannot give a connectivity estimate (3D, too few volumes, NaN, not MNI, a grid that
   does not cover the atlas, too few confound rows);
3. :class:`ResampleToAtlasd` resamples an image in another grid to the atlas's grid;
4. :class:`ExtractRoiSignalsd` wraps nilearn's ``NiftiLabelsMasker``: ROI means over
   the Harvard-Oxford labels, cleaned as the ``filt_noglobal`` outputs were
   (:class:`Cleaning`).

A refusal raises :class:`~fedbn_med.tasks.abide.data.DataFileError` naming the file.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import nibabel as nib
import numpy as np
from monai.config import KeysCollection
from monai.transforms import Compose, LoadImaged, MapTransform

from fedbn_med.tasks.abide.data.roi_files import MIN_VOLUMES, DataFileError

__all__ = [
    "MIN_ATLAS_COVERAGE",
    "CheckBoldd",
    "Cleaning",
    "ExtractRoiSignalsd",
    "ResampleToAtlasd",
    "min_volumes",
    "scan_transforms",
]

#: Share of the atlas's labelled voxels an image's field of view must cover.
MIN_ATLAS_COVERAGE = 0.9
_NOT_MNI_CODES = {1: "scanner", 3: "talairach"}


@dataclass(frozen=True)
class Cleaning:
    """Which cleaning steps run, as in the ``filt_noglobal`` outputs (no global signal).

    Attributes
    ----------
    confounds : bool
        Regress out the six motion parameters, and white matter and CSF when the
        confounds file gives them.
    detrend : bool
        Remove a linear trend (and the mean).
    band_pass : tuple of float or None
        High-pass and low-pass cut-offs in Hz, applied at the image's TR; None: none.
    """

    confounds: bool = True
    detrend: bool = True
    band_pass: tuple[float, float] | None = (0.01, 0.1)

    def __post_init__(self) -> None:
        if self.band_pass is not None:
            low, high = self.band_pass
            if not 0 < low < high:
                raise ValueError(f"band_pass must be (high_pass, low_pass) with "
                                 f"0 < high_pass < low_pass, got {self.band_pass!r}.")

    @classmethod
    def off(cls) -> Cleaning:
        """Return no cleaning at all: plain ROI means (``--no-clean``)."""
        return cls(confounds=False, detrend=False, band_pass=None)

    def describe(self) -> str:
        """Return the steps in words, for logs and the manifest."""
        steps = (["motion (+WM/CSF) regression"] if self.confounds else []) + (
            ["linear detrending"] if self.detrend else []) + (
            [f"band-pass {self.band_pass[0]:g}-{self.band_pass[1]:g} Hz"]
            if self.band_pass else [])
        return ", ".join(steps) if steps else "none (plain ROI means)"


def min_volumes(cleaning: Cleaning, tr: float, n_regressors: int) -> int:
    """Return the fewest volumes that still give a connectivity estimate.

    ``MIN_VOLUMES`` (10, as for ``.1D`` files) always; with nuisance regression, 10 more
    than the regressors (each one uses up a degree of freedom); with band-pass
    filtering, one period of the high-pass cut-off (100 s at 0.01 Hz), below which the
    filter leaves almost nothing of the band to correlate.
    """
    bound = MIN_VOLUMES
    if cleaning.confounds:
        bound = max(bound, n_regressors + MIN_VOLUMES)
    if cleaning.band_pass is not None:
        bound = max(bound, math.ceil(1.0 / cleaning.band_pass[0] / tr))
    return bound


def _source(data: Mapping[Hashable, Any], key: Hashable) -> str:
    return str(data.get("source") or data[key].meta.get("filename_or_obj", "image"))


class CheckBoldd(MapTransform):
    """Find the TR and refuse an image that cannot give a connectivity estimate.

    Parameters
    ----------
    keys : str or sequence of str
        The image key(s).
    atlas : nibabel.Nifti1Image
        The label image whose labelled voxels the field of view must cover.
    cleaning : Cleaning
        Sets the volume bound (:func:`min_volumes`).
    confounds_key, tr_key : str
        Keys of the confounds array (or None) and of the TR from the sidecar or the
        NIfTI header (:func:`.inputs.image_tr`; None when neither gives one).
    default_tr : float or None
        The TR when neither the dictionary nor the header gives one (``--tr``).
    """

    def __init__(self, keys: KeysCollection, atlas: nib.Nifti1Image, cleaning: Cleaning,
                 confounds_key: str = "confounds", tr_key: str = "tr",
                 default_tr: float | None = None) -> None:
        super().__init__(keys)
        self.cleaning = cleaning
        self.default_tr = default_tr
        self.confounds_key = confounds_key
        self.tr_key = tr_key
        labelled = np.argwhere(np.asarray(atlas.dataobj) > 0)
        self._atlas_mm = nib.affines.apply_affine(atlas.affine, labelled)

    def __call__(self, data: Mapping[Hashable, Any]) -> dict[Hashable, Any]:  # noqa: D102
        d = dict(data)
        for key in self.key_iterator(d):
            self._check(d, key)
        return d

    def _check(self, d: dict[Hashable, Any], key: Hashable) -> None:
        image, path = d[key], _source(d, key)
        if image.ndim != 4 or image.shape[-1] < 2:
            raise DataFileError(path, f"a {image.ndim}D image of shape {tuple(image.shape)}; "
                                "expected a 4D BOLD series (x, y, z, volumes).")
        tr = d.get(self.tr_key) or self.default_tr
        if tr is None:
            raise DataFileError(path, "no TR anywhere: no RepetitionTime in a JSON sidecar, "
                                "pixdim[4] of the header is 0, and no --tr was given.")
        d[self.tr_key] = float(tr)
        confounds = d.get(self.confounds_key)
        n_regressors = 0 if confounds is None else confounds.shape[1]
        needed = min_volumes(self.cleaning, tr, n_regressors)
        n_volumes = int(image.shape[-1])
        if n_volumes < needed:
            raise DataFileError(path, f"only {n_volumes} volumes; at least {needed} are needed "
                                f"for a connectivity estimate at TR {tr:g} s with cleaning "
                                f"'{self.cleaning.describe()}'.")
        bad = ~np.isfinite(np.asarray(image))
        if bad.any():
            raise DataFileError(path, f"{int(bad.sum())} NaN/Inf voxel value(s); expected "
                                "finite intensities (mask them to 0 before extraction).")
        for name in ("sform_code", "qform_code"):
            code = int(np.asarray(image.meta.get(name, 0)).ravel()[0])
            if code in _NOT_MNI_CODES:
                raise DataFileError(path, f"the header's {name} says {_NOT_MNI_CODES[code]} "
                                    "space; expected an image in MNI space.")
            if code:
                break
        self._check_grid(path, np.asarray(image.affine, dtype=float), image.shape[:3])

    def _check_grid(self, path: str, affine: np.ndarray, shape: Sequence[int]) -> None:
        if affine.shape != (4, 4) or not np.isfinite(affine).all() or abs(
                np.linalg.det(affine[:3, :3])) < 1e-6:
            raise DataFileError(path, "its affine is singular or not finite; it cannot be "
                                f"resampled to the atlas:\n{affine}")
        voxels = nib.affines.apply_affine(np.linalg.inv(affine), self._atlas_mm)
        inside = ((voxels > -0.5) & (voxels < np.asarray(shape) - 0.5)).all(axis=1).mean()
        if inside < MIN_ATLAS_COVERAGE:
            raise DataFileError(path, f"its grid covers {inside:.0%} of the atlas's labelled "
                                f"voxels; expected at least {MIN_ATLAS_COVERAGE:.0%} (an MNI "
                                "image of the whole brain).")


def _to_nifti(image: Any) -> nib.Nifti1Image:
    array = image.detach().cpu().numpy() if hasattr(image, "detach") else np.asarray(image)
    return nib.Nifti1Image(array, np.asarray(image.affine, dtype=float))


class ResampleToAtlasd(MapTransform):
    """Resample an image in another grid to the atlas's grid (nilearn, continuous)."""

    def __init__(self, keys: KeysCollection, atlas: nib.Nifti1Image) -> None:
        super().__init__(keys)
        self.atlas = atlas

    def __call__(self, data: Mapping[Hashable, Any]) -> dict[Hashable, Any]:  # noqa: D102
        from nilearn.image import resample_img

        d = dict(data)
        for key in self.key_iterator(d):
            image = _to_nifti(d[key])
            same = image.shape[:3] == self.atlas.shape and np.allclose(
                image.affine, self.atlas.affine, atol=1e-4)
            d[key] = image if same else resample_img(
                image, target_affine=self.atlas.affine, target_shape=self.atlas.shape,
                interpolation="continuous", force_resample=True, copy_header=True)
        return d


class ExtractRoiSignalsd(MapTransform):
    """Replace a 4D image by its ROI time series, through nilearn's ``NiftiLabelsMasker``.

    Parameters
    ----------
    keys : str or sequence of str
        The image key(s); each becomes a ``float64`` array ``(volumes, n_labels)`` with
        one column per atlas label in ascending label order (the ``rois_ho`` order).
    atlas : nibabel.Nifti1Image
        The label image.
    cleaning : Cleaning
        Nuisance regression, detrending and band-pass; ``Cleaning.off()`` gives plain
        ROI means. Never global signal regression.
    confounds_key, tr_key : str
        Keys of the confounds array (or None) and of the TR.
    """

    def __init__(self, keys: KeysCollection, atlas: nib.Nifti1Image, cleaning: Cleaning,
                 confounds_key: str = "confounds", tr_key: str = "tr") -> None:
        super().__init__(keys)
        self.atlas = atlas
        self.cleaning = cleaning
        self.confounds_key = confounds_key
        self.tr_key = tr_key
        self.n_labels = len(np.unique(np.asarray(atlas.dataobj))) - 1

        self._masker: Any = None

    def _fitted_masker(self) -> Any:
        """Return the masker, fitted once: fitting (label table, checks) costs seconds."""
        if self._masker is None:
            from nilearn.maskers import NiftiLabelsMasker

            band = self.cleaning.band_pass
            self._masker = NiftiLabelsMasker(
                labels_img=self.atlas, resampling_target="labels", strategy="mean",
                standardize=False, detrend=self.cleaning.detrend,
                high_pass=band[0] if band else None, low_pass=band[1] if band else None,
                reports=False).fit()
        return self._masker

    def __call__(self, data: Mapping[Hashable, Any]) -> dict[Hashable, Any]:  # noqa: D102
        d = dict(data)
        masker = self._fitted_masker()
        if self.cleaning.band_pass:
            masker.set_params(t_r=d.get(self.tr_key))
        confounds = d.get(self.confounds_key) if self.cleaning.confounds else None
        for key in self.key_iterator(d):
            image = d[key] if isinstance(d[key], nib.Nifti1Image) else _to_nifti(d[key])
            signals = masker.transform(image, confounds=confounds)
            if signals.shape[1] != self.n_labels:
                raise DataFileError(_source(d, key), f"gave {signals.shape[1]} ROI series; "
                                    f"expected {self.n_labels} (one per atlas label).")
            d[key] = np.asarray(signals, dtype=np.float64)
        return d


def scan_transforms(atlas: nib.Nifti1Image, cleaning: Cleaning, key: str = "image",
                    default_tr: float | None = None) -> Compose:
    """Return the chain from an image path to its ROI time series (see the module)."""
    return Compose([
        LoadImaged(keys=key, image_only=True, dtype=np.float32),
        CheckBoldd(key, atlas, cleaning, default_tr=default_tr),
        ResampleToAtlasd(key, atlas),
        ExtractRoiSignalsd(key, atlas, cleaning),
    ])
