"""The `kreduce` variant: C = A @ B for outputs too small for tensor cores, K split among
K_SLICES programs that each reduce their slice of K for the whole output on the CUDA cores.

A 2×2×65536 GEMM is a reduction, not a matrix product: tl.dot takes tiles of 16 or more a
side, so a tile kernel computes 256 outputs to keep 4, and, where B's rows are 8 bytes apart,
its loads cannot be vectors (padding copies the operands first: a whole pass over them
before the GEMM). Here a program loads its slice of A's M rows and B's N columns as they lie,
any strides, multiplies them elementwise in fp32 into a BLOCK_M×BLOCK_N×BLOCK_K accumulator
(M and N rounded up to powers of two) and sums it over K once, after its loop, as the gemv
variant does. Its partial output goes to its own slice of an fp32 workspace, and the last
program sums the slices in a fixed order (kernels/_partials.py): deterministic, one launch,
replayable.

fp32 multiplies in IEEE fp32 whether or not tf32 is allowed (the CUDA cores have no tf32;
the result is as accurate as IEEE tiles'), every other dtype converts to fp32 first.
FlagGems has no op for such a kernel: its mm ops are tensor-core tiles.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
import triton
import triton.language as tl

from tuner.kernels import kreduce_cost
from tuner.kernels._epilogue import apply_epilogue
from tuner.kernels._launch import cdiv, epilogue_args, needs_int64
from tuner.kernels._mainloop import wrapped_indices
from tuner.kernels._partials import arrives_last, slices_summed_at_once, summed_slices
from tuner.kernels.base import (
    CUDA_CORE_ACCUMULATOR_REGS,
    MIN_DOT_TILE,
    TILE_SHORT_NAMES,
    Gemm,
    Variant,
    accumulator_refusal,
)
from tuner.kernels.launches import start
from tuner.kernels.mma import TileOperands
from tuner.kernels.workspace import WORKSPACE

# The largest output, M and N rounded up to powers of two: one tensor-core tile. A larger
# output fills tl.dot's tiles, which do its multiplies at many times the CUDA cores' rate.
MAX_OUTPUTS = MIN_DOT_TILE * MIN_DOT_TILE


@triton.jit
def _kreduce_kernel(
    a_ptr, b_ptr, ws_ptr, arrivals_ptr, c_ptr, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    bias_ptr, scale_a_ptr, scale_b_ptr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,  # M and N rounded up to powers of two
    WRAP_M: tl.constexpr, WRAP_N: tl.constexpr,  # M (N) is not a power of two
    BLOCK_K: tl.constexpr, K_SLICES: tl.constexpr,
    SUM_SLICES: tl.constexpr,  # slices the fix-up adds per step (_partials.py)
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0: no K mask needed
    INT64_OFFSETS: tl.constexpr,  # some offset may overflow int32
    HAS_BIAS: tl.constexpr, SCALED: tl.constexpr,  # epilogue (_epilogue.py)
):
    """Program `slice`: the fp32 product over its slice of K into the workspace; the last
    program to arrive then writes C."""
    if INT64_OFFSETS:
        # Every offset below is index * stride, so wide strides make all of them int64.
        stride_am, stride_ak = tl.cast(stride_am, tl.int64), tl.cast(stride_ak, tl.int64)
        stride_bk, stride_bn = tl.cast(stride_bk, tl.int64), tl.cast(stride_bn, tl.int64)
        stride_cm, stride_cn = tl.cast(stride_cm, tl.int64), tl.cast(stride_cn, tl.int64)

    # Balanced contiguous slices of BLOCK_K steps, as split-K's: none empty while
    # K_SLICES <= steps (`unsupported`).
    steps = tl.cdiv(K, BLOCK_K)
    first_step = tl.program_id(0) * steps // K_SLICES
    end_step = (tl.program_id(0) + 1) * steps // K_SLICES

    # Rows (columns) past M (N) wrap onto real ones: no mask on the loads, and what they
    # compute lands in partials the store masks off. Where none do, the indices stay a plain
    # range, which lets the compiler vectorize loads along a unit stride of M (N).
    rows = tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    if WRAP_M:
        rows = wrapped_indices(0, M, BLOCK_M, False)
    if WRAP_N:
        cols = wrapped_indices(0, N, BLOCK_N, False)
    ks = first_step * BLOCK_K + tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak  # BLOCK_M×BLOCK_K
    b_ptrs = b_ptr + cols[:, None] * stride_bn + ks[None, :] * stride_bk  # BLOCK_N×BLOCK_K
    acc = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k_step in range(first_step, end_step):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = K - k_step * BLOCK_K
            in_k = tl.arange(0, BLOCK_K)[None, :] < k_left
            a = tl.load(a_ptrs, mask=in_k, other=0.0)
            b = tl.load(b_ptrs, mask=in_k, other=0.0)
        acc += a.to(tl.float32)[:, None, :] * b.to(tl.float32)[None, :, :]
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    partial = tl.sum(acc, axis=2)

    out_rows = tl.arange(0, BLOCK_M)
    out_cols = tl.arange(0, BLOCK_N)
    in_bounds = (out_rows[:, None] < M) & (out_cols[None, :] < N)
    ws_ptrs = ws_ptr + out_rows[:, None] * N + out_cols[None, :]  # contiguous [K_SLICES, M, N]
    tl.store(ws_ptrs + tl.program_id(0) * M * N, partial, mask=in_bounds)
    if arrives_last(arrivals_ptr, K_SLICES):
        total = summed_slices(ws_ptrs, in_bounds, M * N, K_SLICES, SUM_SLICES, BLOCK_M,
                              BLOCK_N)
        total = apply_epilogue(total, out_cols, N, bias_ptr, scale_a_ptr, scale_b_ptr,
                               HAS_BIAS, SCALED)
        c_ptrs = c_ptr + out_rows[:, None] * stride_cm + out_cols[None, :] * stride_cn
        tl.store(c_ptrs, total.to(c_ptr.dtype.element_ty), mask=in_bounds)


def output_block(M: int, N: int) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N): the output's sides rounded up to powers of two (tl.arange's)."""
    return triton.next_power_of_2(M), triton.next_power_of_2(N)


