"""The `gemv`, `multigemv` and `mmagemv` variants' term in the analytical model
(tuner.model.predict): Y = A @ X, bound by reading the matrix once (kernels/gemv.py).

Beside the kernel rather than in it, so that a change to the model leaves the kernel's source
hash, and with it every tuned result, as it is.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from tuner.kernels.base import MIN_DOT_TILE
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
            spec: DeviceSpec, rows_param: str = "BLOCK_M", tensor_cores: bool = False) -> float:
    """The matrix is A where N is the short side, else B transposed (kernels/gemv.py); each
    program reduces `rows_param` of its rows over K in BLOCK_K steps against the short side's
    vectors: the tile machinery with multiply-and-sums for an MMA, each matrix byte read by
    one program, straight from DRAM, and every vector by every program. On tensor cores
    (mmagemv) the CUDA cores touch each matrix element once, as for a single vector, and the
    accumulator is one MMA column block."""
    block_m, block_k, warps = config[rows_param], config["BLOCK_K"], config["num_warps"]
    rows, unit_along_k, stride = ((ops.M, ops.a_k_unit, ops.a_stride) if ops.N <= ops.M
                                  else (ops.N, ops.b_k_unit, ops.b_stride))
    vectors = min(ops.M, ops.N)
    step = gemv_step(ops, block_m, block_k, config["num_stages"], warps, unit_along_k,
                     stride, spec, 1 if tensor_cores else vectors)
    held = MIN_DOT_TILE * (block_m + block_k) if tensor_cores else vectors * block_m * block_k
    regs = held // (32 * warps) + BASE_REGS
    occupancy = resident_programs(smem_bytes(), regs, warps, spec)
    dram_bytes = ((rows + vectors) * ops.K * ops.itemsize  # the matrix and the vectors
                  + rows * vectors * ops.out_itemsize)
    compute = rounds_seconds(cdiv(rows, block_m), cdiv(ops.K, block_k), step, occupancy,
                             0.0, spec)
    return max(compute, dram_seconds(dram_bytes, spec)) + LAUNCH_S
