"""An analytical performance model of the mm and gemv variants: predicted time per config.

It serves callers that cannot measure: the warm start of each Optuna study (enqueue the
model's top configs), `tune suggest` (a config per shape with no GPU) and the runtime
fallback for keys no table holds. Its job is ranking, not accuracy: the few configs it puts
first should hold a near-best one. So every term is a simple bound that says why it is
there, monotone where it should be, and each constant says where it comes from.

How `predict_ms` times one config:

- Padding (`pad`) changes the problem the variant sees; the pad copies (A and B in, the
  result out) cost their bytes at DRAM bandwidth plus a launch each.
- A tile program walks K in BLOCK_K steps. One step of the programs resident on an SM
  takes the longest of: their tensor-core work (at a per-tile efficiency: wgmma or
  mma.sync), their shared-memory traffic, their load-issue slots (pointer loads only;
  scalar when a stride is not a multiple of 16 elements), one program's serial chain (its
  MMA and the barrier bubble, plus the load latency when loads cannot be asynchronous), and
  memory: the SM keeps at most num_stages - 1 steps of loads, and at most
  INFLIGHT_BYTES_PER_SM, in flight, each for its latency (Little's law).
- Every load waits about a DRAM latency: the programs that share a panel of A or B run
  side by side and ask for it together, so nearly all wait on a fill. The grouped tile
  order (GROUP_M) sets how often A and B come from DRAM, so the kernel's DRAM floor.
- Programs run in rounds of (resident programs per SM) × SMs, so a grid that spills over
  a round pays a whole extra one (wave quantization). Residency comes from shared memory,
  registers and warps. The persistent variant keeps one program per SM and saves the
  per-tile pipeline refill; split-K multiplies the programs (filling the SMs when M×N has
  few tiles) and pays fp32 partials and a finishing kernel; gemv streams the matrix once
  on the CUDA cores.
- A kernel takes at least its DRAM bytes at sustained bandwidth, and a launch overhead.
- cuBLAS (the `cublas` variant, torch's own GEMM) is a roofline at the rates it was measured
  to sustain, slower where operand strides are unaligned: the yardstick the runtime's
  fallback holds tuned candidates to.

Hopper-shaped: the rules for wgmma, TMA and the cp.async pipeline are sm_90's; other devices
get their own peak rates and bandwidth but Hopper's rules.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import NamedTuple

from tuner.dtypes import DTYPES
from tuner.execution.backends import DeviceInfo
from tuner.kernels.base import MAX_REGS_PER_THREAD
from tuner.kernels.mma import TileOperands, uses_wgmma
from tuner.shapes import Shape
from tuner.space import SearchSpace

# ---------------------------------------------------------------------------------------
# Hopper SM resources (CUDA C Programming Guide, compute capability 9.0).
REGS_PER_SM = 65536
MAX_THREADS_PER_SM = 2048
MAX_PROGRAMS_PER_SM = 32
SMEM_RESERVED_PER_PROGRAM = 1024  # the driver keeps 1 KB of shared memory per block
SMEM_BYTES_PER_CLOCK = 128  # 32 banks × 4 bytes per clock per SM (~33 TB/s over 132 SMs)
LSU_LANES = 32  # load/store lanes per SM: one warp-wide memory instruction per clock
FP32_LANES = 128  # FP32 FMA lanes per SM (gemv multiplies on CUDA cores)
FP32_BYTES = 4  # accumulators and split-K partials

# ---------------------------------------------------------------------------------------
# Model constants: public figures, instruction counts, or stated assumptions. None was fitted
# numerically to the anchor measurements (/work/shared/anchors), but three were picked among
# plausible values with measurements in view, and their comments say so: SCALAR_LOAD_SLOTS,
# LOAD_LATENCY_S and INFLIGHT_BYTES_PER_SM. One, KMAJOR_B_TWO_GROUP_SLOWDOWN, is a ratio of
# H200 timings, for an effect the model's terms do not explain; the CUBLAS_* ones are read off
# H200 timings of cuBLAS itself, which the model does not describe kernel by kernel.

# Dense GEMMs sustain ~80% of the datasheet tensor peak: the peak assumes the boost clock,
# which drops under full tensor load (chipsandcheese.com, "Nvidia's H100: Funny L2, and Tons
# of Bandwidth", saw ~80% of boost). cuBLAS's best bf16 GEMMs run at ~780-800 of 989 TF/s.
# The whole SM runs at that clock, so the model's other per-clock rates (shared memory, load
# issue, the epilogue's stores, gemv's lanes) count cycles at it too (_sm_clock_hz).
TENSOR_EFFICIENCY = 0.8
# Tiles wgmma cannot take (BLOCK_M not a multiple of 64, or num_warps not whole warp
# groups) run Ampere's synchronous mma.sync, reported at about half of wgmma's throughput
# on H100 (practitioners' measurements; Luo et al., arXiv 2402.13499 and 2501.12084,
# compare the two paths).
MMA_SYNC_FRACTION = 0.5
# CUDA-core GEMMs (IEEE fp32) block outputs in registers so that each operand read from
# shared memory feeds several FMAs; below a 4×4 block per thread (CUTLASS's SIMT kernels use
# 8×8) the reads outnumber the FMAs and the lanes idle.
FMA_OUTPUTS_PER_THREAD = 16
# Load-issue slots on the LSU lanes. A 16-byte vector load: the cp.async and its address
# update. A scalar load (a stride Triton cannot prove a multiple of 16 elements), per
# element: the global load, the shared-memory store (cp.async needs >= 4 bytes), the 64-bit
# address add (2) and the K mask (compare and select, 2). An instruction count, checked
# against the 4097×4095×4100 anchor row (~150 TF/s unpadded, cuBLAS included).
VECTOR_LOAD_SLOTS = 2
SCALAR_LOAD_SLOTS = 6
# Each K step of a loop that is not warp-specialized waits on a barrier and issues the next
# loads between MMAs: a bubble of about one shared-memory round trip plus the MMA commit.
# wgmma is asynchronous, so the bubble overlaps the MMA in flight; mma.sync pays it.
STEP_BUBBLE_CYCLES = 64
# Load latency: a DRAM access ~600-700 ns unloaded (~1000+ cycles: public H100
# microbenchmarks, chipsandcheese, Luo et al.), more once a GEMM's requests queue: taken as
# 1 µs for every load. Tile programs that share a panel run side by side and request it
# together, so even the loads L2 serves mostly wait on the same fill. Chosen over 0.8 µs
# (small-M GEMMs then come out DRAM-bound, which the anchors' small-M rows contradict) and
# over L2-hit latencies for reused panels (large GEMMs then run ~10% over the anchors).
LOAD_LATENCY_S = 1.0e-6
# Bytes one SM can keep in flight (the misses it can track; the hardware figure is not
# public): half of its 256 KB of L1 and shared memory, where cp.async and TMA land their
# loads. About 3.5× the share of bandwidth × latency each SM needs when all are busy
# (4.8 TB/s × 1 µs / 132 SMs ≈ 36 KB), so a kernel on fewer than a third of the SMs is
# latency-bound: why GEMMs with very few tiles want split-K. Raised from 64 KB against H200
# measurements: that bound held a deep 128×128 pipeline to half its measured speed, so the
# model put split-K ahead of single-pass tiles that measured faster at M = 16-512. Its pick
# among the measured configs of 52 H200 studies went from 0.891 to 0.922 of the best
# (benchmarks/model_on_studies.py), on the exhaustive recording from 0.924 to 0.933; any
# value from 96 to 192 KB ranks the same. The anchors' rows still hold (tests/test_model.py).
INFLIGHT_BYTES_PER_SM = 128 * 1024
# An outstanding miss holds a 128-byte L1 line slot whatever part of the line it wants, so
# a tile row narrower than a line takes a whole slot.
REQUEST_BYTES = 128
# Share of L2 that keeps operands for reuse: H100's L2 is two partitions that may each hold
# a copy of a line (chipsandcheese's "funny L2"), so about half of it.
L2_USABLE_FRACTION = 0.5
# Streaming kernels reach ~90% of datasheet HBM bandwidth (refresh, bank conflicts).
DRAM_EFFICIENCY = 0.9
# Device time a kernel launch adds to a timed call: launch latency and ramp-up of the grid.
LAUNCH_S = 2.0e-6
# Registers a tile program needs beside its fp32 accumulator (indices, pointers, loop
# state). Past MAX_REGS_PER_THREAD the compiler spills to local memory, and the step's
# work runs several times slower.
BASE_REGS = 40
SPILL_SLOWDOWN = 3.0
# cuBLAS (the `cublas` variant), modelled as a roofline rather than by its kernels. On one
# H200 (benchmarks/results/h200-issue4/vs_cublas.md) it reached 0.70-0.76 of the datasheet
# tensor rate on the large aligned bf16 GEMMs (688-754 TF/s) and 0.74 of the fp32 rate at
# 2048³; its memory-bound GEMMs with one or 16 rows moved their bytes at 0.72-0.76 of the
# datasheet bandwidth once a launch and a load latency are taken off (1x4096x4096,
# 1x28672x4096, 16x4096x4096), though at 0.53 and 0.63 for 1x6144x4096 and 1x4096x14336.
CUBLAS_MATMUL_FRACTION = 0.75
CUBLAS_DRAM_FRACTION = 0.75
# Operand strides that are not 16-byte multiples keep cuBLAS from its fast Hopper kernels:
# 4097x4095x4100 bf16 ran at 146.6 TF/s, 5.1 times its aligned-rate roofline (same file).
CUBLAS_UNALIGNED_SLOWDOWN = 5.0
# A K loop run once per program (general, tma, split-K) by two wgmma warp groups (8 warps)
# on a B stored K-contiguous (layout 't') runs this much slower than the model's step: a
# measured figure, the one constant here fitted to timings (see _loop_slowdown).
KMAJOR_B_TWO_GROUP_SLOWDOWN = 1.2


# ---------------------------------------------------------------------------------------
# Devices


@dataclass(frozen=True)
class DeviceSpec:
    """What the model needs to know of a GPU: datasheet rates and a few sizes."""
    name: str
    sm_count: int
    smem_per_block: int  # bytes one program may use (the opt-in maximum)
    smem_per_sm: int  # bytes all resident programs share
    fp16_tflops: float  # dense tensor-core fp16 / bf16 with fp32 accumulation
    tf32_tflops: float  # dense tensor-core tf32 (fp32 inputs with allow_tf32)
    fp8_tflops: float  # dense tensor-core fp8 e4m3
    fp32_tflops: float  # IEEE fp32 on the CUDA cores
    dram_tbps: float
    l2_bytes: int
    clock_ghz: float  # the clock the tensor peak is quoted at: converts cycles to seconds

    def matmul_tflops(self, dtype: str, allow_tf32: bool = False) -> float:
        """Peak rate of a GEMM's multiply-adds in `dtype`."""
        if dtype == "fp32":
            return self.tf32_tflops if allow_tf32 else self.fp32_tflops
        return self.fp8_tflops if dtype == "fp8e4m3" else self.fp16_tflops

    @property
    def clock_hz(self) -> float:
        return self.clock_ghz * 1e9


