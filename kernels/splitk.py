"""The `splitk` variant: C = A @ B with K split among SPLIT_K programs per output tile.

A GEMM with a small M×N and a large K (16×4096×4096, 1000×3000×2000) has too few output
tiles to fill the GPU: each tile is one long walk along K, and most SMs sit idle. Split-K
runs SPLIT_K programs per tile, each over one contiguous slice of K, and each stores its fp32
partial tile in its own slice of a [SPLIT_K, M, N] workspace. The tile's last split to arrive
(a per-tile arrival counter) sums the slices in a fixed order (kernels/_partials.py), so
results are deterministic, applies the epilogue (fp8 scales, bias) once, and casts into C
with any strides. A call is one launch, as cheap to issue as any tile kernel's:
decode-sized split-K calls are host-bound.

There is no GROUP_M: split-K pays off when the output tiles are few, so they all run at once and the
order they start in gives L2 nothing to reuse; it would only quadruple the search.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
import triton
import triton.language as tl

from tuner.kernels import splitk_cost
from tuner.kernels._epilogue import apply_epilogue
from tuner.kernels._launch import (
    cdiv,
    dot_options,
    epilogue_args,
    needs_int64,
    tile_count,
    wrap_keeps_vectors,
    wrap_point,
)
from tuner.kernels._mainloop import accumulate_k_steps, wrapped_indices
from tuner.kernels._partials import arrives_last, slices_summed_at_once, summed_slices
from tuner.kernels.base import TILE_SHORT_NAMES, Gemm, Variant
from tuner.kernels.launches import start
from tuner.kernels.mma import TileOperands, pipeline_smem_bytes, uses_wgmma
from tuner.kernels.workspace import WORKSPACE

# tl.dot needs every block dimension >= 16, so no config has a BLOCK_K below this.
MIN_BLOCK_K = 16

@triton.jit
def _splitk_kernel(
    a_ptr, b_ptr, ws_ptr, arrivals_ptr, c_ptr, M, N, K,
    wrap_m, wrap_n,  # rows of A and columns of B wrap here (_launch.wrap_point)
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    bias_ptr, scale_a_ptr, scale_b_ptr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    SUM_SPLITS: tl.constexpr,  # slices the fix-up adds per step (sum_splits)
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0: no K mask needed
    HINT_M: tl.constexpr, HINT_N: tl.constexpr,  # contiguity hints hold (wrap_keeps_vectors)
    INT64_OFFSETS: tl.constexpr,  # some offset may overflow int32
    DOT_UPCAST: tl.constexpr,  # multiply in fp32 (interpreter workaround, _launch.py)
    INPUT_PRECISION: tl.constexpr,  # "ieee" / "tf32" for fp32 inputs, None (default) else
    HAS_BIAS: tl.constexpr, SCALED: tl.constexpr,  # epilogue (_epilogue.py)
):
    """Program (tile, split): the tile's fp32 product over the split's slice of K into the
    workspace; the tile's last split to arrive then writes the tile of C."""
    stride_wm = N  # the workspace is contiguous: [SPLIT_K * M, N]
    if INT64_OFFSETS:
        # Every offset below is index * stride, so wide strides make all of them int64.
        stride_am, stride_ak = tl.cast(stride_am, tl.int64), tl.cast(stride_ak, tl.int64)
        stride_bk, stride_bn = tl.cast(stride_bk, tl.int64), tl.cast(stride_bn, tl.int64)
        stride_cm, stride_cn = tl.cast(stride_cm, tl.int64), tl.cast(stride_cn, tl.int64)
        stride_wm = tl.cast(stride_wm, tl.int64)

    tile = tl.program_id(0)
    tiles_n = tl.cdiv(N, BLOCK_N)
    tile_m = tile // tiles_n
    tile_n = tile % tiles_n
    split = tl.program_id(1)
    # Balanced contiguous slices: split s takes steps [s*steps//SPLIT_K, (s+1)*steps//SPLIT_K),
    # so slices differ by at most one step and none is empty while SPLIT_K <= steps.
    steps = tl.cdiv(K, BLOCK_K)
    first_step = split * steps // SPLIT_K
    end_step = (split + 1) * steps // SPLIT_K

    rows = wrapped_indices(tile_m * BLOCK_M, wrap_m, BLOCK_M, HINT_M)
    cols = wrapped_indices(tile_n * BLOCK_N, wrap_n, BLOCK_N, HINT_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc = accumulate_k_steps(acc, a_ptr, b_ptr, rows, cols, K, first_step, end_step,
                             stride_am, stride_ak, stride_bk, stride_bn,
                             BLOCK_K, EVEN_K, DOT_UPCAST, INPUT_PRECISION)

    out_rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    out_cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    in_bounds = (out_rows[:, None] < M) & (out_cols[None, :] < N)
    ws_ptrs = ws_ptr + out_rows[:, None] * stride_wm + out_cols[None, :]
    tl.store(ws_ptrs + split * M * stride_wm, acc, mask=in_bounds)
    if arrives_last(arrivals_ptr + tile, SPLIT_K):
        total = summed_slices(ws_ptrs, in_bounds, M * stride_wm, SPLIT_K, SUM_SPLITS,
                              BLOCK_M, BLOCK_N)
        total = apply_epilogue(total, out_cols, N, bias_ptr, scale_a_ptr, scale_b_ptr,
                               HAS_BIAS, SCALED)
        c_ptrs = c_ptr + out_rows[:, None] * stride_cm + out_cols[None, :] * stride_cn
        tl.store(c_ptrs, total.to(c_ptr.dtype.element_ty), mask=in_bounds)


def sum_splits(tunables: Mapping[str, int]) -> int:
    """How many slices the fix-up loads at once (_partials.slices_summed_at_once)."""
    return slices_summed_at_once(tunables["BLOCK_M"] * tunables["BLOCK_N"], tunables["SPLIT_K"])


def _workspace(gemm: Gemm, split_k: int) -> torch.Tensor:
    """The fp32 [SPLIT_K, M, N] workspace, one slice per split."""
    M, N, K = gemm.mnk
    return WORKSPACE.get(("splitk-partials", M, N, K), (split_k, M, N), torch.float32,
                         gemm.out.device)


def _arrivals(gemm: Gemm, tiles: int) -> torch.Tensor:
    """The per-tile count of splits done: zeros, and left as zeros by every call."""
    return WORKSPACE.get(("splitk-arrivals", *gemm.mnk), (tiles,), torch.int32,
                         gemm.out.device)


def launch(gemm: Gemm, tunables: Mapping[str, int], compile_only: bool) -> None:
    """Partial products into the workspace, summed into gemm.out by each tile's last split."""
    a, b, out = gemm.a, gemm.b, gemm.out
    M, N, K = gemm.mnk
    workspace = _workspace(gemm, tunables["SPLIT_K"])
    tiles = tile_count(M, N, tunables)
    epilogue, epilogue_flags = epilogue_args(gemm)
    wrap_m, wrap_n = wrap_point(M, gemm.a_buffer_rows), wrap_point(N, gemm.b_buffer_cols)
    start(_splitk_kernel, (tiles, tunables["SPLIT_K"]),
          (a, b, workspace, _arrivals(gemm, tiles), out, M, N, K, wrap_m, wrap_n,
           *a.stride(), *b.stride(), *out.stride(), *epilogue), dict(
              SUM_SPLITS=sum_splits(tunables), EVEN_K=K % tunables["BLOCK_K"] == 0,
              HINT_M=wrap_keeps_vectors(wrap_m), HINT_N=wrap_keeps_vectors(wrap_n),
              INT64_OFFSETS=needs_int64(a, b, out, workspace),
              **dot_options(gemm), **epilogue_flags,
              **tunables,  # BLOCK_M/N/K, SPLIT_K constexprs; num_stages, num_warps
          ), compile_only)


# Shared memory for the fp32 partial tile's layout change before a wgmma tile stores it:
# Triton's figures reach the whole tile (BLOCK_M × BLOCK_N × 4 bytes) but never more than
# 64 KiB (benchmarks/constraint_accuracy.py compares them).
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
    params=("BLOCK_M", "BLOCK_N", "BLOCK_K", "SPLIT_K", "num_stages", "num_warps"),
    launch=launch,
    smem_bytes=smem_bytes,
    source_path=Path(__file__),
    unsupported=unsupported,
    short_names={**TILE_SHORT_NAMES, "SPLIT_K": "SK"},
    expand_op="mm_splitk",
    model_seconds=splitk_cost.seconds,
)
