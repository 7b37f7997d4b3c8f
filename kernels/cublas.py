"""The `cublas` variant: the call as torch makes it (cuBLAS / cuBLASLt), as one candidate
among the Triton variants.

It has no parameters: it is measured like every config and wins where cuBLAS is fastest, so
the dispatcher never does worse than torch by choosing a Triton tile where the library has
a better kernel. Tuning times it through `launch` (torch.mm / addmm / _scaled_mm into the
call's output); the dispatcher's repeated calls go straight to the torch function the user
would have called (`CALLS`), the cheapest host path there is. It takes no padding, and
FlagGems has no such op, so expand exports leave it out.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
import torch.nn.functional as F

from tuner.kernels.base import Gemm, LibraryCalls, Variant


def launch(gemm: Gemm, tunables: Mapping[str, int], compile_only: bool) -> None:
    """gemm.out = a @ b (scaled, plus bias) through torch; nothing to compile."""
    if compile_only:
        return
    if gemm.scale_a is not None:
        torch._scaled_mm(gemm.a, gemm.b, gemm.scale_a, gemm.scale_b, bias=gemm.bias,
                         out_dtype=gemm.out.dtype, out=gemm.out)
    elif gemm.bias is not None:
        torch.addmm(gemm.bias, gemm.a, gemm.b, out=gemm.out)
    else:
        torch.mm(gemm.a, gemm.b, out=gemm.out)


def _scaled_matmul(a, b, out, scale_a, scale_b):
    return torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.bfloat16, out=out)


def _matmul(a, b, out, scale_a, scale_b):
    if scale_a is not None:
        return _scaled_matmul(a, b, out, scale_a, scale_b)
    return torch.matmul(a, b, out=out)


def unsupported(gemm: Gemm, tunables: Mapping[str, int]) -> str | None:
    """What torch's GEMM cannot do as this call asks: fp8 only as row-major A times
    column-major B with K and N multiples of 16 (torch._scaled_mm) on a GPU (or meta tensors,
    judging a key), and fp32 only in the precision torch's global tf32 switch selects
    (allow_tf32 must match it)."""
    if gemm.scale_a is not None:
        _, N, K = gemm.mnk
        a, b = gemm.a, gemm.b
        # Row-major A and column-major B with leading dimensions of at least K: cuBLASLt
        # finds no algorithm for a one-row A whose rows are one element apart.
        row_major_a = a.stride(1) == 1 and a.stride(0) >= K
        column_major_b = b.stride(0) == 1 and b.stride(1) >= K
        if (a.device.type not in ("cuda", "meta") or not row_major_a or not column_major_b
                or K % 16 or N % 16):
            return ("cublas: fp8 needs torch._scaled_mm's layout (row-major A, column-major "
                    "B, K and N multiples of 16) on CUDA")
    if (gemm.a.dtype == torch.float32
            and torch.backends.cuda.matmul.allow_tf32 != gemm.allow_tf32):
        return (f"cublas: the call asks allow_tf32={gemm.allow_tf32}, torch's "
                f"backends.cuda.matmul.allow_tf32 is {torch.backends.cuda.matmul.allow_tf32}")
    return None


CUBLAS = Variant(
    name="cublas",
    params=(),
    launch=launch,
    smem_bytes=lambda tunables, operands: 0,
    source_path=Path(__file__),
    unsupported=unsupported,
    replayable=lambda tunables: False,
    takes_pad=False,
    library_calls=LibraryCalls(linear=F.linear, matmul=_matmul),
)
