"""The `gemv` and `multigemv` variants: a matrix times one vector (y = A @ x) or a few
(Y = A @ X), for GEMMs whose short side is 1 (gemv) or at most MAX_VECTORS (multigemv).

With one output column a tensor-core tile would be almost all padding, and the work is bound
by reading A once. So each program reduces BLOCK_M rows of A against x on the CUDA cores:
multiply in fp32, sum over K. A single-row GEMM (M == 1, decode) is the same product
transposed: out^T = B^T @ a^T, with B^T read through its strides, never copied.

A few rows (decode at batch 2 to 4) are the same walk over A, each loaded element multiplied
into every vector's sum. On an H100 a 2×4096×4096 bf16 GEMM streams the weight at 2.3 TB/s
this way: 1.6x cuBLAS and 1.8x the best tensor-core tile its study timed, whose 16-row MMA is
mostly padding here (benchmarks/results/vs-cublas/README.md). The gemv kernel serves the
single row or column (tuner.kernels.kernel_for); the mm kernel offers multigemv for its
short ones.

From 2 to 16 vectors `mmagemv` walks the matrix the same way, BLOCK_M rows a program, but
multiplies on tensor cores: the matrix's rows are the MMA's rows and the vectors, padded to
16, its columns (C^T = B^T A^T for a few-row GEMM), so the multiplies cost nothing beside
the read. Its loads hint the matrix out of L2 first, as gemv's do. At batch 6-16 on an H100
it ran 1.03-1.14x cuBLAS on attention-sized and down-projection weights, where the tile
variants, whose 16 rows are the few vectors, stalled at cuBLAS's pace
(benchmarks/results/vs-cublas/README.md).
"""
from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path

import triton
import triton.language as tl

from tuner.kernels import gemv_cost
from tuner.kernels._launch import (
    cdiv,
    dot_options,
    epilogue_args,
    needs_int64,
    wrap_keeps_vectors,
    wrap_point,
)
from tuner.kernels._mainloop import wrapped_indices
from tuner.kernels.base import (
    CUDA_CORE_ACCUMULATOR_REGS,
    MIN_DOT_TILE,
    TILE_SHORT_NAMES,
    Gemm,
    Variant,
    accumulator_refusal,
)
from tuner.kernels.launches import start
from tuner.kernels.mma import TileOperands, pipeline_smem_bytes

# The most vectors (the GEMM's short side) multigemv takes: at 4 it already trails cuBLAS
# on bf16 weights of 3584 and more; beyond, every program's loads of X and its multiplies
# grow while the matrix's read does not.
MAX_VECTORS = 4
# The most vectors mmagemv takes: one MMA column block (MIN_DOT_TILE) holds them all;
# beyond it the tile variants' own 32- and 64-row MMAs do the same work.
MAX_MMA_VECTORS = 16


@triton.jit
def _gemv_kernel(
    a_ptr, x_ptr, y_ptr, M, K, VECTORS,
    wrap_m,  # rows of A wrap here (_launch.wrap_point)
    stride_am, stride_ak, stride_xk, stride_xv, stride_ym, stride_yv,
    bias_ptr, stride_bias_m, stride_bias_v, scale_a_ptr, scale_b_ptr,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
    # VECTORS rounded up to a power of two (tl.arange's); on tensor cores, to MIN_DOT_TILE
    BLOCK_V: tl.constexpr,
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0: no K mask needed
    HINT_M: tl.constexpr,  # the contiguity hint holds (_launch.wrap_keeps_vectors)
    INT64_OFFSETS: tl.constexpr,  # some offset may overflow int32
    HAS_BIAS: tl.constexpr, SCALED: tl.constexpr,  # as in _epilogue.py, along Y
    TENSOR_CORES: tl.constexpr,  # multiply on them (mmagemv), else on the CUDA cores
    DOT_UPCAST: tl.constexpr, INPUT_PRECISION: tl.constexpr,  # _launch.dot_options
):
    """Y[m, v] = sum_k A[m, k] X[k, v] for BLOCK_M rows m of A and every vector v.

    A is read once, X by every program: A's loads ask for its lines to leave L2 first, so
    X's stay."""
    if INT64_OFFSETS:
        # Every offset below is index * stride, so wide strides make all of them int64.
        stride_am, stride_ak = tl.cast(stride_am, tl.int64), tl.cast(stride_ak, tl.int64)
        stride_xk, stride_xv = tl.cast(stride_xk, tl.int64), tl.cast(stride_xv, tl.int64)
        stride_ym, stride_yv = tl.cast(stride_ym, tl.int64), tl.cast(stride_yv, tl.int64)

    first_row = tl.program_id(0) * BLOCK_M
    rows = wrapped_indices(first_row, wrap_m, BLOCK_M, HINT_M)
    if TENSOR_CORES:
        y = _mma_sums(a_ptr, x_ptr, rows, K, VECTORS, stride_am, stride_ak, stride_xk,
                      stride_xv, BLOCK_M, BLOCK_K, BLOCK_V, EVEN_K, DOT_UPCAST, INPUT_PRECISION)
    else:
        y = _cuda_core_sums(a_ptr, x_ptr, rows, K, VECTORS, stride_am, stride_ak, stride_xk,
                            stride_xv, BLOCK_M, BLOCK_K, BLOCK_V, EVEN_K)
    _store_y(y, first_row, M, VECTORS, y_ptr, stride_ym, stride_yv,
             bias_ptr, stride_bias_m, stride_bias_v, scale_a_ptr, scale_b_ptr,
             BLOCK_M, BLOCK_V, HAS_BIAS, SCALED)