# NVIDIA datasheets, dense figures (the sheets print tensor rates with sparsity, doubled).
# H100 SXM5: 132 SMs, 989.4 TF fp16/bf16 (132 SMs × 4096 flops/clock × 1.83 GHz), 494.7 TF
# tf32, 1978.9 TF fp8, 67 TF fp32, 3.35 TB/s HBM3, 50 MB L2; 228 KB shared memory per SM,
# 227 KB per block.
H100_SXM = DeviceSpec("H100 SXM", 132, 232448, 233472, 989.4, 494.7, 1978.9, 66.9, 3.35,
                      50 * 2**20, 1.83)
# H100 PCIe: 114 SMs, 756 TF bf16, 378 tf32, 1513 fp8, 51 fp32, 2.0 TB/s HBM2e.
H100_PCIE = replace(H100_SXM, name="H100 PCIe", sm_count=114, fp16_tflops=756.5,
                    tf32_tflops=378.0, fp8_tflops=1513.0, fp32_tflops=51.2, dram_tbps=2.0,
                    clock_ghz=1.62)
# H100 NVL: 132 SMs, 835 TF bf16, 418 tf32, 1671 fp8, 60 fp32, 3.9 TB/s HBM3.
H100_NVL = replace(H100_SXM, name="H100 NVL", fp16_tflops=835.5, tf32_tflops=417.5,
                   fp8_tflops=1670.5, fp32_tflops=60.0, dram_tbps=3.9, clock_ghz=1.545)
