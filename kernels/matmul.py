"""The general GEMM, C = A @ B, for any M, N, K >= 1 and any strides of A, B and C.

Each program computes one BLOCK_M x BLOCK_N tile of C, walking K in BLOCK_K steps with fp32
accumulation on tensor cores. Programs are ordered in groups of GROUP_M tile rows so that
programs running at the same time share A rows and B columns in L2.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch
import triton
import triton.language as tl

from tuner.kernels._launch import needs_int64
from tuner.kernels.base import Config, Kernel

# Triton picks the interpreter when @triton.jit runs, i.e. when this module is imported, so
# reading the switch at the same moment says what the kernel below will run on.
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _matmul_kernel(
    a_ptr, b_ptr, c_ptr, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0: no K mask needed
    INT64_OFFSETS: tl.constexpr,  # some offset may overflow int32
    DOT_UPCAST: tl.constexpr,  # multiply in fp32 (interpreter bf16 workaround, see launch)
    INPUT_PRECISION: tl.constexpr,  # "ieee" / "tf32" for fp32 inputs, None (default) else
):
    if INT64_OFFSETS:
        # Every offset below is index * stride, so wide strides make all of them int64.
        stride_am, stride_ak = tl.cast(stride_am, tl.int64), tl.cast(stride_ak, tl.int64)
        stride_bk, stride_bn = tl.cast(stride_bk, tl.int64), tl.cast(stride_bn, tl.int64)
        stride_cm, stride_cn = tl.cast(stride_cm, tl.int64), tl.cast(stride_cn, tl.int64)

    # Grouped tile order: consecutive programs fill a column of GROUP_M tiles before moving
    # to the next tile column, so they reuse the same A rows and B columns from L2.
    # GROUP_M == 1 is plain row-major order.
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(N, BLOCK_N)
    tiles_per_group = GROUP_M * tiles_n
    first_tile_m = (pid // tiles_per_group) * GROUP_M
    group_rows = min(tl.cdiv(M, BLOCK_M) - first_tile_m, GROUP_M)  # the last group may be short
    tile_m = first_tile_m + (pid % tiles_per_group) % group_rows
    tile_n = (pid % tiles_per_group) // group_rows

    # Rows past M and columns past N wrap around onto valid ones, so A and B loads need only
    # the K mask; what those lanes compute lands in C rows/columns the store masks off.
    # The contiguity hints let the compiler vectorize loads along a unit-stride M or N; they
    # are exact except on the last tile, where the wrapping lanes only feed masked-off output.
    rows = (tile_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    cols = (tile_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    rows = tl.max_contiguous(tl.multiple_of(rows, BLOCK_M), BLOCK_M)
    cols = tl.max_contiguous(tl.multiple_of(cols, BLOCK_N), BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak
    b_ptrs = b_ptr + ks[:, None] * stride_bk + cols[None, :] * stride_bn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k_step in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = K - k_step * BLOCK_K
            a = tl.load(a_ptrs, mask=ks[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=ks[:, None] < k_left, other=0.0)
        if DOT_UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    out_rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    out_cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + out_rows[:, None] * stride_cm + out_cols[None, :] * stride_cn
    in_bounds = (out_rows[:, None] < M) & (out_cols[None, :] < N)
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=in_bounds)


def bind(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, config: Config,
         allow_tf32: bool) -> tuple:
    """Grid, arguments and constexprs of out = a @ b for one config.

    fp32 inputs multiply in IEEE fp32 unless allow_tf32; fp16/bf16 use tensor cores as is.
    """
    (M, K), N = a.shape, b.shape[1]
    is_fp32 = a.dtype == torch.float32
    grid = (triton.cdiv(M, config["BLOCK_M"]) * triton.cdiv(N, config["BLOCK_N"]),)
    args = (a, b, out, M, N, K, *a.stride(), *b.stride(), *out.stride())
    return grid, args, dict(
        EVEN_K=K % config["BLOCK_K"] == 0,
        INT64_OFFSETS=needs_int64(a, b, out),
        # The interpreter's tl.dot multiplies bf16 operands as their raw uint16 bit patterns
        # (triton issue #11584; Triton's docs: the interpreter has no bf16 arithmetic), so
        # under it bf16 tiles go to fp32 first. Compiled kernels never take this path.
        DOT_UPCAST=_INTERPRETED and a.dtype == torch.bfloat16,
        INPUT_PRECISION=("tf32" if allow_tf32 else "ieee") if is_fp32 else None,
        **config,  # BLOCK_M/N/K and GROUP_M constexprs; num_stages and num_warps options
    )


def smem_bytes(config: Config, itemsize: int) -> int:
    """Shared memory of the software pipeline: num_stages buffered A and B tiles."""
    tile_elements = config["BLOCK_M"] * config["BLOCK_K"] + config["BLOCK_K"] * config["BLOCK_N"]
    return config["num_stages"] * tile_elements * itemsize


MM = Kernel(
    name="mm",
    params=("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_stages", "num_warps"),
    jit_fn=_matmul_kernel,
    bind=bind,
    smem_bytes=smem_bytes,
    source_path=Path(__file__),
)
