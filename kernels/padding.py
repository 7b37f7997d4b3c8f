"""The `pad` parameter: run a variant on copies of the operands padded to aligned sizes.

Unaligned GEMMs (4097×4095×4100, 8191³) are slow in every kernel, cuBLAS included: strides
that are not 16-byte multiples rule out TMA and vectorized loads, and a ragged K needs masks
in the inner loop. Copying A and B into buffers whose dimensions are multiples of `pad`
(zero margins: a zero K margin adds nothing to the products), running an aligned variant, and
copying the M×N corner of the result back measured 3.5-4.2× cuBLAS on an H200, copies
included. Each padded buffer keeps its operand's orientation, so copies stay contiguous.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from tuner.kernels.workspace import WORKSPACE

if TYPE_CHECKING:
    from tuner.kernels.base import Gemm, Variant


def _padded(dim: int, multiple: int) -> int:
    """dim rounded up to a multiple; a dimension of 1 stays 1 (it has no stride to align,
    and M == 1 or N == 1 is what lets the gemv variant run)."""
    return dim if dim == 1 else -(-dim // multiple) * multiple


def is_transposed(t: torch.Tensor) -> bool:
    """Column-major storage (a `t` operand): unit stride along rows."""
    return t.stride(0) == 1 and t.stride(1) != 1


def _buffer(role: str, source: torch.Tensor, rows: int, cols: int, key: tuple,
            allocate: bool) -> torch.Tensor:
    """A zero-margined rows×cols buffer in `source`'s orientation and dtype."""
    transposed = is_transposed(source)
    size = (cols, rows) if transposed else (rows, cols)
    if allocate:
        storage = WORKSPACE.get(("pad", role, *key), size, source.dtype, source.device)
    else:
        storage = torch.empty(size, dtype=source.dtype, device="meta")
    return storage.t() if transposed else storage


def padded_operands(gemm: Gemm, pad: int, allocate: bool = True) -> Gemm:
    """The gemm on padded buffers, holding no data yet (meta tensors unless `allocate`)."""
    M, N, K = gemm.mnk
    Mp, Np, Kp = (_padded(d, pad) for d in (M, N, K))
    key = (M, N, K, gemm.a.stride(), gemm.b.stride(), pad)
    return gemm.with_operands(_buffer("a", gemm.a, Mp, Kp, key, allocate),
                              _buffer("b", gemm.b, Kp, Np, key, allocate),
                              _buffer("out", gemm.out, Mp, Np, key, allocate))


def pad_changes_nothing(gemm: Gemm, pad: int) -> bool:
    """True when the padded operands would have the original shapes and strides."""
    padded = padded_operands(gemm, pad, allocate=False)
    return all(p.shape == t.shape and p.stride() == t.stride() for p, t in
               ((padded.a, gemm.a), (padded.b, gemm.b), (padded.out, gemm.out)))


def run_padded(variant: Variant, gemm: Gemm, tunables: Mapping[str, int], pad: int,
               compile_only: bool) -> None:
    """Copy in, run the variant on the padded problem, copy the result (plus bias) out."""
    M, N, K = gemm.mnk
    padded = padded_operands(gemm, pad, allocate=not compile_only)
    if not compile_only:
        padded.a[:M, :K].copy_(gemm.a)
        padded.b[:K, :N].copy_(gemm.b)
    # The bias is added on the way out: the padded output has columns the bias lacks.
    variant.launch(replace(padded, bias=None), tunables, compile_only)
    if compile_only:
        return
    corner = padded.out[:M, :N]
    if gemm.bias is None:
        gemm.out.copy_(corner)
    else:
        torch.add(corner, gemm.bias, out=gemm.out)
