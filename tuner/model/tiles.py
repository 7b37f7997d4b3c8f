"""The analytical model's building blocks: what one tile or gemv program costs on an SM.

The variants' cost terms (each variant's `model_seconds`, beside it in kernels/) compose these:
the operands a variant sees (`Operands`), one K step of one program (`tile_step`,
`gemv_step`), how many programs an SM holds (`resident_programs`, `tile_occupancy`), the DRAM
traffic of a grouped tile order (`operand_dram_bytes`) and how programs share the SMs
(`rounds_seconds`, `persistent_seconds`, `kernel_seconds`). tuner/model/predict.py describes
the model as a whole.

Imports nothing from kernels/ (the kernels import it), and nothing but the standard library.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from tuner.model.predict import DeviceSpec

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
# 32-bit registers one thread may hold (every NVIDIA GPU since Kepler); past it, the compiler
# spills to local memory.
MAX_REGS_PER_THREAD = 255

# ---------------------------------------------------------------------------------------
# Model constants: public figures, instruction counts, or stated assumptions. None was fitted
# numerically to the anchor measurements in tests/test_model.py, but three were picked among
# plausible values with measurements in view, and their comments say so: SCALAR_LOAD_SLOTS,
# LOAD_LATENCY_S and INFLIGHT_BYTES_PER_SM. One, KMAJOR_B_TWO_GROUP_SLOWDOWN, is a ratio of
# H200 timings, for an effect the model's terms do not explain (the cuBLAS term's constants,
# in kernels/cublas_cost.py, are read off timings of cuBLAS itself).

# Dense GEMMs sustain ~80% of the datasheet tensor peak: the peak assumes the boost clock,
# which drops under full tensor load (chipsandcheese.com, "Nvidia's H100: Funny L2, and Tons
# of Bandwidth", saw ~80% of boost). cuBLAS's best bf16 GEMMs run at ~780-800 of 989 TF/s.
# The whole SM runs at that clock, so the model's other per-clock rates (shared memory, load
# issue, the epilogue's stores, gemv's lanes) count cycles at it too (sm_clock_hz).
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
# A kernel that states its own pipeline (kernels/gluon_mm.py) and has no producer warp issues
# each step's TMA copies from the multiplying warps, in the same gap: each copy (its barrier's
# expected bytes, the copy, the ring's bookkeeping) adds this much to the gap, which the MMA
# in flight hides only while it lasts longer. Fitted to 168 pairs of gluon tiles timed with and
# without a producer warp on an H200 (benchmarks/results/model-quality/gluon_ws-h200.md):
# 64-row tiles with a tail ran up to 1.44x slower without one, 128×128 tiles as fast.
COPY_ISSUE_CYCLES = 160
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
# latency-bound: why GEMMs with very few tiles want split-K. Chosen over 64 KB, which held a
# deep 128×128 pipeline to half its measured speed and put split-K ahead of one-pass tiles
# that measured faster at M = 16-512; values from 96 to 192 KB rank the same
# (benchmarks/model_on_studies.py scores the choice).
INFLIGHT_BYTES_PER_SM = 128 * 1024
# How a step's throughput work (tensor cores, shared memory, load issue) and its load wait
# combine: their p-norm with this p, a maximum with a rounded corner. Neither hides the other
# fully (near balance the MMAs stall on late tiles, the loads on busy slots), and a plain
# maximum sees no gain from stages that measured 10-20% faster (benchmarks/results/vs-cublas/
# pipeline-depth-h100.md). p = 4 ranks the studies' measured configs best of 2-8 and the
# plain maximum (benchmarks/results/model-quality/model_on_studies-*.md).
STEP_OVERLAP_NORM = 4
# An outstanding miss holds a 128-byte L1 line slot whatever part of the line it wants, so
# a tile row narrower than a line takes a whole slot.
REQUEST_BYTES = 128
# The fewest contiguous bytes per thread of a K step's matrix load with which a gemv over
# several vectors runs pipelined: on an H100 at 2-4 vectors, 4 bytes a thread ran 1.3-1.8x
# the time of 8 or 16 in 8 of 11 studies, as if each step waited on its loads; a single
# vector ran as fast with 4 (H200 gemv studies). The timings are
# benchmarks/data/studies-h100-multigemv.json.gz (tests/test_multigemv.py scores the model's
# pick among them).
MULTIVECTOR_MIN_THREAD_BYTES = 8
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
# A K loop run once per program (general, tma, split-K) by two wgmma warp groups (8 warps)
# on a B stored K-contiguous (layout 't') runs this much slower than the model's step: a
# measured ratio, the one constant here fitted to timings (see loop_slowdown).
KMAJOR_B_TWO_GROUP_SLOWDOWN = 1.2


# Warps that multiply in a warp-specialized Hopper tile loop (tl.range(warp_specialize=)):
# Triton 3.6 and 3.9 give it two warp groups of its own beside the loads and the epilogue,
# whatever num_warps says (kernels/persistent.py).
WS_MMA_WARPS = 8


def uses_wgmma(block_m: int, num_warps: int, tensor_cores: bool) -> bool:
    """Hopper's wgmma: a warp group (4 warps) per 64 rows of the tile, on tensor cores
    (tuner.kernels.mma says how Triton chooses)."""
    return tensor_cores and num_warps % 4 == 0 and block_m % 64 == 0


# ---------------------------------------------------------------------------------------
# The problem a variant sees


class Operands(NamedTuple):
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


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ---------------------------------------------------------------------------------------
# One K step of one program


class Tile(NamedTuple):
    """A tile program's shape and launch options (a tuple: one is built per config)."""
    BM: int
    BN: int
    BK: int
    stages: int
    warps: int


