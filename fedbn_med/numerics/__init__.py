"""One floating-point code path on every x86 machine, so one command gives one set of numbers.

torch, MKL, numpy, OpenBLAS and oneDNN each pick their kernels by the CPU they find: on
a machine with AVX-512 they sum and multiply in wider vectors, in another order, than on
one with AVX2 only, and MKL picks by the CPU's vendor as well. A training run of a
hundred rounds on a few hundred subjects turns such last-bit differences into another
selected round and other test scores, and numpy's and OpenBLAS's choice changes the bytes
of the built-in cohort itself (both measured by ``benchmarks/research/numerics.py``). :func:`pin`
therefore fixes each library's path when the CPU has AVX2 and FMA, before any of them
loads. Importing :mod:`fedbn_med` does not call it (a library must not change a
researcher's process): the command line, the pipelines, the benchmarks and the tests opt
in by importing :mod:`fedbn_med.numerics.pinned` before numpy loads (or by calling
:func:`pin`):

- ``ATEN_CPU_CAPABILITY=avx2``: torch's vectorised kernels (read at their first use);
- ``MKL_CBWR=COMPATIBLE``: MKL, torch's matrix products (read at its first call). MKL's
  ``AVX2`` branch gives the same results only across Intel CPUs (on others MKL takes its
  own branch); ``COMPATIBLE`` (SSE2), the other branch tried, gave the same numbers on
  an AMD AVX2 machine and on an Intel AVX-512 one;
- ``NPY_DISABLE_CPU_FEATURES=X86_V4 AVX512_ICL AVX512_SPR``: numpy's loops (read when
  numpy is imported);
- ``OPENBLAS_CORETYPE=Haswell``: numpy's and scipy's OpenBLAS (read when it loads);
- ``ONEDNN_MAX_CPU_ISA=AVX2``: oneDNN, torch's convolutions (the imaging tasks; read at
  its first call).

A variable the user has set already is left as it is. ``FEDBN_MED_NUMERICS=native`` turns
the pin off (each library's fastest path, numbers tied to the machine). Outside x86 with
AVX2 nothing is set: an arm64 machine computes with other libraries and gives other
numbers. The threads a site computes with are fixed by its spec (``RunSpec.threads``).
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import MutableMapping

#: The pinned code path's variables and values.
PINNED: dict[str, str] = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "COMPATIBLE",
    "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR",
    "OPENBLAS_CORETYPE": "Haswell",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
}

#: Set to ``native`` to keep each library's own choice of kernels.
SWITCH = "FEDBN_MED_NUMERICS"
#: Libraries that read their variable when they load, and had loaded when this process
#: was pinned (their own choice stands).
_LOADED_BEFORE: list[str] = []


def cpu_info(path: str = "/proc/cpuinfo") -> dict[str, str]:
    """Return the first processor's fields as Linux lists them (empty elsewhere)."""
    info: dict[str, str] = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if not line.strip():
                    if info:
                        break  # every processor's block lists the same features
                    continue
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return info


def cpu_flags(path: str = "/proc/cpuinfo") -> frozenset[str]:
    """Return the CPU's feature flags (x86 ``flags``, Arm ``Features``; empty elsewhere)."""
    info = cpu_info(path)
    return frozenset((info.get("flags") or info.get("Features") or "").split())


def pinnable(flags: frozenset[str] | None = None, machine: str | None = None) -> bool:
    """Whether this machine can run the pinned path: x86-64 with AVX2 and FMA."""
    machine = (machine or platform.machine()).lower()
    flags = cpu_flags() if flags is None else flags
    return machine in ("x86_64", "amd64") and {"avx2", "fma"} <= flags


def pin(environ: MutableMapping[str, str] | None = None,
        flags: frozenset[str] | None = None, machine: str | None = None) -> dict[str, str]:
    """Fix torch's, MKL's, numpy's, OpenBLAS's and oneDNN's code path; return what was set.

    Leaves every variable already in ``environ`` alone, and sets nothing when
    ``FEDBN_MED_NUMERICS`` is ``native`` or the machine lacks AVX2 (see :func:`pinnable`).
    Raises ``ValueError`` for any other value of ``FEDBN_MED_NUMERICS``.
    """
    own = environ is None
    if environ is None:
        environ = os.environ
    mode = environ.get(SWITCH, "pinned").strip().lower()
    if mode not in ("pinned", "native"):
        raise ValueError(f"{SWITCH}={environ[SWITCH]!r}: expected 'pinned' (the default) "
                         f"or 'native'")
    missing = {name: value for name, value in PINNED.items() if name not in environ}
    # a process that inherited every variable (a site a launcher started) reads no CPU info
    if mode == "native" or not missing or not pinnable(flags, machine):
        return {}
    environ.update(missing)
    if own and {"NPY_DISABLE_CPU_FEATURES", "OPENBLAS_CORETYPE"} & set(missing):
        # set too late for a library already loaded (a process that inherited the
        # variables had them from its start)
        _LOADED_BEFORE[:] = [name for name in ("numpy", "scipy") if name in sys.modules]
    return missing


def describe() -> dict[str, object]:
    """Return the code path in effect now, for a result's record.

    ``mode`` is ``pinned`` only when every library runs the pinned path: torch reports
    AVX2, numpy's AVX-512 loops are off, the other variables hold their pinned values,
    and neither numpy nor scipy had
    loaded before :func:`pin` ran (``loaded_before_pin``: a script that imports numpy
    before :mod:`fedbn_med` keeps numpy's and OpenBLAS's own choice). ``numpy_x86_v4``
    says whether numpy's AVX-512 loops are in use.
    """
    import torch

    try:
        from numpy._core._multiarray_umath import __cpu_features__ as features
    except ImportError:  # pragma: no cover - numpy < 2
        features = {}
    capability = torch.backends.cpu.get_cpu_capability()
    variables = {name: os.environ.get(name, "") for name in PINNED}
    pinned = (capability == "AVX2" and not features.get("X86_V4", False)
              and all(variables[name] == PINNED[name] for name in PINNED
                      if name != "ATEN_CPU_CAPABILITY")
              and not _LOADED_BEFORE)
    return {"mode": "pinned" if pinned else "native", "torch_capability": capability,
            "numpy_x86_v4": bool(features.get("X86_V4", False)),
            "loaded_before_pin": list(_LOADED_BEFORE), **variables}
