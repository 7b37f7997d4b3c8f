"""The `gluon` variant: a persistent Hopper GEMM written in Gluon, where the kernel, not
Triton's software pipeliner, decides the pipeline.

The tl kernels (tma, persistent) leave the shared-memory ring, its barriers and the overlap
of loads, multiplies and stores to Triton's pipeliner. Gluon (triton.experimental.gluon)
states each of them: layouts, shared-memory buffers, mbarriers, TMA copies and asynchronous
wgmma. This kernel:
- runs one program per SM over its tiles in grouped order (as kernels/persistent.py);
- keeps a num_stages-deep ring of A and B tiles in shared memory, each slot filled by two
  TMA copies that complete on the slot's mbarrier;
- multiplies each step with an asynchronous wgmma and then waits for the previous one
  (wait depth 1): the tensor cores never idle between steps, and the slot the previous step
  read takes the load num_stages - 1 steps ahead. The loads run ahead across tile
  boundaries, so the next tile's first steps arrive while this tile's epilogue runs;
- scales and biases the fp32 accumulator (kernels/_epilogue.py), stages it in shared memory
  and stores it with one TMA copy, waited for only before the next tile's store.

Operands are addressed as in kernels/tma.py: descriptors built on the host over the
operands' row-major storage (a transposed operand's block shape swapped), which
kernels/launches.py re-bases when it replays a launch, as it does tma's; refusals of what TMA
cannot address are tma's own. A transposed tile reaches wgmma as a permuted view of shared
memory, which wgmma reads MN-major for 16-bit types; 8-bit (fp8) and 32-bit (tf32) wgmma
read K-major operands only, so those run only A row-major and B stored transposed (`nt`).
IEEE fp32 has no wgmma and is refused. An output TMA cannot address (rows off 16 bytes,
column-major) is stored through masked pointers, as tma does.

BLOCK_N_TAIL > 0 widens each tile by a second accumulator of that many columns, multiplied by a
wgmma of its own from the same A slot (Gluon's tensors are powers of two, a tile 144 wide is
not). Tile widths such as 144 or 288 then fill the SMs in one wave where powers of two leave a
second, nearly empty one, as cuBLAS's own widths do (384x6144: 129 tiles of 128×144;
benchmarks/results/vs-cublas/cublas-tiles-h100-unseen.md).

SWAP_AB=1 computes the tile transposed, out^T = b^T a^T: B's blocks feed wgmma's rows (BLOCK_M
along N) and A's its columns (BLOCK_N + BLOCK_N_TAIL along M), and the accumulator is
transposed in registers on its way out. wgmma's columns come in steps of 8 where its rows come
in 64s, so a call with few or odd rows gets a tile that fits them: cuBLAS runs such tiles at
the mid-size shapes our row-major tiles lose (80 rows at 400x3072 and 160x7168, 104 at
200x4096; benchmarks/results/vs-cublas/cublas-tiles-h100-dev.md). The host swaps the
operands (`_product_operands`); the kernel only stores differently.

WARP_SPECIALIZE=1 gives the loads a producer warp of their own (gl.warp_specialize): it
fills each slot the multiplying warps release on the slot's second mbarrier, up to
num_stages steps ahead, and the multiplying warps only wait, multiply and store.

Gluon is experimental and its API moves between Triton releases (3.6's TMA copies
async_copy_global_to_shared / async_copy_shared_to_global are 3.9's async_load /
async_store, 3.6's thread_barrier 3.9's barrier), so `unsupported` refuses releases it has
not been compiled with, and Triton's interpreter, which cannot run Gluon at all.
"""
from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path

import torch
import triton

from tuner.kernels import gluon_cost, tma
from tuner.kernels._epilogue import apply_epilogue
from tuner.kernels._launch import INTERPRETED, epilogue_args, tile_count
from tuner.kernels._mainloop import grouped_tile
from tuner.kernels.base import TILE_PARAMS, TILE_SHORT_NAMES, Gemm, Variant
from tuner.kernels.launches import start
from tuner.kernels.mma import TileOperands
from tuner.kernels.padding import is_transposed
from tuner.kernels.persistent import num_sms

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia import hopper
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier
    from triton.experimental.gluon.language.nvidia.hopper import tma as hopper_tma
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonTensorDescriptor
    _IMPORT_ERROR = None
    _GLUON_DTYPES = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16,
                     torch.float32: gl.float32, torch.float8_e4m3fn: gl.float8e4nv,
                     torch.float8_e5m2: gl.float8e5}
