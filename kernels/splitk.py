"""The `splitk` variant: C = A @ B with K split among SPLIT_K programs per output tile.

A GEMM with a small M×N and a large K (16×4096×4096, 1000×3000×2000) has too few output
tiles to fill the GPU: each tile is one long walk along K, and most SMs sit idle. Split-K
runs SPLIT_K programs per tile, each over one contiguous slice of K, and adds up their fp32
partial products afterwards. Two reductions compete (the searched ATOMIC parameter):

- ATOMIC=0: each split stores its partial tile in its own slice of an fp32 [SPLIT_K, M, N]
  workspace; a finishing kernel sums the slices in a fixed order (deterministic results).
- ATOMIC=1: every split atomically adds into one fp32 [M, N] workspace; the finishing kernel
  reads that one slice and writes zeros back, so the workspace is zero again for the next
  call with no memset launch of its own (a call is Triton launches alone, and replays). Less
  workspace traffic, but a summation order that varies from run to run.

Either way the finishing kernel applies the epilogue (fp8 scales, bias) and casts into C with
any strides. There is no GROUP_M: split-K pays off when the output tiles are few, so they all
run at once and the order they start in gives L2 nothing to reuse; it would only quadruple
the search.
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
    wrap_keeps_vectors,
)
from tuner.kernels._mainloop import accumulate_k_steps
from tuner.kernels.base import Gemm, Variant
from tuner.kernels.launches import start
from tuner.kernels.workspace import WORKSPACE
from tuner.mma import TileOperands, pipeline_smem_bytes, uses_wgmma

# tl.dot needs every block dimension >= 16, so no config has a BLOCK_K below this.
MIN_BLOCK_K = 16

# The finishing kernel's tile and warps are fixed, not searched. It is a memory-bound
# elementwise pass (read PARTIALS×M×N fp32, write M×N once) with no data reuse to tile for:
# a 16×128 tile reads 512 contiguous bytes per workspace row, enough for fully coalesced
# loads, and fits the few-row M that split-K serves without idle rows. Searching it would
# multiply the space for a pass that is a small part of the time; fixed, one finishing
# binary per call specialization serves every tile config.
FINISH_BLOCK_M = 16
FINISH_BLOCK_N = 128
FINISH_WARPS = 4


@triton.jit
def _partials_kernel(
    a_ptr, b_ptr, ws_ptr, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    ATOMIC: tl.constexpr,  # add into one [M, N] slice instead of storing into slice `split`
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0: no K mask needed
    HINT_M: tl.constexpr, HINT_N: tl.constexpr,  # contiguity hints hold (wrap_keeps_vectors)
    INT64_OFFSETS: tl.constexpr,  # some offset may overflow int32
    DOT_UPCAST: tl.constexpr,  # multiply in fp32 (interpreter workaround, _launch.py)
    INPUT_PRECISION: tl.constexpr,  # "ieee" / "tf32" for fp32 inputs, None (default) else
):
    """Program (tile, split): the tile's fp32 product over the split's slice of K."""
    stride_wm = N  # the workspace is contiguous: [partials * M, N]
    if INT64_OFFSETS:
        # Every offset below is index * stride, so wide strides make all of them int64.
        stride_am, stride_ak = tl.cast(stride_am, tl.int64), tl.cast(stride_ak, tl.int64)
        stride_bk, stride_bn = tl.cast(stride_bk, tl.int64), tl.cast(stride_bn, tl.int64)
        stride_wm = tl.cast(stride_wm, tl.int64)

    tiles_n = tl.cdiv(N, BLOCK_N)
    tile_m = tl.program_id(0) // tiles_n
    tile_n = tl.program_id(0) % tiles_n
    split = tl.program_id(1)
    # Balanced contiguous slices: split s takes steps [s*steps//SPLIT_K, (s+1)*steps//SPLIT_K),
    # so slices differ by at most one step and none is empty while SPLIT_K <= steps.
    steps = tl.cdiv(K, BLOCK_K)
    first_step = split * steps // SPLIT_K
    end_step = (split + 1) * steps // SPLIT_K

    # Rows past M and columns past N wrap onto valid ones (as in general.py, hints included):
    # loads need only the K mask, and what those lanes compute lands in workspace cells the
    # store masks off.
    rows = (tile_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    cols = (tile_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    if HINT_M:
        rows = tl.max_contiguous(tl.multiple_of(rows, BLOCK_M), BLOCK_M)
    if HINT_N:
        cols = tl.max_contiguous(tl.multiple_of(cols, BLOCK_N), BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc = accumulate_k_steps(acc, a_ptr, b_ptr, rows, cols, K, first_step, end_step,
                             stride_am, stride_ak, stride_bk, stride_bn,
                             BLOCK_K, EVEN_K, DOT_UPCAST, INPUT_PRECISION)

    out_rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    out_cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    in_bounds = (out_rows[:, None] < M) & (out_cols[None, :] < N)
    if ATOMIC:
        ws_ptrs = ws_ptr + out_rows[:, None] * stride_wm + out_cols[None, :]
        # Relaxed: nothing reads the sums before the finishing kernel, which the stream orders.
        tl.atomic_add(ws_ptrs, acc, mask=in_bounds, sem="relaxed")
    else:
        ws_ptrs = ws_ptr + (split * M + out_rows)[:, None] * stride_wm + out_cols[None, :]
        tl.store(ws_ptrs, acc, mask=in_bounds)


@triton.jit
def _finish_kernel(
    ws_ptr, c_ptr, M, N, partials, stride_cm, stride_cn,
    bias_ptr, scale_a_ptr, scale_b_ptr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    INT64_OFFSETS: tl.constexpr,  # some offset may overflow int32
    RESET: tl.constexpr,  # zero the workspace after reading it (the atomic sums)
    HAS_BIAS: tl.constexpr, SCALED: tl.constexpr,  # epilogue (_epilogue.py)
):
    """C tile = epilogue(sum of the tile's `partials` workspace slices), cast to C's dtype."""
    stride_wm = N  # the workspace is contiguous: [partials * M, N]
    if INT64_OFFSETS:
        stride_wm = tl.cast(stride_wm, tl.int64)
        stride_cm, stride_cn = tl.cast(stride_cm, tl.int64), tl.cast(stride_cn, tl.int64)

    tiles_n = tl.cdiv(N, BLOCK_N)
    rows = (tl.program_id(0) // tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = (tl.program_id(0) % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    in_bounds = (rows[:, None] < M) & (cols[None, :] < N)
    ws_ptrs = ws_ptr + rows[:, None] * stride_wm + cols[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(partials):
        acc += tl.load(ws_ptrs, mask=in_bounds, other=0.0)
        if RESET:
            tl.store(ws_ptrs, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), mask=in_bounds)
        ws_ptrs += M * stride_wm
    acc = apply_epilogue(acc, cols, N, bias_ptr, scale_a_ptr, scale_b_ptr, HAS_BIAS, SCALED)
    c_ptrs = c_ptr + rows[:, None] * stride_cm + cols[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=in_bounds)


def _workspace(gemm: Gemm, split_k: int, atomic: bool) -> torch.Tensor:
    """The fp32 [partials, M, N] workspace: one slice per split, or the one slice all splits
    add into, which starts as zeros and which every finishing kernel leaves as zeros."""
    M, N, K = gemm.mnk
    role = "splitk-atomic" if atomic else "splitk-partials"
    return WORKSPACE.get((role, M, N, K), (1 if atomic else split_k, M, N), torch.float32,
                         gemm.out.device)


def launch(gemm: Gemm, tunables: Mapping[str, int], compile_only: bool) -> None:
    """Partial products into the workspace, then the finishing kernel into gemm.out."""
    a, b, out = gemm.a, gemm.b, gemm.out
    M, N, K = gemm.mnk
    workspace = _workspace(gemm, tunables["SPLIT_K"], bool(tunables["ATOMIC"]))
    int64 = needs_int64(a, b, out, workspace)

    tiles = tile_count(M, N, tunables)
    start(_partials_kernel, (tiles, tunables["SPLIT_K"]),
          (a, b, workspace, M, N, K, *a.stride(), *b.stride()), dict(
              EVEN_K=K % tunables["BLOCK_K"] == 0,
              HINT_M=wrap_keeps_vectors(M), HINT_N=wrap_keeps_vectors(N),
              INT64_OFFSETS=int64,
              **dot_options(gemm),
              **tunables,  # BLOCK_M/N/K, SPLIT_K, ATOMIC constexprs; num_stages, num_warps
          ), compile_only)

    epilogue, epilogue_flags = epilogue_args(gemm)
    finish_tiles = cdiv(M, FINISH_BLOCK_M) * cdiv(N, FINISH_BLOCK_N)
    start(_finish_kernel, (finish_tiles,),
          (workspace, out, M, N, workspace.shape[0], *out.stride(), *epilogue), dict(
              BLOCK_M=FINISH_BLOCK_M, BLOCK_N=FINISH_BLOCK_N, num_warps=FINISH_WARPS,
              INT64_OFFSETS=int64, RESET=bool(tunables["ATOMIC"]), **epilogue_flags,
          ), compile_only)


# Shared memory for the fp32 partial tile's layout change before a wgmma tile stores it:
# Triton's figures on an H200 reach the whole tile (BLOCK_M × BLOCK_N × 4 bytes) but never
# more than 64 KiB (benchmarks/results/h200-issue5/constraint_accuracy*.jsonl).
MAX_PARTIAL_SCRATCH_BYTES = 64 * 1024


def smem_bytes(tunables: Mapping[str, int], operands: TileOperands) -> int:
    """The main loop's pipeline, or the partial tile's scratch if larger: the store follows
    the K loop, so the two share memory."""
    pipeline = pipeline_smem_bytes(tunables, operands)
    if not uses_wgmma(tunables["BLOCK_M"], tunables["num_warps"], operands.tensor_cores):
        return pipeline
    partial = tunables["BLOCK_M"] * tunables["BLOCK_N"] * 4
    return max(pipeline, min(partial, MAX_PARTIAL_SCRATCH_BYTES))


def unsupported(gemm: Gemm, tunables: Mapping[str, int]) -> str | None:
    """Why this config makes no sense for this call, or None.

    No config can split a K that fits in one BLOCK_K step. And a split gets a whole number of
    BLOCK_K steps, so with more splits than steps some get no work: they still cost a launch
    slot (and workspace traffic) and add nothing.
    """
    K = gemm.mnk[2]
    if K <= MIN_BLOCK_K:
        return f"split-K needs K > {MIN_BLOCK_K}, not {K}"
    steps = cdiv(K, tunables["BLOCK_K"])
    if tunables["SPLIT_K"] > steps:
        return (f"SPLIT_K {tunables['SPLIT_K']} > {steps} BLOCK_K steps of K={K}: "
                "some splits would get no work")
    return None


SPLITK = Variant(
    name="splitk",
    params=("BLOCK_M", "BLOCK_N", "BLOCK_K", "SPLIT_K", "ATOMIC", "num_stages", "num_warps"),
    launch=launch,
    smem_bytes=smem_bytes,
    source_path=Path(__file__),
    unsupported=unsupported,
)
