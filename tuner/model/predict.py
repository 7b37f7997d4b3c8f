"""An analytical performance model of the kernels' variants: predicted time per config.

It serves callers that cannot measure: the warm start of each Optuna study (enqueue the
model's top configs), `tune suggest` (a config per shape with no GPU) and the runtime
fallback for keys no table holds. Its job is ranking, not accuracy: the few configs it puts
first should hold a near-best one. So every term is a simple bound that says why it is
there, monotone where it should be, and each constant says where it comes from.

Each variant brings its own term (`Variant.model_seconds`, beside the variant in kernels/),
found through the kernel registry (tuner.kernels.KERNELS) and built from the shared blocks of
tuner/model/tiles.py; a variant without one (a user's own kernel) has no prediction. How
`predict_ms` times one config:

- Padding (`pad`) changes the problem the variant sees; the pad copies (A and B in, the
  result out) cost their bytes at DRAM bandwidth plus a launch each.
- A tile program walks K in BLOCK_K steps. One step of the programs resident on an SM
  takes the longest of their tensor-core work (at a per-tile efficiency: wgmma or
  mma.sync), their shared-memory traffic and their load-issue slots (pointer loads only;
  scalar when a stride is not a multiple of 16 elements), combined with the wait on
  memory (the SM keeps at most num_stages - 1 steps of loads, and at most
  INFLIGHT_BYTES_PER_SM, in flight, each for its latency: Little's law) by a rounded
  maximum, since neither hides the other fully; and no less than one program's serial
  chain (its MMA and the barrier bubble, plus the load latency when loads cannot be
  asynchronous, or the copies it issues itself between wgmmas where no producer warp does).
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
- cuBLAS (the `cublas` variant, torch's own GEMM) is a roofline at the rates it sustains,
  slower where operand strides are unaligned: the yardstick the runtime's fallback holds
  tuned candidates to.

Hopper-shaped: the rules for wgmma, TMA and the cp.async pipeline are sm_90's; other devices
get their own peak rates and bandwidth but Hopper's rules.
"""
from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

from tuner.devices import DeviceInfo
from tuner.dtypes import DTYPES
from tuner.kernels.mma import TileOperands
from tuner.model.tiles import LAUNCH_S, Operands, dram_seconds
from tuner.shapes import Shape
from tuner.space import SearchSpace

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


