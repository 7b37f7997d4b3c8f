"""The `splitk` variant's term in the analytical model (tuner.model.predict): SPLIT_K
programs per tile over slices of K into fp32 partials, summed into C by each tile's last
program (kernels/splitk.py).

Beside the kernel rather than in it, so that a change to the model leaves the kernel's source
hash, and with it every tuned result, as it is.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import TYPE_CHECKING

from tuner.model.tiles import (
    FP32_BYTES,
    LAUNCH_S,
    Operands,
    Tile,
    cdiv,
    dram_seconds,
    epilogue_seconds,
    operand_dram_bytes,
    output_tiles,
    rounds_seconds,
    tile_occupancy,
    tile_of,
    tile_step,
)

if TYPE_CHECKING:
    from tuner.model.predict import DeviceSpec


def seconds(ops: Operands, config: Mapping, smem_bytes: Callable[[], int],
            spec: DeviceSpec) -> float:
    tile = tile_of(config)
    return split_programs(ops, tile, config["SPLIT_K"],
                          tile_occupancy(ops, tile, smem_bytes(), spec), spec)


@lru_cache(maxsize=65536)
def split_programs(ops: Operands, tile: Tile, splits: int, occupancy: int,
                   spec: DeviceSpec) -> float:
    """More programs fill the SMs when M×N has few tiles, and each walks a shorter chain of K
    steps; the price is the partial traffic: S slices written, then read back by the tiles'
    last programs after the rest.

    The slices are written after the multiplies, not beside them: every program stores its
    fp32 tile once its K loop ends, and split-K's programs fill one or two waves that end
    together, so the stores (S times the output, at 4 bytes an element) follow the compute
    at DRAM bandwidth. Counted as overlapping, the model put split-K ahead of one-pass tiles
    that ran markedly faster at M = 128-512.
    """
    programs = output_tiles(ops, tile) * splits
    steps = cdiv(cdiv(ops.K, tile.BK), splits)
    # No GROUP_M: program ids run row-major over the tiles of each split.
    slice_bytes = ops.M * ops.N * FP32_BYTES
    written = splits * slice_bytes
    concurrent = min(programs, occupancy * spec.sm_count)
    dram_bytes = operand_dram_bytes(ops, tile, 1, concurrent, spec) + written
    partials = rounds_seconds(programs, steps, tile_step(ops, tile, False, False, False, spec),
                              occupancy, epilogue_seconds(tile, FP32_BYTES, spec), spec)
    main = max(partials + dram_seconds(written, spec), dram_seconds(dram_bytes, spec)) + LAUNCH_S
    return main + dram_seconds(written + ops.c_bytes, spec)
