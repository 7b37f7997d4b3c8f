"""The `kreduce` variant's term in the analytical model (tuner.model.predict): K_SLICES
programs, each reducing its slice of K for the whole (tiny) output on the CUDA cores, then
the last one summing their fp32 partials (kernels/kreduce.py).

Beside the kernel rather than in it, so that a change to the model leaves the kernel's source
hash, and with it every tuned result, as it is.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from tuner.kernels._partials import slices_summed_at_once
from tuner.model.tiles import (
    BASE_REGS,
    FP32_LANES,
    LAUNCH_S,
    LOAD_LATENCY_S,
    LSU_LANES,
    SMEM_BYTES_PER_CLOCK,
    Operands,
    Step,
    aligned,
    cdiv,
    charged_bytes,
    dram_seconds,
    load_slots,
    resident_programs,
    rounds_seconds,
    sm_clock_hz,
    spill_factor,
)

if TYPE_CHECKING:
    from tuner.model.predict import DeviceSpec


def _power_of_two(n: int) -> int:
    return 1 << (n - 1).bit_length()


def seconds(ops: Operands, config: Mapping, smem_bytes: Callable[[], int],
            spec: DeviceSpec) -> float:
    """The slices' programs in rounds, each a few K steps, or the operands' bytes at DRAM
    bandwidth, whichever is longer; then the fix-up, one load latency per chunk of slices it
    sums (a dependent chain on one SM), and the launch."""
    block_m, block_n = _power_of_two(ops.M), _power_of_two(ops.N)
    block_k, slices, warps = config["BLOCK_K"], config["K_SLICES"], config["num_warps"]
    step = _step(ops, block_m, block_n, block_k, config["num_stages"], warps, spec)
    regs = (block_m * block_n + block_m + block_n) * block_k // (32 * warps) + BASE_REGS
    occupancy = resident_programs(smem_bytes(), regs, warps, spec)
    compute = rounds_seconds(slices, cdiv(cdiv(ops.K, block_k), slices), step, occupancy, 0.0,
                             spec)
    memory = dram_seconds(ops.a_bytes + ops.b_bytes, spec)
    chunks = cdiv(slices, slices_summed_at_once(block_m * block_n, slices))
    return max(compute, memory) + chunks * LOAD_LATENCY_S + LAUNCH_S


def _run(k_unit: bool, extent: int, stride: int, block_k: int) -> int:
    """Contiguous elements of one operand's K step: a row of BLOCK_K where K is the unit
    stride; else BLOCK_K rows of `extent` (M or N) elements, one run where they lie packed."""
    if k_unit:
        return block_k
    return extent * block_k if stride == extent else extent


def _step(ops: Operands, block_m: int, block_n: int, block_k: int, stages: int, warps: int,
          spec: DeviceSpec) -> Step:
    """One K step: BLOCK_M×BLOCK_K of A and BLOCK_N×BLOCK_K of B loaded, converted to fp32,
    multiplied into the BLOCK_M×BLOCK_N×BLOCK_K accumulator. Loads are vectors only along a
    unit stride whose rows are aligned (as gemv's); otherwise they are scalar and cannot be
    asynchronous."""
    item, clock = ops.itemsize, sm_clock_hz(spec)
    a_elements, b_elements = block_m * block_k, block_n * block_k
    spill = spill_factor((block_m * block_n * block_k + a_elements + b_elements)
                         // (32 * warps) + BASE_REGS)
    alu = (block_m * block_n * block_k + a_elements + b_elements) / (FP32_LANES * clock) * spill
    # Vectors run along the unit stride: K, or M (N) where no row (column) wraps, its extent
    # a power of two. Other loads count a stride of 1, never a multiple of 16.
    a_stride = ops.a_stride if ops.a_k_unit or block_m == ops.M else 1
    b_stride = ops.b_stride if ops.b_k_unit or block_n == ops.N else 1
    # The K mask (K not a multiple of BLOCK_K) is not counted: a few programs' last step
    # pays it, and counted on every step it makes K rounded up to BLOCK_K cost less than K.
    lsu = (load_slots(a_elements, a_stride, item, False)
           + load_slots(b_elements, b_stride, item, False)) / (LSU_LANES * clock) * spill
    asynchronous = stages > 1 and aligned(a_stride) and aligned(b_stride)
    smem = (2 * (a_elements + b_elements) * item / (SMEM_BYTES_PER_CLOCK * clock)
            if asynchronous else 0.0)
    chain = alu if asynchronous else LOAD_LATENCY_S + lsu + alu
    charged = (charged_bytes(ops.M * block_k, _run(ops.a_k_unit, ops.M, ops.a_stride, block_k),
                             item)
               + charged_bytes(ops.N * block_k, _run(ops.b_k_unit, ops.N, ops.b_stride,
                                                     block_k), item))
    return Step(alu, smem, lsu, chain, charged, stages - 1 if asynchronous else 1)
