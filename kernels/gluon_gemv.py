"""The `gluongemv` variant: mmagemv's walk (kernels/gemv.py) written in Gluon, so that the
matrix goes from global memory straight into the registers an MMA reads.

mmagemv's tl.dot decides its own operand layouts: the matrix's tile is loaded in one
layout and converted (through shared memory, or pipelined into it) before the MMA. Here
every load already lands in the layout of mma.sync's operands (Gluon's DotOperandLayout),
with k_width 8: each thread holds 8 consecutive K elements of a row, one 16-byte load. An
m16n8k16 MMA takes a row's 16 K elements from 4 threads, two pairs each; k_width 8 hands
each MMA a permutation of K instead, the same one for both operands, so their products sum
to the same result. Nothing passes through shared memory until the warps' sums are added.

- A program takes BLOCK_M rows of the matrix (16 per MMA block) and all the vectors, padded
  to 8 (the MMA's N) or 16.
- Its warps split each K step: warp w multiplies K elements [w·BLOCK_K, (w+1)·BLOCK_K) of
  it, so a program streams num_warps·BLOCK_K columns of its rows per step, and the warps'
  accumulators (a batched MMA, one batch per warp) are summed once, at the end.
- num_stages 2 issues the next step's loads before this step's MMA, a register double
  buffer; 1 loads, then multiplies.

On an H100 at decode batch 6-8 it ran Llama-3-8B's projections 1.03-1.14x cuBLAS (the best
config of each, timed alone with L2 flushed; mmagemv's best 1.01-1.03x where measured
beside it). Inside the model's graphed decode step the gate and up weights stream at
cuBLAS's pace (both near 2.8 TB/s), the down and attention weights 1.07-1.14x faster
(benchmarks/results/vs-cublas/README.md). The matrix must be K-contiguous (as nn.Linear
stores its weight) and 16-bit; the vectors may have any strides.
"""
from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path

from tuner.kernels import gemv_cost, gluon_mm
from tuner.kernels._launch import cdiv, epilogue_args, needs_int64
from tuner.kernels.base import TILE_SHORT_NAMES, Gemm, Variant, accumulator_refusal
from tuner.kernels.gemv import MAX_MMA_VECTORS, as_gemv, bias_strides, vectors
from tuner.kernels.gluon_mm import gl, gluon_jit
from tuner.kernels.launches import start
from tuner.kernels.mma import TileOperands

try:
    from triton.experimental.gluon.language.nvidia.ampere import mma_v2
except ImportError:  # no Gluon: gluon_mm.toolchain_problem refuses every call
    mma_v2 = None

# mma.sync's tile: 16 rows, 8 columns (vectors), and 16 K elements, each thread's k_width 8
# of them one 16-byte load of a 16-bit operand.
MMA_ROWS = 16
MMA_VECTORS = 8
K_WIDTH = 8
# The sm number from which mma.sync takes bf16 (Ampere).
MIN_ARCH = 80
# Register double buffering: one step ahead at most.
MAX_STAGES = 2


@gluon_jit()
def _load_step(a_ptrs, x_ptrs, in_v, k0, K, stride_xk, a_ks, x_ks, MASK_K: gl.constexpr):
    """One K step of the matrix and the vectors from column k0, masked past K if MASK_K
    (a_ks, x_ks: each operand's K offsets within the step; the matrix's K stride is 1)."""
    x_ptrs += k0 * stride_xk
    if MASK_K:
        a = gl.load(a_ptrs + k0, mask=a_ks < K - k0, other=0.0, eviction_policy="evict_first")
        x = gl.load(x_ptrs, mask=in_v & (x_ks < K - k0), other=0.0,
                    eviction_policy="evict_last")
    else:
        a = gl.load(a_ptrs + k0, eviction_policy="evict_first")
        x = gl.load(x_ptrs, mask=in_v, other=0.0, eviction_policy="evict_last")
    return a, x