def accumulator_regs(M: int, N: int, tunables: Mapping[str, int]) -> int:
    """Registers per thread of the fp32 BLOCK_M×BLOCK_N×BLOCK_K accumulator."""
    block_m, block_n = output_block(M, N)
    return block_m * block_n * tunables["BLOCK_K"] // (32 * tunables["num_warps"])


def launch(gemm: Gemm, tunables: Mapping[str, int], compile_only: bool) -> None:
    """Partial products into the workspace, summed into gemm.out by the last program."""
    a, b, out = gemm.a, gemm.b, gemm.out
    M, N, K = gemm.mnk
    slices = tunables["K_SLICES"]
    workspace = WORKSPACE.get(("kreduce-partials", M, N, K), (slices, M, N), torch.float32,
                              out.device)
    # The count of programs done: zeros, and left as zeros by every call.
    arrivals = WORKSPACE.get(("kreduce-arrivals", M, N, K), (1,), torch.int32, out.device)
    block_m, block_n = output_block(M, N)
    epilogue, epilogue_flags = epilogue_args(gemm)
    start(_kreduce_kernel, (slices,),
          (a, b, workspace, arrivals, out, M, N, K, *a.stride(), *b.stride(), *out.stride(),
           *epilogue), dict(
              BLOCK_M=block_m, BLOCK_N=block_n, WRAP_M=block_m != M, WRAP_N=block_n != N,
              SUM_SLICES=slices_summed_at_once(block_m * block_n, slices),
              EVEN_K=K % tunables["BLOCK_K"] == 0,
              INT64_OFFSETS=needs_int64(a, b, out, workspace),
              **epilogue_flags,
              **tunables,  # BLOCK_K, K_SLICES constexprs; num_stages, num_warps
          ), compile_only)


def unsupported(gemm: Gemm, tunables: Mapping[str, int]) -> str | None:
    """Why this config cannot (or should not) run this call, or None: an output past one
    tensor-core tile, an accumulator that would spill, or more slices than BLOCK_K steps
    (slices with no work cost a program and a partial and add nothing)."""
    M, N, K = gemm.mnk
    block_m, block_n = output_block(M, N)
    if block_m * block_n > MAX_OUTPUTS:
        return (f"kreduce: {M}×{N} outputs (rounded up to {block_m}×{block_n}) exceed "
                f"{MAX_OUTPUTS}: tensor-core tiles compute them")
    if why := accumulator_refusal(accumulator_regs(M, N, tunables), CUDA_CORE_ACCUMULATOR_REGS):
        return why
    steps = cdiv(K, tunables["BLOCK_K"])
    if tunables["K_SLICES"] > steps:
        return (f"K_SLICES {tunables['K_SLICES']} > {steps} BLOCK_K steps of K={K}: "
                "some slices would get no work")
    return None


def smem_bytes(tunables: Mapping[str, int], operands: TileOperands) -> int:
    """Shared memory if Triton pipelines the loads, as the gemv variant counts it: at most
    num_stages steps of A's and B's slices. The slices' widths are the call's own, which a
    config does not know, so one tensor-core tile's worth (MIN_DOT_TILE rows and columns)."""
    step = 2 * MIN_DOT_TILE * tunables["BLOCK_K"] * operands.itemsize
    return tunables["num_stages"] * step


KREDUCE = Variant(
    name="kreduce",
    params=("BLOCK_K", "K_SLICES", "num_stages", "num_warps"),
    launch=launch,
    smem_bytes=smem_bytes,
    source_path=Path(__file__),
    unsupported=unsupported,
    takes_pad=False,  # reads any strides in place: a pad copy only adds a pass
    short_names={**{p: TILE_SHORT_NAMES[p] for p in ("BLOCK_K", "num_stages", "num_warps")},
                 "K_SLICES": "KS"},
    no_expand_op=("a CUDA-core reduction for tiny outputs: FlagGems' mm ops are tensor-core "
                  "tiles"),
    model_seconds=kreduce_cost.seconds,
)