except ImportError as error:  # no Gluon Hopper API: `unsupported` refuses every call
    gluon = gl = hopper = mbarrier = hopper_tma = GluonTensorDescriptor = None
    _IMPORT_ERROR = str(error)

_TRITON_VERSION = tuple(int(part) for part in triton.__version__.split(".")[:2])
# The Triton releases this kernel has been compiled with for sm_90.
COMPILED_WITH = ((3, 6), (3, 9))
# TMA copies between global and shared memory, by 3.9's names or else 3.6's.
_TMA_COPIES = ("async_load", "async_store") if hasattr(hopper_tma, "async_load") else (
    "async_copy_global_to_shared", "async_copy_shared_to_global")
_tma_load, _tma_store = (getattr(hopper_tma, name, None) for name in _TMA_COPIES)
# A barrier of the warps running the code (the partition's, in a warp-specialized region),
# by 3.9's name or else 3.6's.
_warps_barrier = getattr(gl, "barrier", None) or getattr(gl, "thread_barrier", None)
HOPPER_ARCH = 90
# wgmma's instruction tile: 16 rows per warp, a warp group of 4 warps per 64 rows, and 32
# bytes of K (16 bf16 elements).
_WGMMA_ROWS_PER_WARP = 16
_WARP_GROUP = 4
_WGMMA_K_BYTES = 32


def gluon_jit(**options):
    """gluon.jit, or where Triton has no Gluon the function as it is (never launched)."""
    return gluon.jit(**options) if gluon is not None else (lambda fn: fn)


@gluon_jit()
def _copy_block(desc, row, col, barrier, slot, pred, TRANSPOSED: gl.constexpr):
    """TMA-copy the operand block at logical (row, col) into a ring slot; a transposed
    operand's storage holds it at (col, row)."""
    if TRANSPOSED:
        _tma_load(desc, [col, row], barrier, slot, pred)
    else:
        _tma_load(desc, [row, col], barrier, slot, pred)


@gluon_jit()
def _wgmma_view(slot, TRANSPOSED: gl.constexpr):
    """A ring slot as wgmma's operand: a transposed block is read through a permuted view."""
    if TRANSPOSED:
        view = slot.permute((1, 0))
    else:
        view = slot
    return view


