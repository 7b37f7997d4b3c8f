"""The `streamk` variant: C = A @ B with the K steps of all tiles shared evenly among the SMs.

A GEMM whose output tiles number a little less (or a little more) than a multiple of the
SM count leaves SMs idle in its last wave: 256×6144 in 128×128 tiles is 96 tiles for 132
SMs, and 1000×3000 in 128×256 tiles 96 too. Split-K multiplies the programs, but by a
whole factor per tile. Stream-K (Osama et al., PPoPP 2023) cuts the work finer: the grid is
one program per SM, and the tiles' BLOCK_K steps, laid end to end in grouped tile order,
are cut into one contiguous, equal range per program. A program walks its range tile by
tile; a tile it computes whole is stored directly, with the epilogue, and a tile split
between programs is summed with fp32 atomic adds into a workspace. A finishing kernel then
applies the epilogue to the split tiles, casts them into C, and zeroes their workspace
cells again, so the workspace is zero before every call without a memset on the host (and
the launch can be replayed: kernels/launches.py).

Split tiles are summed in whatever order the atomics land (results vary in the last bits
from run to run, as split-K's atomic reduction); tiles computed whole are deterministic.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
import triton
import triton.language as tl

from tuner.kernels._epilogue import apply_epilogue
from tuner.kernels._launch import (
    cdiv,
    dot_options,
    epilogue_args,
    needs_int64,
    tile_count,
    tile_smem_bytes,
)
from tuner.kernels._mainloop import accumulate_k_steps, grouped_tile
from tuner.kernels.base import TILE_PARAMS, Gemm, Variant, start
from tuner.kernels.persistent import num_sms
from tuner.kernels.workspace import WORKSPACE

# The finishing kernel walks a split tile in slices of this many rows (all its columns):
# 16 × 256 fp32 at most, few registers per thread at any num_warps.
FINISH_ROWS = 16


@triton.jit
def _range_owner(step, total_steps, programs):
    """The program whose range holds global step `step`: program p covers steps
    [p * total // programs, (p + 1) * total // programs), so the owner is the largest p with
    p * total // programs <= step, i.e. ceil((step + 1) * programs / total) - 1."""
    return ((step + 1) * programs + total_steps - 1) // total_steps - 1


@triton.jit(do_not_specialize=["PROGRAMS"])
def _streamk_kernel(
    a_ptr, b_ptr, c_ptr, ws_ptr, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    bias_ptr, scale_a_ptr, scale_b_ptr,
    PROGRAMS,  # programs in the grid, each owning an equal range of the K steps
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0: no K mask needed
    INT64_OFFSETS: tl.constexpr,  # some offset may overflow int32
    DOT_UPCAST: tl.constexpr,  # multiply in fp32 (interpreter workaround, _launch.py)
    INPUT_PRECISION: tl.constexpr,  # "ieee" / "tf32" for fp32 inputs, None (default) else
    HAS_BIAS: tl.constexpr, SCALED: tl.constexpr,  # epilogue (_epilogue.py)
):
    stride_wm = N  # the workspace is a contiguous fp32 [M, N]
    if INT64_OFFSETS:
        # Every offset below is index * stride, so wide strides make all of them int64.
        stride_am, stride_ak = tl.cast(stride_am, tl.int64), tl.cast(stride_ak, tl.int64)
        stride_bk, stride_bn = tl.cast(stride_bk, tl.int64), tl.cast(stride_bn, tl.int64)
        stride_cm, stride_cn = tl.cast(stride_cm, tl.int64), tl.cast(stride_cn, tl.int64)
        stride_wm = tl.cast(stride_wm, tl.int64)

    steps = tl.cdiv(K, BLOCK_K)
    # Global step numbers run to tiles × steps, which can pass int32 (8192² in 16×16 tiles,
    # 512 steps each): int64.
    total = (tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)).to(tl.int64) * steps
    program = tl.program_id(0).to(tl.int64)
    step = program * total // PROGRAMS
    end = (program + 1) * total // PROGRAMS
    while step < end:
        tile = step // steps
        first = (step - tile * steps).to(tl.int32)  # the tile's K steps [first, last)
        last = tl.minimum(end - tile * steps, steps).to(tl.int32)
        tile_m, tile_n = grouped_tile(tile.to(tl.int32), M, N, BLOCK_M, BLOCK_N, GROUP_M)
        # Rows and columns past M and N wrap onto valid ones, as in general.py.
        rows = (tile_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
        cols = (tile_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
        rows = tl.max_contiguous(tl.multiple_of(rows, BLOCK_M), BLOCK_M)
        cols = tl.max_contiguous(tl.multiple_of(cols, BLOCK_N), BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc = accumulate_k_steps(acc, a_ptr, b_ptr, rows, cols, K, first, last,
                                 stride_am, stride_ak, stride_bk, stride_bn,
                                 BLOCK_K, EVEN_K, DOT_UPCAST, INPUT_PRECISION)

        out_rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
        out_cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
        in_bounds = (out_rows[:, None] < M) & (out_cols[None, :] < N)
        if (first == 0) & (last == steps):  # the whole tile: store it
            acc = apply_epilogue(acc, out_cols, N, bias_ptr, scale_a_ptr, scale_b_ptr,
                                 HAS_BIAS, SCALED)
            c_ptrs = c_ptr + out_rows[:, None] * stride_cm + out_cols[None, :] * stride_cn
            tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=in_bounds)
        else:  # a share of a split tile: the finishing kernel stores the sum
            ws_ptrs = ws_ptr + out_rows[:, None] * stride_wm + out_cols[None, :]
            # Relaxed: nothing reads the sums before the finishing kernel, which the stream
            # orders after this one.
            tl.atomic_add(ws_ptrs, acc, mask=in_bounds, sem="relaxed")
        step = tile * steps + last


@triton.jit(do_not_specialize=["PROGRAMS"])
def _finish_kernel(
    ws_ptr, c_ptr, M, N, K, stride_cm, stride_cn,
    bias_ptr, scale_a_ptr, scale_b_ptr,
    PROGRAMS,  # the main kernel's grid, which decides the split tiles
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, FINISH_ROWS: tl.constexpr,
    INT64_OFFSETS: tl.constexpr,  # some offset may overflow int32
    HAS_BIAS: tl.constexpr, SCALED: tl.constexpr,  # epilogue (_epilogue.py)
):
    """Program t: if tile t was split between programs, C tile = epilogue(workspace tile),
    and the workspace tile back to zeros. Whole tiles were stored by the main kernel."""
    stride_wm = N
    if INT64_OFFSETS:
        stride_wm = tl.cast(stride_wm, tl.int64)
        stride_cm, stride_cn = tl.cast(stride_cm, tl.int64), tl.cast(stride_cn, tl.int64)

    steps = tl.cdiv(K, BLOCK_K)
    total = (tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)).to(tl.int64) * steps
    tile = tl.program_id(0).to(tl.int64)
    first_owner = _range_owner(tile * steps, total, PROGRAMS)
    last_owner = _range_owner(tile * steps + steps - 1, total, PROGRAMS)
    if first_owner != last_owner:
        tile_m, tile_n = grouped_tile(tile.to(tl.int32), M, N, BLOCK_M, BLOCK_N, GROUP_M)
        cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
        for first_row in range(0, BLOCK_M, FINISH_ROWS):
            rows = tile_m * BLOCK_M + first_row + tl.arange(0, FINISH_ROWS)
            in_bounds = (rows[:, None] < M) & (cols[None, :] < N)
            ws_ptrs = ws_ptr + rows[:, None] * stride_wm + cols[None, :]
            acc = tl.load(ws_ptrs, mask=in_bounds, other=0.0)
            tl.store(ws_ptrs, tl.zeros((FINISH_ROWS, BLOCK_N), dtype=tl.float32),
                     mask=in_bounds)
            acc = apply_epilogue(acc, cols, N, bias_ptr, scale_a_ptr, scale_b_ptr,
                                 HAS_BIAS, SCALED)
            c_ptrs = c_ptr + rows[:, None] * stride_cm + cols[None, :] * stride_cn
            tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=in_bounds)


