"""The `streamk` variant: the persistent TMA GEMM with its last, partial wave of tiles shared
out by K steps (stream-K, Osama et al., PPoPP 2023), deterministic.

A persistent kernel runs ceil(T / P) rounds of T tiles on P SMs: 72 tiles of 128×256 leave
60 of 132 SMs idle, and 3.3 waves cost 4. Stream-K sees the tiles' K steps as one stream of
iterations and gives every program an equal range of it. Here the first tiles still go
whole, program p taking tiles p, p + P, ... over all of K (full waves need no balancing), and
only the last `sk_tiles` are streamed: the remainder T mod P, plus SK_FULL_WAVES full waves
(`schedule`). With 0, a small remainder goes to as few as two programs a tile (below);
with 1, every program streams a tile's worth of steps or more, so no tile has more than two
parts and every SM takes part, at the price of streaming a wave that was already balanced
(and of more tiles split in two).

Program p streams iterations [p·I // Q, (p+1)·I // Q) of the I = sk_tiles·S (S: BLOCK_K
steps per tile) over Q programs: no more than I, so that no range is empty and the programs
holding a tile's iterations are exactly `owner(first) .. owner(last)`; and no more than
2·sk_tiles, so that ranges hold half a tile or more and no tile is summed from more than
MAX_PARTS = 3 parts, since the program finishing a tile reads its parts one after another
(on an H100, 8 tiles of 128×256 and 64 steps, streamed over all 132 SMs, 17 parts a tile,
added 70 µs to a wave of whole tiles for 3.9 steps a program).

Each tile a range touches is a segment: a whole tile is stored directly; a part of one is
an fp32 partial tile written to a workspace slot of the program, then counted on the tile's
arrival counter. Only a range's first and last segments can be parts (the tiles between are
whole), so two slots per program suffice: slot 0 for its first tile, 1 for its last; a
range within one tile has one segment, in slot 0. The program whose arrival completes the
count sums the contributors' partials in program order, applies the epilogue once, stores
the tile and puts the counter back to 0 for the next call (replays, CUDA graphs). No program
waits for another (the interpreter, which runs programs one after another, computes the
same), the segments and the order of the sum are fixed, so the output is bit-identical from
run to run whichever program arrives last, and no atomic touches the output.

Iteration indices, and their products with Q, are int64: (i + 1)·Q passes 2**31 once K
passes ~500,000 with 16-wide steps. Tiles, K steps and slot offsets stay int32.

Whether the streamed part splits anything depends on the SM count: with T mod P == 0 every
range is whole tiles and the kernel runs the persistent schedule. `unsupported` cannot refuse
those duplicates, since the tuner checks configs on meta tensors, which know no SM count;
the model term (kernels/streamk_cost.py) predicts them no faster than the persistent
variant, so its ranking never prefers them. It does refuse a K of one BLOCK_K step, where no
tile can be split on any device.
"""
from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from tuner.kernels import persistent, streamk_cost, tma
from tuner.kernels._launch import cdiv, tile_count
from tuner.kernels._mainloop import grouped_tile
from tuner.kernels.base import TILE_PARAMS, TILE_SHORT_NAMES, Gemm, Variant
from tuner.kernels.launches import start
from tuner.kernels.mma import TileOperands, pipeline_smem_bytes, uses_wgmma
from tuner.kernels.tma import operand_descriptor, output_descriptor, store_tile, tile_product
from tuner.kernels.workspace import WORKSPACE
from tuner.model.tiles import FP32_BYTES

PARTIAL_SLOTS = 2  # per program: its first and its last tile (module docstring)
# The most programs a streamed tile is summed from: ranges of half a tile or more.
MAX_PARTS = 3


class Schedule(NamedTuple):
    """How one launch shares its tiles out (module docstring)."""
    programs: int  # the grid: min(SMs, tiles × k_steps)
    dp_tiles: int  # the first tiles, whole: program p takes p, p + programs, ...
    sk_tiles: int  # the last tiles, streamed by K step
    sk_programs: int  # the programs streaming them (no more than has work)
    k_steps: int  # BLOCK_K steps per tile


