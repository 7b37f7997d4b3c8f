"""Regimes of keys where the model's terms have measured reason behind them, kept light (no
torch, no Triton: the runtime asks on a table miss before loading the kernels).

`few_outputs` is where cuBLAS leaves its fast kernels: a GEMM of a handful of outputs is a
reduction along K, which cuBLAS's kernels for it walk in few programs (kernels/cublas_cost.py
charges that). Along a long K (`few_outputs_long_k`) the `kreduce` variant's term is checked
against measured times and cuBLAS's there: the runtime's fallback may answer a key no tuning
measured with the model's best config of a variant here (TRUSTED_REGIMES), where the model
predicts it faster than cuBLAS (benchmarks/results/fallback/README.md, "Tiny outputs").

Per variant name rather than on the Variant, so that a change here leaves the kernels' source
hash, and with it every tuned result, as it is.
"""
from __future__ import annotations

from collections.abc import Callable

# The most outputs (M·N) of a "few outputs" GEMM: the largest measured slow under cuBLAS
# (4×4); 8×16 already runs on its fast kernels. A side of 1 is a GEMV, which cuBLAS serves
# with kernels of its own that split K.
FEW_OUTPUTS = 16
# The shortest K at which a variant's term is trusted against cuBLAS on few outputs: below,
# both take a few µs of launch and latency, which the model cannot tell apart.
LONG_K = 2**15


def few_outputs(M: int, N: int) -> bool:
    """Whether an M×N output is a few outputs (FEW_OUTPUTS at most, neither side 1)."""
    return M > 1 and N > 1 and M * N <= FEW_OUTPUTS


def few_outputs_long_k(M: int, N: int, K: int) -> bool:
    """few_outputs along a K of LONG_K or more."""
    return few_outputs(M, N) and K >= LONG_K


# Per variant, where its term may answer keys no tuning measured (see the module docstring).
TRUSTED_REGIMES: dict[str, Callable[[int, int, int], bool]] = {"kreduce": few_outputs_long_k}


def trusted_variants(M: int, N: int, K: int, excluded: frozenset[str] = frozenset()
                     ) -> tuple[str, ...]:
    """The variants, less the excluded ones, whose term is trusted for an M×N×K GEMM."""
    return tuple(name for name, regime in TRUSTED_REGIMES.items()
                 if name not in excluded and regime(M, N, K))