# H200 SXM: the H100 SXM's compute with 141 GB of HBM3e at 4.8 TB/s. H200 NVL: the H100
# NVL's compute at 4.8 TB/s.
H200_SXM = replace(H100_SXM, name="H200 SXM", dram_tbps=4.8)
H200_NVL = replace(H100_NVL, name="H200 NVL", dram_tbps=4.8)
# A100 SXM4 80 GB, the template for Ampere parts: 108 SMs, 312 TF bf16, 156 tf32, no fp8
# (the bf16 rate), 19.5 fp32, 2.04 TB/s, 40 MB L2, 164 KB shared memory per SM.
A100_SXM = DeviceSpec("A100 SXM", 108, 166912, 167936, 312.0, 156.0, 312.0, 19.5, 2.04,
                      40 * 2**20, 1.41)

# Substrings of torch's device names, most specific first ("NVIDIA H100 80GB HBM3" is the
# SXM part; "NVIDIA GH200 480GB" gets the H200's figures, close to its own).
_KNOWN_PARTS = (("H200 NVL", H200_NVL), ("H200", H200_SXM), ("H100 NVL", H100_NVL),
                ("H100 PCIe", H100_PCIE), ("H100", H100_SXM), ("A100", A100_SXM))
# Per compute-capability major version, the part an unknown name is scaled from.
_ARCHITECTURE_TEMPLATES = {8: A100_SXM, 9: H100_SXM}


def device_spec(info: DeviceInfo) -> DeviceSpec:
    """The spec of the device a DeviceInfo describes.

    Known parts by name. An unknown GPU gets its architecture's template (Hopper's for 9.x
    and anything else) with compute scaled by its SM count. The CPU interpreter (compute
    capability "none", sm_count = CPU cores) gets an H100 SXM, so `tune suggest` works
    without a GPU. A GPU's own shared-memory limit replaces the template's.
    """
    spec = next((s for part, s in _KNOWN_PARTS if part in info.name), None)
    if spec is None:
        spec = _scaled_template(info)
    if info.compute_capability != "none" and info.smem_per_block > 0:
        spec = replace(spec, smem_per_block=info.smem_per_block)
    return spec


def _scaled_template(info: DeviceInfo) -> DeviceSpec:
    try:
        major = int(info.compute_capability.split(".")[0])
    except ValueError:  # "none": the interpreter, whose sm_count is the CPU's cores
        return H100_SXM
    template = _ARCHITECTURE_TEMPLATES.get(major, H100_SXM)
    scale = info.sm_count / template.sm_count
    return replace(template, name=f"{info.name} (scaled {template.name})",
                   sm_count=info.sm_count, fp16_tflops=template.fp16_tflops * scale,
                   tf32_tflops=template.tf32_tflops * scale,
                   fp8_tflops=template.fp8_tflops * scale,
                   fp32_tflops=template.fp32_tflops * scale)


# ---------------------------------------------------------------------------------------
# The problem a variant sees


class _Operands(NamedTuple):
    """The GEMM as the variant runs it: after padding, with storage strides in elements.
    (A tuple: it keys the model's caches, hashed once per config scored.)"""
    M: int
    N: int
    K: int
    dtype: str
    tensor_cores: bool  # False: IEEE fp32 on the CUDA cores
    itemsize: int
    out_itemsize: int
    a_k_unit: bool  # A's unit stride runs along K (layout 'n')
    b_k_unit: bool  # B's unit stride runs along K (layout 't')
    a_stride: int  # A's storage row stride: K for 'n', M for 't'
    b_stride: int  # B's storage row stride: N for 'n', K for 't'
    tma_addressable: bool  # both strides 16-byte multiples, as TMA needs (kernels/tma.py)

    @property
    def a_bytes(self) -> int:
        return self.M * self.K * self.itemsize

    @property
    def b_bytes(self) -> int:
        return self.K * self.N * self.itemsize

    @property
    def c_bytes(self) -> int:
        return self.M * self.N * self.out_itemsize

    @property
    def flops(self) -> int:
        return 2 * self.M * self.N * self.K