def _padded(dim: int, pad: int) -> int:
    """As kernels/padding.py: rounded up to a multiple of pad; a dimension of 1 stays 1."""
    return dim if dim == 1 or not pad else -(-dim // pad) * pad


@lru_cache(maxsize=1024)
def _operands(shape: Shape, pad: int, allow_tf32: bool) -> Operands:
    dtype = DTYPES[shape.dtype]
    # Padding rounds K and the operands' strides up (kernels/padding.py); the product keeps
    # its M×N, written in place.
    Mp, Np, K = (_padded(d, pad) for d in (shape.M, shape.N, shape.K))
    M, N = shape.M, shape.N
    a_k_unit, b_k_unit = shape.layout[0] == "n", shape.layout[1] == "t"
    a_stride, b_stride = K if a_k_unit else Mp, K if b_k_unit else Np
    itemsize = dtype.torch.itemsize
    return Operands(M, N, K, shape.dtype, shape.dtype != "fp32" or allow_tf32, itemsize,
                    dtype.out.itemsize, a_k_unit, b_k_unit, a_stride, b_stride,
                    all(s * itemsize % 16 == 0 for s in (a_stride, b_stride)))


# ---------------------------------------------------------------------------------------
# Variants: their terms and shared memory, through the kernel registry


@functools.cache
def _variants() -> dict:
    """Every kernel variant by name (imported on first use: the kernels import Triton)."""
    from tuner.kernels import KERNELS
    return {v.name: v for kernel in KERNELS.values() for v in kernel.variants}


def _smem_bytes(config: Mapping, operands: TileOperands) -> int:
    """Shared memory one program of the config uses: the variant's own estimate."""
    variant = _variants()[config["variant"]]
    return variant.smem_bytes({p: config[p] for p in variant.params}, operands)


def _modelled(variant_name: str) -> bool:
    """Whether the model has a term for the variant."""
    variant = _variants().get(variant_name)
    return variant is not None and variant.model_seconds is not None


@lru_cache(maxsize=1024)
def _pad_copy_seconds(shape: Shape, pad: int, spec: DeviceSpec) -> float:
    """The pad variant's copies: A and B read and written into their padded buffers, in one
    copy kernel (the result is written in place)."""
    if not pad:
        return 0.0
    ops = _operands(shape, 0, False)
    return dram_seconds(2 * (ops.a_bytes + ops.b_bytes), spec) + LAUNCH_S


# ---------------------------------------------------------------------------------------
# Public API


def _shape_timer(shape: Shape, spec: DeviceSpec, allow_tf32: bool):
    """A function config -> predicted seconds for one shape, which prepares the padded
    operands and the pad copies once per pad value rather than once per config."""
    per_pad: dict[int, tuple[Operands, float]] = {}
    variants = _variants()

    def seconds(config: Mapping) -> float:
        variant = variants.get(config["variant"])
        if variant is None or variant.model_seconds is None:
            raise ValueError(f"no performance model for variant {config['variant']!r}")
        pad = config.get("pad", 0)
        if pad not in per_pad:
            per_pad[pad] = (_operands(shape, pad, allow_tf32),
                            _pad_copy_seconds(shape, pad, spec))
        ops, copies = per_pad[pad]

        def smem_bytes() -> int:
            return variant.smem_bytes({p: config[p] for p in variant.params}, ops)

        return variant.model_seconds(ops, config, smem_bytes, spec) + copies

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


def roofline_ms(shape: Shape, spec: DeviceSpec) -> float:
    """The least time the datasheet allows the GEMM: its multiply-adds at its dtype's peak
    rate, or A and B read and C written once at DRAM speed, whichever takes longer."""
    dtype = DTYPES[shape.dtype]
    moved = ((shape.M * shape.K + shape.K * shape.N) * dtype.torch.itemsize
             + shape.M * shape.N * dtype.out.itemsize)
    return max(shape.flops / (spec.matmul_tflops(shape.dtype) * 1e12),
               moved / (spec.dram_tbps * 1e12)) * 1e3


def predicted_tflops(shape: Shape, ms: float) -> float:
    """The TFLOP/s of the shape's GEMM done in `ms` milliseconds."""
    return shape.flops / (ms * 1e-3) / 1e12


def _scored(shape: Shape, configs: Iterable[tuple[int, dict]], spec: DeviceSpec,
            allow_tf32: bool) -> Iterator[tuple[float, int, dict]]:
    """(ms, index, config) for every modelled one of the (index in the space, config),
    fastest first. Ties go to the config using fewer resources (shared memory, then warps),
    as in the tuner's final re-timing, then to the larger GROUP_M, then to the space's
    order. Within one wave the modelled DRAM bytes cannot tell program orders apart, yet
    grouping every tile row ran up to 1.8x faster than GROUP_M 1 there (the readers of a
    panel of B next to each other; H100, benchmarks/results/vs-cublas/README.md, "program
    order"), and of 76 recorded configs timed at several groups, 4 ran over 3% slower at
    the largest and 23 over 3% faster. Most configs tie with
    others (a few thousand distinct times in 300,000 configs): shared memory is reckoned for
    a tie only once the caller reaches it, where for every config it would cost a fifth of
    the ranking."""
    operands = _operands(shape, 0, allow_tf32)  # padding changes neither dtype nor itemsize
    seconds = _shape_timer(shape, spec, allow_tf32)
    modelled = {name for name in _variants() if _modelled(name)}
    scored = [(seconds(config) * 1e3, index, config) for index, config in configs
              if config["variant"] in modelled]
    scored.sort(key=lambda entry: entry[:2])
    for _, tie in itertools.groupby(scored, key=lambda entry: entry[0]):
        yield from sorted(tie, key=lambda entry: (_smem_bytes(entry[2], operands),
                                                  entry[2].get("num_warps", 0),
                                                  -entry[2].get("GROUP_M", 0)))


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
    return [(ms, config) for ms, _, config in rank_indexed(
        shape, space.indexed_configs(), kernel, spec, smem_limit, k, allow_tf32, distinct)]


def rank_indexed(shape: Shape, configs: Iterable[tuple[int, dict]], kernel, spec: DeviceSpec,
                 smem_limit: int | None = None, k: int | None = None,
                 allow_tf32: bool = False,
                 distinct: Callable[[dict], Hashable] | None = None
                 ) -> list[tuple[float, int, dict]]:
    """rank_configs of some of a space's (index, config), each kept with its index. With
    `distinct` and k, ranking each part of a space (every n-th config) and then the union of
    the parts' picks gives rank_configs of the whole (tuner.search.warmstart ranks the parts
    in parallel): a distinct tag among the whole's first k is among its own part's first k,
    since every tag ahead of it there is ahead of it in the whole."""
    from tuner.kernels.calls import meta_gemm  # imports the Triton kernels: not at module level

    gemm = meta_gemm(shape)
    limit = smem_limit or spec.smem_per_block
    ranked: list[tuple[float, int, dict]] = []
    taken: set = set()
    for ms, index, config in _scored(shape, configs, spec, allow_tf32):
        tag = None if distinct is None else distinct(config)
        if tag is not None and tag in taken:
            continue
        if kernel.feasible(config, gemm, limit) is None:
            ranked.append((ms, index, config))
            taken.add(tag)
            if len(ranked) == k:
                break
    return ranked
