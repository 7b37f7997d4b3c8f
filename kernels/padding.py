"""The `pad` parameter: run a variant on copies of the operands whose strides and K are
aligned.

Unaligned GEMMs (4097×4095×4100, 8191³) are slow in every kernel, cuBLAS included: strides
that are not 16-byte multiples rule out TMA and vectorized loads, and a ragged K needs masks
in the inner loop. So A and B are copied into buffers whose dimensions are multiples of
`pad` (zero margins: a zero K margin adds nothing to the products), and the variant runs on
views of them cut back to M rows and N columns: it reads aligned storage and writes the real
output directly (bias included), so no result is copied back. An operand the padding would
not change (an A whose K and row stride are aligned already) is read in place. The copies are
one Triton launch (`_copy_kernel`), so a padded call replays like any other
(kernels/launches.py). Each buffer keeps its operand's orientation, so copies stay contiguous.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from tuner.kernels.launches import start
from tuner.kernels.workspace import WORKSPACE

if TYPE_CHECKING:
    from tuner.kernels.base import Gemm, Variant

# The copy kernel's tile: 32 rows of 128 contiguous elements (256 bytes of bf16 per row).
COPY_BLOCK_ROWS = 32
COPY_BLOCK_COLS = 128
COPY_WARPS = 4


@triton.jit
def _copy_tiles(src, dst, rows, cols, src_stride, dst_stride, tile,
                BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr,
                SRC_STRIDE_MULTIPLE: tl.constexpr, DST_STRIDE_MULTIPLE: tl.constexpr):
    """Copy tile `tile` of the rows×cols matrix src (unit inner stride) into dst."""
    # Triton knows a stride divides by 16 or nothing; an unaligned operand's stride (4100)
    # still divides by 4, which lets its rows move in 8-byte vectors instead of one element
    # at a time. (A stride of 1 arrives as a constant: there is nothing to say of it.)
    if SRC_STRIDE_MULTIPLE > 1:
        src_stride = tl.multiple_of(src_stride, SRC_STRIDE_MULTIPLE)
    if DST_STRIDE_MULTIPLE > 1:
        dst_stride = tl.multiple_of(dst_stride, DST_STRIDE_MULTIPLE)
    tiles_c = tl.cdiv(cols, BLOCK_COLS)
    if tile < tl.cdiv(rows, BLOCK_ROWS) * tiles_c:
        r = (tile // tiles_c) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        c = (tile % tiles_c) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
        mask = (r[:, None] < rows) & (c[None, :] < cols)
        r64 = r.to(tl.int64)[:, None]
        values = tl.load(src + r64 * src_stride + c[None, :], mask=mask)
        tl.store(dst + r64 * dst_stride + c[None, :], values, mask=mask)


@triton.jit
def _copy_kernel(src0, dst0, rows0, cols0, src_stride0, dst_stride0,
                 src1, dst1, rows1, cols1, src_stride1, dst_stride1,
                 BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr,
                 SRC_STRIDE_MULTIPLE0: tl.constexpr, DST_STRIDE_MULTIPLE0: tl.constexpr,
                 SRC_STRIDE_MULTIPLE1: tl.constexpr, DST_STRIDE_MULTIPLE1: tl.constexpr):
    """Program (tile, m) copies tile `tile` of matrix m: both operands in one launch."""
    if tl.program_id(1) == 0:
        _copy_tiles(src0, dst0, rows0, cols0, src_stride0, dst_stride0, tl.program_id(0),
                    BLOCK_ROWS, BLOCK_COLS, SRC_STRIDE_MULTIPLE0, DST_STRIDE_MULTIPLE0)
    else:
        _copy_tiles(src1, dst1, rows1, cols1, src_stride1, dst_stride1, tl.program_id(0),
                    BLOCK_ROWS, BLOCK_COLS, SRC_STRIDE_MULTIPLE1, DST_STRIDE_MULTIPLE1)


def _padded(dim: int, multiple: int) -> int:
    """dim rounded up to a multiple; a dimension of 1 stays 1 (it has no stride to align,
    and M == 1 or N == 1 is what lets the gemv variant run)."""
    return dim if dim == 1 else -(-dim // multiple) * multiple


def is_transposed(t: torch.Tensor) -> bool:
    """Column-major storage (a `t` operand): unit stride along rows."""
    return t.stride(0) == 1 and t.stride(1) != 1


def _storage(t: torch.Tensor) -> torch.Tensor:
    """t as its storage is laid out: unit stride along the last dimension."""
    return t.t() if is_transposed(t) else t


def _aligned_view(role: str, source: torch.Tensor, rows: int, cols: int, keep_rows: int,
                  keep_cols: int, key: tuple, allocate: bool) -> torch.Tensor:
    """The keep_rows×keep_cols corner of a zero-margined rows×cols buffer in `source`'s
    orientation and dtype (a meta tensor unless `allocate`)."""
    transposed = is_transposed(source)
    size = (cols, rows) if transposed else (rows, cols)
    if allocate:
        storage = WORKSPACE.get(("pad", role, *key), size, source.dtype, source.device)
    else:
        storage = torch.empty(size, dtype=source.dtype, device="meta")
    buffer = storage.t() if transposed else storage
    return buffer[:keep_rows, :keep_cols]


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.stride() == b.stride()


def padded_operands(gemm: Gemm, pad: int, allocate: bool = True) -> Gemm:
    """The gemm reading A (M×Kp) and B (Kp×N) from padded buffers, K and the strides rounded
    up to multiples of `pad`; an operand the padding leaves as it is stays itself. The output
    and bias are the gemm's own. Padded buffers hold no data yet (meta unless `allocate`)."""
    M, N, K = gemm.mnk
    Mp, Np, Kp = (_padded(d, pad) for d in (M, N, K))
    key = (M, N, K, gemm.a.stride(), gemm.b.stride(), pad)
    a = _aligned_view("a", gemm.a, Mp, Kp, M, Kp, key, allocate)
    b = _aligned_view("b", gemm.b, Kp, Np, Kp, N, key, allocate)
    a_kept, b_kept = _same_layout(a, gemm.a), _same_layout(b, gemm.b)
    return replace(gemm, a=gemm.a if a_kept else a, b=gemm.b if b_kept else b,
                   a_buffer_rows=gemm.a_buffer_rows if a_kept else Mp,
                   b_buffer_cols=gemm.b_buffer_cols if b_kept else Np)


