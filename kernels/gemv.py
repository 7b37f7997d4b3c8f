"""The `gemv` variant: the matrix-vector product y = A @ x, for GEMMs with N == 1 or M == 1.

With one output column a tensor-core tile would be almost all padding, and the work is bound
by reading A once. So each program reduces BLOCK_M rows of A against x on the CUDA cores:
multiply in fp32, sum over K. A single-row GEMM (M == 1, decode) is the same product
transposed: out^T = B^T @ a^T, with B^T read through its strides, never copied.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import triton
import triton.language as tl

from tuner.kernels import gemv_cost
from tuner.kernels._launch import (
    cdiv,
    epilogue_args,
    needs_int64,
    wrap_keeps_vectors,
    wrap_point,
)
from tuner.kernels._mainloop import wrapped_indices
from tuner.kernels.base import TILE_SHORT_NAMES, Gemm, Variant
from tuner.kernels.launches import start
from tuner.kernels.mma import TileOperands


@triton.jit
def _gemv_kernel(
    a_ptr, x_ptr, y_ptr, M, K,
    wrap_m,  # rows of A wrap here (_launch.wrap_point)
    stride_am, stride_ak, stride_xk, stride_ym,
    bias_ptr, stride_bias, scale_a_ptr, scale_b_ptr,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0: no K mask needed
    HINT_M: tl.constexpr,  # the contiguity hint holds (_launch.wrap_keeps_vectors)
    INT64_OFFSETS: tl.constexpr,  # some offset may overflow int32
    HAS_BIAS: tl.constexpr, SCALED: tl.constexpr,  # as in _epilogue.py, along y
):
    if INT64_OFFSETS:
        # Every offset below is index * stride, so wide strides make all of them int64.
        stride_am, stride_ak = tl.cast(stride_am, tl.int64), tl.cast(stride_ak, tl.int64)
        stride_xk, stride_ym = tl.cast(stride_xk, tl.int64), tl.cast(stride_ym, tl.int64)

    first_row = tl.program_id(0) * BLOCK_M
    rows = wrapped_indices(first_row, wrap_m, BLOCK_M, HINT_M)
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak
    x_ptrs = x_ptr + ks * stride_xk

    # Products accumulate elementwise and are summed over K once, after the loop: a sum per
    # step would shuffle across threads on every step, and the loop should only stream A.
    # A is read once, x by every program: A's lines leave L2 first, so x's stay.
    acc = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    for k_step in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs, eviction_policy="evict_first")
            x = tl.load(x_ptrs, eviction_policy="evict_last")
        else:
            k_left = K - k_step * BLOCK_K
            a = tl.load(a_ptrs, mask=ks[None, :] < k_left, other=0.0,
                        eviction_policy="evict_first")
            x = tl.load(x_ptrs, mask=ks < k_left, other=0.0, eviction_policy="evict_last")
        acc += a.to(tl.float32) * x.to(tl.float32)[None, :]
        a_ptrs += BLOCK_K * stride_ak
        x_ptrs += BLOCK_K * stride_xk
    y = tl.sum(acc, axis=1)

    out_rows = first_row + tl.arange(0, BLOCK_M)
    if SCALED:
        y = y * (tl.load(scale_a_ptr) * tl.load(scale_b_ptr))
    if HAS_BIAS:  # stride_bias 0: one bias for every row (N == 1)
        y += tl.load(bias_ptr + out_rows * stride_bias, mask=out_rows < M).to(tl.float32)
    tl.store(y_ptr + out_rows * stride_ym, y.to(y_ptr.dtype.element_ty), mask=out_rows < M)


def _as_gemv(gemm: Gemm):
    """(A, x, y, rows of A's buffer) with y = A @ x: the GEMM itself when N == 1, its
    transpose when M == 1."""
    M, N, _ = gemm.mnk
    if N == 1:
        return gemm.a, gemm.b[:, 0], gemm.out[:, 0], gemm.a_buffer_rows
    return gemm.b.t(), gemm.a[0, :], gemm.out[0, :], gemm.b_buffer_cols


def launch(gemm: Gemm, tunables: Mapping[str, int], compile_only: bool) -> None:
    a, x, y, buffer_rows = _as_gemv(gemm)
    (M, K) = a.shape
    wrap_m = wrap_point(M, buffer_rows)
    (bias, *scales), epilogue_flags = epilogue_args(gemm)
    # The bias runs along N: one value for all of y when N == 1, one per element of y else.
    stride_bias = 0 if gemm.bias is None or gemm.mnk[1] == 1 else bias.stride(0)
    args = (a, x, y, M, K, wrap_m, *a.stride(), x.stride(0), y.stride(0), bias, stride_bias,
            *scales)
    start(_gemv_kernel, (cdiv(M, tunables["BLOCK_M"]),), args, dict(
        EVEN_K=K % tunables["BLOCK_K"] == 0,
        HINT_M=wrap_keeps_vectors(wrap_m),
        INT64_OFFSETS=needs_int64(a, x, y),
        **epilogue_flags,
        **tunables,  # BLOCK_M/K constexprs; num_stages and num_warps options
    ), compile_only)


def unsupported(gemm: Gemm, tunables: Mapping[str, int]) -> str | None:
    M, N, _ = gemm.mnk
    return None if M == 1 or N == 1 else f"gemv needs M == 1 or N == 1, not {M}×{N}"


def smem_bytes(tunables: Mapping[str, int], operands: TileOperands) -> int:
    """Shared memory if Triton pipelines the loads: at most num_stages buffered A tiles and x
    slices (not measured against Triton's figures, so the tile kernels' num_stages - 1 off
    the CUDA cores is not assumed)."""
    tile_elements = tunables["BLOCK_M"] * tunables["BLOCK_K"] + tunables["BLOCK_K"]
    return tunables["num_stages"] * tile_elements * operands.itemsize


GEMV = Variant(
    name="gemv",
    params=("BLOCK_M", "BLOCK_K", "num_stages", "num_warps"),
    launch=launch,
    smem_bytes=smem_bytes,
    source_path=Path(__file__),
    unsupported=unsupported,
    short_names={p: TILE_SHORT_NAMES[p] for p in ("BLOCK_M", "BLOCK_K", "num_stages",
                                                  "num_warps")},
    expand_op="gemv",
    model_seconds=gemv_cost.seconds,
)
