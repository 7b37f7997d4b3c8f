"""What every tunable kernel exposes to the tuner: variants, their parameters, a launcher.

A `Kernel` is one operation (`mm`, `gemv`) computed by a family of `Variant`s: the general
pointer kernel, TMA, persistent, split-K, gemv. The variant is itself a searched parameter,
and each variant reads only its own parameters (a conditional search space), so a config is
`{"variant": "splitk", "pad": 0, "BLOCK_M": 64, ..., "SPLIT_K": 8}`. `pad` belongs to every
variant: the kernel copies unaligned operands into aligned buffers first (kernels/padding.py).

The tuner never touches a Triton kernel directly. It asks a `Kernel` for the parameters of
each variant, checks a config with `feasible` before paying for a compile, compiles it with
`compile` (in a worker process, on meta tensors) and runs it with `launch`. A `Variant` also
says what the rest of the tuner needs to know of it: its parameters' short names for labels,
its FlagGems op for expand exports, how its loads are fed and its programs scheduled (for the
runtime's variations), and its term in the analytical model (tuner.model.predict). Adding a
variant means adding one module that builds one `Variant`, listing it in kernels/__init__.py
and giving its parameters values in a search-space YAML (search_spaces/).
"""
from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from tuner.kernels.mma import TileOperands
from tuner.kernels.padding import pad_changes_nothing, padded_operands, run_padded
from tuner.model.tiles import MAX_REGS_PER_THREAD

if TYPE_CHECKING:
    from tuner.kernels.launches import Repeated
    from tuner.model.predict import DeviceSpec
    from tuner.model.tiles import Operands

Config = Mapping[str, "int | str"]
SPECIALIZED_FIELDS = ("M", "N", "K", "stride_am", "stride_bk")
# Parameters of every kernel rather than of one variant's Triton code: which variant runs,
# and the padding applied before it (kernels/padding.py).
KERNEL_PARAMS = ("variant", "pad")
# The parameters of a plain tile GEMM, which the tile variants share, and their short names
# in config labels.
TILE_PARAMS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_stages", "num_warps")
TILE_SHORT_NAMES = {"BLOCK_M": "BM", "BLOCK_N": "BN", "BLOCK_K": "BK", "GROUP_M": "G",
                    "num_stages": "s", "num_warps": "w"}
# The smallest tile side tl.dot accepts (a tensor-core MMA is at least 16 wide).
MIN_DOT_TILE = 16
# A tile variant's fewest pipeline stages: with one, each K step's loads wait for the last
# step's MMA (the general variant ran 1.1-1.6x slower so on an H100 at M 6-48). The gemv
# variants, whose many small programs hide their loads' latency, take 1.
MIN_TILE_STAGES = 2
# Registers per thread a CUDA-core reduction's fp32 accumulator (kreduce, multigemv) may
# take: half a thread's, so the loaded operands and addresses fit beside it without spilling.
CUDA_CORE_ACCUMULATOR_REGS = MAX_REGS_PER_THREAD // 2


def accumulator_refusal(regs: int, limit: int = MAX_REGS_PER_THREAD) -> str | None:
    """Why an accumulator of `regs` registers per thread cannot be compiled well (over
    `limit`: it spills for certain, and ptxas takes minutes), or None."""
    if regs > limit:
        return f"registers: the accumulator alone needs {regs} per thread, limit {limit}"
    return None


def specialization(key: Mapping[str, object]) -> str:
    """The part of a raw key that decides which binary Triton builds for a config.

    Triton specializes integer arguments on being 1 or a multiple of 16; our launchers add
    EVEN_K (K a multiple of BLOCK_K <= 256, which gcd(K, 256) decides). A config that failed
    for one key fails for every key with the same specialization, so failures are
    remembered per specialization rather than per shape.
    """
    classes = []
    for f in SPECIALIZED_FIELDS:
        v = key[f]
        classes.append(f"{f}:{'1' if v == 1 else '16n' if v % 16 == 0 else 'any'}")
    return " ".join([key["dtype"], *classes, f"gcd(K,256):{math.gcd(key['K'], 256)}"])


