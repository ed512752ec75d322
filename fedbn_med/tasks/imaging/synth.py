"""Built-in imaging sites, generated offline from the MNI152 anatomy that nilearn ships.

Every subject is the MNI152 T1 template and its grey/white-matter maps, deformed by a
random MONAI affine and elastic warp (the subject's anatomy). A site is a fixed scanner
model applied to its subjects: bias field, gamma contrast, Gibbs ringing, noise level,
slice thickness and intensity scale for MRI; exposure, detector gamma, noise, blur and
windowing for X-ray. Labels come from the warped tissue maps (MRI) or from whether a
bright nodule was placed in the head before projecting it (X-ray), so a label means the
same thing at every site while the intensities do not (feature shift, as in FedBN).

Sites are written in the formats hospitals hand over (NIfTI, uncompressed NIfTI, DICOM
series, DICOM radiographs, PNG) with a MONAI-style JSON datalist, on first use, under
``<data_dir>/imaging/<task>/<variant>/<site>/``; generation is seeded and deterministic.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

import numpy as np
from monai.transforms import (
    AdjustContrast,
    Compose,
    GaussianSmooth,
    GibbsNoise,
    Rand3DElasticd,
    RandAffined,
    RandBiasField,
    Resize,
)

from fedbn_med.paths import resolve_data_dir
from fedbn_med.tasks.imaging import dicom_io
from fedbn_med.training.trainer import derive_seed

__all__ = [
    "MRI_SCANNERS",
    "TISSUE_CLASSES",
    "XRAY_DETECTORS",
    "MriScanner",
    "XrayDetector",
    "ensure_mri_site",
    "ensure_xray_site",
    "mni_anatomy",
]

logger = logging.getLogger(__name__)

TISSUE_CLASSES = ("background", "csf", "gm", "wm")
_GENERATOR_VERSION = 1
_SPLITS = (("training", 0.6), ("validation", 0.2), ("test", 0.2))


@dataclass(frozen=True)
class MriScanner:
    """A site's MRI acquisition, fixed for all its subjects.

    Attributes
    ----------
    gamma : float
        Contrast curve applied to the [0, 1] image (``monai.transforms.AdjustContrast``).
    bias : float
        Magnitude of the smooth multiplicative bias field (``RandBiasField`` coefficients).
    noise : float
        Rician noise standard deviation, relative to the [0, 1] image.
    gibbs : float
        Gibbs ringing strength (k-space truncation, ``GibbsNoise`` alpha; 0 disables it).
    slice_factor : float
        Slice thickness relative to the in-plane resolution (through-plane blur).
    scale : float
        Scanner units of the stored intensities.
    fmt : {"nii.gz", "nii", "dicom"}
        How the site stores its images (labels are always NIfTI).
    """

    gamma: float
    bias: float
    noise: float
    gibbs: float
    slice_factor: float
    scale: float
    fmt: Literal["nii.gz", "nii", "dicom"]


@dataclass(frozen=True)
class XrayDetector:
    """A hospital's radiography chain, fixed for all its images.

    Attributes
    ----------
    exposure : float
        Attenuation scale: higher means a darker, more saturated projection.
    gamma : float
        Detector response curve applied after exposure.
    noise : float
        Quantum noise standard deviation, relative to the [0, 1] image.
    blur : float
        Detector point-spread sigma in pixels.
    window : tuple of float
        Percentiles kept by the windowing before storage.
    fmt : {"dicom", "png", "nii.gz"}
        How the hospital stores its radiographs.
    """

    exposure: float
    gamma: float
    noise: float
    blur: float
    window: tuple[float, float]
    fmt: Literal["dicom", "png", "nii.gz"]


MRI_SCANNERS: dict[str, MriScanner] = {
    "SiteA": MriScanner(gamma=1.0, bias=0.10, noise=0.02, gibbs=0.0, slice_factor=1.0,
                        scale=1000.0, fmt="nii.gz"),
    "SiteB": MriScanner(gamma=1.8, bias=0.35, noise=0.01, gibbs=0.4, slice_factor=1.0,
                        scale=3000.0, fmt="nii"),
    "SiteC": MriScanner(gamma=0.45, bias=0.20, noise=0.06, gibbs=0.0, slice_factor=2.5,
                        scale=500.0, fmt="dicom"),
}

XRAY_DETECTORS: dict[str, XrayDetector] = {
    "HospitalA": XrayDetector(exposure=1.0, gamma=1.0, noise=0.02, blur=0.0,
                              window=(0.5, 99.5), fmt="dicom"),
    "HospitalB": XrayDetector(exposure=1.8, gamma=0.6, noise=0.05, blur=0.8,
                              window=(2.0, 98.0), fmt="png"),
    "HospitalC": XrayDetector(exposure=0.5, gamma=1.7, noise=0.01, blur=0.4,
                              window=(0.0, 100.0), fmt="nii.gz"),
}


def _unknown(kind: str, name: str, valid: Sequence[str]) -> ValueError:
    return ValueError(f"Unknown built-in {kind} site '{name}'. Valid sites: "
                      f"{', '.join(valid)} (or give the site a datalist in its config).")


@lru_cache(maxsize=1)
def _mni_maps() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from nilearn import datasets  # nilearn's package data: no download

    return (datasets.load_mni152_template(resolution=2).get_fdata(dtype=np.float32),
            datasets.load_mni152_gm_template(resolution=2).get_fdata(dtype=np.float32),
            datasets.load_mni152_wm_template(resolution=2).get_fdata(dtype=np.float32),
            datasets.load_mni152_brain_mask(resolution=2).get_fdata(dtype=np.float32) > 0.5)


@lru_cache(maxsize=4)
def mni_anatomy(size: int) -> tuple[np.ndarray, np.ndarray]:
    """Return the MNI152 T1 in [0, 1] and its tissue labels, cropped to the head and resized.

    Parameters
    ----------
    size : int
        Edge of the cubic output grid (voxels).

    Returns
    -------
    (t1, labels)
        Arrays of shape ``(size, size, size)``: float32 intensities and uint8 labels
        0 background, 1 CSF, 2 grey matter, 3 white matter (:data:`TISSUE_CLASSES`).
    """
    t1, gm, wm, mask = _mni_maps()
    csf = np.clip(1.0 - gm - wm, 0.0, 1.0)
    labels = (np.argmax(np.stack([csf, gm, wm]), axis=0) + 1) * mask
    head = np.argwhere((t1 > 0.05) | mask)
    lo, hi = head.min(0), head.max(0) + 1
    box = tuple(slice(a, b) for a, b in zip(lo, hi))
    t1 = t1[box] / max(float(t1.max()), 1e-6)
    grid = (size, size, size)
    t1_small = Resize(grid, mode="trilinear")(t1[None])[0]
    lab_small = Resize(grid, mode="nearest")(labels[box][None].astype(np.float32))[0]
    return (np.asarray(t1_small, dtype=np.float32), np.asarray(lab_small, dtype=np.uint8))


def _subject(size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Return one subject: the MNI anatomy under a seeded affine and elastic warp."""
    t1, labels = mni_anatomy(size)
    warp = Compose([
        RandAffined(("image", "label"), prob=1.0, rotate_range=(0.12, 0.12, 0.12),
                    scale_range=(0.08, 0.08, 0.08), translate_range=(0.03 * size,) * 3,
                    mode=("bilinear", "nearest"), padding_mode="zeros"),
        Rand3DElasticd(("image", "label"), sigma_range=(size / 10, size / 7),
                       magnitude_range=(size / 2, size), prob=1.0,
                       mode=("bilinear", "nearest"), padding_mode="zeros"),
    ])
    warp.set_random_state(seed=seed)
    out = warp({"image": t1[None], "label": labels[None].astype(np.float32)})
    return (np.asarray(out["image"][0], dtype=np.float32),
            np.asarray(out["label"][0]).round().astype(np.uint8))