def _padded(dim: int, pad: int) -> int:
    """As kernels/padding.py: rounded up to a multiple of pad; a dimension of 1 stays 1."""
    return dim if dim == 1 or not pad else -(-dim // pad) * pad


@lru_cache(maxsize=1024)
def _operands(shape: Shape, pad: int, allow_tf32: bool) -> _Operands:
    dtype = DTYPES[shape.dtype]
    # Padding rounds K and the operands' strides up (kernels/padding.py); the product keeps
    # its M×N, written in place.
    Mp, Np, K = (_padded(d, pad) for d in (shape.M, shape.N, shape.K))
    M, N = shape.M, shape.N
    a_k_unit, b_k_unit = shape.layout[0] == "n", shape.layout[1] == "t"
    a_stride, b_stride = K if a_k_unit else Mp, K if b_k_unit else Np
    itemsize = dtype.torch.itemsize
    return _Operands(M, N, K, shape.dtype, shape.dtype != "fp32" or allow_tf32, itemsize,
                     dtype.out.itemsize, a_k_unit, b_k_unit, a_stride, b_stride,
                     all(s * itemsize % 16 == 0 for s in (a_stride, b_stride)))


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ---------------------------------------------------------------------------------------
# One K step of one program


class _Tile(NamedTuple):
    """A tile program's shape and launch options (a tuple: one is built per config)."""
    BM: int
    BN: int
    BK: int
    stages: int
    warps: int


def _tile_of(config: Mapping) -> _Tile:
    return _Tile(config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"], config["num_stages"],
                 config["num_warps"])


def _output_tiles(ops: _Operands, tile: _Tile) -> int:
    return _cdiv(ops.M, tile.BM) * _cdiv(ops.N, tile.BN)


@dataclass(frozen=True)
class _Step:
    """Seconds and bytes of one K step of one program, before programs share the SM."""
    mma: float  # tensor cores (or FMA lanes)
    smem: float  # shared-memory traffic
    lsu: float  # load-issue slots
    chain: float  # the program's own serial work, which other resident programs can hide
    charged: float  # bytes loaded, each request counted as at least REQUEST_BYTES
    depth: int  # steps of loads in flight: num_stages - 1 when asynchronous, else 1


def _sm_clock_hz(spec: DeviceSpec) -> float:
    """The clock an SM sustains under a GEMM's load, which converts its cycles to seconds.

    Counted at the boost clock instead, a 128×128 tile's shared-memory traffic (80 KB per step
    of 64: the loads written in, A read once and B twice by the 64-row wgmmas) came out no
    slower than its multiplies, so the model ranked it with the 128×256 tile, whose traffic per
    multiply is lower. On an H200 the 128×128 tiles ran 10-20% slower on large shapes (e.g.
    2048x5120x5120: 0.179-0.205 ms against 0.168, benchmarks/results/h200-issue6), and the
    runtime's nearest fallback picked them there. Counting at this clock, the model's pick
    among the exhaustive recording's configs went from 0.933 to 0.966 of the best, among the
    52 studies' measured configs from 0.926 to 0.932 (benchmarks/model_on_studies.py).
    """
    return spec.clock_hz * TENSOR_EFFICIENCY


def _sm_flops(ops: _Operands, spec: DeviceSpec) -> float:
    """Sustained multiply-add flops per second of one SM for this dtype."""
    tflops = spec.matmul_tflops(ops.dtype, allow_tf32=ops.tensor_cores)
    return tflops * 1e12 * TENSOR_EFFICIENCY / spec.sm_count


def _mma_efficiency(tile: _Tile, ops: _Operands) -> float:
    """Share of the SM's sustained peak a tile's multiplies reach: all of it with wgmma;
    MMA_SYNC_FRACTION with mma.sync, less when the tile has fewer 16×8 instruction tiles
    than warps (the idle warps' share is lost); on CUDA cores, the register-blocking share."""
    if not ops.tensor_cores:
        outputs = tile.BM * tile.BN / (32 * tile.warps)
        return min(1.0, outputs / FMA_OUTPUTS_PER_THREAD)
    if uses_wgmma(tile.BM, tile.warps, ops.tensor_cores):
        return 1.0
    busy_warps = min(tile.warps, (tile.BM // 16) * max(tile.BN // 8, 1))
    return MMA_SYNC_FRACTION * max(busy_warps, 1) / tile.warps


def _smem_traffic(tile: _Tile, itemsize: int, wgmma: bool) -> int:
    """Shared-memory bytes per step: the loaded tiles written in, then read by the MMAs.

    A wgmma reads a 64-row slice of A and its warp group's columns of B, so B is read once
    per 64 rows and A once per warp group splitting N. mma.sync warps (split over M first)
    each read their rows of A and columns of B.
    """
    writes = (tile.BM + tile.BN) * tile.BK
    if wgmma:
        groups = tile.warps // 4
        m_split = min(groups, tile.BM // 64)
        reads = tile.BM * (groups // m_split) + tile.BN * (tile.BM // 64)
    else:
        m_split = min(tile.warps, max(tile.BM // 16, 1))
        reads = tile.BM * (tile.warps // m_split) + tile.BN * m_split
    return (writes + reads * tile.BK) * itemsize


def _aligned(stride: int) -> bool:
    """Triton specializes integer arguments on being multiples of 16: only such strides let
    it prove 16-byte alignment, and so vectorize pointer loads."""
    return stride % 16 == 0


def _load_slots(elements: int, stride: int, itemsize: int, masked: bool) -> float:
    """LSU slots to load `elements` through pointers: per 16-byte vector when the stride is
    aligned (one more for a K mask: K not a multiple of BLOCK_K), else per element."""
    if not _aligned(stride):
        return elements * SCALAR_LOAD_SLOTS
    return elements / (16 // itemsize) * (VECTOR_LOAD_SLOTS + masked)


def _charged(elements: int, run: int, itemsize: int) -> float:
    """Bytes of a tile load as the memory system counts them: rows of `run` contiguous
    elements, each taking at least REQUEST_BYTES."""
    return elements * itemsize * max(1.0, REQUEST_BYTES / (run * itemsize))


def _accumulator_regs(tile: _Tile) -> int:
    """Registers per thread for the fp32 BM×BN accumulator, spread over the warps."""
    return tile.BM * tile.BN // (32 * tile.warps)


def _program_regs(tile: _Tile, ops: _Operands) -> int:
    """Registers per thread of a tile program. On the CUDA cores (IEEE fp32) a thread also
    holds the A and B fragments of its outer products, about as many registers again as
    its accumulators: on an H200, 128×128 tiles on 4 warps (128 accumulators a thread) ran
    at 9 TF/s, spilling, where 8 warps (64 each) ran at 42 (benchmarks/data/recording-h200)."""
    operands = 0 if ops.tensor_cores else _accumulator_regs(tile)
    return _accumulator_regs(tile) + operands + BASE_REGS


def _spill_factor(regs: int) -> float:
    return 1.0 if regs <= MAX_REGS_PER_THREAD else SPILL_SLOWDOWN


def _loop_slowdown(ops: _Operands, tile: _Tile, persistent: bool) -> float:
    """How much slower than its resources allow a tile loop's step runs: a measured
    KMAJOR_B_TWO_GROUP_SLOWDOWN for a one-tile-per-program loop of two wgmma warp groups
    over a K-contiguous B, else 1.

    benchmarks/data/candidates-h200.json.gz times the same tiles (block sizes, GROUP_M,
    stages, warps) as tma and persistent programs side by side. With 8 warps on a K-contiguous
    B (layout nt) the tma program took a median 1.24× the persistent one's time over 105
    pairs (never less than 1.01×), with B N-contiguous (nn) 1.01× over 45; with 4 warps, one
    warp group, 0.97-0.98× over 18. Both run the same tile_product (kernels/tma.py), a
    program per tile for as many tiles as SMs; what differs is the code Triton builds around
    the loop. On that file's 24 shapes-dev shapes, the measured over predicted time of 8-warp
    nt configs had a median of 1.25 for tma, 1.17 for general and 1.21 for split-K, against
    1.00 and 0.90 for tma and general on nn and 1.01 for persistent on nt. Left out, the model
    preferred such configs on hold-out shapes where they ran 14-30% behind the tile a table
    also held (512x4096x11008: split-K 128×256 over tma 128×128 on 4 warps).
    """
    two_groups = tile.warps >= 8 and uses_wgmma(tile.BM, tile.warps, ops.tensor_cores)
    return KMAJOR_B_TWO_GROUP_SLOWDOWN if two_groups and ops.b_k_unit and not persistent else 1.0


@lru_cache(maxsize=65536)
def _tile_step(ops: _Operands, tile: _Tile, tma: bool, persistent: bool,
               warp_specialized: bool, spec: DeviceSpec) -> _Step:
    """One K step of a tile program: BM×BK of A and BK×BN of B into an fp32 accumulator."""
    BM, BN, BK = tile.BM, tile.BN, tile.BK
    clock, item = _sm_clock_hz(spec), ops.itemsize
    spill = _spill_factor(_program_regs(tile, ops))
    wgmma = uses_wgmma(tile.BM, tile.warps, ops.tensor_cores)
    mma = 2 * BM * BN * BK / (_sm_flops(ops, spec) * _mma_efficiency(tile, ops)) * spill
    smem = _smem_traffic(tile, item, wgmma) / (SMEM_BYTES_PER_CLOCK * clock)
    # TMA: one thread issues a bulk copy per operand. Pointers: every element is addressed.
    masked = ops.K % BK != 0
    lsu = 0.0 if tma else spill * (
        _load_slots(BM * BK, ops.a_stride, item, masked and ops.a_k_unit)
        + _load_slots(BK * BN, ops.b_stride, item, masked and ops.b_k_unit)) / (
        LSU_LANES * clock)
    # Scalar loads cannot be cp.async copies: the loop loads, waits, stores, then multiplies.
    asynchronous = tma or (_aligned(ops.a_stride) and _aligned(ops.b_stride))
    bubble = STEP_BUBBLE_CYCLES / clock
    if not asynchronous:
        chain = LOAD_LATENCY_S + lsu + mma + bubble
    elif warp_specialized:  # producer warps wait and load; the consumers only multiply
        chain = mma
    elif wgmma:  # asynchronous MMAs: the barrier wait overlaps the MMA in flight
        chain = max(mma, bubble)
    else:
        chain = mma + bubble
    charged = (_charged(BM * BK, BK if ops.a_k_unit else BM, item)
               + _charged(BK * BN, BK if ops.b_k_unit else BN, item))
    depth = tile.stages - 1 if asynchronous and tile.stages > 1 else 1
    slow = _loop_slowdown(ops, tile, persistent)
    return _Step(mma * slow, smem * slow, lsu * slow, chain * slow, charged, depth)


@lru_cache(maxsize=4096)
def _gemv_step(ops: _Operands, block_m: int, block_k: int, stages: int, warps: int,
               unit_along_k: bool, stride: int, spec: DeviceSpec) -> _Step:
    """One K step of a gemv program: BLOCK_K of x and BLOCK_M×BLOCK_K of the matrix, held
    in registers as fp32 and reduced on the CUDA cores."""
    item, clock = ops.itemsize, _sm_clock_hz(spec)
    elements = block_m * block_k
    asynchronous = _aligned(stride) and stages > 1
    spill = _spill_factor(elements // (32 * warps) + BASE_REGS)
    alu = 2 * elements / (FP32_LANES * clock) * spill  # convert to fp32, then multiply-add
    masked = ops.K % block_k != 0 and unit_along_k
    lsu = _load_slots(elements, stride, item, masked) / (LSU_LANES * clock) * spill
    smem = 2 * elements * item / (SMEM_BYTES_PER_CLOCK * clock) if asynchronous else 0.0
    chain = alu if asynchronous else LOAD_LATENCY_S + lsu + alu
    charged = (_charged(block_k, block_k, item)
               + _charged(elements, block_k if unit_along_k else block_m, item))
    return _Step(alu, smem, lsu, chain, charged, stages - 1 if asynchronous else 1)


# ---------------------------------------------------------------------------------------
# Residency and DRAM traffic


@functools.cache
def _variants() -> dict:
    """Every kernel variant by name (imported on first use: the kernels import Triton)."""
    from tuner.kernels import KERNELS
    return {v.name: v for kernel in KERNELS.values() for v in kernel.variants}


def _smem_bytes(config: Mapping, operands: TileOperands) -> int:
    """Shared memory one program of the config uses: the variant's own estimate."""
    variant = _variants()[config["variant"]]
    return variant.smem_bytes({p: config[p] for p in variant.params}, operands)


def _resident_programs(smem_bytes: int, regs_per_thread: int, warps: int,
                       spec: DeviceSpec) -> int:
    """Programs one SM holds at once: shared memory, registers and threads all limit it."""
    threads = 32 * warps
    return max(1, min(spec.smem_per_sm // (smem_bytes + SMEM_RESERVED_PER_PROGRAM),
                      REGS_PER_SM // (min(regs_per_thread, MAX_REGS_PER_THREAD) * threads),
                      MAX_THREADS_PER_SM // threads,
                      MAX_PROGRAMS_PER_SM))


def _tile_occupancy(ops: _Operands, config: Mapping, tile: _Tile, spec: DeviceSpec) -> int:
    return _resident_programs(_smem_bytes(config, ops),
                              _program_regs(tile, ops), tile.warps, spec)


@lru_cache(maxsize=65536)
def _operand_dram_bytes(ops: _Operands, tile: _Tile, group_m: int, concurrent: int,
                        spec: DeviceSpec) -> float:
    """Bytes of A and B fetched from DRAM, given the grouped tile order and `concurrent`
    programs.

    An operand that fits in L2 is fetched once. Otherwise a panel of B is fetched once per
    set of tile rows that use it together: a group of GROUP_M rows, or the rows a wave of
    `concurrent` programs spans. A's rows stay cached while their group sweeps the columns
    if a group's rows fit, else they are fetched once per wave's worth of columns.
    """
    budget = spec.l2_bytes * L2_USABLE_FRACTION
    tiles_m, tiles_n = _cdiv(ops.M, tile.BM), _cdiv(ops.N, tile.BN)
    group_rows = min(group_m, tiles_m)
    rows_together = max(group_rows, min(tiles_m, concurrent // tiles_n))
    cols_together = min(tiles_n, _cdiv(concurrent, group_rows))
    b_fetches = 1 if ops.b_bytes <= budget else _cdiv(tiles_m, rows_together)
    a_fits = min(ops.a_bytes, group_rows * tile.BM * ops.K * ops.itemsize) <= budget
    a_fetches = 1 if a_fits else _cdiv(tiles_n, cols_together)
    return ops.a_bytes * a_fetches + ops.b_bytes * b_fetches


def _dram_seconds(nbytes: float, spec: DeviceSpec) -> float:
    return nbytes / (spec.dram_tbps * 1e12 * DRAM_EFFICIENCY)


# ---------------------------------------------------------------------------------------
# Schedules: how programs share the SMs


def _step_seconds(step: _Step, resident: int) -> float:
    """Time for `resident` co-resident programs to each do one K step on one SM.

    They share the tensor cores, shared memory and load lanes (throughput); each has its own
    serial chain; and the SM keeps at most `depth` steps, and INFLIGHT_BYTES_PER_SM, of
    loads in flight, each for LOAD_LATENCY_S (Little's law).
    """
    shared = resident * max(step.mma, step.smem, step.lsu)
    in_flight = min(resident * step.depth * step.charged, INFLIGHT_BYTES_PER_SM)
    memory = resident * step.charged * LOAD_LATENCY_S / in_flight
    return max(shared, step.chain, memory)


def _epilogue_seconds(tile: _Tile, out_itemsize: int, spec: DeviceSpec) -> float:
    """Storing one output tile: registers through shared memory to global (write + read)."""
    return 2 * tile.BM * tile.BN * out_itemsize / (SMEM_BYTES_PER_CLOCK * _sm_clock_hz(spec))


def _rounds_seconds(programs: int, steps: int, step: _Step, occupancy: int, epilogue: float,
                    spec: DeviceSpec) -> float:
    """One program per tile (or per tile and split), `occupancy` of them resident per SM.

    The busiest SM runs ceil(programs / SMs) programs, in rounds (wave quantization); a
    round pays the pipeline fill (one latency), its K steps and its programs' epilogues. A
    last, partial round runs fewer programs side by side, each step sooner.
    """
    per_sm = _cdiv(programs, spec.sm_count)
    resident = min(occupancy, per_sm)

    def round_seconds(together: int) -> float:
        return LOAD_LATENCY_S + steps * _step_seconds(step, together) + together * epilogue

    full_rounds, rest = divmod(per_sm, resident)
    return full_rounds * round_seconds(resident) + (round_seconds(rest) if rest else 0.0)


def _persistent_seconds(tiles: int, steps: int, step: _Step, epilogue: float,
                        refill_hidden: bool, spec: DeviceSpec) -> float:
    """One program per SM looping over its tiles: the pipeline fills once; between tiles the
    next tile's loads overlap the epilogue (and with a flattened or warp-specialized loop the
    pipeline never drains). Alone on its SM, nothing hides its latency."""
    boundary = epilogue if refill_hidden else max(epilogue, LOAD_LATENCY_S)
    per_tile = steps * _step_seconds(step, 1) + boundary
    return LOAD_LATENCY_S + _cdiv(tiles, spec.sm_count) * per_tile


# ---------------------------------------------------------------------------------------
# Variants: seconds of one config's kernel launches on the (padded) operands


def _general(ops: _Operands, config: Mapping, spec: DeviceSpec) -> float:
    tile = _tile_of(config)
    return _one_program_per_tile(ops, tile, config["GROUP_M"],
                                 _tile_occupancy(ops, config, tile, spec), False, spec)


def _tma(ops: _Operands, config: Mapping, spec: DeviceSpec) -> float:
    if not ops.tma_addressable:
        return math.inf
    tile = _tile_of(config)
    return _one_program_per_tile(ops, tile, config["GROUP_M"],
                                 _tile_occupancy(ops, config, tile, spec), True, spec)


def _one_program_per_tile(ops: _Operands, tile: _Tile, group_m: int, occupancy: int,
                          tma: bool, spec: DeviceSpec) -> float:
    """The general (pointer loads) and tma variants: a program per tile, grouped order."""
    return _kernel_seconds(ops, tile, group_m, occupancy * spec.sm_count,
                           _tile_rounds(ops, tile, occupancy, tma, spec), spec)


def _kernel_seconds(ops: _Operands, tile: _Tile, group_m: int, programs_at_once: int,
                    compute_s: float, spec: DeviceSpec) -> float:
    """One launch of a tile kernel: its compute, or its DRAM traffic (how often A and B are
    refetched depends on the tiles in flight at once), whichever is longer."""
    concurrent = min(_output_tiles(ops, tile), programs_at_once)
    dram_bytes = _operand_dram_bytes(ops, tile, group_m, concurrent, spec) + ops.c_bytes
    return max(compute_s, _dram_seconds(dram_bytes, spec)) + LAUNCH_S


@lru_cache(maxsize=65536)
def _tile_rounds(ops: _Operands, tile: _Tile, occupancy: int, tma: bool,
                 spec: DeviceSpec) -> float:
    """The SMs' share of _one_program_per_tile (GROUP_M changes only its DRAM bytes)."""
    return _rounds_seconds(_output_tiles(ops, tile), _cdiv(ops.K, tile.BK),
                           _tile_step(ops, tile, tma, False, False, spec), occupancy,
                           _epilogue_seconds(tile, ops.out_itemsize, spec), spec)


def _persistent(ops: _Operands, config: Mapping, spec: DeviceSpec) -> float:
    """TMA tiles with one program per SM: saves the per-tile refill, loses co-resident
    programs. EPILOGUE_SUBTILE changes only shared memory (_smem_bytes), not the time.

    Warp-specialized tiles of 128 rows or more do not compile on Hopper (kernels/persistent.py:
    Triton splits the tile in M, which fixed descriptor block shapes forbid), so cannot run.
    """
    tile = _tile_of(config)
    warp_specialized = bool(config["WARP_SPECIALIZE"])
    if not ops.tma_addressable or (warp_specialized and tile.BM >= 128):
        return math.inf
    refill_hidden = bool(config["FLATTEN"]) or warp_specialized
    return _one_program_per_sm(ops, tile, config["GROUP_M"], warp_specialized, refill_hidden,
                               spec)


def _one_program_per_sm(ops: _Operands, tile: _Tile, group_m: int, warp_specialized: bool,
                        refill_hidden: bool, spec: DeviceSpec) -> float:
    return _kernel_seconds(ops, tile, group_m, spec.sm_count,
                           _tile_loops(ops, tile, warp_specialized, refill_hidden, spec), spec)


@lru_cache(maxsize=65536)
def _tile_loops(ops: _Operands, tile: _Tile, warp_specialized: bool, refill_hidden: bool,
                spec: DeviceSpec) -> float:
    """The SMs' share of _one_program_per_sm (GROUP_M changes only its DRAM bytes)."""
    return _persistent_seconds(_output_tiles(ops, tile), _cdiv(ops.K, tile.BK),
                               _tile_step(ops, tile, True, True, warp_specialized, spec),
                               _epilogue_seconds(tile, ops.out_itemsize, spec),
                               refill_hidden, spec)


def _splitk(ops: _Operands, config: Mapping, spec: DeviceSpec) -> float:
    tile = _tile_of(config)
    return _split_programs(ops, tile, config["SPLIT_K"], _tile_occupancy(ops, config, tile, spec),
                           spec)


@lru_cache(maxsize=65536)
def _split_programs(ops: _Operands, tile: _Tile, splits: int, occupancy: int,
                    spec: DeviceSpec) -> float:
    """SPLIT_K programs per tile over slices of K into fp32 partials, summed into C by each
    tile's last program (kernels/splitk.py).

    More programs fill the SMs when M×N has few tiles, and each walks a shorter chain of K
    steps; the price is the partial traffic: S slices written, then read back by the tiles'
    last programs after the rest.

    The slices are written after the multiplies, not beside them: every program stores its
    fp32 tile once its K loop ends, and split-K's programs fill one or two waves that end
    together, so the stores (S times the output, at 4 bytes an element) follow the compute
    at DRAM bandwidth. Counted as overlapping, split-K at M = 128-512 measured a median 1.35×
    its prediction against 1.06-1.14× for one-pass tiles (the H200 studies); 384x6144x4096
    then took a split-K config predicted 1.3% faster than the persistent tile, which ran
    28-37% slower (benchmarks/results/h200-issue6/validate-retune*.md).
    """
    programs = _output_tiles(ops, tile) * splits
    steps = _cdiv(_cdiv(ops.K, tile.BK), splits)
    # No GROUP_M: program ids run row-major over the tiles of each split.
    slice_bytes = ops.M * ops.N * FP32_BYTES
    written = splits * slice_bytes
    concurrent = min(programs, occupancy * spec.sm_count)
    dram_bytes = _operand_dram_bytes(ops, tile, 1, concurrent, spec) + written
    partials = _rounds_seconds(programs, steps, _tile_step(ops, tile, False, False, False, spec),
                               occupancy, _epilogue_seconds(tile, FP32_BYTES, spec), spec)
    main = max(partials + _dram_seconds(written, spec), _dram_seconds(dram_bytes, spec)) + LAUNCH_S
    return main + _dram_seconds(written + ops.c_bytes, spec)


def _gemv(ops: _Operands, config: Mapping, spec: DeviceSpec) -> float:
    """y = A @ x on the CUDA cores, bound by reading the matrix once (kernels/gemv.py).

    The matrix is A (N == 1) or B transposed (M == 1); each program reduces BLOCK_M of its
    rows over K in BLOCK_K steps: the tile machinery with a multiply-and-sum for an MMA,
    each matrix byte read by one program, straight from DRAM.
    """
    block_m, block_k, warps = config["BLOCK_M"], config["BLOCK_K"], config["num_warps"]
    rows, unit_along_k, stride = ((ops.M, ops.a_k_unit, ops.a_stride) if ops.N == 1
                                  else (ops.N, ops.b_k_unit, ops.b_stride))
    step = _gemv_step(ops, block_m, block_k, config["num_stages"], warps, unit_along_k,
                      stride, spec)
    regs = block_m * block_k // (32 * warps) + BASE_REGS
    occupancy = _resident_programs(_smem_bytes(config, ops), regs, warps, spec)
    dram_bytes = (rows + 1) * ops.K * ops.itemsize + rows * ops.out_itemsize  # A, x, y
    compute = _rounds_seconds(_cdiv(rows, block_m), _cdiv(ops.K, block_k), step, occupancy,
                              0.0, spec)
    return max(compute, _dram_seconds(dram_bytes, spec)) + LAUNCH_S


def _cublas(ops: _Operands, config: Mapping, spec: DeviceSpec) -> float:
    """torch's own GEMM (kernels/cublas.py): the GEMM's roofline at the rates cuBLAS
    sustains, plus one launch and one load latency (its pipeline's fill, as a tile kernel's).

    A roofline, not a model of cuBLAS's kernels: on the 24 shapes of
    benchmarks/results/h200-issue4/vs_cublas.md it predicts 0.73-1.16x the measured time,
    under 0.9x on mid-sized GEMMs, whose wave quantization it does not see. So where a tuned
    tile and cuBLAS run close, it leans to cuBLAS; a tile predicted faster still has the
    model's reasons for it.
    """
    rate = spec.matmul_tflops(ops.dtype, allow_tf32=ops.tensor_cores) * 1e12
    compute = ops.flops / (rate * CUBLAS_MATMUL_FRACTION)
    if not ops.tma_addressable:
        compute *= CUBLAS_UNALIGNED_SLOWDOWN
    bandwidth = spec.dram_tbps * 1e12 * CUBLAS_DRAM_FRACTION
    memory = (ops.a_bytes + ops.b_bytes + ops.c_bytes) / bandwidth
    return max(compute, memory) + LOAD_LATENCY_S + LAUNCH_S


_VARIANT_SECONDS = {"general": _general, "tma": _tma, "persistent": _persistent,
                    "splitk": _splitk, "gemv": _gemv, "cublas": _cublas}


@lru_cache(maxsize=1024)
def _pad_copy_seconds(shape: Shape, pad: int, spec: DeviceSpec) -> float:
    """The pad variant's copies: A and B read and written into their padded buffers, in one
    copy kernel (the result is written in place)."""
    if not pad:
        return 0.0
    ops = _operands(shape, 0, False)
    return _dram_seconds(2 * (ops.a_bytes + ops.b_bytes), spec) + LAUNCH_S


# ---------------------------------------------------------------------------------------
# Public API


def _shape_timer(shape: Shape, spec: DeviceSpec, allow_tf32: bool):
    """A function config -> predicted seconds for one shape, which prepares the padded
    operands and the pad copies once per pad value rather than once per config."""
    per_pad: dict[int, tuple[_Operands, float]] = {}

    def seconds(config: Mapping) -> float:
        variant = config["variant"]
        if variant not in _VARIANT_SECONDS:
            raise ValueError(f"no performance model for variant {variant!r}")
        pad = config.get("pad", 0)
        if pad not in per_pad:
            per_pad[pad] = (_operands(shape, pad, allow_tf32),
                            _pad_copy_seconds(shape, pad, spec))
        ops, copies = per_pad[pad]
        return _VARIANT_SECONDS[variant](ops, config, spec) + copies

    return seconds


def predict_ms(shape: Shape, config: Mapping, spec: DeviceSpec,
               allow_tf32: bool = False) -> float:
    """Predicted milliseconds of one call of `config` on `shape`; math.inf where the model
    knows the variant cannot run it (TMA on strides that are not 16-byte multiples).

    config is a search-space config: `variant`, `pad` and that variant's parameters.
    Raises ValueError for a variant the model does not know (a user's own kernel).
    """
    return _shape_timer(shape, spec, allow_tf32)(config) * 1e3


def predicted_or_inf(shape: Shape, config: Mapping, spec: DeviceSpec) -> float:
    """predict_ms, or math.inf for a variant the model does not know (never preferred)."""
    try:
        return predict_ms(shape, config, spec)
    except ValueError:
        return math.inf


def fastest_of(shape: Shape, configs: Sequence[Mapping], spec: DeviceSpec) -> int:
    """The index of the config predicted fastest on `shape` (the first on a tie). A config of
    a variant the model does not know is never preferred to one it does. The model's own
    choice, as benchmarks/model_on_studies.py scores it; the runtime's nearest fallback
    calibrates these predictions by its neighbours' measurements first
    (runtime._fastest_predicted)."""
    predicted = [predicted_or_inf(shape, config, spec) for config in configs]
    return min(range(len(configs)), key=lambda i: (predicted[i], i))


def predicted_tflops(shape: Shape, ms: float) -> float:
    """The TFLOP/s of the shape's GEMM done in `ms` milliseconds."""
    return shape.flops / (ms * 1e-3) / 1e12


def _scored(shape: Shape, space: SearchSpace, spec: DeviceSpec,
            allow_tf32: bool) -> list[tuple]:
    """(ms, shared memory, warps, index, config) for every modelled config of the space,
    fastest first. Ties go to the config using fewer resources, as in the tuner's final
    re-timing, then to the space's order."""
    operands = _operands(shape, 0, allow_tf32)  # padding changes neither dtype nor itemsize
    seconds = _shape_timer(shape, spec, allow_tf32)
    scored = [(seconds(config) * 1e3, _smem_bytes(config, operands), config.get("num_warps", 0),
               index, config)
              for index, config in enumerate(space.configs())
              if config["variant"] in _VARIANT_SECONDS]
    scored.sort(key=lambda entry: entry[:4])
    return scored


def rank_configs(shape: Shape, space: SearchSpace, kernel, spec: DeviceSpec,
                 smem_limit: int | None = None, k: int | None = None,
                 allow_tf32: bool = False,
                 distinct: Callable[[dict], Hashable] | None = None) -> list[tuple[float, dict]]:
    """(predicted ms, config) for the feasible configs of `space` on `shape`, fastest first,
    at most k of them; with `distinct`, only the fastest config of each distinct(config).

    Every config is scored (cheap), then checked with `kernel.feasible` in ranked order
    until k pass: the kernel's own checks (shared memory, pads that change nothing, variants
    that cannot run the shape) always decide, yet only about k of those checks run, which
    keeps the 300,000-config mm space to a few seconds. Without k every config is checked
    (several seconds more). Variants the model does not know are left out.
    """
    from tuner.execution.measure import meta_gemm  # imports the Triton kernels: not at module level

    gemm = meta_gemm(shape)
    limit = smem_limit or spec.smem_per_block
    ranked: list[tuple[float, dict]] = []
    taken: set = set()
    for ms, *_, config in _scored(shape, space, spec, allow_tf32):
        tag = None if distinct is None else distinct(config)
        if tag is not None and tag in taken:
            continue
        if kernel.feasible(config, gemm, limit) is None:
            ranked.append((ms, config))
            taken.add(tag)
            if len(ranked) == k:
                break
    return ranked