def config_label(config: Config) -> str:
    """A config in one short line for tables and logs: 'tma BM128 BN256 BK64 G8 s3 w8 pad64'.

    Parameters go by their variant's short names (Variant.short_names); a config of no
    registered variant by those of every registered variant."""
    variants = [v for kernel in KERNELS.values() for v in kernel.variants]
    own = [v for v in variants if v.name == config.get("variant")][:1]
    short = {k: s for v in (own or variants) for k, s in v.short_names.items()}
    parts = [str(config["variant"])] if "variant" in config else []
    parts += [f"{short.get(k, k)}{v}" for k, v in config.items() if k not in KERNEL_PARAMS]
    if config.get("pad"):
        parts.append(f"pad{config['pad']}")
    return " ".join(parts)


@dataclass(frozen=True)
class Gemm:
    """One call, out = a @ b (+ bias), as every variant receives it.

    a is M×K, b is K×N and out M×N, with any strides; a and b share one dtype, and out has
    the output dtype (bf16 for fp8 inputs, else the input dtype). The tensors may be meta
    tensors when only compiling. Accumulation is in fp32.
    """
    a: torch.Tensor
    b: torch.Tensor
    out: torch.Tensor
    bias: torch.Tensor | None = None  # (N,), in out's dtype, added in the epilogue
    # fp8 inputs only: one-element fp32 tensors, out = (scale_a * a) @ (scale_b * b).
    scale_a: torch.Tensor | None = None
    scale_b: torch.Tensor | None = None
    allow_tf32: bool = False  # fp32 inputs: tf32 tensor cores instead of IEEE fp32
    # Rows of a's buffer and columns of b's when they reach past M and N (the zero margins
    # of kernels/padding.py): loads may run there, so tile kernels wrap at an aligned point.
    a_buffer_rows: int | None = None
    b_buffer_cols: int | None = None

    @property
    def mnk(self) -> tuple[int, int, int]:
        return self.a.shape[0], self.b.shape[1], self.a.shape[1]

    @property
    def itemsize(self) -> int:
        return self.a.element_size()

    @property
    def tensor_cores(self) -> bool:
        """Whether the multiplies run on tensor cores (all but IEEE fp32): with the tile's
        shape, this decides how Triton pipelines it (tuner.kernels.mma)."""
        return self.a.dtype != torch.float32 or self.allow_tf32

    def with_operands(self, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> Gemm:
        return replace(self, a=a, b=b, out=out)


@dataclass(frozen=True)
class Variant:
    """One way of computing a `Gemm`: a Triton kernel (or two) and the code that launches it."""
    name: str
    # Tunable parameters, in search order: constexprs and the num_stages/num_warps options.
    params: tuple[str, ...]
    # launch(gemm, tunables, compile_only): run (or only compile) the variant; `tunables`
    # holds exactly `params`.
    launch: Callable[[Gemm, Mapping[str, int], bool], None] = field(repr=False)
    # smem_bytes(tunables, operands): estimated shared memory one program needs; operands is
    # a tuner.kernels.mma.TileOperands (a Gemm is one).
    smem_bytes: Callable[[Mapping[str, int], TileOperands], int] = field(repr=False)
    # The file holding the Triton source; its hash identifies results measured with it.
    source_path: Path = field(repr=False)
    # unsupported(gemm, tunables): why this config of the variant cannot (or should not) run
    # this call, e.g. TMA needs 16-byte aligned strides, or None.
    unsupported: Callable[[Gemm, Mapping[str, int]], str | None] = field(
        default=lambda gemm, tunables: None, repr=False)
    # replayable(tunables): whether a launch runs Triton kernels and nothing else (no torch
    # operation on the host), so that kernels.launches can replay it for new operands.
    replayable: Callable[[Mapping[str, int]], bool] = field(
        default=lambda tunables: True, repr=False)
    # Whether padding the operands can help it (False for a library call).
    takes_pad: bool = True
    # For a library variant: makes what serves one signature's repeated user calls (a
    # kernels.launches.Repeated calling the library, with no output allocation of ours).
    library_calls: Callable[[], Repeated] | None = field(default=None, repr=False)
    # Short names of its parameters in config labels ("BLOCK_M": "BM"); a parameter without
    # one is labelled by its own name.
    short_names: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)
    # The FlagGems op its configs export under in expand exports (tuner.export.flaggems_ops);
    # None: the kernel's own name for it, "<kernel>_<variant>" (a plugin kernel's variants).
    expand_op: str | None = None
    # What it is, where FlagGems has no op for it (cublas: "a cuBLAS call through torch"):
    # expand exports leave its picks out and say why. None: it has an op.
    no_expand_op: str | None = None
    # Whether TMA feeds its K loop (descriptor loads, no pointer arithmetic): the runtime may
    # re-choose such a pipeline's depth for a nearby key.
    tma_fed: bool = False
    # Whether it runs one program per SM, looping over the output tiles (a persistent
    # kernel), rather than a program per tile.
    program_per_sm: bool = False
    # output_tile(tunables): a tile's (rows, columns) of the output, for variants with output
    # tiles: how many there are decides how they fill the SMs.
    output_tile: Callable[[Mapping[str, int]], tuple[int, int]] = field(
        default=lambda tunables: (tunables["BLOCK_M"], tunables["BLOCK_N"]), repr=False)
    # accumulator_warps(tunables): the warps that hold a tile's fp32 accumulator (a
    # warp-specialized loop has MMA warps of its own); num_warps unless said otherwise.
    accumulator_warps: Callable[[Mapping[str, int]], int] = field(
        default=lambda tunables: tunables["num_warps"], repr=False)
    # model_seconds(operands, config, smem_bytes, spec): its term in the analytical model
    # (tuner.model.predict), the seconds of one config's launches on the (padded) operands
    # (a tuner.model.tiles.Operands) on the device (a tuner.model.predict.DeviceSpec), or
    # math.inf where it cannot run them; smem_bytes() gives the shared memory one program
    # uses (the `smem_bytes` estimate, worked out only if asked for). None: the model does
    # not know the variant (predict_ms raises ValueError).
    model_seconds: Callable[[Operands, Mapping, Callable[[], int], DeviceSpec], float] | None = (
        field(default=None, repr=False))


