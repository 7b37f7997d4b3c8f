"""The `gemv` variant's term in the analytical model (tuner.model.predict): y = A @ x on the
CUDA cores, bound by reading the matrix once (kernels/gemv.py).

Beside the kernel rather than in it, so that a change to the model leaves the kernel's source
hash, and with it every tuned result, as it is.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from tuner.model.tiles import (
    BASE_REGS,
    LAUNCH_S,
    Operands,
    cdiv,
    dram_seconds,
    gemv_step,
    resident_programs,
    rounds_seconds,
)

if TYPE_CHECKING:
    from tuner.model.predict import DeviceSpec


def seconds(ops: Operands, config: Mapping, smem_bytes: Callable[[], int],
            spec: DeviceSpec) -> float:
    """The matrix is A (N == 1) or B transposed (M == 1); each program reduces BLOCK_M of its
    rows over K in BLOCK_K steps: the tile machinery with a multiply-and-sum for an MMA,
    each matrix byte read by one program, straight from DRAM."""
    block_m, block_k, warps = config["BLOCK_M"], config["BLOCK_K"], config["num_warps"]
    rows, unit_along_k, stride = ((ops.M, ops.a_k_unit, ops.a_stride) if ops.N == 1
                                  else (ops.N, ops.b_k_unit, ops.b_stride))
    step = gemv_step(ops, block_m, block_k, config["num_stages"], warps, unit_along_k,
                     stride, spec)
    regs = block_m * block_k // (32 * warps) + BASE_REGS
    occupancy = resident_programs(smem_bytes(), regs, warps, spec)
    dram_bytes = (rows + 1) * ops.K * ops.itemsize + rows * ops.out_itemsize  # A, x, y
    compute = rounds_seconds(cdiv(rows, block_m), cdiv(ops.K, block_k), step, occupancy,
                             0.0, spec)
    return max(compute, dram_seconds(dram_bytes, spec)) + LAUNCH_S