@triton.jit
def _cuda_core_sums(a_ptr, x_ptr, rows, K, VECTORS, stride_am, stride_ak, stride_xk, stride_xv,
                    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
                    EVEN_K: tl.constexpr):
    """The BLOCK_V×BLOCK_M sums, multiplied and added in fp32 on the CUDA cores."""
    vs = tl.arange(0, BLOCK_V)
    ks = tl.arange(0, BLOCK_K)
    # Both operands are loaded as 3-D blocks of the accumulator's shape (1×BLOCK_M×BLOCK_K
    # of A, BLOCK_V×1×BLOCK_K of X), so the product broadcasts without changing layouts.
    a_ptrs = a_ptr + (rows[None, :, None] * stride_am + ks[None, None, :] * stride_ak)
    x_ptrs = x_ptr + (vs[:, None, None] * stride_xv + ks[None, None, :] * stride_xk)
    in_v = vs[:, None, None] < VECTORS

    # Products accumulate elementwise and are summed over K once, after the loop: a sum per
    # step would shuffle across threads on every step, and the loop should only stream A.
    acc = tl.zeros((BLOCK_V, BLOCK_M, BLOCK_K), dtype=tl.float32)
    for k_step in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs, eviction_policy="evict_first")
            x = tl.load(x_ptrs, mask=in_v, other=0.0, eviction_policy="evict_last")
        else:
            in_k = ks[None, None, :] < K - k_step * BLOCK_K
            a = tl.load(a_ptrs, mask=in_k, other=0.0, eviction_policy="evict_first")
            x = tl.load(x_ptrs, mask=in_v & in_k, other=0.0, eviction_policy="evict_last")
        acc += a.to(tl.float32) * x.to(tl.float32)
        a_ptrs += BLOCK_K * stride_ak
        x_ptrs += BLOCK_K * stride_xk
    return tl.sum(acc, axis=2)