@dataclass(frozen=True)
class Kernel:
    """An operation and the variants the tuner chooses among for it."""
    name: str
    variants: tuple[Variant, ...]
    # Source files every variant depends on (padding, shared launch helpers), for the hash.
    shared_sources: tuple[Path, ...] = ()

    @cached_property
    def variant(self) -> dict[str, Variant]:
        return {v.name: v for v in self.variants}

    @cached_property
    def variant_params(self) -> dict[str, tuple[str, ...]]:
        """Per variant, every parameter a config of it holds (variant and pad included)."""
        return {v.name: (*KERNEL_PARAMS, *v.params) for v in self.variants}

    @cached_property
    def library_variants(self) -> frozenset[str]:
        """The variants that call a library (cuBLAS): measured, never searched."""
        return frozenset(v.name for v in self.variants if v.library_calls is not None)

    def calls_library(self, config: Mapping) -> bool:
        """Whether the config calls a library (cuBLAS), which launches no Triton kernel of ours."""
        return config["variant"] in self.library_variants

    @cached_property
    def params(self) -> tuple[str, ...]:
        """Every parameter of any variant, in search order."""
        return tuple(dict.fromkeys(p for ps in self.variant_params.values() for p in ps))

    @cached_property
    def source_hash(self) -> str:
        """Identifies the code results were measured with: the contents (not the locations)
        of every variant's source, the shared sources and this file."""
        paths = {*(v.source_path for v in self.variants), *self.shared_sources, Path(__file__)}
        digests = sorted(hashlib.sha256(p.read_bytes()).digest() for p in paths)
        return hashlib.sha256(b"".join(digests)).hexdigest()[:16]

    def launch(self, gemm: Gemm, config: Config, compile_only: bool = False) -> None:
        """Compute gemm.out in place with one config. Unchecked: the dispatcher validates."""
        variant = self.variant[config["variant"]]
        tunables = {p: config[p] for p in variant.params}
        if config["pad"]:
            run_padded(variant, gemm, tunables, config["pad"], compile_only)
        else:
            variant.launch(gemm, tunables, compile_only)

    def replayable(self, config: Config) -> bool:
        """Whether `launch` of this config is Triton launches alone (see Variant.replayable;
        padding copies are a Triton launch too)."""
        variant = self.variant[config["variant"]]
        return variant.replayable({p: config[p] for p in variant.params})

    def compile(self, gemm: Gemm, config: Config) -> None:
        """Compile exactly what `launch` would run (gemm may hold meta tensors)."""
        self.launch(gemm, config, compile_only=True)

    def smem_bytes(self, config: Config, operands: TileOperands) -> int:
        variant = self.variant[config["variant"]]
        return variant.smem_bytes({p: config[p] for p in variant.params}, operands)

    def unsupported(self, config: Config, gemm: Gemm) -> str | None:
        """Why this config's variant cannot compute this call (after padding), or None."""
        if config["pad"]:
            gemm = padded_operands(gemm, config["pad"], allocate=False)
        variant = self.variant[config["variant"]]
        return variant.unsupported(gemm, {p: config[p] for p in variant.params})

    def feasible_configs(self, space, gemm: Gemm, smem_limit: int) -> list[dict]:
        """Every config of `space` (a tuner.space.SearchSpace: anything with `configs()`) that
        passes `feasible` for this call, in the space's order: what an exhaustive study
        measures."""
        return [c for c in space.configs() if self.feasible(c, gemm, smem_limit) is None]

    def feasible(self, config: Config, gemm: Gemm, smem_limit: int) -> str | None:
        """None if the config may compile and run for this call, else the reason it cannot.

        Runs before compiling, so an oversized config (shared memory, or an accumulator
        beyond the registers of its threads), a variant the operands do not suit, or a pad
        that changes nothing costs no compile time. `gemm` may hold meta tensors.
        """
        need = self.smem_bytes(config, gemm)
        if need > smem_limit:
            return f"shared memory: needs ~{need} bytes, device limit {smem_limit}"
        variant = self.variant[config["variant"]]
        if "BLOCK_N" in variant.params:  # a tile variant: its fp32 BLOCK_M×BLOCK_N accumulator
            if min(config["BLOCK_M"], config["BLOCK_N"]) < MIN_DOT_TILE:
                return f"tensor cores: BLOCK_M and BLOCK_N must be >= {MIN_DOT_TILE}"
            if config["num_stages"] < MIN_TILE_STAGES:
                return (f"num_stages {config['num_stages']}: a tile's K loop needs its next "
                        f"loads in flight (>= {MIN_TILE_STAGES})")
            warps = variant.accumulator_warps({p: config[p] for p in variant.params})
            regs = config["BLOCK_M"] * config["BLOCK_N"] // (32 * warps)
            if why := accumulator_refusal(regs):
                return why
        if config["pad"] and not variant.takes_pad:
            return f"{config['variant']}: takes no pad"
        if config["pad"] and pad_changes_nothing(gemm, config["pad"]):
            return f"pad {config['pad']}: the operands are already aligned to it"
        return self.unsupported(config, gemm)


# The kernels by the names stored in the database and exported tables: filled, and exported,
# by kernels/__init__.py (here so that config_label reads it without importing the package).
KERNELS: dict[str, Kernel] = {}
