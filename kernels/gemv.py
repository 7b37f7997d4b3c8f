"""The matrix-vector product y = A @ x, the N == 1 case of the GEMM.

With one output column a tensor-core tile would be almost all padding, and the work is bound
by reading A once. So each program reduces BLOCK_M rows of A against x on the CUDA cores:
multiply in fp32, sum over K.
"""
from __future__ import annotations

from pathlib import Path

import torch
import triton
import triton.language as tl

from tuner.kernels._launch import needs_int64
from tuner.kernels.base import Config, Kernel


@triton.jit
def _gemv_kernel(
    a_ptr, x_ptr, y_ptr, M, K,
    stride_am, stride_ak, stride_xk, stride_ym,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0: no K mask needed
    INT64_OFFSETS: tl.constexpr,  # some offset may overflow int32
):
    if INT64_OFFSETS:
        # Every offset below is index * stride, so wide strides make all of them int64.
        stride_am, stride_ak = tl.cast(stride_am, tl.int64), tl.cast(stride_ak, tl.int64)
        stride_xk, stride_ym = tl.cast(stride_xk, tl.int64), tl.cast(stride_ym, tl.int64)

    # Rows past M wrap around onto valid ones, so A loads need only the K mask; their sums
    # land in y rows the store masks off. The hints let a unit-stride M vectorize; they are
    # exact except on the last block, where the wrapping lanes only feed masked-off rows.
    first_row = tl.program_id(0) * BLOCK_M
    rows = (first_row + tl.arange(0, BLOCK_M)) % M
    rows = tl.max_contiguous(tl.multiple_of(rows, BLOCK_M), BLOCK_M)
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak
    x_ptrs = x_ptr + ks * stride_xk

    acc = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k_step in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            x = tl.load(x_ptrs)
        else:
            k_left = K - k_step * BLOCK_K
            a = tl.load(a_ptrs, mask=ks[None, :] < k_left, other=0.0)
            x = tl.load(x_ptrs, mask=ks < k_left, other=0.0)
        acc += tl.sum(a.to(tl.float32) * x.to(tl.float32)[None, :], axis=1)
        a_ptrs += BLOCK_K * stride_ak
        x_ptrs += BLOCK_K * stride_xk

    out_rows = first_row + tl.arange(0, BLOCK_M)
    tl.store(y_ptr + out_rows * stride_ym, acc.to(y_ptr.dtype.element_ty), mask=out_rows < M)


def bind(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, config: Config,
         allow_tf32: bool) -> tuple:
    """Grid, arguments and constexprs of out = a @ b for b of shape (K, 1).

    allow_tf32 is accepted for the common signature and ignored: this kernel uses no tensor
    cores, so fp32 is always multiplied in IEEE fp32.
    """
    M, K = a.shape
    grid = (triton.cdiv(M, config["BLOCK_M"]),)
    args = (a, b, out, M, K, *a.stride(), b.stride(0), out.stride(0))
    return grid, args, dict(
        EVEN_K=K % config["BLOCK_K"] == 0,
        INT64_OFFSETS=needs_int64(a, b, out),
        **config,  # BLOCK_M/K constexprs; num_stages and num_warps options
    )


def smem_bytes(config: Config, itemsize: int) -> int:
    """Shared memory if Triton pipelines the loads: num_stages buffered A tiles and x slices."""
    tile_elements = config["BLOCK_M"] * config["BLOCK_K"] + config["BLOCK_K"]
    return config["num_stages"] * tile_elements * itemsize


GEMV = Kernel(
    name="gemv",
    params=("BLOCK_M", "BLOCK_K", "num_stages", "num_warps"),
    jit_fn=_gemv_kernel,
    bind=bind,
    smem_bytes=smem_bytes,
    source_path=Path(__file__),
)