@gluon_jit()
def _gluon_gemv_kernel(
    a_ptr, x_ptr, y_ptr, M, K, VECTORS,
    stride_am, stride_xk, stride_xv, stride_ym, stride_yv,
    bias_ptr, stride_bias_m, stride_bias_v, scale_a_ptr, scale_b_ptr,
    BLOCK_M: gl.constexpr, BLOCK_K: gl.constexpr, BLOCK_V: gl.constexpr,
    STAGES: gl.constexpr,  # 2: the next step's loads issued before this step's MMA
    EVEN_K: gl.constexpr,  # K % (num_warps * BLOCK_K) == 0: no masked last step
    INT64_OFFSETS: gl.constexpr,  # some offset may overflow int32
    HAS_BIAS: gl.constexpr, SCALED: gl.constexpr,  # as in _epilogue.py, along Y
):
    """Y[m, v] = sum_k A[m, k] X[k, v] for BLOCK_M rows m of A (K-contiguous) and every
    vector v. A is read once, X by every program: A's loads ask for its lines to leave L2
    first, X's to stay."""
    if INT64_OFFSETS:
        # Every offset below is index * stride, so wide strides make all of them int64.
        stride_am = gl.cast(stride_am, gl.int64)
        stride_xk, stride_xv = gl.cast(stride_xk, gl.int64), gl.cast(stride_xv, gl.int64)
        stride_ym, stride_yv = gl.cast(stride_ym, gl.int64), gl.cast(stride_yv, gl.int64)
    WARPS: gl.constexpr = gl.num_warps()
    # Batched MMA: dimension 0 is the warp, each taking its own BLOCK_K of every step;
    # mma.sync's 16×8 tile (MMA_ROWS × MMA_VECTORS), operands of k_width K_WIDTH.
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[2, 0], warps_per_cta=[WARPS, 1, 1], instr_shape=[1, 16, 8])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout,
                                                 k_width=8)
    x_layout: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=acc_layout,
                                                 k_width=8)
    first_row = gl.program_id(0) * BLOCK_M

    # A: [warp, row, K], rows past M read row M - 1 (their results are never stored).
    a_rows_layout: gl.constexpr = gl.SliceLayout(2, a_layout)
    a_warps = gl.arange(0, WARPS, layout=gl.SliceLayout(1, a_rows_layout))
    rows = first_row + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, a_rows_layout))
    rows = gl.minimum(rows, M - 1)
    a_ks = ((a_warps * BLOCK_K)[:, None, None]
            + gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, gl.SliceLayout(1, a_layout)))
            [None, None, :])
    a_ptrs = a_ptr + rows[None, :, None] * stride_am + a_ks
    # X: [warp, K, vector].
    x_ks_layout: gl.constexpr = gl.SliceLayout(2, x_layout)
    x_warps = gl.arange(0, WARPS, layout=gl.SliceLayout(1, x_ks_layout))
    x_ks = ((x_warps * BLOCK_K)[:, None, None]
            + gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, x_ks_layout))[None, :, None])
    vs = gl.arange(0, BLOCK_V, layout=gl.SliceLayout(0, gl.SliceLayout(1, x_layout)))
    x_ptrs = x_ptr + x_ks * stride_xk + vs[None, None, :] * stride_xv
    in_v = vs[None, None, :] < VECTORS

    STEP: gl.constexpr = WARPS * BLOCK_K
    full_steps = K // STEP
    acc = gl.zeros([WARPS, BLOCK_M, BLOCK_V], gl.float32, layout=acc_layout)
    if STAGES == 1:
        for step in range(full_steps):
            a, x = _load_step(a_ptrs, x_ptrs, in_v, step * STEP, K, stride_xk, a_ks, x_ks,
                              False)
            acc = mma_v2(a, x, acc)
    else:  # `unsupported` asks for a full step at least
        a, x = _load_step(a_ptrs, x_ptrs, in_v, 0, K, stride_xk, a_ks, x_ks, False)
        for step in range(1, full_steps):
            a_next, x_next = _load_step(a_ptrs, x_ptrs, in_v, step * STEP, K, stride_xk, a_ks,
                                        x_ks, False)
            acc = mma_v2(a, x, acc)
            a, x = a_next, x_next
        acc = mma_v2(a, x, acc)
    if not EVEN_K:
        a, x = _load_step(a_ptrs, x_ptrs, in_v, full_steps * STEP, K, stride_xk, a_ks, x_ks,
                          True)
        acc = mma_v2(a, x, acc)

    y = gl.sum(acc, axis=0)  # the warps' sums: [row, vector]
    y_layout: gl.constexpr = gl.SliceLayout(0, acc_layout)
    out_rows = first_row + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, y_layout))
    out_vs = gl.arange(0, BLOCK_V, layout=gl.SliceLayout(0, y_layout))
    in_y = (out_rows[:, None] < M) & (out_vs[None, :] < VECTORS)
    if SCALED:
        y = y * (gl.load(scale_a_ptr) * gl.load(scale_b_ptr))
    if HAS_BIAS:  # the bias runs along N: along Y's rows or along its vectors
        y += gl.load(bias_ptr + out_rows[:, None] * stride_bias_m
                     + out_vs[None, :] * stride_bias_v, mask=in_y).to(gl.float32)
    gl.store(y_ptr + out_rows[:, None] * stride_ym + out_vs[None, :] * stride_yv,
             y.to(y_ptr.dtype.element_ty), mask=in_y)