def tile_of(config: Mapping) -> Tile:
    return Tile(config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"], config["num_stages"],
                 config["num_warps"])


def output_tiles(ops: Operands, tile: Tile) -> int:
    return cdiv(ops.M, tile.BM) * cdiv(ops.N, tile.BN)


@dataclass(frozen=True)
class Step:
    """Seconds and bytes of one K step of one program, before programs share the SM."""
    mma: float  # tensor cores (or FMA lanes)
    smem: float  # shared-memory traffic
    lsu: float  # load-issue slots
    chain: float  # the program's own serial work, which other resident programs can hide
    charged: float  # bytes loaded, each request counted as at least REQUEST_BYTES
    depth: int  # steps of loads in flight: num_stages - 1 when asynchronous, else 1


def sm_clock_hz(spec: DeviceSpec) -> float:
    """The clock an SM sustains under a GEMM's load, which converts its cycles to seconds.

    Counted at the boost clock instead, a 128×128 tile's shared-memory traffic (80 KB per step
    of 64: the loads written in, A read once and B twice by the 64-row wgmmas) comes out no
    slower than its multiplies, so the model ranks it with the 128×256 tile, whose traffic per
    multiply is lower, though it runs 10-20% slower on large shapes
    (benchmarks/model_on_studies.py scores the choice).
    """
    return spec.clock_hz * TENSOR_EFFICIENCY


def sm_flops(ops: Operands, spec: DeviceSpec) -> float:
    """Sustained multiply-add flops per second of one SM for this dtype."""
    tflops = spec.matmul_tflops(ops.dtype, allow_tf32=ops.tensor_cores)
    return tflops * 1e12 * TENSOR_EFFICIENCY / spec.sm_count


def mma_efficiency(tile: Tile, ops: Operands) -> float:
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


def smem_traffic(tile: Tile, itemsize: int, wgmma: bool) -> int:
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


def aligned(stride: int) -> bool:
    """Triton specializes integer arguments on being multiples of 16: only such strides let
    it prove 16-byte alignment, and so vectorize pointer loads."""
    return stride % 16 == 0


