"""The `tma` variant's term in the analytical model (tuner.model.predict): the general
variant's program per tile, its loads issued by TMA (kernels/tma.py), which cannot address
strides that are not 16-byte multiples.

Beside the kernel rather than in it, so that a change to the model leaves the kernel's source
hash, and with it every tuned result, as it is.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from tuner.model.tiles import Operands, one_program_per_tile, tile_occupancy, tile_of

if TYPE_CHECKING:
    from tuner.model.predict import DeviceSpec


def seconds(ops: Operands, config: Mapping, smem_bytes: Callable[[], int],
            spec: DeviceSpec) -> float:
    if not ops.tma_addressable:
        return math.inf
    tile = tile_of(config)
    return one_program_per_tile(ops, tile, config["GROUP_M"],
                                tile_occupancy(ops, tile, smem_bytes(), spec), True, spec)
