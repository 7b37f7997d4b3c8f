"""The `persistent` variant's term in the analytical model (tuner.model.predict): TMA tiles
with one program per SM (kernels/persistent.py), which saves the per-tile pipeline refill and
loses co-resident programs.

Beside the kernel rather than in it, so that a change to the model leaves the kernel's source
hash, and with it every tuned result, as it is.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import TYPE_CHECKING

from tuner.model.tiles import (
    WS_MMA_WARPS,
    Operands,
    Tile,
    cdiv,
    epilogue_seconds,
    kernel_seconds,
    output_tiles,
    persistent_seconds,
    tile_of,
    tile_step,
)

if TYPE_CHECKING:
    from tuner.model.predict import DeviceSpec


def seconds(ops: Operands, config: Mapping, smem_bytes: Callable[[], int],
            spec: DeviceSpec) -> float:
    """EPILOGUE_SUBTILE changes only shared memory, not the time. A warp-specialized loop
    multiplies on WS_MMA_WARPS warps of its own, whatever num_warps says."""
    tile = tile_of(config)
    warp_specialized = bool(config["WARP_SPECIALIZE"])
    if not ops.tma_addressable:
        return math.inf
    if warp_specialized:
        tile = tile._replace(warps=WS_MMA_WARPS)
    refill_hidden = bool(config["FLATTEN"]) or warp_specialized
    return one_program_per_sm(ops, tile, config["GROUP_M"], warp_specialized, refill_hidden,
                              spec)


def one_program_per_sm(ops: Operands, tile: Tile, group_m: int, warp_specialized: bool,
                       refill_hidden: bool, spec: DeviceSpec, issued_copies: int = 0) -> float:
    """issued_copies: see tile_step (the gluon kernel without a producer warp)."""
    return kernel_seconds(ops, tile, group_m, spec.sm_count,
                          _tile_loops(ops, tile, warp_specialized, refill_hidden, spec,
                                      issued_copies), spec)


@lru_cache(maxsize=65536)
def _tile_loops(ops: Operands, tile: Tile, warp_specialized: bool, refill_hidden: bool,
                spec: DeviceSpec, issued_copies: int) -> float:
    """The SMs' share of one_program_per_sm (GROUP_M changes only its DRAM bytes)."""
    return persistent_seconds(output_tiles(ops, tile), cdiv(ops.K, tile.BK),
                              tile_step(ops, tile, True, True, warp_specialized, spec,
                                        issued_copies),
                              epilogue_seconds(tile, ops.out_itemsize, spec),
                              refill_hidden, spec)
