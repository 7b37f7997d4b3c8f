"""The `general` variant: C = A @ B for any M, N, K >= 1 and any strides of A, B and C.

Each program computes one BLOCK_M x BLOCK_N tile of C, walking K in BLOCK_K steps with fp32
accumulation on tensor cores. Programs are ordered in groups of GROUP_M tile rows so that
programs running at the same time share A rows and B columns in L2.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import triton
import triton.language as tl

from tuner.kernels import general_cost
from tuner.kernels._epilogue import apply_epilogue
from tuner.kernels._launch import (
    dot_options,
    epilogue_args,
    needs_int64,
    tile_count,
    wrap_keeps_vectors,
    wrap_point,
)
from tuner.kernels._mainloop import accumulate_k_steps, grouped_tile, wrapped_indices
from tuner.kernels.base import TILE_PARAMS, TILE_SHORT_NAMES, Gemm, Variant
from tuner.kernels.launches import start
from tuner.kernels.mma import pipeline_smem_bytes


@triton.jit
def _matmul_kernel(
    a_ptr, b_ptr, c_ptr, M, N, K,
    wrap_m, wrap_n,  # rows of A and columns of B wrap here (_launch.wrap_point)
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    bias_ptr, scale_a_ptr, scale_b_ptr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0: no K mask needed
    HINT_M: tl.constexpr, HINT_N: tl.constexpr,  # contiguity hints hold (wrap_keeps_vectors)
    INT64_OFFSETS: tl.constexpr,  # some offset may overflow int32
    DOT_UPCAST: tl.constexpr,  # multiply in fp32 (interpreter workaround, _launch.py)
    INPUT_PRECISION: tl.constexpr,  # "ieee" / "tf32" for fp32 inputs, None (default) else
    HAS_BIAS: tl.constexpr, SCALED: tl.constexpr,  # epilogue (_epilogue.py)
):
    if INT64_OFFSETS:
        # Every offset below is index * stride, so wide strides make all of them int64.
        stride_am, stride_ak = tl.cast(stride_am, tl.int64), tl.cast(stride_ak, tl.int64)
        stride_bk, stride_bn = tl.cast(stride_bk, tl.int64), tl.cast(stride_bn, tl.int64)
        stride_cm, stride_cn = tl.cast(stride_cm, tl.int64), tl.cast(stride_cn, tl.int64)

    tile_m, tile_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)

    rows = wrapped_indices(tile_m * BLOCK_M, wrap_m, BLOCK_M, HINT_M)
    cols = wrapped_indices(tile_n * BLOCK_N, wrap_n, BLOCK_N, HINT_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc = accumulate_k_steps(acc, a_ptr, b_ptr, rows, cols, K, 0, tl.cdiv(K, BLOCK_K),
                             stride_am, stride_ak, stride_bk, stride_bn,
                             BLOCK_K, EVEN_K, DOT_UPCAST, INPUT_PRECISION)

    out_rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    out_cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = apply_epilogue(acc, out_cols, N, bias_ptr, scale_a_ptr, scale_b_ptr, HAS_BIAS, SCALED)
    c_ptrs = c_ptr + out_rows[:, None] * stride_cm + out_cols[None, :] * stride_cn
    in_bounds = (out_rows[:, None] < M) & (out_cols[None, :] < N)
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=in_bounds)


def launch(gemm: Gemm, tunables: Mapping[str, int], compile_only: bool) -> None:
    a, b, out = gemm.a, gemm.b, gemm.out
    (M, N, K) = gemm.mnk
    grid = (tile_count(M, N, tunables),)
    epilogue, epilogue_flags = epilogue_args(gemm)
    wrap_m, wrap_n = wrap_point(M, gemm.a_buffer_rows), wrap_point(N, gemm.b_buffer_cols)
    args = (a, b, out, M, N, K, wrap_m, wrap_n, *a.stride(), *b.stride(), *out.stride(),
            *epilogue)
    start(_matmul_kernel, grid, args, dict(
        EVEN_K=K % tunables["BLOCK_K"] == 0,
        HINT_M=wrap_keeps_vectors(wrap_m), HINT_N=wrap_keeps_vectors(wrap_n),
        INT64_OFFSETS=needs_int64(a, b, out),
        **dot_options(gemm), **epilogue_flags,
        **tunables,  # BLOCK_M/N/K and GROUP_M constexprs; num_stages and num_warps options
    ), compile_only)


GENERAL = Variant(
    name="general",
    params=TILE_PARAMS,
    launch=launch,
    smem_bytes=pipeline_smem_bytes,
    source_path=Path(__file__),
    short_names=TILE_SHORT_NAMES,
    # FlagGems' mm_general_tma op covers the pointer and the TMA paths (it takes TMA whenever
    # strides allow), so the general, tma and persistent variants all export to it.
    expand_op="mm_general_tma",
    model_seconds=general_cost.seconds,
)
