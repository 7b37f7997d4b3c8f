"""The fallback policy's model-driven parts, for a key the table has no entry of: which
neighbouring entries' configs may answer it (`nearest`), their variations that suit the key
better (`variation_maker`), the model's choice among them calibrated by what the neighbours
measured, or cuBLAS where the model predicts it clearly faster (`fastest_predicted`), the
model's own pick where no entry of the key's dtype exists (`model_picker`), and its pick of a
variant whose term is trusted for the key where no tuning says otherwise (`trusted_picker`).
`ModelParts` holds a table's, each built on first need; tuner.runtime.policy decides which to
ask, in what order.

The model, the kernels and torch are imported on first need: a table hit needs none of them.
The constants are what benchmarks/fallback_pool.py, benchmarks/nearest_fallback.py,
benchmarks/candidate_pool.py and `tune validate` on hold-out shapes measure; change them only
with such a measurement.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import cached_property
from typing import TYPE_CHECKING

from tuner.formats.table import Measurement
from tuner.runtime.answer import CUBLAS, CUBLAS_CONFIG, TunedConfig
from tuner.runtime.runnable import key_gemm, shape_of
from tuner.space import config_signature

if TYPE_CHECKING:
    from tuner.shapes import Shape

# How many of the closest tuned buckets `nearest` lets the model choose among (their configs
# and alternates): fewer miss the tile that suits the key, more let far neighbours mislead
# the model (benchmarks/nearest_fallback.py measures the regret per count).
NEAREST_BUCKETS = 4
# The smallest BLOCK_M or BLOCK_N: tl.dot's minimum. A tile of it suits any call, however
# small, and halving a neighbour's tile stops there.
MIN_BLOCK = 16
# How much faster than the best measured candidate the model must predict a variation no
# tuning measured (a re-split, re-piped or halved neighbour tile) for it to answer instead,
# and cuBLAS for it to answer instead of them: the model orders configs predicted a few
# percent apart little better than a coin (benchmarks/candidate_pool.py order), so a smaller
# predicted gain is not trusted.
VARIATION_MARGIN = 0.05
# How far (log distance: octaves summed over M, N and K) a tuned bucket may lie from a key for
# its configs to answer it. Farther away the tile was tuned for a GEMM tens of times larger or
# smaller in its work and nothing says it still suits, while cuBLAS is tuned for every shape
# (`tune validate` on hold-out shapes measures how far answers may come from).
MAX_NEIGHBOUR_OCTAVES = 6.0

# Per bucket: its log sizes, and its entry's config and alternates answering as "nearest".
Neighbour = tuple[tuple[float, ...], list[TunedConfig]]


def log_sizes(bucket: tuple, size_fields: Iterable[int]) -> tuple[float, ...]:
    """log2 of a bucket key's M, N and K (at size_fields; 0 counted as 1): where `nearest`
    measures from."""
    return tuple(math.log2(max(bucket[i], 1)) for i in size_fields)


def _log_distance(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    return sum(abs(x - y) for x, y in zip(a, b))


def nearest(here: tuple[float, ...], neighbours: Iterable[Neighbour],
            allowed: Callable[[Mapping], bool], max_octaves: float = math.inf
            ) -> list[TunedConfig]:
    """The allowed configs, then alternates, of the neighbours closest to `here` (log sizes)
    no farther than max_octaves, closest first (given order on a tie), each config once, until
    NEAREST_BUCKETS distinct entry configs are in; none without such a neighbour. An entry
    whose own config is not allowed (cannot run the key) stands for its first allowed
    alternate, and one with none is passed over: the count is of configs that can answer."""
    by_distance = sorted(((_log_distance(here, sizes), configs) for sizes, configs
                          in neighbours), key=lambda neighbour: neighbour[0])
    candidates: dict[tuple, TunedConfig] = {}
    entry_configs: set[tuple] = set()
    for distance, configs in by_distance:
        if distance > max_octaves:
            break
        usable = [config for config in configs if allowed(config)]
        if not usable:
            continue
        entry_configs.add(config_signature(usable[0]))
        for config in usable:
            candidates.setdefault(config_signature(config), config)
        if len(entry_configs) == NEAREST_BUCKETS:
            break
    return list(candidates.values())


def _named_spec(device_name: str | None):
    from tuner.model.named_devices import named_spec

    return named_spec(device_name)


def variation_maker(op: str, device_name: str | None
                    ) -> Callable[[Mapping, list, Callable[[Mapping], bool]], list] | None:
    """A function giving the variations of a key's candidates that suit the key rather than
    the neighbour they were tuned for, each once and none a candidate itself; None when the
    kernels cannot be imported (the candidates then stay as they are). Each variation must be
    allowed (run on the key: the lookup's predicate) and feasible on the table's device
    (Kernel.feasible: nothing measured it, and a deeper pipeline of a neighbour's tile may
    not fit its shared memory, and would fail at launch). A neighbour's config was tuned for
    the neighbour's split of the work; the parts of a config that follow from the call's
    size are re-chosen for the key:

    - Each split-K candidate at every other SPLIT_K of the op's built-in space: how many
      slices K is cut into should fill the SMs given the output tiles, a matter of the call's
      shape, not of the tile.
    - The K pipeline of each candidate whose loads TMA issues (`Variant.tma_fed`): every
      num_stages of the space, at its BLOCK_K and at the space's BLOCK_K half and twice it.
      How deep a pipeline must be follows from how many programs share an SM and how many K
      steps each has. Pointer-fed loops keep theirs: there the model misses costs that depend
      on both.
    - Each of these one-pass tiles with BLOCK_M or BLOCK_N halved, where each SM runs its
      tiles one at a time (a grid under one wave of the table's device's SMs, or a persistent
      program) and the halved grid fills its rounds of SMs better (_wave_fill): a neighbour's
      tile fits the neighbour's grid, and on a smaller output leaves SMs idle.
    """
    try:
        from tuner.kernels import KERNELS, kernel_variants
        from tuner.space import builtin_spaces
        spec = _named_spec(device_name)
    except ImportError:
        return None
    space = builtin_spaces(kernel_variants()).get(op)
    kernel = KERNELS.get(op)
    variants = kernel.variant if kernel is not None else {}
    params = space.params if space is not None else {}
    splits, stages = params.get("SPLIT_K", ()), params.get("num_stages", ())
    block_ks = params.get("BLOCK_K", ())
    sm_count = spec.sm_count

    def pipelines(config: Mapping) -> Iterator[dict]:
        """The config and, when TMA feeds it, its other K pipelines (each once)."""
        yield dict(config)
        variant = variants.get(config["variant"])
        if variant is not None and variant.tma_fed:
            step, depth = config["BLOCK_K"], config["num_stages"]
            for block_k in (k for k in block_ks if step // 2 <= k <= 2 * step):
                yield from ({**config, "BLOCK_K": block_k, "num_stages": n} for n in stages
                            if (block_k, n) != (step, depth))

    def halved(key: Mapping, config: dict) -> Iterator[dict]:
        """The tile with BLOCK_M, then BLOCK_N, halved, where that fills the SMs better."""
        tiles = _tiles(key, config)
        variant = variants.get(config["variant"])
        if tiles >= sm_count and not (variant is not None and variant.program_per_sm):
            return
        for block in ("BLOCK_M", "BLOCK_N"):
            smaller = {**config, block: config[block] // 2}
            if (smaller[block] >= MIN_BLOCK and _fits(key, smaller)
                    and _wave_fill(_tiles(key, smaller), sm_count)
                    > _wave_fill(tiles, sm_count)):
                yield smaller

    def variations(key: Mapping, config: Mapping) -> Iterator[dict]:
        if "SPLIT_K" in config:
            yield from ({**config, "SPLIT_K": split} for split in splits)
        elif "BLOCK_N" in config:
            for pipeline in pipelines(config):
                yield pipeline
                yield from halved(key, pipeline)

    def of_candidates(key: Mapping, configs: list, allowed: Callable[[Mapping], bool]) -> list:
        taken = {config_signature(config) for config in configs}
        made = {}
        gemm = key_gemm(key) if kernel is not None else None

        def fits(config: Mapping) -> bool:
            return gemm is None or kernel.feasible(config, gemm, spec.smem_per_block) is None

        for config in configs:
            for other in variations(key, config):
                signature = config_signature(other)
                if (signature not in taken and signature not in made and allowed(other)
                        and fits(other)):
                    made[signature] = TunedConfig(other, config.source, config.bucket)
        return list(made.values())

    return of_candidates


def _output_tile(config: Mapping) -> tuple[int, int]:
    """The config's (rows, columns) of the output per tile, by its variant's rule
    (Variant.output_tile): gluon's tiles are wider than BLOCK_N, or transposed."""
    from tuner.kernels import KERNELS
    for kernel in KERNELS.values():
        variant = kernel.variant.get(config["variant"])
        if variant is not None:
            return variant.output_tile(config)
    return config["BLOCK_M"], config["BLOCK_N"]


def _fits(key: Mapping, config: Mapping) -> bool:
    """Whether no side of the tile is twice the call's size or more, past MIN_BLOCK: a tile
    that tall computes mostly padding rows, and there the model is least right
    (benchmarks/fallback_pool.py: it rates such neighbour tiles ahead of cuBLAS where they run
    well behind it)."""
    return all(side < 2 * max(size, MIN_BLOCK)
               for side, size in zip(_output_tile(config), (key["M"], key["N"])))


def _suits(key: Mapping, config: Mapping) -> bool:
    """Whether a candidate's tile fits the key (_fits); a config without output tiles (cuBLAS,
    gemv) always does."""
    return "BLOCK_N" not in config or _fits(key, config)


def _wave_fill(tiles: int, sm_count: int) -> float:
    """The share of its rounds of sm_count programs that a grid of `tiles` fills."""
    return tiles / (-(-tiles // sm_count) * sm_count)


def _tiles(key: Mapping, config: Mapping) -> int:
    """The output tiles of the config's grid for the key."""
    rows, cols = _output_tile(config)
    return -(-key["M"] // rows) * -(-key["N"] // cols)


def calibrated_predictor(device_name: str | None
                         ) -> Callable[[Shape, TunedConfig, Mapping], float] | None:
    """A function giving a candidate's predicted time (ms) for a call's shape, calibrated by
    the measurements of the bucket it came from (`measured`, per bucket); None when the model
    cannot be imported.

    Predictions are the analytical model's (tuner.model.predict), cuBLAS's as it gives them
    and each tile's scaled by how much the model overrated it against cuBLAS where it was
    measured: that changes slowly with the shape, and a neighbour's measurement says how much
    it was there.
    """
    try:
        from tuner.model.predict import predicted_or_inf
        from tuner.shapes import Shape
        spec = _named_spec(device_name)
    except ImportError:
        return None

    def overrating(config: TunedConfig, measurement: Measurement | None) -> float:
        """How much faster than cuBLAS the model rated `config`'s tile over what was measured,
        at the bucket the config came from: the config's own measurement there, or for a
        variation the fastest measured config of its variant (1: cuBLAS itself, or nothing
        measured)."""
        if config["variant"] == CUBLAS or measurement is None:
            return 1.0
        shape = Shape.from_label(measurement.tuned_shape)
        own = measurement.times.get(config_signature(config))
        if own is None:
            kin = [(ms, signature) for signature, ms in measurement.times.items()
                   if dict(signature)["variant"] == config["variant"]]
            if not kin:
                return 1.0
            own, signature = min(kin)
            config = dict(signature)
        rated = (predicted_or_inf(shape, CUBLAS_CONFIG, spec)
                 / predicted_or_inf(shape, config, spec))
        measured = measurement.cublas_ms / own
        return rated / measured if math.isfinite(rated) and rated > 0 else 1.0

    def calibrated(shape: Shape, config: TunedConfig,
                   measured: Mapping[tuple, Measurement]) -> float:
        return (predicted_or_inf(shape, config, spec)
                * overrating(config, measured.get(config.bucket)))

    return calibrated


def fastest_predicted(device_name: str | None
                      ) -> Callable[..., TunedConfig] | None:
    """A function giving, for a raw key, the candidate (a measured config) predicted fastest
    (calibrated_predictor), or the variation predicted fastest where that is VARIATION_MARGIN
    faster still, or cuBLAS (when given) where it is predicted VARIATION_MARGIN faster than
    either; None when the model cannot be imported. Candidates and variations whose tile does
    not fit the key (_suits) are left out, and cuBLAS answers where none fits.

    The margin before cuBLAS: the lookup asks only where the closest tuned neighbour measured
    a Triton config fastest, and the model's few percent do not overturn that measurement.
    """
    predicted = calibrated_predictor(device_name)
    if predicted is None:
        return None

    def fastest(key: Mapping, candidates: list, variations: list,
                measured: Mapping[tuple, Measurement],
                cublas: TunedConfig | None = None) -> TunedConfig:
        shape = shape_of(key)

        def calibrated(config: TunedConfig) -> float:
            return predicted(shape, config, measured)

        fitting = [config for config in candidates if _suits(key, config)]
        if not fitting and cublas is not None:
            return cublas
        pick = min(fitting or candidates, key=calibrated)  # the first on a tie
        variations = [config for config in variations if _suits(key, config)]
        if variations:
            challenger = min(variations, key=calibrated)
            if calibrated(challenger) < (1 - VARIATION_MARGIN) * calibrated(pick):
                pick = challenger
        if cublas is not None and calibrated(cublas) < (1 - VARIATION_MARGIN) * calibrated(pick):
            return cublas
        return pick

    return fastest


def model_picker(op: str, configs: list[Mapping], device_name: str | None,
                 excluded: frozenset[str]) -> Callable[[Mapping], TunedConfig | None] | None:
    """A function giving the analytical model's best config for a raw key, or None when the
    model cannot be imported or there is nothing to rank.

    The model ranks the op's built-in space narrowed to the values (variants included, less
    the excluded ones) that the table's configs of the op use: a small space (a new key stays
    cheap), and one that stays near what tuning chose on this device. Predictions are for
    the table's device.
    """
    try:
        from tuner.kernels import KERNELS, kernel_variants
        from tuner.model.predict import rank_configs
        from tuner.space import builtin_spaces
    except ImportError:
        return None
    space = builtin_spaces(kernel_variants()).get(op)
    if space is None:
        return None
    used = {name: {c[name] for c in configs if name in c} for name in space.params}
    narrowing = {name: values for name, values in used.items() if values}
    narrowing["variant"] = used["variant"] - excluded
    try:
        space = space.narrowed(**narrowing)
    except ValueError:  # none of the table's values of some parameter is left in the space
        return None
    try:
        kernel, spec = KERNELS[op], _named_spec(device_name)
    except ImportError:
        return None

    def pick(key: Mapping) -> TunedConfig | None:
        ranked = rank_configs(shape_of(key), space, kernel, spec, k=1)
        return TunedConfig(ranked[0][1], "model") if ranked else None

    return pick


def trusted_picker(op: str, device_name: str | None, variants: tuple[str, ...]
                   ) -> Callable[[Mapping], TunedConfig | None] | None:
    """A function giving, for a raw key, the model's best config of the named variants (those
    tuner.model.regimes trusts for the key) where it is predicted VARIATION_MARGIN faster than
    cuBLAS, else None; None when the model cannot be imported or the op's space has none of
    them.

    The op's whole built-in space of those variants is ranked: no table narrows it, since
    none measured the key's regime, and a variant such as kreduce has a few hundred configs.
    Uncalibrated predictions on both sides: the regime is where they were checked against
    measured times.
    """
    try:
        from tuner.kernels import KERNELS, kernel_variants
        from tuner.model.predict import predicted_or_inf, rank_configs
        from tuner.space import builtin_spaces
        spec = _named_spec(device_name)
    except ImportError:
        return None
    space = builtin_spaces(kernel_variants()).get(op)
    in_space = space.params["variant"] if space is not None else ()
    offered = tuple(name for name in variants if name in in_space)
    if not offered:
        return None
    kernel = KERNELS[op]
    if not any(kernel.variant[name].takes_pad for name in offered):
        space = space.narrowed(pad=(0,))  # every other pad is infeasible: not worth scoring
    space = space.narrowed(variant=offered)

    def pick(key: Mapping) -> TunedConfig | None:
        shape = shape_of(key)
        ranked = rank_configs(shape, space, kernel, spec, k=1)
        if not ranked:
            return None
        ms, config = ranked[0]
        bar = (1 - VARIATION_MARGIN) * predicted_or_inf(shape, CUBLAS_CONFIG, spec)
        return TunedConfig(config, "trusted") if ms < bar else None

    return pick


class ModelParts:
    """What a table's fallback steps ask of the model and the kernels, each part built on
    first need and kept for the table's life: the model's choice among candidates
    (`fastest`), their variations (per op), the model's pick (per op and excluded variants)
    and its pick of trusted variants (per op and variants). A part whose imports fail is
    None, and the steps do without it."""

    def __init__(self, device_name: str | None):
        self.device_name = device_name
        self._variation_makers: dict[str, Callable | None] = {}
        self._pickers: dict[tuple[str, frozenset[str]],
                            Callable[[Mapping], TunedConfig | None] | None] = {}
        self._trusted_pickers: dict[tuple[str, tuple[str, ...]],
                                    Callable[[Mapping], TunedConfig | None] | None] = {}

    @cached_property
    def fastest(self) -> Callable[..., TunedConfig] | None:
        """fastest_predicted for the table's device."""
        return fastest_predicted(self.device_name)

    @cached_property
    def _predicted(self) -> Callable[[Shape, TunedConfig, Mapping], float] | None:
        return calibrated_predictor(self.device_name)

    def ranked(self, key: Mapping, configs: list[TunedConfig],
               measured: Mapping[tuple, Measurement]) -> list[TunedConfig]:
        """The configs whose tile fits the key (_suits), predicted fastest first
        (calibrated_predictor; the given order on a tie, and without the model)."""
        fitting = [config for config in configs if _suits(key, config)]
        if self._predicted is None:
            return fitting
        shape = shape_of(key)
        return sorted(fitting, key=lambda config: self._predicted(shape, config, measured))

    def variations(self, op: str, key: Mapping, candidates: list,
                   allowed: Callable[[Mapping], bool]) -> list:
        """The candidates' variations for the key (variation_maker)."""
        if op not in self._variation_makers:
            self._variation_makers[op] = variation_maker(op, self.device_name)
        make = self._variation_makers[op]
        return [] if make is None else make(key, candidates, allowed)

    def pick(self, op: str, configs: list[Mapping], key: Mapping, excluded: frozenset[str]
             ) -> TunedConfig | None:
        """The model's pick for the key among the values the op's `configs` use
        (model_picker), or None."""
        if (op, excluded) not in self._pickers:
            self._pickers[op, excluded] = model_picker(op, configs, self.device_name, excluded)
        pick_for = self._pickers[op, excluded]
        return pick_for(key) if pick_for is not None else None

    def trusted(self, op: str, key: Mapping, variants: tuple[str, ...]) -> TunedConfig | None:
        """The model's pick among the named variants' configs where predicted faster than
        cuBLAS (trusted_picker), or None."""
        if (op, variants) not in self._trusted_pickers:
            self._trusted_pickers[op, variants] = trusted_picker(op, self.device_name,
                                                                 variants)
        pick_for = self._trusted_pickers[op, variants]
        return pick_for(key) if pick_for is not None else None