def padded_vectors(count: int) -> int:
    """The vectors padded to the MMA's N (8), or to two of them (the kernel's BLOCK_V)."""
    return MMA_VECTORS if count <= MMA_VECTORS else 2 * MMA_VECTORS


def launch(gemm: Gemm, tunables: Mapping[str, int], compile_only: bool) -> None:
    a, x, y, _, transposed = as_gemv(gemm)
    (M, K), count = a.shape, x.shape[1]
    (bias, *scales), epilogue_flags = epilogue_args(gemm)
    step = tunables["num_warps"] * tunables["BLOCK_K"]
    start(_gluon_gemv_kernel, (cdiv(M, tunables["BLOCK_M"]),),
          (a, x, y, M, K, count, a.stride(0), *x.stride(), *y.stride(), bias,
           *bias_strides(gemm, bias, transposed), *scales), dict(
              BLOCK_M=tunables["BLOCK_M"], BLOCK_K=tunables["BLOCK_K"],
              BLOCK_V=padded_vectors(count), STAGES=tunables["num_stages"],
              EVEN_K=K % step == 0, INT64_OFFSETS=needs_int64(a, x, y),
              num_warps=tunables["num_warps"], **epilogue_flags,
          ), compile_only)


def registers(tunables: Mapping[str, int], block_v: int, itemsize: int) -> int:
    """Registers per thread of the accumulator and of num_stages steps of both operands
    (each warp loads its own BLOCK_K of the rows and of the vectors)."""
    block_m, block_k = tunables["BLOCK_M"], tunables["BLOCK_K"]
    step = (block_m + block_v) * block_k * itemsize // 4
    return (tunables["num_stages"] * step + block_m * block_v) // 32


def unsupported(gemm: Gemm, tunables: Mapping[str, int]) -> str | None:
    """Why this Triton, device, config or operands cannot run the kernel, or None."""
    problem = gluon_mm.toolchain_problem()
    if problem:
        return problem
    if mma_v2 is None:
        return "gluongemv: this Triton's Gluon has no mma_v2"
    arch = gluon_mm.target_arch(gemm.a.device)
    if arch is None or arch < MIN_ARCH:
        target = f"sm_{arch}" if arch else "no CUDA GPU"
        return f"gluongemv: mma.sync takes bf16 from sm_{MIN_ARCH}, and the target is {target}"
    M, N, K = gemm.mnk
    if not 2 <= vectors(gemm) <= MAX_MMA_VECTORS:
        return f"gluongemv needs M or N from 2 to {MAX_MMA_VECTORS}, not {M}×{N}"
    if gemm.itemsize != 2:
        return "gluongemv: 16-bit operands only (its loads are 8 elements of 16 bytes)"
    matrix = as_gemv(gemm)[0]
    if matrix.stride(1) != 1 or matrix.stride(0) % K_WIDTH:
        return ("gluongemv: the matrix must be K-contiguous with rows 16-byte aligned "
                "(an nn.Linear weight)")
    if tunables["BLOCK_M"] % MMA_ROWS:
        return f"gluongemv: BLOCK_M must be a multiple of {MMA_ROWS}"
    if tunables["BLOCK_K"] % (2 * MMA_ROWS):
        return "gluongemv: BLOCK_K must be a multiple of 32 (4 threads of 8 K elements)"
    if tunables["num_stages"] > MAX_STAGES:
        return f"gluongemv: num_stages {MAX_STAGES} at most (registers hold one step ahead)"
    if tunables["num_stages"] > 1 and K < tunables["num_warps"] * tunables["BLOCK_K"]:
        return "gluongemv: num_stages 2 needs a whole K step to load ahead"
    return accumulator_refusal(registers(tunables, padded_vectors(vectors(gemm)), gemm.itemsize))


def smem_bytes(tunables: Mapping[str, int], operands: TileOperands) -> int:
    """The warps' fp32 sums, summed through shared memory once at the end."""
    return tunables["num_warps"] * tunables["BLOCK_M"] * 2 * MMA_VECTORS * 4


_PARAMS = ("BLOCK_M", "BLOCK_K", "num_stages", "num_warps")

GLUONGEMV = Variant(
    name="gluongemv",
    params=_PARAMS,
    launch=launch,
    smem_bytes=smem_bytes,
    source_path=Path(__file__),
    unsupported=unsupported,
    takes_pad=False,  # the vectors take any strides; a padded matrix would be a copy
    short_names={p: TILE_SHORT_NAMES[p] for p in _PARAMS},
    no_expand_op=("a Gluon kernel of the matrix times a few vectors: FlagGems' mm ops are tl "
                  "kernels that tile the output as it is"),
    model_seconds=functools.partial(gemv_cost.gluon_seconds, block_v=padded_vectors,
                                    registers=registers),
)