@gluon_jit()
def _barriers(COUNT: gl.constexpr):
    """COUNT mbarriers, each completing a phase on one arrival (and its TMA bytes)."""
    barriers = gl.allocate_shared_memory(gl.int64, [COUNT, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(COUNT):
        mbarrier.init(barriers.index(i), count=1)
    return barriers


@gluon_jit()
def _invalidate(barriers, COUNT: gl.constexpr):
    for i in gl.static_range(COUNT):
        mbarrier.invalidate(barriers.index(i))


@gluon_jit()
def _load_step(ring, step, off_m, off_n, k_step, pred, BLOCK_N: gl.constexpr,
               BLOCK_N_TAIL: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr,
               A_T: gl.constexpr, B_T: gl.constexpr):
    """Issue step `step`'s A and B blocks (and B's tail block) into its ring slot (nothing
    where not pred)."""
    a_desc, b_desc, t_desc, a_ring, b_ring, t_ring, ready, empty = ring
    slot = step % STAGES
    barrier = ready.index(slot)
    k = k_step * BLOCK_K
    if BLOCK_N_TAIL:
        mbarrier.expect(barrier, a_desc.block_type.nbytes + b_desc.block_type.nbytes
                        + t_desc.block_type.nbytes, pred)
        _copy_block(t_desc, k, off_n + BLOCK_N, barrier, t_ring.index(slot), pred, B_T)
    else:
        mbarrier.expect(barrier, a_desc.block_type.nbytes + b_desc.block_type.nbytes, pred)
    _copy_block(a_desc, off_m, k, barrier, a_ring.index(slot), pred, A_T)
    _copy_block(b_desc, k, off_n, barrier, b_ring.index(slot), pred, B_T)


@gluon_jit()
def _tile_origin(tile, M, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                 GROUP_M: gl.constexpr):
    """The (row, column) of the tile-th output tile's first element, in grouped order."""
    tile_m, tile_n = grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    return tile_m * BLOCK_M, tile_n * BLOCK_N


@gluon_jit()
def _store_through_pointers(out_ptr, staged, tile, off_m, off_n, M, N, stride_cm, stride_cn,
                            BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """Store the tile with masked pointer stores: the path for outputs TMA cannot address.
    The tile goes through the staging buffer and out in row chunks of at most 32 elements a
    thread, whose int64 pointers (as tma.store_tile's) fit in registers; a whole 128×256
    tile's would spill."""
    staged.store(tile)
    COLS_PER_WARP: gl.constexpr = 32 if BLOCK_N >= 32 else BLOCK_N
    layout: gl.constexpr = gl.BlockedLayout([1, 1], [32 // COLS_PER_WARP, COLS_PER_WARP],
                                            [gl.num_warps(), 1], [1, 0])
    CHUNK_M: gl.constexpr = min(BLOCK_M, 32 * 32 * gl.num_warps() // BLOCK_N)
    cols = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))
    for chunk in gl.static_range(BLOCK_M // CHUNK_M):
        rows = off_m + chunk * CHUNK_M + gl.arange(0, CHUNK_M, layout=gl.SliceLayout(1, layout))
        ptrs = (out_ptr + rows.to(gl.int64)[:, None] * stride_cm
                + cols.to(gl.int64)[None, :] * stride_cn)
        gl.store(ptrs, staged.slice(chunk * CHUNK_M, CHUNK_M).load(layout),
                 mask=(rows[:, None] < M) & (cols[None, :] < N))


@gluon_jit()
def _store_through_tma(out_desc, staged, tile, off_m, off_n):
    """Stage the tile in shared memory and store it with one TMA copy, which clips at the
    edges. The caller has waited for the previous tile's copies to read the staging buffers;
    this one is waited for only before the next tile's."""
    staged.store(tile)
    hopper.fence_async_shared()
    _tma_store(out_desc, [off_m, off_n], staged)


@gluon_jit()
def _store_part(part, row, col, out_desc, staged, out_rows, out_cols, output,
                ROWS: gl.constexpr, COLS: gl.constexpr, OUT_DESC: gl.constexpr,
                HAS_BIAS: gl.constexpr, SCALED: gl.constexpr):
    """One ROWS×COLS part of the output (a tile's BLOCK_N columns or its tail's, transposed
    under SWAP_AB) at (row, col) of the out_rows×out_cols output, through the epilogue."""
    out_ptr, stride_cm, stride_cn, bias_ptr, scale_a_ptr, scale_b_ptr = output
    cols = col + gl.arange(0, COLS, layout=gl.SliceLayout(0, part.type.layout))
    result = apply_epilogue(part, cols, out_cols, bias_ptr, scale_a_ptr, scale_b_ptr, HAS_BIAS,
                            SCALED).to(out_ptr.dtype.element_ty)
    if OUT_DESC:
        _store_through_tma(out_desc, staged, result, row, col)
    else:
        _store_through_pointers(out_ptr, staged, result, row, col, out_rows, out_cols,
                                stride_cm, stride_cn, ROWS, COLS)


@gluon_jit()
def _store_tile(acc, off_m, off_n, out_desc, staged, sizes, output, BLOCK_M: gl.constexpr,
                PART_N: gl.constexpr, SWAP_AB: gl.constexpr, OUT_DESC: gl.constexpr,
                HAS_BIAS: gl.constexpr, SCALED: gl.constexpr):
    """One accumulator (BLOCK_M×PART_N at (off_m, off_n) of the product the kernel computes)
    into the output: as it is, or transposed where that product is out^T (SWAP_AB)."""
    M, N, K, NUM_SMS = sizes
    if SWAP_AB:
        _store_part(gl.permute(acc, (1, 0)), off_n, off_m, out_desc, staged, N, M, output,
                    PART_N, BLOCK_M, OUT_DESC, HAS_BIAS, SCALED)
    else:
        _store_part(acc, off_m, off_n, out_desc, staged, M, N, output, BLOCK_M, PART_N,
                    OUT_DESC, HAS_BIAS, SCALED)


@gluon_jit()
def _load_ahead(ring, sizes, position, total_steps, BLOCK_M: gl.constexpr,
                BLOCK_N: gl.constexpr, BLOCK_N_TAIL: gl.constexpr, BLOCK_K: gl.constexpr,
                GROUP_M: gl.constexpr, STAGES: gl.constexpr, A_T: gl.constexpr,
                B_T: gl.constexpr):
    """Without a producer warp: issue the loads at `position` (steps issued, tile, K step,
    the tile's origin; nothing past the program's last step) and return the next position,
    the program's next tile after a tile's last K step."""
    M, N, K, NUM_SMS = sizes
    loaded, tile, k_step, off_m, off_n = position
    _load_step(ring, loaded, off_m, off_n, k_step, loaded < total_steps, BLOCK_N,
               BLOCK_N_TAIL, BLOCK_K, STAGES, A_T, B_T)
    k_step += 1
    if k_step == gl.cdiv(K, BLOCK_K):
        k_step = 0
        tile += NUM_SMS
        off_m, off_n = _tile_origin(tile, M, N, BLOCK_M, BLOCK_N + BLOCK_N_TAIL, GROUP_M)
    return loaded + 1, tile, k_step, off_m, off_n


@gluon_jit()
def _load_tiles(ring, sizes, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                BLOCK_N_TAIL: gl.constexpr, BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr,
                STAGES: gl.constexpr, A_T: gl.constexpr, B_T: gl.constexpr):
    """The producer warp: every step's loads, each into a slot the multiplying warps have
    released (its `empty` barrier; on the first pass every slot is free, since a fresh
    barrier's previous phase counts as complete)."""
    M, N, K, NUM_SMS = sizes
    empty = ring[7]
    TILE_N: gl.constexpr = BLOCK_N + BLOCK_N_TAIL
    step = 0
    for tile in range(gl.program_id(0), gl.cdiv(M, BLOCK_M) * gl.cdiv(N, TILE_N), NUM_SMS):
        off_m, off_n = _tile_origin(tile, M, N, BLOCK_M, TILE_N, GROUP_M)
        for k_step in range(gl.cdiv(K, BLOCK_K)):
            mbarrier.wait(empty.index(step % STAGES), ((step // STAGES) & 1) ^ 1)
            _load_step(ring, step, off_m, off_n, k_step, True, BLOCK_N, BLOCK_N_TAIL, BLOCK_K,
                       STAGES, A_T, B_T)
            step += 1


@gluon_jit()
def _multiply_tiles(ring, sizes, output, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                    BLOCK_N_TAIL: gl.constexpr, BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr,
                    STAGES: gl.constexpr, A_T: gl.constexpr, B_T: gl.constexpr,
                    SWAP_AB: gl.constexpr, OUT_DESC: gl.constexpr, HAS_BIAS: gl.constexpr,
                    SCALED: gl.constexpr, WARP_SPECIALIZE: gl.constexpr, WARPS_M: gl.constexpr,
                    INSTR_N: gl.constexpr, TAIL_INSTR_N: gl.constexpr):
    """Every tile of the program: its K steps on wgmma, then its epilogue and store.

    Once a step's wgmma is issued (two with a tail: each its own commit group), the previous
    step's are waited for, and once every warp group is past that wait (a barrier of the
    multiplying warps: each waits for its own wgmmas only), its slot is handed on: to the
    producer warp under WARP_SPECIALIZE (one thread arrives for all), else refilled here with
    the step STAGES - 1 ahead (_load_ahead; the first STAGES - 1 steps are issued up front)."""
    a_desc, b_desc, t_desc, a_ring, b_ring, t_ring, ready, empty = ring
    M, N, K, NUM_SMS = sizes
    out_desc, t_out_desc, staged, t_staged, epilogue = output
    K_ELEMENTS: gl.constexpr = 256 // a_desc.dtype.primitive_bitwidth  # K: 32 bytes
    TILE_N: gl.constexpr = BLOCK_N + BLOCK_N_TAIL
    pid = gl.program_id(0)
    num_tiles = gl.cdiv(M, BLOCK_M) * gl.cdiv(N, TILE_N)
    k_steps = gl.cdiv(K, BLOCK_K)
    if not WARP_SPECIALIZE:
        total_steps = gl.cdiv(num_tiles - pid, NUM_SMS) * k_steps  # the grid <= num_tiles
        off_m, off_n = _tile_origin(pid, M, N, BLOCK_M, TILE_N, GROUP_M)
        position = (0, pid, 0, off_m, off_n)
        for stage in gl.static_range(STAGES - 1):  # noqa: B007 (the loads ahead)
            position = _load_ahead(ring, sizes, position, total_steps, BLOCK_M, BLOCK_N,
                                   BLOCK_N_TAIL, BLOCK_K, GROUP_M, STAGES, A_T, B_T)

    # wgmma's accumulators: warp groups down the rows, then across the columns.
    WARPS_N: gl.constexpr = gl.num_warps() // WARPS_M
    ACC_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[WARPS_M, WARPS_N], instr_shape=[16, INSTR_N, K_ELEMENTS])
    acc = gl.zeros((BLOCK_M, BLOCK_N), gl.float32, ACC_LAYOUT)
    if BLOCK_N_TAIL:
        TAIL_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[WARPS_M, WARPS_N],
            instr_shape=[16, TAIL_INSTR_N, K_ELEMENTS])
        tail = gl.zeros((BLOCK_M, BLOCK_N_TAIL), gl.float32, TAIL_LAYOUT)
    used = 0
    for tile in range(pid, num_tiles, NUM_SMS):
        for k_step in range(k_steps):
            slot = used % STAGES
            mbarrier.wait(ready.index(slot), (used // STAGES) & 1)
            a_slot = a_ring.index(slot)
            b_slot = b_ring.index(slot)
            a_view = _wgmma_view(a_slot, A_T)
            acc = hopper.warpgroup_mma(a_view, _wgmma_view(b_slot, B_T), acc,
                                       use_acc=k_step > 0, is_async=True)
            if BLOCK_N_TAIL:
                t_slot = t_ring.index(slot)
                tail = hopper.warpgroup_mma(a_view, _wgmma_view(t_slot, B_T), tail,
                                            use_acc=k_step > 0, is_async=True)
                acc, tail, _, _, _ = hopper.warpgroup_mma_wait(
                    2, deps=(acc, tail, a_slot, b_slot, t_slot))
            else:
                acc, _, _ = hopper.warpgroup_mma_wait(1, deps=(acc, a_slot, b_slot))
            _warps_barrier()
            if WARP_SPECIALIZE:
                mbarrier.arrive(empty.index((used + STAGES - 1) % STAGES), pred=k_step > 0)
            else:
                position = _load_ahead(ring, sizes, position, total_steps, BLOCK_M, BLOCK_N,
                                       BLOCK_N_TAIL, BLOCK_K, GROUP_M, STAGES, A_T, B_T)
            used += 1
        if BLOCK_N_TAIL:
            acc, tail = hopper.warpgroup_mma_wait(0, deps=(acc, tail))
        else:
            acc = hopper.warpgroup_mma_wait(0, deps=(acc,))
        if WARP_SPECIALIZE:
            _warps_barrier()
            mbarrier.arrive(empty.index((used + STAGES - 1) % STAGES))

        off_m, off_n = _tile_origin(tile, M, N, BLOCK_M, TILE_N, GROUP_M)
        if OUT_DESC:
            hopper_tma.store_wait(0)  # the previous tile's copies have read the staging
        _store_tile(acc, off_m, off_n, out_desc, staged, sizes, epilogue, BLOCK_M, BLOCK_N,
                    SWAP_AB, OUT_DESC, HAS_BIAS, SCALED)
        if BLOCK_N_TAIL:
            _store_tile(tail, off_m, off_n + BLOCK_N, t_out_desc, t_staged, sizes, epilogue,
                        BLOCK_M, BLOCK_N_TAIL, SWAP_AB, OUT_DESC, HAS_BIAS, SCALED)
    hopper_tma.store_wait(0)


@gluon_jit()
def _staging(out_desc, out, BLOCK_M: gl.constexpr, PART_N: gl.constexpr,
             SWAP_AB: gl.constexpr, OUT_DESC: gl.constexpr):
    """The shared-memory buffer one part of the tile (BLOCK_M×PART_N of the product) goes
    through on its way out, in the output's orientation: in the layout of the part's TMA
    store, or for pointer stores in the default one."""
    if SWAP_AB:
        ROWS: gl.constexpr = PART_N
        COLS: gl.constexpr = BLOCK_M
    else:
        ROWS: gl.constexpr = BLOCK_M
        COLS: gl.constexpr = PART_N
    if OUT_DESC:
        layout: gl.constexpr = out_desc.layout
    else:
        layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, COLS],
                                                                    out.dtype.element_ty)
    return gl.allocate_shared_memory(out.dtype.element_ty, [ROWS, COLS], layout)


@gluon_jit(do_not_specialize=["NUM_SMS"])
def _gluon_mm_kernel(
    # TMA descriptors (launch's _descriptor) of the product's M×K and K×N operands' blocks and
    # the tail's blocks of the second (None: no tail); of the output's parts, BLOCK_N's and
    # the tail's (None: stored through pointers). The product is out^T under SWAP_AB.
    a_desc, b_desc, t_desc, out_desc, t_out_desc,
    out, M, N, K, stride_cm, stride_cn,  # M, N: the product's; out's strides
    bias_ptr, scale_a_ptr, scale_b_ptr,
    NUM_SMS,  # programs in the grid; the stride of each program's tile loop
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
    GROUP_M: gl.constexpr, STAGES: gl.constexpr,  # STAGES: the ring's depth (num_stages)
    BLOCK_N_TAIL: gl.constexpr,  # columns of a second wgmma beside BLOCK_N's (0: none)
    WARP_SPECIALIZE: gl.constexpr,  # loads issued by a producer warp of their own
    SWAP_AB: gl.constexpr,  # the product is out^T: stored transposed
    A_T: gl.constexpr, B_T: gl.constexpr, OUT_DESC: gl.constexpr,  # as in tma.py
    HAS_BIAS: gl.constexpr, SCALED: gl.constexpr,  # epilogue (_epilogue.py)
    WARPS_M: gl.constexpr, INSTR_N: gl.constexpr,  # the accumulator's layout (wgmma_tiling)
    TAIL_INSTR_N: gl.constexpr,  # the tail accumulator's instruction N
):
    dtype: gl.constexpr = a_desc.dtype
    a_ring = gl.allocate_shared_memory(dtype, [STAGES] + a_desc.block_type.shape,
                                       a_desc.layout)
    b_ring = gl.allocate_shared_memory(dtype, [STAGES] + b_desc.block_type.shape,
                                       b_desc.layout)
    staged = _staging(out_desc, out, BLOCK_M, BLOCK_N, SWAP_AB, OUT_DESC)
    if BLOCK_N_TAIL:
        t_ring = gl.allocate_shared_memory(dtype, [STAGES] + t_desc.block_type.shape,
                                           t_desc.layout)
        t_staged = _staging(t_out_desc, out, BLOCK_M, BLOCK_N_TAIL, SWAP_AB, OUT_DESC)
    else:  # placeholders the kernel never reads
        t_desc, t_ring, t_out_desc, t_staged = b_desc, b_ring, out_desc, staged
    ready = _barriers(STAGES)
    if WARP_SPECIALIZE:
        empty = _barriers(STAGES)
    else:
        empty = ready  # unused: the multiplying warps refill the slots themselves

    ring = (a_desc, b_desc, t_desc, a_ring, b_ring, t_ring, ready, empty)
    sizes = (M, N, K, NUM_SMS)
    epilogue = (out, stride_cm, stride_cn, bias_ptr, scale_a_ptr, scale_b_ptr)
    output = (out_desc, t_out_desc, staged, t_staged, epilogue)
    if WARP_SPECIALIZE:
        # One producer warp with few registers: setmaxnreg leaves the rest to the
        # multiplying warps.
        PRODUCER_WARPS: gl.constexpr = 1
        PRODUCER_REGISTERS: gl.constexpr = 40
        gl.warp_specialize([
            (_multiply_tiles, (ring, sizes, output, BLOCK_M, BLOCK_N, BLOCK_N_TAIL, BLOCK_K,
                               GROUP_M, STAGES, A_T, B_T, SWAP_AB, OUT_DESC, HAS_BIAS,
                               SCALED, WARP_SPECIALIZE, WARPS_M, INSTR_N, TAIL_INSTR_N)),
            (_load_tiles, (ring, sizes, BLOCK_M, BLOCK_N, BLOCK_N_TAIL, BLOCK_K, GROUP_M,
                           STAGES, A_T, B_T)),
        ], [PRODUCER_WARPS], [PRODUCER_REGISTERS])
        _invalidate(empty, STAGES)
    else:
        _multiply_tiles(ring, sizes, output, BLOCK_M, BLOCK_N, BLOCK_N_TAIL, BLOCK_K, GROUP_M,
                        STAGES, A_T, B_T, SWAP_AB, OUT_DESC, HAS_BIAS, SCALED,
                        WARP_SPECIALIZE, WARPS_M, INSTR_N, TAIL_INSTR_N)
    _invalidate(ready, STAGES)


def output_tile(tunables: Mapping[str, int]) -> tuple[int, int]:
    """A tile's (rows, columns) of the output: BLOCK_M by BLOCK_N and its tail, or the other
    way round under SWAP_AB. Their counts decide how the tiles fill the SMs."""
    width = tunables["BLOCK_N"] + tunables["BLOCK_N_TAIL"]
    return (width, tunables["BLOCK_M"]) if tunables["SWAP_AB"] else (tunables["BLOCK_M"], width)


def wgmma_tiling(tunables: Mapping[str, int]) -> tuple[int, int, int]:
    """(WARPS_M, INSTR_N, TAIL_INSTR_N): how the warps split the tile for wgmma, and the
    instruction's N for BLOCK_N and for the tail.

    A warp group takes 64 rows; the warps go down the rows while the tile has rows for them
    (each warp 16 at least), then across the columns, whose share of one warp group is the
    instruction's N (at most 256)."""
    warps, block_m = tunables["num_warps"], tunables["BLOCK_M"]
    warps_m = _WARP_GROUP
    while warps_m < warps and block_m >= 2 * warps_m * _WGMMA_ROWS_PER_WARP:
        warps_m *= 2
    warps_n = warps // warps_m
    return (warps_m, min(256, tunables["BLOCK_N"] // warps_n),
            min(256, tunables["BLOCK_N_TAIL"] // warps_n))


@functools.cache
def _cuda_arch(device: torch.device) -> int:
    major, minor = torch.cuda.get_device_capability(device)
    return 10 * major + minor


def target_arch(device: torch.device) -> int | None:
    """The sm number a launch with tensors on `device` runs on; for meta tensors (compiles),
    the GPU Triton compiles for; None where there is none."""
    if device.type == "cuda":
        return _cuda_arch(device)
    try:
        target = triton.runtime.driver.active.get_current_target()
    except RuntimeError:  # no active GPU driver
        return None
    return target.arch if target.backend == "cuda" else None


def toolchain_problem() -> str | None:
    """Why the installed Triton cannot build this kernel, or None."""
    if INTERPRETED:
        return "Gluon kernels do not run in Triton's interpreter"
    if _IMPORT_ERROR is not None:
        return f"triton {triton.__version__} has no Gluon Hopper API ({_IMPORT_ERROR})"
    if _TRITON_VERSION not in COMPILED_WITH:
        tested = " and ".join(".".join(map(str, v)) for v in COMPILED_WITH)
        return (f"triton {triton.__version__}: the Gluon kernel is compiled only with triton "
                f"{tested} (Gluon's API changes between releases)")
    return None


def _operand_problem(gemm: Gemm) -> str | None:
    """Why wgmma cannot take these operands' dtype and storage orders, or None."""
    if not gemm.tensor_cores:
        return "gluon: IEEE fp32 has no wgmma (allow tf32, or use the tl variants)"
    if gemm.itemsize != 2 and (is_transposed(gemm.a) or not is_transposed(gemm.b)):
        dtype = str(gemm.a.dtype).removeprefix("torch.")
        return (f"gluon: wgmma reads {dtype} operands K-major only: A row-major and B stored "
                "transposed (layout nt)")
    return None


def _tile_problem(tunables: Mapping[str, int], itemsize: int) -> str | None:
    """Why wgmma cannot take this tile, or None."""
    warps, block_m = tunables["num_warps"], tunables["BLOCK_M"]
    if warps % _WARP_GROUP or block_m % (_WARP_GROUP * _WGMMA_ROWS_PER_WARP):
        return "gluon: wgmma needs whole warp groups (num_warps 4 or 8) and BLOCK_M % 64 == 0"
    warps_m, instr_n, tail_instr_n = wgmma_tiling(tunables)
    for name, instr in (("BLOCK_N", instr_n), ("BLOCK_N_TAIL", tail_instr_n)):
        if tunables[name] and (instr % 8 or tunables[name] % (warps // warps_m)):
            return f"gluon: wgmma needs each warp group's share of {name} a multiple of 8"
    if tunables["BLOCK_N_TAIL"] >= tunables["BLOCK_N"]:
        return "gluon: BLOCK_N_TAIL must be narrower than BLOCK_N (else widen BLOCK_N)"
    if tunables["BLOCK_K"] * itemsize % _WGMMA_K_BYTES:
        return f"gluon: wgmma needs BLOCK_K a multiple of {_WGMMA_K_BYTES // itemsize} here"
    return None


def unsupported(gemm: Gemm, tunables: Mapping[str, int]) -> str | None:
    """Why this Triton, device, tile or operands cannot run the kernel, or None. Operands
    TMA cannot address are refused as the tma variant refuses them."""
    problem = toolchain_problem()
    if problem:
        return problem
    arch = target_arch(gemm.a.device)
    if arch != HOPPER_ARCH:
        target = f"sm_{arch}" if arch else "no CUDA GPU"
        return f"gluon: a Hopper (sm_{HOPPER_ARCH}) kernel, and the target is {target}"
    return (_tile_problem(tunables, gemm.itemsize) or _operand_problem(gemm)
            or tma.unsupported(gemm, tunables))


def _descriptor(t: torch.Tensor, block_rows: int, block_cols: int):
    """A Gluon TMA descriptor of block_rows×block_cols blocks of t over its storage
    (tma.storage_block), in the swizzled shared layout wgmma reads and TMA stores from."""
    storage, block = tma.storage_block(t, block_rows, block_cols)
    layout = gl.NVMMASharedLayout.get_default_for(block, _GLUON_DTYPES[t.dtype])
    return GluonTensorDescriptor.from_tensor(storage, block, layout)


def _product_operands(gemm: Gemm, tunables: Mapping[str, int]) -> tuple[torch.Tensor, ...]:
    """The M×K and K×N operands of the product the kernel computes: a and b, or under
    SWAP_AB b^T and a^T (out^T = b^T a^T)."""
    return (gemm.b.t(), gemm.a.t()) if tunables["SWAP_AB"] else (gemm.a, gemm.b)


def launch(gemm: Gemm, tunables: Mapping[str, int], compile_only: bool) -> None:
    """Descriptors are built here, on the host: built by each program on the device they cost
    ~4 µs of every call (400x3072x64: 7.9 µs against tma's 3.8; H100, 2026-11-28), and a
    replay re-bases them as it does tma's (kernels/launches.py)."""
    a, b = _product_operands(gemm, tunables)
    block_m, block_n, tail = tunables["BLOCK_M"], tunables["BLOCK_N"], tunables["BLOCK_N_TAIL"]
    block_k = tunables["BLOCK_K"]
    by_descriptor = tma.out_by_descriptor(gemm.out)

    def out_part(width: int):
        if not by_descriptor:
            return None
        return _descriptor(gemm.out, *((width, block_m) if tunables["SWAP_AB"] else
                                       (block_m, width)))

    (bias, scale_a, scale_b), epilogue_flags = epilogue_args(gemm)
    warps_m, instr_n, tail_instr_n = wgmma_tiling(tunables)
    rows, cols = output_tile(tunables)
    programs = num_sms(gemm.a.device)
    tiles = tile_count(gemm.mnk[0], gemm.mnk[1], {"BLOCK_M": rows, "BLOCK_N": cols})
    stride_cm, stride_cn = gemm.out.stride()
    start(_gluon_mm_kernel, (min(programs, tiles),), (), dict(
        a_desc=_descriptor(a, block_m, block_k), b_desc=_descriptor(b, block_k, block_n),
        t_desc=_descriptor(b, block_k, tail) if tail else None,
        out_desc=out_part(block_n), t_out_desc=out_part(tail) if tail else None,
        out=gemm.out, M=a.shape[0], N=b.shape[1], K=gemm.mnk[2], stride_cm=stride_cm,
        stride_cn=stride_cn, bias_ptr=bias, scale_a_ptr=scale_a, scale_b_ptr=scale_b,
        NUM_SMS=programs, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        GROUP_M=tunables["GROUP_M"], STAGES=tunables["num_stages"], BLOCK_N_TAIL=tail,
        WARP_SPECIALIZE=bool(tunables["WARP_SPECIALIZE"]), SWAP_AB=bool(tunables["SWAP_AB"]),
        A_T=is_transposed(a), B_T=is_transposed(b), OUT_DESC=by_descriptor, **epilogue_flags,
        WARPS_M=warps_m, INSTR_N=instr_n, TAIL_INSTR_N=tail_instr_n,
        num_warps=tunables["num_warps"]), compile_only)


def smem_bytes(tunables: Mapping[str, int], operands: TileOperands) -> int:
    """The ring (num_stages steps of A and B tiles, the tail's included), the staged output
    tile and the barriers: the kernel allocates each of them, and nothing else."""
    rows, cols = output_tile(tunables)
    ring = tunables["num_stages"] * (rows + cols) * tunables["BLOCK_K"] * operands.itemsize
    staged = rows * cols * max(operands.itemsize, 2)  # as tma.staging_smem_bytes
    return ring + staged + tma.BARRIER_SMEM_BYTES


GLUON = Variant(
    name="gluon",
    params=(*TILE_PARAMS, "BLOCK_N_TAIL", "SWAP_AB", "WARP_SPECIALIZE"),
    launch=launch,
    smem_bytes=smem_bytes,
    source_path=Path(__file__),
    unsupported=unsupported,
    short_names={**TILE_SHORT_NAMES, "BLOCK_N_TAIL": "tail", "SWAP_AB": "swap",
                 "WARP_SPECIALIZE": "ws"},
    no_expand_op=("a Gluon kernel: FlagGems' mm ops are tl kernels, none of which takes a "
                  "Gluon config"),
    tma_fed=True,
    program_per_sm=True,
    output_tile=output_tile,
    model_seconds=functools.partial(gluon_cost.seconds, output_tile=output_tile),
)