@triton.jit
def _mma_sums(a_ptr, x_ptr, rows, K, VECTORS, stride_am, stride_ak, stride_xk, stride_xv,
              BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
              EVEN_K: tl.constexpr, DOT_UPCAST: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """The BLOCK_V×BLOCK_M sums as one BLOCK_M×BLOCK_V tensor-core tile (mmagemv)."""
    vs = tl.arange(0, BLOCK_V)
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak
    x_ptrs = x_ptr + ks[:, None] * stride_xk + vs[None, :] * stride_xv
    in_v = vs[None, :] < VECTORS
    acc = tl.zeros((BLOCK_M, BLOCK_V), dtype=tl.float32)
    for k_step in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs, eviction_policy="evict_first")
            x = tl.load(x_ptrs, mask=in_v, other=0.0, eviction_policy="evict_last")
        else:
            in_k = ks < K - k_step * BLOCK_K
            a = tl.load(a_ptrs, mask=in_k[None, :], other=0.0, eviction_policy="evict_first")
            x = tl.load(x_ptrs, mask=in_v & in_k[:, None], other=0.0,
                        eviction_policy="evict_last")
        if DOT_UPCAST:
            a = a.to(tl.float32)
            x = x.to(tl.float32)
        acc = tl.dot(a, x, acc, input_precision=INPUT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        x_ptrs += BLOCK_K * stride_xk
    return tl.trans(acc)


@triton.jit
def _store_y(y, first_row, M, VECTORS, y_ptr, stride_ym, stride_yv,
             bias_ptr, stride_bias_m, stride_bias_v, scale_a_ptr, scale_b_ptr,
             BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr,
             HAS_BIAS: tl.constexpr, SCALED: tl.constexpr):
    """Y's BLOCK_V×BLOCK_M block y (fp32) from row first_row, with the epilogue of
    _epilogue.py along Y."""
    vs = tl.arange(0, BLOCK_V)
    out_rows = first_row + tl.arange(0, BLOCK_M)
    in_y = (vs[:, None] < VECTORS) & (out_rows[None, :] < M)
    if SCALED:
        y = y * (tl.load(scale_a_ptr) * tl.load(scale_b_ptr))
    if HAS_BIAS:  # the bias runs along N: along Y's rows or along its vectors
        y += tl.load(bias_ptr + out_rows[None, :] * stride_bias_m + vs[:, None] * stride_bias_v,
                     mask=in_y).to(tl.float32)
    tl.store(y_ptr + out_rows[None, :] * stride_ym + vs[:, None] * stride_yv,
             y.to(y_ptr.dtype.element_ty), mask=in_y)


def as_gemv(gemm: Gemm):
    """(A, X, Y, rows of A's buffer, transposed) with Y = A @ X, X holding the short side's
    vectors: the GEMM itself when N is the short side, its transpose when M is."""
    M, N, _ = gemm.mnk
    if N <= M:
        return gemm.a, gemm.b, gemm.out, gemm.a_buffer_rows, False
    return gemm.b.t(), gemm.a.t(), gemm.out.t(), gemm.b_buffer_cols, True


def vectors(gemm: Gemm) -> int:
    """How many vectors multiply the matrix: the GEMM's short side."""
    M, N, _ = gemm.mnk
    return min(M, N)


def bias_strides(gemm: Gemm, bias, transposed: bool) -> tuple[int, int]:
    """The bias's strides along Y's rows and along its vectors (as_gemv's Y): the bias runs
    along N, so along the vectors when N is the short side, along the rows when M is."""
    stride = 0 if gemm.bias is None else bias.stride(0)
    return (stride, 0) if transposed else (0, stride)


def launch(gemm: Gemm, tunables: Mapping[str, int], compile_only: bool,
           rows_param: str = "BLOCK_M", tensor_cores: bool = False) -> None:
    """rows_param: the variant's name for the rows of A per program (the kernel's BLOCK_M);
    tensor_cores: multiply on them (mmagemv) rather than the CUDA cores."""
    a, x, y, buffer_rows, transposed = as_gemv(gemm)
    (M, K), count = a.shape, x.shape[1]
    wrap_m = wrap_point(M, buffer_rows)
    (bias, *scales), epilogue_flags = epilogue_args(gemm)
    args = (a, x, y, M, K, count, wrap_m, *a.stride(), *x.stride(), *y.stride(), bias,
            *bias_strides(gemm, bias, transposed), *scales)
    block_m = tunables[rows_param]
    block_v = triton.next_power_of_2(count)
    dot = dot_options(gemm) if tensor_cores else dict(DOT_UPCAST=False, INPUT_PRECISION=None)
    start(_gemv_kernel, (cdiv(M, block_m),), args, dict(
        BLOCK_M=block_m, BLOCK_K=tunables["BLOCK_K"],
        BLOCK_V=max(MIN_DOT_TILE, block_v) if tensor_cores else block_v,
        TENSOR_CORES=tensor_cores, **dot,
        EVEN_K=K % tunables["BLOCK_K"] == 0,
        HINT_M=wrap_keeps_vectors(wrap_m),
        INT64_OFFSETS=needs_int64(a, x, y),
        num_stages=tunables["num_stages"], num_warps=tunables["num_warps"],
        **epilogue_flags,
    ), compile_only)


def unsupported(gemm: Gemm, tunables: Mapping[str, int]) -> str | None:
    M, N, _ = gemm.mnk
    return None if M == 1 or N == 1 else f"gemv needs M == 1 or N == 1, not {M}×{N}"


def multigemv_unsupported(gemm: Gemm, tunables: Mapping[str, int]) -> str | None:
    """Past MAX_VECTORS the tiles win (module docstring); an accumulator past half a
    thread's registers would spill."""
    M, N, _ = gemm.mnk
    count = vectors(gemm)
    if count > MAX_VECTORS:
        return f"multigemv needs M or N <= {MAX_VECTORS}, not {M}×{N}"
    regs = (triton.next_power_of_2(count) * tunables["ROWS"] * tunables["BLOCK_K"]
            // (32 * tunables["num_warps"]))
    return accumulator_refusal(regs, CUDA_CORE_ACCUMULATOR_REGS)


def _smem_bytes(tunables: Mapping[str, int], operands: TileOperands, vectors: int,
                rows_param: str) -> int:
    """Shared memory if Triton pipelines the loads: at most num_stages buffered A tiles and
    slices of `vectors` vectors (not measured against Triton's figures, so the tile kernels'
    num_stages - 1 off the CUDA cores is not assumed)."""
    tile_elements = (tunables[rows_param] + vectors) * tunables["BLOCK_K"]
    return tunables["num_stages"] * tile_elements * operands.itemsize


def mmagemv_unsupported(gemm: Gemm, tunables: Mapping[str, int]) -> str | None:
    """Tensor-core dtypes only: IEEE fp32 would multiply on the CUDA cores (multigemv's
    way), and fp8 MMAs of under 64 rows are not measured here."""
    M, N, _ = gemm.mnk
    if not 2 <= vectors(gemm) <= MAX_MMA_VECTORS:
        return f"mmagemv needs M or N from 2 to {MAX_MMA_VECTORS}, not {M}×{N}"
    if not gemm.tensor_cores:
        return "mmagemv: IEEE fp32 has no tensor-core multiply (multigemv serves it)"
    if gemm.itemsize == 1:
        return "mmagemv: fp8 is left to the tile variants"
    block_m = tunables["BLOCK_M"]
    if block_m < MIN_DOT_TILE:
        return f"tensor cores: BLOCK_M must be >= {MIN_DOT_TILE}"
    # The accumulator and one step of the matrix, loaded into registers before the MMA.
    regs = ((block_m * MIN_DOT_TILE + block_m * tunables["BLOCK_K"] * gemm.itemsize // 4)
            // (32 * tunables["num_warps"]))
    return accumulator_refusal(regs)


def _mma_smem_bytes(tunables: Mapping[str, int], operands: TileOperands) -> int:
    """The pipelined loads of a BLOCK_M-row tile of the matrix and its MIN_DOT_TILE vectors,
    as a tile variant's main loop keeps them (tuner.kernels.mma)."""
    return pipeline_smem_bytes({**tunables, "BLOCK_N": MIN_DOT_TILE}, operands)


_STEP_PARAMS = ("BLOCK_K", "num_stages", "num_warps")

GEMV = Variant(
    name="gemv",
    params=("BLOCK_M", *_STEP_PARAMS),
    launch=launch,
    smem_bytes=functools.partial(_smem_bytes, vectors=1, rows_param="BLOCK_M"),
    source_path=Path(__file__),
    unsupported=unsupported,
    short_names={p: TILE_SHORT_NAMES[p] for p in ("BLOCK_M", *_STEP_PARAMS)},
    expand_op="gemv",
    model_seconds=gemv_cost.seconds,
)

# In the mm kernel's space the rows of A per program are ROWS: the tile variants' BLOCK_M
# starts at 16 (a tensor-core MMA), and 1-8 there would multiply every tile variant's
# configs that the model ranks for each study.
MULTIGEMV = Variant(
    name="multigemv",
    params=("ROWS", *_STEP_PARAMS),
    launch=functools.partial(launch, rows_param="ROWS"),
    smem_bytes=functools.partial(_smem_bytes, vectors=MAX_VECTORS, rows_param="ROWS"),
    source_path=Path(__file__),
    unsupported=multigemv_unsupported,
    takes_pad=False,  # reads any strides in place: a pad copy only adds a pass
    short_names={"ROWS": "R", **{p: TILE_SHORT_NAMES[p] for p in _STEP_PARAMS}},
    no_expand_op=("a CUDA-core product of a matrix with a few vectors: FlagGems' mm ops are "
                  "tensor-core tiles"),
    model_seconds=functools.partial(gemv_cost.seconds, rows_param="ROWS"),
)

# BLOCK_M is the MMA's rows, as in the tile variants (16 and up), so the space's list serves.
MMAGEMV = Variant(
    name="mmagemv",
    params=("BLOCK_M", *_STEP_PARAMS),
    launch=functools.partial(launch, tensor_cores=True),
    smem_bytes=_mma_smem_bytes,
    source_path=Path(__file__),
    unsupported=mmagemv_unsupported,
    takes_pad=False,  # reads any strides in place, as multigemv does
    short_names={p: TILE_SHORT_NAMES[p] for p in ("BLOCK_M", *_STEP_PARAMS)},
    no_expand_op=("the matrix-times-few-vectors product with the matrix as the MMA's rows: "
                  "FlagGems' mm ops tile the output as it is"),
    model_seconds=functools.partial(gemv_cost.seconds, tensor_cores=True),
)
