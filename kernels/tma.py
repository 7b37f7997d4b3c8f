"""The `tma` variant: C = A @ B with operands read through TMA tensor descriptors.

Hopper's Tensor Memory Accelerator copies a whole tile between global and shared memory in
one instruction, computing addresses and bounds in hardware: the kernel needs no pointer
arithmetic, and loads past the edge of a matrix read zeros, so ragged M, N and K need no
masks.

The host builds the descriptors (triton.tools.tensor_descriptor), with block shapes set per
config, and kernels/launches.py re-bases them per operand address in replays. A kernel can
build its own instead (tl.make_tensor_descriptor, `operand_descriptor` with ON_DEVICE): the
persistent variant does so where it warp-specializes, since Triton's Hopper warp specializer
splits a 128-row tile between two MMA warp groups, which host-built block shapes forbid
(triton #11587). Elsewhere host-built ones are faster: a device-built descriptor costs each
program a global write and a fence before its first load, 1.1-1.5x the device time of
decode-sized and small-tile calls on an H100 (benchmarks/results/descriptors/). Device-built
descriptors live in a global scratch area Triton asks its allocator for
(launches.use_torch_allocator).

Every layout runs natively. TMA needs a unit stride along the block's inner dimension, so an
operand stored transposed (a `t` operand: A = storage(K×M).t()) gets a descriptor over its
row-major storage with the block shape swapped, and the kernel transposes each loaded tile
(the A_T / B_T constexprs). What TMA cannot address at all (no unit stride, a stride or a
base address off 16 bytes) is refused by `unsupported`; the `pad` parameter or the general
variant serve those calls.

The output goes through a descriptor when it is row-major and 16-byte aligned, so the store
is one TMA copy that clips at the edges. Otherwise (an N whose rows are not 16-byte
multiples, a column-major out) the tile is stored with masked pointer stores instead
(OUT_DESC=False): refusing those calls would lose, say, an x @ W.T with an odd vocabulary N,
whose operands TMA reads fine. That path always forms offsets in int64: it runs once per tile,
where the cost is nothing, and descriptors need no int64 switch of their own (TMA takes
64-bit strides), so `needs_int64` has nothing to decide here.

Block shapes need no check of their own: tl.dot already needs every block dimension >= 16,
so each descriptor's inner block dimension holds >= 16 bytes, as TMA requires, and Triton
splits blocks with a dimension over TMA's 256-element box limit into several copies.

The descriptors, tile loop and store live in jit helpers that the persistent and stream-K
variants reuse. Both kernels here take either placement (DESC_ON_DEVICE); each variant's
launcher chooses.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from tuner.kernels import tma_cost
from tuner.kernels._epilogue import apply_epilogue
from tuner.kernels._launch import dot_options, epilogue_args, tile_count
from tuner.kernels._mainloop import grouped_tile
from tuner.kernels.base import TILE_PARAMS, TILE_SHORT_NAMES, Gemm, Variant
from tuner.kernels.launches import start, use_torch_allocator
from tuner.kernels.mma import TileOperands, pipeline_smem_bytes
from tuner.kernels.padding import is_transposed

_ALIGN_BYTES = 16  # TMA: base addresses and the strides between rows, in bytes
_MAX_STRIDE_BYTES = 2**40  # TMA: strides must stay below this


@triton.jit
def operand_descriptor(operand, rows, cols, row_stride, BLOCK_ROWS: tl.constexpr,
                       BLOCK_COLS: tl.constexpr, TRANSPOSED: tl.constexpr,
                       ON_DEVICE: tl.constexpr):
    """The descriptor of a logical rows×cols operand's BLOCK_ROWS×BLOCK_COLS blocks: the one
    the host built (`operand` itself), or, ON_DEVICE, one built here over the pointer
    `operand`, whose storage has `row_stride` between rows (a transposed operand's storage
    is cols×rows, and so are its blocks: see _load_block)."""
    if not ON_DEVICE:
        desc = operand
    elif TRANSPOSED:
        desc = tl.make_tensor_descriptor(operand, shape=[cols, rows], strides=[row_stride, 1],
                                         block_shape=[BLOCK_COLS, BLOCK_ROWS])
    else:
        desc = tl.make_tensor_descriptor(operand, shape=[rows, cols], strides=[row_stride, 1],
                                         block_shape=[BLOCK_ROWS, BLOCK_COLS])
    return desc


@triton.jit
def output_descriptor(out, M, N, stride_cm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      OUT_DESC: tl.constexpr, ON_DEVICE: tl.constexpr):
    """What store_tile writes through: ON_DEVICE with OUT_DESC, a descriptor of BLOCK_M×BLOCK_N
    blocks built over the pointer `out`; else `out` as the host passed it (a descriptor
    where OUT_DESC, a pointer otherwise)."""
    if OUT_DESC and ON_DEVICE:
        out = tl.make_tensor_descriptor(out, shape=[M, N], strides=[stride_cm, 1],
                                        block_shape=[BLOCK_M, BLOCK_N])
    return out


@triton.jit
def _load_block(desc, row, col, TRANSPOSED: tl.constexpr):
    """The block at logical (row, col) of an operand; a transposed operand's descriptor is over
    its storage, which holds the block as its transpose at (col, row)."""
    if TRANSPOSED:
        block = desc.load([col, row]).T
    else:
        block = desc.load([row, col])
    return block


@triton.jit
def tile_product(a_desc, b_desc, off_m, off_n, first_step, end_step,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 A_T: tl.constexpr, B_T: tl.constexpr,
                 DOT_UPCAST: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """The fp32 BLOCK_M×BLOCK_N tile of A @ B at (off_m, off_n) over the K steps
    [first_step, end_step). Blocks past K load as zeros, which add nothing, so a ragged K
    needs no mask."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k_step in range(first_step, end_step):
        a = _load_block(a_desc, off_m, k_step * BLOCK_K, A_T)
        b = _load_block(b_desc, k_step * BLOCK_K, off_n, B_T)
        if DOT_UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
    return acc