def _acquire_mri(t1: np.ndarray, scanner: MriScanner, seed: int) -> np.ndarray:
    """Return what the site's scanner records of a [0, 1] image (float32, scanner units)."""
    rng = np.random.default_rng(seed)
    img = t1[None]
    if scanner.slice_factor > 1.0:
        thick = (img.shape[1], img.shape[2], max(2, round(img.shape[3] / scanner.slice_factor)))
        img = Resize(img.shape[1:], mode="trilinear")(Resize(thick, mode="area")(img))
    bias = RandBiasField(degree=3, coeff_range=(scanner.bias, scanner.bias), prob=1.0)
    bias.set_random_state(seed=seed)
    img = bias(img)
    img = AdjustContrast(scanner.gamma)(img)
    if scanner.gibbs > 0:
        img = GibbsNoise(scanner.gibbs)(img)
    img = np.asarray(img, dtype=np.float32)
    # Rician noise: magnitude of a complex signal with Gaussian noise on both channels.
    real = img + rng.normal(0.0, scanner.noise, img.shape)
    imag = rng.normal(0.0, scanner.noise, img.shape)
    img = np.sqrt(real**2 + imag**2)
    return (img[0] * scanner.scale).astype(np.float32)


def _split_names(n: int, seed: int) -> list[str]:
    """Return the split of each of ``n`` subjects (seeded, about 60/20/20, each non-empty)."""
    order = np.random.default_rng(seed).permutation(n)
    n_val = max(1, round(n * _SPLITS[1][1]))
    n_test = max(1, round(n * _SPLITS[2][1]))
    names = ["training"] * n
    for rank, idx in enumerate(order):
        if rank < n_val:
            names[idx] = "validation"
        elif rank < n_val + n_test:
            names[idx] = "test"
    return names