def schedule(tiles: int, k_steps: int, sms: int, full_waves: int) -> Schedule:
    """The schedule of `tiles` tiles of `k_steps` steps on `sms` SMs: the remainder of the
    last wave and `full_waves` full waves streamed (all tiles when there are fewer), by at
    most MAX_PARTS - 1 programs per streamed tile (module docstring)."""
    programs = min(sms, tiles * k_steps)
    sk_tiles = min(tiles, tiles % programs + full_waves * programs)
    sk_programs = min(programs, sk_tiles * k_steps, (MAX_PARTS - 1) * sk_tiles)
    return Schedule(programs, tiles - sk_tiles, sk_tiles, sk_programs, k_steps)


@triton.jit
def _range_start(program, iterations, programs):
    """The first stream-K iteration of `program` (int64, as `iterations` is)."""
    return program * iterations // programs


@triton.jit
def _iteration_owner(iteration, iterations, programs):
    """The program whose range holds `iteration`: the largest p with
    p·iterations // programs <= iteration."""
    return ((iteration + 1) * programs - 1) // iterations


@triton.jit
def _slot_pointers(partials_ptr, program, slot, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Pointers to the program's fp32 partial tile `slot` (row-major BLOCK_M×BLOCK_N), of
    the two (PARTIAL_SLOTS) each program has."""
    offsets = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    return partials_ptr + (program * 2 + slot) * (BLOCK_M * BLOCK_N) + offsets


@triton.jit
def _summed_partials(partials_ptr, tile_start, first_owner, last_owner, iterations, programs,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """A split tile's partials summed in program order: the same sum whichever program
    finishes it. Only the first contributor can have started before the tile, and then the
    tile is its last, in slot 1. The loads bypass L1: other SMs wrote them."""
    total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for program in range(first_owner, last_owner + 1):
        slot = (_range_start(program, iterations, programs) < tile_start).to(tl.int32)
        total += tl.load(_slot_pointers(partials_ptr, program, slot, BLOCK_M, BLOCK_N),
                         cache_modifier=".cg")
    return total


@triton.jit
def _stream_k_range(
    a_desc, b_desc, out, partials_ptr, arrivals_ptr, M, N, K, stride_cm, stride_cn,
    bias_ptr, scale_a_ptr, scale_b_ptr, DP_TILES, SK_PROGRAMS,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, A_T: tl.constexpr, B_T: tl.constexpr, OUT_DESC: tl.constexpr,
    DOT_UPCAST: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    HAS_BIAS: tl.constexpr, SCALED: tl.constexpr,
):
    """This program's range of the stream-K iterations, a segment per tile it touches."""
    program = tl.program_id(0)
    k_steps = tl.cdiv(K, BLOCK_K).to(tl.int64)  # so that every iteration index is int64
    iterations = (tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N) - DP_TILES) * k_steps
    start = _range_start(program, iterations, SK_PROGRAMS)
    end = _range_start(program + 1, iterations, SK_PROGRAMS)
    first_tile = (start // k_steps).to(tl.int32)
    for sk_tile in range(first_tile, ((end - 1) // k_steps).to(tl.int32) + 1):
        tile_start = sk_tile * k_steps
        first_step = (tl.maximum(start, tile_start) - tile_start).to(tl.int32)
        end_step = (tl.minimum(end, tile_start + k_steps) - tile_start).to(tl.int32)
        tile_m, tile_n = grouped_tile(DP_TILES + sk_tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        off_m = tile_m * BLOCK_M
        off_n = tile_n * BLOCK_N
        acc = tile_product(a_desc, b_desc, off_m, off_n, first_step, end_step,
                           BLOCK_M, BLOCK_N, BLOCK_K, A_T, B_T, DOT_UPCAST, INPUT_PRECISION)
        if (first_step == 0) & (end_step == k_steps):
            store_tile(out, acc, off_m, off_n, M, N, stride_cm, stride_cn,
                       bias_ptr, scale_a_ptr, scale_b_ptr, BLOCK_M, BLOCK_N, OUT_DESC,
                       HAS_BIAS, SCALED)
        else:
            slot = (sk_tile != first_tile).to(tl.int32)
            tl.store(_slot_pointers(partials_ptr, program, slot, BLOCK_M, BLOCK_N), acc)
            # Every thread's partial is in memory before the arrival counts (the barrier,
            # then the counter's release); the finishing program reads after its acquire.
            tl.debug_barrier()
            first_owner = _iteration_owner(tile_start, iterations, SK_PROGRAMS).to(tl.int32)
            last_owner = _iteration_owner(tile_start + k_steps - 1, iterations,
                                          SK_PROGRAMS).to(tl.int32)
            arrived = tl.atomic_add(arrivals_ptr + sk_tile, 1, sem="acq_rel")
            if arrived == last_owner - first_owner:
                tl.store(arrivals_ptr + sk_tile, 0)
                total = _summed_partials(partials_ptr, tile_start, first_owner, last_owner,
                                         iterations, SK_PROGRAMS, BLOCK_M, BLOCK_N)
                store_tile(out, total, off_m, off_n, M, N, stride_cm, stride_cn,
                           bias_ptr, scale_a_ptr, scale_b_ptr, BLOCK_M, BLOCK_N, OUT_DESC,
                           HAS_BIAS, SCALED)


@triton.jit(do_not_specialize=["NUM_PROGRAMS", "DP_TILES", "SK_PROGRAMS"])
def _streamk_kernel(
    a, b, out, M, N, K, stride_cm, stride_cn,  # as in tma.py
    bias_ptr, scale_a_ptr, scale_b_ptr, stride_a, stride_b,
    partials_ptr,  # fp32 [SK_PROGRAMS, 2, BLOCK_M, BLOCK_N]: each program's partial tiles
    arrivals_ptr,  # int32 [stream-K tiles]: partials arrived per tile, zeros between calls
    NUM_PROGRAMS, DP_TILES, SK_PROGRAMS,  # the Schedule (runtime values: one binary)
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    A_T: tl.constexpr, B_T: tl.constexpr, OUT_DESC: tl.constexpr,  # as in tma.py
    DESC_ON_DEVICE: tl.constexpr,
    DOT_UPCAST: tl.constexpr, INPUT_PRECISION: tl.constexpr,  # _launch.dot_options
    HAS_BIAS: tl.constexpr, SCALED: tl.constexpr,  # epilogue (_epilogue.py)
):
    a = operand_descriptor(a, M, K, stride_a, BLOCK_M, BLOCK_K, A_T, DESC_ON_DEVICE)
    b = operand_descriptor(b, K, N, stride_b, BLOCK_K, BLOCK_N, B_T, DESC_ON_DEVICE)
    out = output_descriptor(out, M, N, stride_cm, BLOCK_M, BLOCK_N, OUT_DESC, DESC_ON_DEVICE)
    k_steps = tl.cdiv(K, BLOCK_K)
    for tile in range(tl.program_id(0), DP_TILES, NUM_PROGRAMS):
        tile_m, tile_n = grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        off_m = tile_m * BLOCK_M
        off_n = tile_n * BLOCK_N
        acc = tile_product(a, b, off_m, off_n, 0, k_steps,
                           BLOCK_M, BLOCK_N, BLOCK_K, A_T, B_T, DOT_UPCAST, INPUT_PRECISION)
        store_tile(out, acc, off_m, off_n, M, N, stride_cm, stride_cn,
                   bias_ptr, scale_a_ptr, scale_b_ptr, BLOCK_M, BLOCK_N, OUT_DESC,
                   HAS_BIAS, SCALED)
    if tl.program_id(0) < SK_PROGRAMS:
        _stream_k_range(a, b, out, partials_ptr, arrivals_ptr, M, N, K,
                        stride_cm, stride_cn, bias_ptr, scale_a_ptr, scale_b_ptr,
                        DP_TILES, SK_PROGRAMS, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, A_T, B_T,
                        OUT_DESC, DOT_UPCAST, INPUT_PRECISION, HAS_BIAS, SCALED)


def launch_schedule(gemm: Gemm, tunables: Mapping[str, int]) -> Schedule:
    """The schedule of this call on its device (INTERPRETER_PROGRAMS programs off CUDA)."""
    M, N, K = gemm.mnk
    return schedule(tile_count(M, N, tunables), cdiv(K, tunables["BLOCK_K"]),
                    persistent.num_sms(gemm.a.device), tunables["SK_FULL_WAVES"])


def _workspaces(gemm: Gemm, tunables: Mapping[str, int],
                plan: Schedule) -> tuple[torch.Tensor, torch.Tensor]:
    """The partial slots and arrival counters (zeros, and left as zeros by every call); at
    least one of each, so that no argument is a null pointer."""
    device = gemm.out.device
    slots = (max(plan.sk_programs, 1), PARTIAL_SLOTS, tunables["BLOCK_M"], tunables["BLOCK_N"])
    partials = WORKSPACE.get(("streamk-partials", *gemm.mnk), slots, torch.float32, device)
    arrivals = WORKSPACE.get(("streamk-arrivals", *gemm.mnk), (max(plan.sk_tiles, 1),),
                             torch.int32, device)
    return partials, arrivals


def launch(gemm: Gemm, tunables: Mapping[str, int], compile_only: bool) -> None:
    plan = launch_schedule(gemm, tunables)
    partials, arrivals = _workspaces(gemm, tunables, plan)
    # BLOCK_M/N/K and GROUP_M constexprs, num_stages and num_warps options; SK_FULL_WAVES
    # only shapes the schedule, so both of its values run one binary.
    tile_tunables = {p: tunables[p] for p in TILE_PARAMS}
    start(_streamk_kernel, (plan.programs,), (),
          {**tma.descriptor_args(gemm, tunables, tunables["BLOCK_N"], on_device=False),
           "partials_ptr": partials, "arrivals_ptr": arrivals, "NUM_PROGRAMS": plan.programs,
           "DP_TILES": plan.dp_tiles, "SK_PROGRAMS": plan.sk_programs, **tile_tunables},
          compile_only)


def smem_bytes(tunables: Mapping[str, int], operands: TileOperands) -> int:
    """The pipeline's buffers and the staged output, kept apart as in the persistent kernel,
    plus barriers. A wgmma tile's partial changes layout through shared memory before its
    store: that reuses the pipeline's buffers, dead by then, but Triton 3.6 sizes it as the
    whole fp32 tile, which can outgrow them (fp8 128×256×64, 3 stages: 196608 bytes, of
    which 73728 pipeline). IEEE fp32 tiles of a transposed operand keep one more tile of it,
    transposed in shared memory (the persistent kernel's do too): counted for the larger of
    A's and B's, whatever the layout. An upper bound of what Triton 3.6 and 3.9 report on
    sm_90 for every layout (tests/test_streamk.py lists figures), 1 KB over for most tiles."""
    block_m, block_n, block_k = tunables["BLOCK_M"], tunables["BLOCK_N"], tunables["BLOCK_K"]
    buffers = pipeline_smem_bytes(tunables, operands)
    if uses_wgmma(block_m, tunables["num_warps"], operands.tensor_cores):
        buffers = max(buffers, block_m * block_n * FP32_BYTES)
    if not operands.tensor_cores:
        buffers += max(block_m, block_n) * block_k * FP32_BYTES
    staged = tma.staging_smem_bytes(tunables, operands.itemsize, block_n)
    return buffers + staged + tma.BARRIER_SMEM_BYTES


def unsupported(gemm: Gemm, tunables: Mapping[str, int]) -> str | None:
    """tma's operand checks, after a K of one BLOCK_K step: no tile can be split then, on any
    device, so the kernel would run the persistent schedule (a duplicate). Duplicates that
    depend on the SM count are left to the model (module docstring)."""
    K = gemm.mnk[2]
    if K <= tunables["BLOCK_K"]:
        return (f"stream-K: K={K} is one BLOCK_K={tunables['BLOCK_K']} step, no tile can be "
                "split (the persistent variant's schedule)")
    return tma.unsupported(gemm, tunables)


STREAMK = Variant(
    name="streamk",
    params=(*TILE_PARAMS, "SK_FULL_WAVES"),
    launch=launch,
    smem_bytes=smem_bytes,
    source_path=Path(__file__),
    unsupported=unsupported,
    short_names={**TILE_SHORT_NAMES, "SK_FULL_WAVES": "skw"},
    no_expand_op="a stream-K GEMM: FlagGems has no stream-K op",
    tma_fed=True,
    program_per_sm=True,
    model_seconds=functools.partial(streamk_cost.seconds, schedule=schedule),
)
