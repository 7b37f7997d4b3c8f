"""Which matrix-multiply instructions Triton gives a tile, and the shared memory its main loop
keeps: one answer for the kernels' feasibility check and the analytical model.

On Hopper (sm_90), Triton 3.x lowers a tile's tl.dot to wgmma when the operands go to the
tensor cores and the tile is whole warp groups (num_warps a multiple of 4) of 64 rows each
(BLOCK_M a multiple of 64); other tiles run Ampere's mma.sync, and IEEE fp32 runs on the
CUDA cores. The two pipeline differently. wgmma reads both operands from shared memory, so
the software pipeline keeps num_stages tiles of A and B there. The others load a step into
registers before multiplying, so one of the num_stages steps lives in registers and
num_stages - 1 are buffered. Triton's own figures (benchmarks/constraint_accuracy.py compares
them with these estimates) match this exactly for the pointer-based kernels; counting
num_stages everywhere rejected half the configs that ran.

Other devices: without wgmma (sm_80, sm_89) every tile keeps num_stages - 1, so counting
num_stages for wgmma-shaped tiles there overestimates, which is safe. Blackwell's tcgen05
pipelines are not modelled.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

# Which tiles get wgmma: a fact of Triton's lowering that the model's building blocks hold
# (they import nothing from the kernels), re-exported here for the kernels.
from tuner.model.tiles import uses_wgmma


class TileOperands(Protocol):
    """What the shared-memory estimates read of a GEMM's operands (kernels.base.Gemm and the
    model's operands both provide it)."""
    itemsize: int  # bytes per input element
    tensor_cores: bool  # False: IEEE fp32 on the CUDA cores


def buffered_stages(tunables: Mapping[str, int], operands: TileOperands) -> int:
    """Steps of A and B tiles the main loop keeps in shared memory (see the module doc)."""
    if uses_wgmma(tunables["BLOCK_M"], tunables["num_warps"], operands.tensor_cores):
        return tunables["num_stages"]
    return max(tunables["num_stages"] - 1, 1)


def pipeline_smem_bytes(tunables: Mapping[str, int], operands: TileOperands) -> int:
    """Shared memory of a tile main loop's buffered A and B tiles (Triton's figure for
    128x256x128, 3 stages, bf16, wgmma on sm_90: 294912)."""
    tile_elements = (tunables["BLOCK_M"] * tunables["BLOCK_K"]
                     + tunables["BLOCK_K"] * tunables["BLOCK_N"])
    return buffered_stages(tunables, operands) * tile_elements * operands.itemsize