def load_slots(elements: int, stride: int, itemsize: int, masked: bool) -> float:
    """LSU slots to load `elements` through pointers: per 16-byte vector when the stride is
    aligned (one more for a K mask: K not a multiple of BLOCK_K), else per element."""
    if not aligned(stride):
        return elements * SCALAR_LOAD_SLOTS
    return elements / (16 // itemsize) * (VECTOR_LOAD_SLOTS + masked)


def charged_bytes(elements: int, run: int, itemsize: int) -> float:
    """Bytes of a tile load as the memory system counts them: rows of `run` contiguous
    elements, each taking at least REQUEST_BYTES."""
    return elements * itemsize * max(1.0, REQUEST_BYTES / (run * itemsize))


def accumulator_regs(tile: Tile) -> int:
    """Registers per thread for the fp32 BM×BN accumulator, spread over the warps."""
    return tile.BM * tile.BN // (32 * tile.warps)


def program_regs(tile: Tile, ops: Operands) -> int:
    """Registers per thread of a tile program. On the CUDA cores (IEEE fp32) a thread also
    holds the A and B fragments of its outer products, about as many registers again as
    its accumulators: 128×128 tiles on 4 warps (128 accumulators a thread) spill and run
    several times slower than on 8 warps (64 each)."""
    operands = 0 if ops.tensor_cores else accumulator_regs(tile)
    return accumulator_regs(tile) + operands + BASE_REGS


def spill_factor(regs: int) -> float:
    return 1.0 if regs <= MAX_REGS_PER_THREAD else SPILL_SLOWDOWN


def loop_slowdown(ops: Operands, tile: Tile, persistent: bool) -> float:
    """How much slower than its resources allow a tile loop's step runs: a measured
    KMAJOR_B_TWO_GROUP_SLOWDOWN for a one-tile-per-program loop of two wgmma warp groups
    over a K-contiguous B, else 1.

    The same tiles timed as tma and as persistent programs (benchmarks/candidate_pool.py's
    candidates) differ only here: with 8 warps on a K-contiguous B (layout nt) the tma
    program takes about 1.24× the persistent one's time, on an N-contiguous B or with one
    warp group about the same, though both run the same tile_product (kernels/tma.py); the
    general and split-K loops run as slow. Left out, the model prefers such configs where they
    run well behind the tiles a table also holds.
    """
    two_groups = tile.warps >= 8 and uses_wgmma(tile.BM, tile.warps, ops.tensor_cores)
    return KMAJOR_B_TWO_GROUP_SLOWDOWN if two_groups and ops.b_k_unit and not persistent else 1.0


@lru_cache(maxsize=65536)
def tile_step(ops: Operands, tile: Tile, tma: bool, persistent: bool,
              warp_specialized: bool, spec: DeviceSpec, issued_copies: int = 0) -> Step:
    """One K step of a tile program: BM×BK of A and BK×BN of B into an fp32 accumulator.
    issued_copies: the TMA copies per step that the multiplying warps issue themselves
    between their wgmmas (COPY_ISSUE_CYCLES each); Triton's own pipeliner counts none."""
    BM, BN, BK = tile.BM, tile.BN, tile.BK
    clock, item = sm_clock_hz(spec), ops.itemsize
    spill = spill_factor(program_regs(tile, ops))
    wgmma = uses_wgmma(tile.BM, tile.warps, ops.tensor_cores)
    mma = 2 * BM * BN * BK / (sm_flops(ops, spec) * mma_efficiency(tile, ops)) * spill
    smem = smem_traffic(tile, item, wgmma) / (SMEM_BYTES_PER_CLOCK * clock)
    # TMA: one thread issues a bulk copy per operand. Pointers: every element is addressed.
    masked = ops.K % BK != 0
    lsu = 0.0 if tma else spill * (
        load_slots(BM * BK, ops.a_stride, item, masked and ops.a_k_unit)
        + load_slots(BK * BN, ops.b_stride, item, masked and ops.b_k_unit)) / (
        LSU_LANES * clock)
    # Scalar loads cannot be cp.async copies: the loop loads, waits, stores, then multiplies.
    asynchronous = tma or (aligned(ops.a_stride) and aligned(ops.b_stride))
    bubble = STEP_BUBBLE_CYCLES / clock
    if not asynchronous:
        chain = LOAD_LATENCY_S + lsu + mma + bubble
    elif warp_specialized:  # producer warps wait and load; the consumers only multiply
        chain = mma
    elif wgmma:  # asynchronous MMAs: the barrier wait overlaps the MMA in flight
        chain = max(mma, bubble + issued_copies * COPY_ISSUE_CYCLES / clock)
    else:
        chain = mma + bubble
    charged = (charged_bytes(BM * BK, BK if ops.a_k_unit else BM, item)
               + charged_bytes(BK * BN, BK if ops.b_k_unit else BN, item))
    depth = tile.stages - 1 if asynchronous and tile.stages > 1 else 1
    slow = loop_slowdown(ops, tile, persistent)
    return Step(mma * slow, smem * slow, lsu * slow, chain * slow, charged, depth)


@lru_cache(maxsize=4096)
def gemv_step(ops: Operands, block_m: int, block_k: int, stages: int, warps: int,
              unit_along_k: bool, stride: int, spec: DeviceSpec, vectors: int = 1) -> Step:
    """One K step of a gemv program: BLOCK_K of each of `vectors` vectors and BLOCK_M×BLOCK_K
    of the matrix, held in registers as fp32; each matrix element is converted once and
    multiplied into every vector's sum on the CUDA cores."""
    item, clock = ops.itemsize, sm_clock_hz(spec)
    elements = block_m * block_k
    # Threads lie along K: each loads block_k / threads contiguous elements of a row.
    thread_bytes = (max(1, block_k // (32 * warps)) if unit_along_k else 1) * item
    asynchronous = (aligned(stride) and stages > 1
                    and (vectors == 1 or thread_bytes >= MULTIVECTOR_MIN_THREAD_BYTES))
    spill = spill_factor(vectors * elements // (32 * warps) + BASE_REGS)
    alu = (1 + vectors) * elements / (FP32_LANES * clock) * spill  # convert, multiply-adds
    masked = ops.K % block_k != 0 and unit_along_k
    lsu = load_slots(elements, stride, item, masked) / (LSU_LANES * clock) * spill
    smem = 2 * elements * item / (SMEM_BYTES_PER_CLOCK * clock) if asynchronous else 0.0
    chain = alu if asynchronous else LOAD_LATENCY_S + lsu + alu
    charged = (vectors * charged_bytes(block_k, block_k, item)
               + charged_bytes(elements, block_k if unit_along_k else block_m, item))
    return Step(alu, smem, lsu, chain, charged, stages - 1 if asynchronous else 1)


# ---------------------------------------------------------------------------------------
# Residency and DRAM traffic


def resident_programs(smem_bytes: int, regs_per_thread: int, warps: int,
                      spec: DeviceSpec) -> int:
    """Programs one SM holds at once: shared memory, registers and threads all limit it."""
    threads = 32 * warps
    return max(1, min(spec.smem_per_sm // (smem_bytes + SMEM_RESERVED_PER_PROGRAM),
                      REGS_PER_SM // (min(regs_per_thread, MAX_REGS_PER_THREAD) * threads),
                      MAX_THREADS_PER_SM // threads,
                      MAX_PROGRAMS_PER_SM))


def tile_occupancy(ops: Operands, tile: Tile, smem_bytes: int, spec: DeviceSpec) -> int:
    """Programs of a tile kernel one SM holds, each using `smem_bytes` of shared memory."""
    return resident_programs(smem_bytes,
                             program_regs(tile, ops), tile.warps, spec)


@lru_cache(maxsize=65536)
def operand_dram_bytes(ops: Operands, tile: Tile, group_m: int, concurrent: int,
                       spec: DeviceSpec) -> float:
    """Bytes of A and B fetched from DRAM, given the grouped tile order and `concurrent`
    programs.

    An operand that fits in L2 is fetched once. Otherwise a panel of B is fetched once per
    set of tile rows that use it together: a group of GROUP_M rows, or the rows a wave of
    `concurrent` programs spans. A's rows stay cached while their group sweeps the columns
    if a group's rows fit, else they are fetched once per wave's worth of columns.
    """
    budget = spec.l2_bytes * L2_USABLE_FRACTION
    tiles_m, tiles_n = cdiv(ops.M, tile.BM), cdiv(ops.N, tile.BN)
    group_rows = min(group_m, tiles_m)
    rows_together = max(group_rows, min(tiles_m, concurrent // tiles_n))
    cols_together = min(tiles_n, cdiv(concurrent, group_rows))
    b_fetches = 1 if ops.b_bytes <= budget else cdiv(tiles_m, rows_together)
    a_fits = min(ops.a_bytes, group_rows * tile.BM * ops.K * ops.itemsize) <= budget
    a_fetches = 1 if a_fits else cdiv(tiles_n, cols_together)
    return ops.a_bytes * a_fetches + ops.b_bytes * b_fetches


def dram_seconds(nbytes: float, spec: DeviceSpec) -> float:
    return nbytes / (spec.dram_tbps * 1e12 * DRAM_EFFICIENCY)


# ---------------------------------------------------------------------------------------
# Schedules: how programs share the SMs


def step_seconds(step: Step, resident: int) -> float:
    """Time for `resident` co-resident programs to each do one K step on one SM.

    They share the tensor cores, shared memory and load lanes (throughput); each has its own
    serial chain; and the SM keeps at most `depth` steps, and INFLIGHT_BYTES_PER_SM, of
    loads in flight, each for LOAD_LATENCY_S (Little's law). The throughput and the load
    wait overlap only in part (STEP_OVERLAP_NORM); the chain is a floor.
    """
    shared = resident * max(step.mma, step.smem, step.lsu)
    in_flight = min(resident * step.depth * step.charged, INFLIGHT_BYTES_PER_SM)
    memory = resident * step.charged * LOAD_LATENCY_S / in_flight
    overlapped = (shared ** STEP_OVERLAP_NORM + memory ** STEP_OVERLAP_NORM) ** (
        1 / STEP_OVERLAP_NORM)
    return max(overlapped, step.chain)


def epilogue_seconds(tile: Tile, out_itemsize: int, spec: DeviceSpec) -> float:
    """Storing one output tile: registers through shared memory to global (write + read)."""
    return 2 * tile.BM * tile.BN * out_itemsize / (SMEM_BYTES_PER_CLOCK * sm_clock_hz(spec))


def rounds_seconds(programs: int, steps: int, step: Step, occupancy: int, epilogue: float,
                   spec: DeviceSpec) -> float:
    """One program per tile (or per tile and split), `occupancy` of them resident per SM.

    The busiest SM runs ceil(programs / SMs) programs, in rounds (wave quantization); a
    round pays the pipeline fill (one latency), its K steps and its programs' epilogues. A
    last, partial round runs fewer programs side by side, each step sooner.
    """
    per_sm = cdiv(programs, spec.sm_count)
    resident = min(occupancy, per_sm)

    def round_seconds(together: int) -> float:
        return LOAD_LATENCY_S + steps * step_seconds(step, together) + together * epilogue

    full_rounds, rest = divmod(per_sm, resident)
    return full_rounds * round_seconds(resident) + (round_seconds(rest) if rest else 0.0)


def persistent_seconds(tiles: int, steps: int, step: Step, epilogue: float,
                       refill_hidden: bool, spec: DeviceSpec) -> float:
    """One program per SM looping over its tiles: the pipeline fills once; between tiles the
    next tile's loads overlap the epilogue (and with a flattened or warp-specialized loop the
    pipeline never drains). Alone on its SM, nothing hides its latency."""
    boundary = epilogue if refill_hidden else max(epilogue, LOAD_LATENCY_S)
    per_tile = steps * step_seconds(step, 1) + boundary
    return LOAD_LATENCY_S + cdiv(tiles, spec.sm_count) * per_tile


# ---------------------------------------------------------------------------------------
# One launch of a tile kernel


def one_program_per_tile(ops: Operands, tile: Tile, group_m: int, occupancy: int,
                         tma: bool, spec: DeviceSpec) -> float:
    """The general (pointer loads) and tma variants: a program per tile, grouped order."""
    return kernel_seconds(ops, tile, group_m, occupancy * spec.sm_count,
                          tile_rounds(ops, tile, occupancy, tma, spec), spec)


def kernel_seconds(ops: Operands, tile: Tile, group_m: int, programs_at_once: int,
                   compute_s: float, spec: DeviceSpec) -> float:
    """One launch of a tile kernel: its compute, or its DRAM traffic (how often A and B are
    refetched depends on the tiles in flight at once), whichever is longer."""
    concurrent = min(output_tiles(ops, tile), programs_at_once)
    dram_bytes = operand_dram_bytes(ops, tile, group_m, concurrent, spec) + ops.c_bytes
    return max(compute_s, dram_seconds(dram_bytes, spec)) + LAUNCH_S


@lru_cache(maxsize=65536)
def tile_rounds(ops: Operands, tile: Tile, occupancy: int, tma: bool,
                spec: DeviceSpec) -> float:
    """The SMs' share of one_program_per_tile (GROUP_M changes only its DRAM bytes)."""
    return rounds_seconds(output_tiles(ops, tile), cdiv(ops.K, tile.BK),
                          tile_step(ops, tile, tma, False, False, spec), occupancy,
                          epilogue_seconds(tile, ops.out_itemsize, spec), spec)


