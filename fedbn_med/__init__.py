"""fedbn_med: FedBN federated learning for medical sites whose scanners differ."""

from __future__ import annotations

from fedbn_med import numerics as _numerics

# Before torch, MKL, numpy, OpenBLAS or oneDNN choose their kernels: one code path on every x86
# machine with AVX2, so that one command gives one set of numbers (see fedbn_med.numerics).
_numerics.pin()

__version__ = "0.1.0"