def _save_nifti(path: Path, array: np.ndarray, spacing: Sequence[float]) -> None:
    import nibabel as nib

    zooms = [*map(float, spacing), 1.0, 1.0][:3]
    affine = np.diag([*zooms, 1.0])
    nib.save(nib.Nifti1Image(array, affine), str(path))


def _variant(task: str, size: int, subjects: int, seed: int, model: object) -> str:
    # The site model's hash in the folder name: changing a scanner never reuses old files.
    digest = zlib.crc32(f"{_GENERATOR_VERSION}:{model!r}".encode()) & 0xFFFFFFFF
    return f"{task}_s{size}_n{subjects}_seed{seed}_{digest:08x}"


def _finish_site(tmp: Path, final: Path, datalist: dict[str, list[dict[str, object]]]) -> Path:
    (tmp / "datalist.json").write_text(json.dumps(datalist, indent=1), encoding="utf-8")
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(tmp, final)  # atomic: a half-written site is never seen
    except OSError:  # another process finished the same site first
        shutil.rmtree(tmp, ignore_errors=True)
    return final / "datalist.json"


def _check_sizes(size: int, subjects: int) -> None:
    if not isinstance(size, int) or size < 16 or size % 8:
        raise ValueError(f"image size must be a multiple of 8 and at least 16, got {size!r}.")
    if not isinstance(subjects, int) or subjects < 6:
        raise ValueError(f"subjects must be an integer of at least 6 (so that each split has "
                         f"two or more), got {subjects!r}.")


def ensure_mri_site(site: str, *, size: int = 64, subjects: int = 24, seed: int = 0,
                    data_dir: str | Path | None = None) -> Path:
    """Generate a built-in MRI site on first use and return its datalist path.

    Parameters
    ----------
    site : str
        One of :data:`MRI_SCANNERS`.
    size : int
        Edge of each cubic volume in voxels (a multiple of 8; 16 or 24 for tests).
    subjects : int
        Subjects at the site, split about 60/20/20 into training, validation and test.
    seed : int
        Base seed of the anatomy warps and the scanner noise.
    data_dir : path, optional
        Data root (else ``$FEDBN_MED_DATA``, else ``~/fedbn_med_data``).
    """
    if site not in MRI_SCANNERS:
        raise _unknown("MRI", site, sorted(MRI_SCANNERS))
    _check_sizes(size, subjects)
    variant = _variant("mri", size, subjects, seed, MRI_SCANNERS[site])
    final = resolve_data_dir(data_dir) / "imaging" / variant / site
    if (final / "datalist.json").is_file():
        return final / "datalist.json"
    scanner = MRI_SCANNERS[site]
    logger.info("Generating built-in MRI site %s (%d subjects, %d^3) in %s", site, subjects,
                size, final)
    tmp = final.parent / f".{site}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    spacing = (1.0, 1.0, scanner.slice_factor)
    datalist: dict[str, list[dict[str, object]]] = {name: [] for name, _ in _SPLITS}
    for i, split in enumerate(_split_names(subjects, derive_seed(seed, site, "split"))):
        t1, labels = _subject(size, derive_seed(seed, "anatomy", site, i))
        image = _acquire_mri(t1, scanner, derive_seed(seed, "scanner", site, i))
        sid = f"{site}-{i:03d}"
        _save_nifti(tmp / f"{sid}_seg.nii.gz", labels, (1.0, 1.0, 1.0))
        if scanner.fmt == "dicom":
            dicom_io.write_series(tmp / sid, image, spacing=spacing, patient_id=sid,
                                  uid_seed=f"{seed}:{site}:{i}")
            image_ref = sid
        else:
            image_ref = f"{sid}_t1.{scanner.fmt}"
            _save_nifti(tmp / image_ref, image, (1.0, 1.0, 1.0))
        datalist[split].append({"image": image_ref, "label": f"{sid}_seg.nii.gz",
                                "subject": sid})
    return _finish_site(tmp, final, datalist)