def launch(gemm: Gemm, tunables: Mapping[str, int], compile_only: bool) -> None:
    """The stream-K kernel over one program per SM (fewer if there are fewer K steps in
    all), then the finishing kernel over the tiles."""
    a, b, out = gemm.a, gemm.b, gemm.out
    M, N, K = gemm.mnk
    # Zeros when allocated; every call leaves it zero again (the finishing kernel).
    workspace = WORKSPACE.get(("streamk", M, N, K), (M, N), torch.float32, out.device)
    int64 = needs_int64(a, b, out, workspace)
    tiles = tile_count(M, N, tunables)
    programs = min(num_sms(a.device), tiles * cdiv(K, tunables["BLOCK_K"]))
    epilogue, epilogue_flags = epilogue_args(gemm)
    start(_streamk_kernel, (programs,),
          (a, b, out, workspace, M, N, K, *a.stride(), *b.stride(), *out.stride(), *epilogue,
           programs), dict(
              EVEN_K=K % tunables["BLOCK_K"] == 0,
              INT64_OFFSETS=int64,
              **dot_options(gemm), **epilogue_flags,
              **tunables,  # BLOCK_M/N/K and GROUP_M constexprs; num_stages and num_warps
          ), compile_only)
    start(_finish_kernel, (tiles,),
          (workspace, out, M, N, K, *out.stride(), *epilogue, programs), dict(
              BLOCK_M=tunables["BLOCK_M"], BLOCK_N=tunables["BLOCK_N"],
              BLOCK_K=tunables["BLOCK_K"], GROUP_M=tunables["GROUP_M"],
              FINISH_ROWS=FINISH_ROWS, num_warps=tunables["num_warps"],
              INT64_OFFSETS=int64, **epilogue_flags,
          ), compile_only)


def unsupported(gemm: Gemm, tunables: Mapping[str, int]) -> str | None:
    """A K that fits in one BLOCK_K step leaves nothing to share: every tile is one step, no
    tile is ever split, and the variant is the general kernel with a worse schedule."""
    K = gemm.mnk[2]
    if K <= tunables["BLOCK_K"]:
        return f"stream-K needs more than one BLOCK_K step: K={K}, BLOCK_K={tunables['BLOCK_K']}"
    return None


STREAMK = Variant(
    name="streamk",
    params=TILE_PARAMS,
    launch=launch,
    smem_bytes=tile_smem_bytes,
    source_path=Path(__file__),
    unsupported=unsupported,
)
