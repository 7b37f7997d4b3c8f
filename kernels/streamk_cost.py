"""The `streamk` variant's term in the analytical model (tuner.model.predict): the persistent
variant's loop over whole tiles for the full waves, then each program's equal share of the
streamed tiles' K steps (or their operands' DRAM traffic, which L2 serves less well), and
the fix-up that sums a split tile's parts (kernels/streamk.py). Its figures for the L2 and
the fix-up come from one H100 run (tests/test_streamk.py quotes it).

Beside the kernel rather than in it, so that a change to the model leaves the kernel's source
hash, and with it every tuned result, as it is. Who computes what is the kernel's own
`schedule`, bound into this term by the kernel (STREAMK.model_seconds), so the two cannot
disagree.
"""
from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import TYPE_CHECKING

from tuner.model.tiles import (
    FP32_BYTES,
    INFLIGHT_BYTES_PER_SM,
    L2_USABLE_FRACTION,
    LOAD_LATENCY_S,
    Operands,
    Tile,
    cdiv,
    dram_seconds,
    epilogue_seconds,
    kernel_seconds,
    output_tiles,
    persistent_seconds,
    step_seconds,
    tile_of,
    tile_step,
)

if TYPE_CHECKING:
    from tuner.kernels.streamk import Schedule
    from tuner.model.predict import DeviceSpec


def seconds(ops: Operands, config: Mapping, smem_bytes: Callable[[], int], spec: DeviceSpec,
            *, schedule: Callable[[int, int, int, int], Schedule]) -> float:
    """`schedule` is kernels/streamk.schedule. Where it streams nothing, or only whole tiles
    (T mod SMs == 0), the term is the persistent variant's without flags: no faster."""
    if not ops.tma_addressable:
        return math.inf
    tile = tile_of(config)
    plan = schedule(output_tiles(ops, tile), cdiv(ops.K, tile.BK), spec.sm_count,
                    config["SK_FULL_WAVES"])
    return kernel_seconds(ops, tile, config["GROUP_M"], plan.programs,
                          _busiest_program(ops, tile, plan, spec), spec)


@lru_cache(maxsize=65536)
def _busiest_program(ops: Operands, tile: Tile, plan: Schedule, spec: DeviceSpec) -> float:
    """Whole tiles as in the persistent variant (its pipeline refilled between tiles); then
    the streamed phase, the longer of its compute and its operands' DRAM traffic; then one
    fix-up, by the program whose part of a tile arrives last.

    Never more than the same tiles run whole. Streaming can lose: 66 tiles of 2 K steps
    streamed over 132 SMs take a step each, then write and read 132 parts, slower than 132
    whole tiles of 2 steps. Such a time would fall as the work grows, which the model's must
    not (tests/test_model.py), and the ranking loses nothing: the persistent variant, listed
    first, takes the tie.
    """
    step = tile_step(ops, tile, True, True, False, spec)
    store = epilogue_seconds(tile, ops.out_itemsize, spec)
    whole = persistent_seconds(plan.dp_tiles, plan.k_steps, step, store, False, spec)
    if not plan.sk_tiles:
        return whole
    whole_segment = max(store, LOAD_LATENCY_S)
    part_segment = max(epilogue_seconds(tile, FP32_BYTES, spec), LOAD_LATENCY_S)
    compute = max(steps * step_seconds(step, 1) + wholes * whole_segment + parts * part_segment
                  for steps, wholes, parts in _ranges(plan))
    streamed = max(compute, dram_seconds(_streamed_operand_bytes(ops, tile, plan, spec),
                                         spec))
    unstreamed = persistent_seconds(plan.dp_tiles + plan.sk_tiles, plan.k_steps, step, store,
                                    False, spec)
    return min(whole + streamed + _fix_up_seconds(tile, plan), unstreamed)


def _streamed_operand_bytes(ops: Operands, tile: Tile, plan: Schedule,
                            spec: DeviceSpec) -> float:
    """What the streamed phase fetches from DRAM. Whole tiles run in step, every program at
    the same K step, so tiles that share a panel of A or B share each block of it in L2
    (operand_dram_bytes). Ranges that start mid-tile stagger the programs along K: a block
    is wanted again only after the others have moved on, so each streamed tile fetches its
    own panels, unless the operand fits in L2 whole. (On an H100, 72 tiles of 128×256
    streamed over 132 SMs, 1536×1536×12288, ran 1.4× the persistent kernel's time, not the
    0.55× that their steps take; 256×4096×14336, whose A fits, 0.82×.)"""
    if _most_contributors(plan) < 2:  # ranges of whole tiles run in step
        return 0.0
    room = spec.l2_bytes * L2_USABLE_FRACTION
    fetched = 0.0
    for size, panel_rows in ((ops.a_bytes, tile.BM), (ops.b_bytes, tile.BN)):
        streamed = plan.sk_tiles * panel_rows * ops.K * ops.itemsize
        fetched += min(streamed, size) if size <= room else streamed
    return fetched


def _fix_up_seconds(tile: Tile, plan: Schedule) -> float:
    """The finishing program writes its part, then reads the tile's parts one after another,
    each filling its registers: a round trip per part, its bytes at the SM's in-flight limit
    (as in step_seconds). At most MAX_PARTS of them (kernels/streamk.py)."""
    contributors = _most_contributors(plan)
    if contributors < 2:
        return 0.0
    part_bytes = tile.BM * tile.BN * FP32_BYTES
    return (contributors + 1) * LOAD_LATENCY_S * (1.0 + part_bytes / INFLIGHT_BYTES_PER_SM)


def _range_bounds(plan: Schedule) -> list[int]:
    """Where the stream-K programs' ranges start, and where the last one ends."""
    iterations = plan.sk_tiles * plan.k_steps
    return [p * iterations // plan.sk_programs for p in range(plan.sk_programs + 1)]


@lru_cache(maxsize=4096)
def _ranges(plan: Schedule) -> frozenset[tuple[int, int, int]]:
    """(K steps, whole tiles, parts of tiles) of each stream-K program's range, no repeats."""
    bounds, steps = _range_bounds(plan), plan.k_steps
    ranges = set()
    for start, end in zip(bounds, bounds[1:]):
        segments = (end - 1) // steps - start // steps + 1
        parts = min(segments, (start % steps != 0) + (end % steps != 0))
        ranges.add((end - start, segments - parts, parts))
    return frozenset(ranges)


@lru_cache(maxsize=4096)
def _most_contributors(plan: Schedule) -> int:
    """The most programs a streamed tile is summed from (1: no tile is split)."""
    bounds = _range_bounds(plan)

    def owner(iteration: int) -> int:
        return bisect.bisect_right(bounds, iteration) - 1

    return max(owner((t + 1) * plan.k_steps - 1) - owner(t * plan.k_steps) + 1
               for t in range(plan.sk_tiles))