@triton.jit
def store_tile(out, acc, off_m, off_n, M, N, stride_cm, stride_cn,
               bias_ptr, scale_a_ptr, scale_b_ptr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, OUT_DESC: tl.constexpr,
               HAS_BIAS: tl.constexpr, SCALED: tl.constexpr):
    """Apply the epilogue to the BLOCK_M×BLOCK_N fp32 tile at (off_m, off_n) and store it:
    through the output descriptor (which clips at the edges: output_descriptor) or masked
    pointers (OUT_DESC)."""
    cols = off_n + tl.arange(0, BLOCK_N)
    acc = apply_epilogue(acc, cols, N, bias_ptr, scale_a_ptr, scale_b_ptr, HAS_BIAS, SCALED)
    if OUT_DESC:
        out.store([off_m, off_n], acc.to(out.dtype))
    else:
        rows = off_m + tl.arange(0, BLOCK_M)
        ptrs = (out + rows.to(tl.int64)[:, None] * stride_cm
                + cols.to(tl.int64)[None, :] * stride_cn)
        tl.store(ptrs, acc.to(out.dtype.element_ty),
                 mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit
def _tma_kernel(
    a, b, out, M, N, K, stride_cm, stride_cn,  # a, b: descriptors, or pointers (DESC_ON_DEVICE)
    bias_ptr, scale_a_ptr, scale_b_ptr,
    stride_a, stride_b,  # row strides of a's and b's storage, for descriptors built here
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    A_T: tl.constexpr, B_T: tl.constexpr,  # descriptor over the operand's transposed storage
    OUT_DESC: tl.constexpr,  # out is a descriptor (else a pointer with strides)
    DESC_ON_DEVICE: tl.constexpr,  # the kernel builds the descriptors (operand_descriptor)
    DOT_UPCAST: tl.constexpr,  # multiply in fp32 (interpreter workaround, _launch.py)
    INPUT_PRECISION: tl.constexpr,  # "ieee" / "tf32" for fp32 inputs, None (default) else
    HAS_BIAS: tl.constexpr, SCALED: tl.constexpr,  # epilogue (_epilogue.py)
):
    a = operand_descriptor(a, M, K, stride_a, BLOCK_M, BLOCK_K, A_T, DESC_ON_DEVICE)
    b = operand_descriptor(b, K, N, stride_b, BLOCK_K, BLOCK_N, B_T, DESC_ON_DEVICE)
    out = output_descriptor(out, M, N, stride_cm, BLOCK_M, BLOCK_N, OUT_DESC, DESC_ON_DEVICE)
    tile_m, tile_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    off_m = tile_m * BLOCK_M
    off_n = tile_n * BLOCK_N
    acc = tile_product(a, b, off_m, off_n, 0, tl.cdiv(K, BLOCK_K),
                       BLOCK_M, BLOCK_N, BLOCK_K, A_T, B_T, DOT_UPCAST, INPUT_PRECISION)
    store_tile(out, acc, off_m, off_n, M, N, stride_cm, stride_cn,
               bias_ptr, scale_a_ptr, scale_b_ptr, BLOCK_M, BLOCK_N, OUT_DESC, HAS_BIAS, SCALED)


def descriptor_problem(name: str, t: torch.Tensor) -> str | None:
    """Why TMA cannot address t through its row-major storage view, or None.

    A transposed operand is addressed through t.t(). A stride, and the base address, must be
    16-byte multiples (a meta tensor's data_ptr is 0, so compiles pass the address check).
    """
    view = t.t() if is_transposed(t) else t
    row_stride, inner_stride = view.stride()
    row_bytes = row_stride * t.element_size()
    if inner_stride != 1:
        return f"TMA: {name} has no unit stride (strides {tuple(t.stride())})"
    if row_bytes % _ALIGN_BYTES:
        return (f"TMA: {name}'s stride of {row_stride} elements ({row_bytes} bytes) is not a "
                f"multiple of {_ALIGN_BYTES} bytes")
    if row_bytes >= _MAX_STRIDE_BYTES:
        return f"TMA: {name}'s stride of {row_bytes} bytes exceeds TMA's 2**40"
    if t.data_ptr() % _ALIGN_BYTES:
        return f"TMA: {name}'s data pointer is not {_ALIGN_BYTES}-byte aligned"
    return None


def unsupported(gemm: Gemm, tunables: Mapping[str, int]) -> str | None:
    """Why A or B cannot be read through TMA, or None, whatever the config (block shapes need
    no check: see the module docstring). The output never rules TMA out: an output no
    descriptor can address is stored through pointers."""
    return descriptor_problem("A", gemm.a) or descriptor_problem("B", gemm.b)


def storage_block(t: torch.Tensor, block_rows: int, block_cols: int
                  ) -> tuple[torch.Tensor, list[int]]:
    """t's storage and a block_rows×block_cols block of t as a block of it: a transposed t
    is stored as t.t(), whose blocks are block_cols×block_rows. What a descriptor of t's
    blocks is built over (here, and gluon's)."""
    if is_transposed(t):
        return t.t(), [block_cols, block_rows]
    return t, [block_rows, block_cols]


def _descriptor(t: torch.Tensor, block_rows: int, block_cols: int) -> TensorDescriptor:
    """A descriptor of block_rows×block_cols blocks of t, over t's storage."""
    return TensorDescriptor.from_tensor(*storage_block(t, block_rows, block_cols))


def out_by_descriptor(out: torch.Tensor) -> bool:
    """Whether a TMA descriptor can address the output (else it is stored through pointers)."""
    return not is_transposed(out) and descriptor_problem("out", out) is None


def _row_stride(t: torch.Tensor) -> int:
    """The stride between the rows of t's storage (its columns' if t is stored transposed)."""
    return t.stride(1) if is_transposed(t) else t.stride(0)


def descriptor_args(gemm: Gemm, tunables: Mapping[str, int], out_block_n: int,
                    on_device: bool) -> dict:
    """The arguments the TMA kernels share, by name: a, b and out (host-built descriptors;
    on_device, the tensors themselves, from which the kernel builds its own), M, N, K, the
    strides, the epilogue's pointers, and their layout, descriptor, dot and epilogue
    constexprs. Output blocks are BLOCK_M×out_block_n (the persistent kernel may store a tile
    in halves)."""
    a, b, out = gemm.a, gemm.b, gemm.out
    M, N, K = gemm.mnk
    block_m, block_n, block_k = tunables["BLOCK_M"], tunables["BLOCK_N"], tunables["BLOCK_K"]
    out_desc = out_by_descriptor(out)
    epilogue, epilogue_flags = epilogue_args(gemm)
    if on_device:
        use_torch_allocator()
    else:
        a, b = _descriptor(a, block_m, block_k), _descriptor(b, block_k, block_n)
        out = _descriptor(out, block_m, out_block_n) if out_desc else out
    stride_cm, stride_cn = gemm.out.stride()
    bias_ptr, scale_a_ptr, scale_b_ptr = epilogue
    return dict(a=a, b=b, out=out, M=M, N=N, K=K, stride_cm=stride_cm, stride_cn=stride_cn,
                bias_ptr=bias_ptr, scale_a_ptr=scale_a_ptr, scale_b_ptr=scale_b_ptr,
                stride_a=_row_stride(gemm.a), stride_b=_row_stride(gemm.b),
                A_T=is_transposed(gemm.a), B_T=is_transposed(gemm.b), OUT_DESC=out_desc,
                DESC_ON_DEVICE=on_device, **dot_options(gemm), **epilogue_flags)


def launch(gemm: Gemm, tunables: Mapping[str, int], compile_only: bool,
           on_device: bool = False) -> None:
    """on_device: the kernel builds its descriptors (the placement the module docstring
    weighs; benchmarks/descriptor_placement.py times the two)."""
    M, N, _ = gemm.mnk
    grid = (tile_count(M, N, tunables),)
    args = descriptor_args(gemm, tunables, tunables["BLOCK_N"], on_device)
    # tunables: BLOCK_M/N/K and GROUP_M constexprs; num_stages and num_warps options
    start(_tma_kernel, grid, (), {**args, **tunables}, compile_only)


# The TMA loads' mbarriers and their alignment: Triton's figures exceed the buffers by 8 to
# 576 bytes (benchmarks/constraint_accuracy.py compares them).
BARRIER_SMEM_BYTES = 1024


def staging_smem_bytes(tunables: Mapping[str, int], itemsize: int, out_block_n: int) -> int:
    """A BLOCK_M×out_block_n output block staged for a TMA store (outputs of fp8 inputs are
    bf16: 2 bytes, not 1)."""
    return tunables["BLOCK_M"] * out_block_n * max(itemsize, 2)


def smem_bytes(tunables: Mapping[str, int], operands: TileOperands) -> int:
    """The pipeline's buffers and the staged output, plus barriers. On tensor cores the store
    reuses the buffers once the K loop is done (Triton 3.6 and 3.9 report 98328 bytes for
    128×128×64, 3 stages, fp16 on sm_90: the pipeline's 98304 plus barriers); IEEE fp32
    tiles keep both (180232 for 128×256×32, 2 stages: 49152 + 131072 + barriers)."""
    pipeline = pipeline_smem_bytes(tunables, operands)
    staged = staging_smem_bytes(tunables, operands.itemsize, tunables["BLOCK_N"])
    buffers = max(pipeline, staged) if operands.tensor_cores else pipeline + staged
    return buffers + BARRIER_SMEM_BYTES


TMA = Variant(
    name="tma",
    params=TILE_PARAMS,
    launch=launch,
    smem_bytes=smem_bytes,
    source_path=Path(__file__),
    unsupported=unsupported,
    short_names=TILE_SHORT_NAMES,
    expand_op="mm_general_tma",  # see GENERAL
    tma_fed=True,
    model_seconds=tma_cost.seconds,
)
