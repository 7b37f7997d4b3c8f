"""The `cublas` variant: the call as torch makes it (cuBLAS / cuBLASLt), as one candidate
among the Triton variants.

It has no parameters: it is measured like every config and wins where cuBLAS is fastest, so
the dispatcher never does worse than torch by choosing a Triton tile where the library has
a better kernel. Tuning times it through `launch` (torch.mm / addmm / _scaled_mm into the
call's output); the dispatcher's repeated calls go to the same aten operators (`TorchCalls`),
one layer below F.linear and torch.matmul. It takes no padding, and FlagGems has no such op,
so expand exports leave it out.
"""
from __future__ import annotations

import weakref
from collections.abc import Mapping
from pathlib import Path

import torch
import torch.nn.functional as F

from tuner.kernels import cublas_cost
from tuner.kernels.base import Gemm, Variant
from tuner.kernels.launches import Repeated


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


class TorchCalls(Repeated):
    """Repeated user calls of one signature answered by cuBLAS: torch.mm / addmm /
    _scaled_mm, the operators F.linear and torch.matmul reach through their composite layers.

    linear needs weight^T. Making that view costs a call about as much host time as the
    layers it skips, so each weight's transposed view is made once and kept while the weight
    object lives (a weak reference drops it with the weight). A weight that is itself a view
    (made for this call alone, e.g. `w.t()`) goes through F.linear: caching it would cost more
    than it saves. The view is detached: repeated calls record no autograd.
    """

    def __init__(self):
        # id(weight) -> (weak reference to the weight, its transposed view, its data_ptr)
        self._transposed: dict[int, tuple[weakref.ref, torch.Tensor, int]] = {}

    def linear(self, x, weight, bias):
        if x.dim() != 2:
            return F.linear(x, weight, bias)
        entry = self._transposed.get(id(weight))
        if entry is not None and entry[0]() is weight and entry[2] == weight.data_ptr():
            weight_t = entry[1]
        else:
            weight_t = self._transposed_view(weight)
            if weight_t is None:
                return F.linear(x, weight, bias)
        return torch.mm(x, weight_t) if bias is None else torch.addmm(bias, x, weight_t)

    def _transposed_view(self, weight: torch.Tensor) -> torch.Tensor | None:
        """weight^T, kept for later calls; None for a weight that is a view of another."""
        if weight._base is not None:
            return None
        key = id(weight)

        def forget(ref, key=key, transposed=self._transposed):
            if transposed.get(key, (None,))[0] is ref:
                del transposed[key]
        # A weight whose storage was swapped (`.data = ...`) gets a new view: the old view
        # still holds the old storage, so no new tensor can sit at its address.
        weight_t = weight.detach().t()
        self._transposed[key] = (weakref.ref(weight, forget), weight_t, weight.data_ptr())
        return weight_t

    def compiled_action(self, out):
        return "torch"  # torch.mm / addmm / _scaled_mm, as at::linear and at::mm reach them

    def matmul(self, a, b, out, scale_a, scale_b):
        if scale_a is not None:
            return torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.bfloat16, out=out)
        return torch.mm(a, b) if out is None else torch.mm(a, b, out=out)


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
    library_calls=TorchCalls,
    no_expand_op="a cuBLAS call through torch",
    model_seconds=cublas_cost.seconds,
)
