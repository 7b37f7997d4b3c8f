"""Which torch GEMM calls, at the aten level where F.linear and torch.matmul end, are one GEMM
the tuner's kernels run.

F.linear and torch.matmul decompose into `aten.mm` (no bias, or a batched x that folds into
rows), `aten.addmm` (a bias) and `aten.bmm` (a batched x that does not fold). Recording
(tuner.recording) lists a model's calls by these rules and enabling (tuner.integration)
routes by them, so the shapes a recording lists are the calls enabling sends to the tuner.
"""
from __future__ import annotations

import torch

from tuner.dtypes import DTYPES

# The input dtypes aten's GEMMs and the kernels share (fp8 reaches torch only as _scaled_mm).
KERNEL_DTYPES = frozenset(d.torch for d in DTYPES.values() if not d.scaled)
KERNEL_DTYPE_NAMES = ", ".join(d.name for d in DTYPES.values() if not d.scaled)


def folded_bmm(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """bmm(a, b) as one GEMM, its 2-D operands (M = batch × a's rows); None where it is
    `batch` separate GEMMs.

    It is one GEMM where the batch is 1, or where b is one matrix for every batch (batch
    stride 0, as torch.matmul broadcasts a weight) and a's batches continue each other's rows
    (a.view(batch * M, K) is a view): a 3-D x times a 2-D weight that torch.matmul did not
    fold itself.
    """
    batch, rows, k = a.shape
    if batch == 1:
        return a[0], b[0]
    if batch > 1 and b.stride(0) == 0 and a.stride(0) == rows * a.stride(1):
        return a.view(batch * rows, k), b[0]
    return None


def is_bias_row(c: torch.Tensor, mat2: torch.Tensor, beta, alpha) -> bool:
    """True where addmm(c, mat1, mat2, beta=beta, alpha=alpha) is a GEMM plus the bias the
    kernels add in their epilogue: c one value per output column (N,), of the GEMM's dtype,
    as F.linear passes it; beta and alpha 1."""
    return (beta == 1 and alpha == 1 and c.dim() == 1 and c.shape[0] == mat2.shape[1]
            and c.dtype == mat2.dtype)
