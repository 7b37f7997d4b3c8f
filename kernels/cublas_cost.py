"""The `cublas` variant's term in the analytical model (tuner.model.predict): torch's own
GEMM (kernels/cublas.py) as the GEMM's roofline at the rates cuBLAS sustains, plus one launch
and one load latency (its pipeline's fill, as a tile kernel's).

A roofline, not a model of cuBLAS's kernels: it does not see their wave quantization, so it
runs a little fast on mid-sized GEMMs, and where a tuned tile and cuBLAS run close it leans to
cuBLAS; a tile predicted faster still has the model's reasons for it. It is the yardstick the
runtime's fallback holds tuned candidates to; benchmarks/vs_cublas.py measures the rates.
One exception: a few outputs (tuner.model.regimes.few_outputs), where cuBLAS reduces K in
few programs and reads the operands far below the bandwidth.

Beside the kernel rather than in it, so that a change to the model leaves the kernel's source
hash, and with it every tuned result, as it is.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from tuner.model.regimes import few_outputs
from tuner.model.tiles import LAUNCH_S, LOAD_LATENCY_S, Operands

if TYPE_CHECKING:
    from tuner.model.predict import DeviceSpec

# Shares of the datasheet tensor rate and DRAM bandwidth cuBLAS sustains, read off H200
# timings of cuBLAS itself: its large aligned GEMMs (bf16, and fp32 at 2048³) run at 0.70-0.76
# of the rate, its memory-bound ones (one or 16 rows) move their bytes at about 0.75 of the
# bandwidth once a launch and a load latency are taken off.
CUBLAS_MATMUL_FRACTION = 0.75
CUBLAS_DRAM_FRACTION = 0.75
# Operand strides that are not 16-byte multiples keep cuBLAS from its fast Hopper kernels
# (4097x4095x4100 bf16 runs about 5 times slower than its aligned-rate roofline).
CUBLAS_UNALIGNED_SLOWDOWN = 5.0
# Bytes per second cuBLAS reads the operands of a few outputs at: the fastest rate timed on
# H200 over such GEMMs along K of 2^16 and 2^17 (benchmarks/results/fallback/README.md,
# "Tiny outputs"): a chain of dependent loads, not the DRAM bandwidth. The fastest, so that
# the term never makes cuBLAS look slower than it was seen to run.
CUBLAS_FEW_OUTPUTS_BYTES_PER_S = 1.1e11


def seconds(ops: Operands, config: Mapping, smem_bytes: Callable[[], int],
            spec: DeviceSpec) -> float:
    rate = spec.matmul_tflops(ops.dtype, allow_tf32=ops.tensor_cores) * 1e12
    compute = ops.flops / (rate * CUBLAS_MATMUL_FRACTION)
    if not ops.tma_addressable:
        compute *= CUBLAS_UNALIGNED_SLOWDOWN
    bandwidth = spec.dram_tbps * 1e12 * CUBLAS_DRAM_FRACTION
    if few_outputs(ops.M, ops.N):
        bandwidth = min(bandwidth, CUBLAS_FEW_OUTPUTS_BYTES_PER_S)
    memory = (ops.a_bytes + ops.b_bytes + ops.c_bytes) / bandwidth
    return max(compute, memory) + LOAD_LATENCY_S + LAUNCH_S
