"""The `general` variant's term in the analytical model (tuner.model.predict): a program per
tile in grouped order, its loads issued through pointers (kernels/general.py).

Beside the kernel rather than in it, so that a change to the model leaves the kernel's source
hash, and with it every tuned result, as it is.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from tuner.model.tiles import Operands, one_program_per_tile, tile_occupancy, tile_of

if TYPE_CHECKING:
    from tuner.model.predict import DeviceSpec


def seconds(ops: Operands, config: Mapping, smem_bytes: Callable[[], int],
            spec: DeviceSpec) -> float:
    tile = tile_of(config)
    return one_program_per_tile(ops, tile, config["GROUP_M"],
                                tile_occupancy(ops, tile, smem_bytes(), spec), False, spec)
