"""The `gluon` variant's term in the analytical model (tuner.model.predict): wgmma tiles with
one program per SM (kernels/gluon_mm.py), whose loads run ahead across tile boundaries.

In the model's terms that is the persistent variant's flattened loop: the pipeline fills once
and never drains between tiles (refill hidden), each step is an asynchronous wgmma fed by TMA,
and a tile's epilogue runs on the warps that multiply. With WARP_SPECIALIZE a producer warp
issues the loads, so a step's chain is its multiplies alone; unlike Triton's own warp
specialization (kernels/persistent_cost.py), the multiplying warps are num_warps. Without it
the multiplying warps issue each step's copies themselves (A's and B's, and the tail's),
which a short wgmma does not hide (tuner.model.tiles.COPY_ISSUE_CYCLES).
Where the kernel cannot run (no wgmma for the tile or the dtype, operands TMA cannot address,
8- and 32-bit operands that are not K-major) the term is infinite, as `unsupported` refuses.

Beside the kernel rather than in it, so that a change to the model leaves the kernel's source
hash, and with it every tuned result, as it is.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from tuner.kernels.persistent_cost import one_program_per_sm
from tuner.model.tiles import Operands, tile_of, uses_wgmma

if TYPE_CHECKING:
    from tuner.model.predict import DeviceSpec


def _transposed(ops: Operands) -> Operands:
    """The operands of out^T = b^T a^T: b's storage as the M×K operand, a's as the K×N one."""
    return ops._replace(M=ops.N, N=ops.M, a_k_unit=ops.b_k_unit, b_k_unit=ops.a_k_unit,
                        a_stride=ops.b_stride, b_stride=ops.a_stride)


def runs(ops: Operands, config: Mapping) -> bool:
    """Whether the kernel can run these operands with this tile at all."""
    k_major = ops.a_k_unit and ops.b_k_unit
    return (ops.tma_addressable and ops.tensor_cores and (ops.itemsize == 2 or k_major)
            and uses_wgmma(config["BLOCK_M"], config["num_warps"], ops.tensor_cores))


def seconds(ops: Operands, config: Mapping, smem_bytes: Callable[[], int], spec: DeviceSpec,
            output_tile: Callable[[Mapping], tuple[int, int]]) -> float:
    """output_tile: the kernel's (rows, columns) of the output per tile. Under SWAP_AB the
    kernel runs the transposed product (out^T = b^T a^T), and is counted so."""
    if not runs(ops, config):
        return math.inf
    rows, cols = output_tile(config)
    if config["SWAP_AB"]:
        ops, rows, cols = _transposed(ops), cols, rows
    tile = tile_of(config)._replace(BM=rows, BN=cols)
    warp_specialized = bool(config["WARP_SPECIALIZE"])
    copies = 0 if warp_specialized else 3 if config["BLOCK_N_TAIL"] else 2  # _load_step's
    return one_program_per_sm(ops, tile, config["GROUP_M"], warp_specialized, True, spec,
                              copies)