def _radiograph(size: int, seed: int, nodule: bool) -> np.ndarray:
    """Return a [0, 1] line-integral projection of one subject's head, with or without nodule."""
    t1, labels = _subject(size, seed)
    density = t1 + 0.3 * (labels > 0)
    if nodule:
        rng = np.random.default_rng(seed + 1)
        inside = np.argwhere(labels >= 2)
        centre = inside[rng.integers(len(inside))]
        radius = size * rng.uniform(0.05, 0.08)
        grid = np.stack(np.meshgrid(*[np.arange(size)] * 3, indexing="ij"), axis=-1)
        dist2 = np.sum((grid - centre) ** 2, axis=-1)
        density = density + 3.0 * np.exp(-dist2 / (2 * radius**2))
    proj = density.sum(axis=1)  # anterior-posterior projection
    return (proj / (0.6 * size)).astype(np.float32)


def _acquire_xray(proj: np.ndarray, det: XrayDetector, seed: int) -> np.ndarray:
    """Return a hospital's [0, 1] radiograph of a projection (bright means attenuating)."""
    rng = np.random.default_rng(seed)
    img = 1.0 - np.exp(-det.exposure * proj)
    img = np.clip(img, 0.0, 1.0) ** det.gamma
    if det.blur > 0:
        img = np.asarray(GaussianSmooth(det.blur)(img[None]))[0]
    img = img + rng.normal(0.0, det.noise, img.shape)
    lo, hi = np.percentile(img, det.window)
    return np.clip((img - lo) / max(hi - lo, 1e-6), 0.0, 1.0).astype(np.float32)


def _save_png(path: Path, img: np.ndarray) -> None:
    from PIL import Image

    Image.fromarray((img * 255).round().astype(np.uint8)).save(path)


def ensure_xray_site(site: str, *, size: int = 64, subjects: int = 60, seed: int = 0,
                     data_dir: str | Path | None = None) -> Path:
    """Generate a built-in X-ray site on first use and return its datalist path.

    Half of the radiographs (alternating, then shuffled by the split) show a nodule
    (label 1). Parameters are those of :func:`ensure_mri_site`; ``size`` is the
    radiograph's edge in pixels and ``site`` one of :data:`XRAY_DETECTORS`.
    """
    if site not in XRAY_DETECTORS:
        raise _unknown("X-ray", site, sorted(XRAY_DETECTORS))
    _check_sizes(size, subjects)
    variant = _variant("xray", size, subjects, seed, XRAY_DETECTORS[site])
    final = resolve_data_dir(data_dir) / "imaging" / variant / site
    if (final / "datalist.json").is_file():
        return final / "datalist.json"
    det = XRAY_DETECTORS[site]
    logger.info("Generating built-in X-ray site %s (%d images, %d^2) in %s", site, subjects,
                size, final)
    tmp = final.parent / f".{site}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    datalist: dict[str, list[dict[str, object]]] = {name: [] for name, _ in _SPLITS}
    for i, split in enumerate(_split_names(subjects, derive_seed(seed, site, "split"))):
        label = i % 2
        proj = _radiograph(size, derive_seed(seed, "xray-anatomy", site, i), bool(label))
        img = _acquire_xray(proj, det, derive_seed(seed, "detector", site, i))
        sid = f"{site}-{i:03d}"
        name = f"{sid}.{'dcm' if det.fmt == 'dicom' else det.fmt}"
        if det.fmt == "dicom":
            dicom_io.write_radiograph(tmp / name, img, patient_id=sid,
                                      uid_seed=f"{seed}:{site}:{i}")
        elif det.fmt == "png":
            _save_png(tmp / name, img)
        else:
            _save_nifti(tmp / name, img, (1.0, 1.0))
        datalist[split].append({"image": name, "label": label, "subject": sid})
    return _finish_site(tmp, final, datalist)