def pad_changes_nothing(gemm: Gemm, pad: int) -> bool:
    """True when padding would leave both operands as they are."""
    padded = padded_operands(gemm, pad, allocate=False)
    return padded.a is gemm.a and padded.b is gemm.b


def _copy_in(copies: list[tuple[torch.Tensor, torch.Tensor]], compile_only: bool) -> None:
    """Copy each source into its padded view (same shape), all in one launch."""
    pairs = [(_storage(src), _storage(dst)) for src, dst in copies]
    tiles = max(-(-s.shape[0] // COPY_BLOCK_ROWS) * -(-s.shape[1] // COPY_BLOCK_COLS)
                for s, _ in pairs)
    args, multiples = [], {}
    for i, (src, dst) in enumerate(pairs + pairs[:1] * (2 - len(pairs))):  # slot 1 may idle
        args += [src, dst, *src.shape, src.stride(0), dst.stride(0)]
        # the largest power of two up to 16 that divides each row stride
        multiples[f"SRC_STRIDE_MULTIPLE{i}"] = math.gcd(src.stride(0), 16)
        multiples[f"DST_STRIDE_MULTIPLE{i}"] = math.gcd(dst.stride(0), 16)
    start(_copy_kernel, (tiles, len(pairs)), tuple(args),
          dict(BLOCK_ROWS=COPY_BLOCK_ROWS, BLOCK_COLS=COPY_BLOCK_COLS, num_warps=COPY_WARPS,
               **multiples), compile_only)


def run_padded(variant: Variant, gemm: Gemm, tunables: Mapping[str, int], pad: int,
               compile_only: bool) -> None:
    """Copy the operands that need it into their padded buffers, then run the variant on them
    into the real output."""
    padded = padded_operands(gemm, pad, allocate=not compile_only)
    copies = [(src, dst) for src, dst in ((gemm.a, padded.a), (gemm.b, padded.b))
              if dst is not src]
    if copies:
        _copy_in(copies, compile_only)
    variant.launch(padded, tunables, compile_only)
