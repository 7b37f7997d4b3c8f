"""The `gemv`, `multigemv`, `mmagemv` and `gluongemv` variants' term in the analytical model
(tuner.model.predict): Y = A @ X, bound by reading the matrix once (kernels/gemv.py,
kernels/gluon_gemv.py).

Beside the kernel rather than in it, so that a change to the model leaves the kernel's source
hash, and with it every tuned result, as it is.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from tuner.kernels.base import MIN_DOT_TILE
from tuner.model.tiles import (
    BASE_REGS,
    INFLIGHT_BYTES_PER_SM,
    LAUNCH_S,
    LOAD_LATENCY_S,
    STEP_OVERLAP_NORM,
    Operands,
    cdiv,
    dram_seconds,
    gemv_step,
    resident_programs,
    rounds_seconds,
)

if TYPE_CHECKING:
    from tuner.model.predict import DeviceSpec

# How close to the DRAM bound gluongemv's term counts as on it (gluon_seconds).
DRAM_TIE = 0.005


def _read(ops: Operands, spec: DeviceSpec) -> tuple[int, int, float]:
    """(rows of the matrix, vectors, DRAM seconds of one pass): the matrix is A where N is
    the short side, else B transposed, and the pass reads it and the vectors once and writes
    Y once."""
    rows, vectors = max(ops.M, ops.N), min(ops.M, ops.N)
    nbytes = (rows + vectors) * ops.K * ops.itemsize + rows * vectors * ops.out_itemsize
    return rows, vectors, dram_seconds(nbytes, spec)


def seconds(ops: Operands, config: Mapping, smem_bytes: Callable[[], int],
            spec: DeviceSpec, rows_param: str = "BLOCK_M", tensor_cores: bool = False) -> float:
    """The matrix is A where N is the short side, else B transposed (kernels/gemv.py); each
    program reduces `rows_param` of its rows over K in BLOCK_K steps against the short side's
    vectors: the tile machinery with multiply-and-sums for an MMA, each matrix byte read by
    one program, straight from DRAM, and every vector by every program. On tensor cores
    (mmagemv) the CUDA cores touch each matrix element once, as for a single vector, and the
    accumulator is one MMA column block."""
    block_m, block_k, warps = config[rows_param], config["BLOCK_K"], config["num_warps"]
    unit_along_k, stride = ((ops.a_k_unit, ops.a_stride) if ops.N <= ops.M
                            else (ops.b_k_unit, ops.b_stride))
    rows, vectors, dram = _read(ops, spec)
    step = gemv_step(ops, block_m, block_k, config["num_stages"], warps, unit_along_k,
                     stride, spec, 1 if tensor_cores else vectors)
    held = MIN_DOT_TILE * (block_m + block_k) if tensor_cores else vectors * block_m * block_k
    regs = held // (32 * warps) + BASE_REGS
    occupancy = resident_programs(smem_bytes(), regs, warps, spec)
    compute = rounds_seconds(cdiv(rows, block_m), cdiv(ops.K, block_k), step, occupancy,
                             0.0, spec)
    return max(compute, dram) + LAUNCH_S


def gluon_seconds(ops: Operands, config: Mapping, smem_bytes: Callable[[], int],
                  spec: DeviceSpec, block_v: Callable[[int], int],
                  registers: Callable[[Mapping, int, int], int]) -> float:
    """gluongemv (kernels/gluon_gemv.py): each warp loads its own BLOCK_K of the program's
    rows straight to registers, num_stages steps of it in flight, and nothing pipelines them
    through shared memory. So an SM streams its rows at the bytes its warps keep in flight
    per LOAD_LATENCY_S (Little's law), and the device at most at DRAM's rate; the two
    combine as a step's throughput and wait do (STEP_OVERLAP_NORM). Within DRAM_TIE of the
    DRAM bound a config counts as on it, as the other variants' read-bound configs are: the
    model resolves no finer, and ties go to the least shared memory. Over an exhaustive H100
    run at decode batch 6-8 (benchmarks/data/studies-h100-gluongemv.json.gz) the pick runs
    0.975 of the fastest (geomean, min 0.964); on the DRAM bound alone, 0.465.

    block_v(vectors) and registers(config, block_v, itemsize) are the kernel's own rules
    (its padded vectors, its registers per thread)."""
    block_m, block_k, warps = config["BLOCK_M"], config["BLOCK_K"], config["num_warps"]
    stages, item = config["num_stages"], ops.itemsize
    rows, vectors, dram = _read(ops, spec)  # the vectors' padding is masked, never read
    resident = resident_programs(smem_bytes(),
                                 registers(config, block_v(vectors), item) + BASE_REGS,
                                 warps, spec)
    programs_per_sm = cdiv(cdiv(rows, block_m), spec.sm_count)
    inflight = min(min(programs_per_sm, resident) * warps * block_m * block_k * item * stages,
                   INFLIGHT_BYTES_PER_SM)
    stream = programs_per_sm * block_m * ops.K * item / inflight * LOAD_LATENCY_S
    both = (stream ** STEP_OVERLAP_NORM + dram ** STEP_OVERLAP_NORM) ** (1 / STEP_OVERLAP_NORM)
    return (dram if both <= dram * (1 + DRAM_TIE) else both) + LAUNCH_S
