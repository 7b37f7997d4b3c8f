"""The deployment-side lookup: which config to launch for a GEMM, from an exported table.

`get_tuned_config` loads the table YAML once per path; after that a call is one dict lookup
on the raw key (first sight of a key answers it and memoises the answer). A key is answered,
in this order, by:

- `table`: the entry of its bucket (bucket_key under the op's strategy, as the tuner grouped
  shapes and the export keyed them), as it is: the dispatcher checks that it can run the call;
- `nearest`: among the configs that can run the key (`Kernel.unsupported` on the key's GEMM as
  meta tensors: a TMA-fed config on unaligned strides cannot, its padded twin may) of the
  NEAREST_BUCKETS tuned buckets of the same op and dtype closest in log2 of M, N and K, no
  farther than MAX_NEIGHBOUR_OCTAVES, and their entries' alternates (runner-up tiles their
  studies measured), the one the analytical model predicts fastest (the closest bucket's,
  without the model): a config measured fast at a neighbouring size is a far better guess
  than a generic one, and the model tells a split-K neighbour from a large-tile one. Each
  tile's prediction is scaled by how much the model overrated it against cuBLAS at the bucket
  it came from (its own measured time there, or its variant's fastest measured config's,
  against the entry's cuBLAS time), so the measurement next to the key corrects the model's
  bias for that kind of tile. Variations
  of the candidates that suit the key better (a split-K candidate at the key's other splits, a
  TMA-fed one with another BLOCK_K or num_stages, a tile that would leave SMs idle with BLOCK_M
  or BLOCK_N halved: `_variation_maker`) answer instead when the model predicts one
  VARIATION_MARGIN faster than every measured candidate;
- `cublas`: torch's own GEMM (CUBLAS_CONFIG, kernels/cublas.py) where no tuned config is to
  be trusted: the model predicts it faster than every candidate above, or no runnable
  neighbour lies within MAX_NEIGHBOUR_OCTAVES, or the table holds no entry of the op, or
  (for a dtype the op has no entry of) the model has no runnable pick or predicts cuBLAS
  faster than it;
- `nearest` again, from runnable neighbours farther away, where cuBLAS cannot run the key
  (fp8 in another layout than torch._scaled_mm's);
- `model`: for a dtype the op has no entry of (or none that can run the key, where cuBLAS
  cannot either), the analytical model's pick among the values the op's tuned configs use
  (tuner.model.predict; imported on first need, so only then torch);
- `default`: DEFAULT_CONFIGS[op], where nothing above can run the key.

A key answered by the default, or by cuBLAS for want of any entry of its op and dtype, gets
one RuntimeWarning. `get_tuned_config_without` answers as if some variants did not exist
(`("cublas",)`: the best Triton config, which benchmarks report beside cuBLAS).

The answer is a read-only mapping that also says which of these answered (`TunedConfig`);
with TUNE_LOG=1 each raw key's answer is logged once, to the "tuner.runtime" logger. The
module imports neither optuna nor sqlalchemy, so deployments need neither.
"""
from __future__ import annotations

import logging
import math
import os
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import cached_property
from pathlib import Path
from types import MappingProxyType
from typing import NamedTuple

import yaml

from tuner.bucketing.strategies import KEY_FIELDS, BucketingError, bucket_key
from tuner.space import config_signature

ENV_VAR = "TUNE_CONFIG"
LOG_ENV_VAR = "TUNE_LOG"
TABLE_FORMAT = "gemm-tuner-table/2"  # /2: configs name their variant and pad

_LOG = logging.getLogger("tuner.runtime")
_DTYPE_FIELD = KEY_FIELDS.index("dtype")
_SIZE_FIELDS = tuple(KEY_FIELDS.index(f) for f in ("M", "N", "K"))
# How many of the closest tuned buckets `nearest` lets the model choose among (their configs
# and alternates): the count with the least regret when each tuned shape of shapes-dev is
# answered from the others on an H200, measured by benchmarks/nearest_fallback.py (results in
# benchmarks/results/h200-issue6/nearest_fallback.md): with alternates, 4 buckets lose the
# least (3.6% geomean; 5 or 6: 4.0%; the configs of 6 without alternates: 8.9%); with 8,
# far neighbours mislead the model (10.0%).
NEAREST_BUCKETS = 4
# The smallest block a halved neighbour tile may have: tl.dot's minimum.
MIN_HALVED_BLOCK = 16
# How much faster than the best measured candidate the model must predict a variation no tuning
# measured (a re-split, re-piped or halved neighbour tile) for it to answer instead. Among the
# configs within 1.5x of each shape's best in benchmarks/data/candidates-h200.json.gz (52 shapes, an
# H200), the model orders a pair as measured 51-64% of the time when it predicts them under 5%
# apart, 63-87% from 5% on. Over the committed tables' hold-out and leave-one-out questions, the
# variations predicted 5.9-43% faster that were timed ran 0.77-1.00x the best measured candidate. Of
# those predicted 1.4-3.7% faster, two halved tiles ran 0.92-0.94x (a gain the margin gives up), but
# a halved 64x256 tile ran 640x3072x8192 at 1.53x its best config and a re-split (SK2) 15.4% behind
# a fresh tune, where the measured candidate now answering runs 10.2% behind
# (benchmarks/results/h200-issue6/validate-extra-tuned-*.md). The order figures:
# benchmarks/candidate_pool.py order.
VARIATION_MARGIN = 0.05
# How far (log distance: octaves summed over M, N and K) a tuned bucket may lie from a key for
# its configs to answer it. The hold-out keys of benchmarks/shapes, answered from the tables
# of benchmarks/results/h200-issue6, took their answers from buckets up to 5.8 octaves away
# and ran at most 28% behind a fresh tune of the key (validate*.md there). No answer from
# farther away was measured: there the tile was tuned for a GEMM some 64 times larger or
# smaller in its work, and nothing says it still suits, while cuBLAS is tuned for every shape.
MAX_NEIGHBOUR_OCTAVES = 6.0
# The mm variants whose K loop TMA feeds (kernels/tma.py, kernels/persistent.py): the ones
# whose pipeline a variation may re-choose (_variation_maker).
TMA_FED = ("tma", "persistent")


class TunedConfig(Mapping):
    """A config to launch, read-only (the runtime hands the same object to every call of a key),
    with where it came from: `source` is "table", "nearest", "cublas", "model" or "default"
    (see the module docstring); `bucket` is the bucket key of the table entry it came from
    (None for the others)."""

    __slots__ = ("_values", "_source", "_bucket")

    def __init__(self, values: Mapping[str, int | str], source: str,
                 bucket: tuple | None = None):
        self._values = MappingProxyType(dict(values))
        self._source = source
        self._bucket = bucket

    @property
    def source(self) -> str:
        return self._source

    @property
    def bucket(self) -> tuple | None:
        return self._bucket

    def __getitem__(self, name: str) -> int | str:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return (f"TunedConfig({dict(self._values)}, source={self._source!r}, "
                f"bucket={self._bucket!r})")


# What a key gets where neither a tuned config nor cuBLAS can run it: safe on any CUDA GPU for
# every dtype (fits shared memory on pre-Hopper parts too) and reasonable on large shapes; the
# variants they name run any call of their kernel (the pointer GEMM; gemv for a single row or
# column).
DEFAULT_CONFIGS: dict[str, TunedConfig] = {
    "mm": TunedConfig({"variant": "general", "pad": 0, "BLOCK_M": 128, "BLOCK_N": 128,
                       "BLOCK_K": 32, "GROUP_M": 8, "num_stages": 3, "num_warps": 8}, "default"),
    "gemv": TunedConfig({"variant": "gemv", "pad": 0, "BLOCK_M": 64, "BLOCK_K": 128,
                         "num_stages": 2, "num_warps": 4}, "default"),
}
# What a key gets where cuBLAS answers: the variant calling torch's own GEMM
# (kernels/cublas.py), which every op has. It runs every key but fp8 ones in another layout
# than torch._scaled_mm's and fp32 ones whose tf32 choice is not torch's.
CUBLAS = "cublas"
CUBLAS_CONFIG = TunedConfig({"variant": CUBLAS, "pad": 0}, "cublas")


def _log_sizes(bucket: tuple) -> tuple[float, ...]:
    """log2 of a bucket key's M, N and K (0 counted as 1): where `nearest` measures from."""
    return tuple(math.log2(max(bucket[i], 1)) for i in _SIZE_FIELDS)


def _log_distance(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    return sum(abs(x - y) for x, y in zip(a, b))


class Measurement(NamedTuple):
    """What a table entry measured at its own shape (`tuned_shape`, a Shape label): cuBLAS's
    kernel time and, per config signature, its config's and its alternates' (`ms`,
    `alternates_ms` of tune export), in ms."""
    tuned_shape: str
    cublas_ms: float
    times: dict[tuple, float]

    @classmethod
    def of(cls, entry: Mapping) -> Measurement | None:
        """The entry's measurement, or None where it states none (a bucketed export's)."""
        shape, ms, cublas_ms = (entry.get(f) for f in ("tuned_shape", "ms", "cublas_ms"))
        if not (isinstance(shape, str) and _positive(ms) and _positive(cublas_ms)):
            return None
        times = {config_signature(entry["config"]): ms}
        alternates, alternates_ms = entry.get("alternates", ()), entry.get("alternates_ms", ())
        if len(alternates) == len(alternates_ms):
            times.update((config_signature(config), alternate_ms) for config, alternate_ms
                         in zip(alternates, alternates_ms) if _positive(alternate_ms))
        return cls(shape, cublas_ms, times)


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


class OpTable:
    """One op's part of a table: its strategy, the config per bucket, and per dtype the
    buckets' log sizes (computed at load, so a new key's nearest search is a short scan)."""

    def __init__(self, body: Mapping):
        self.strategy: dict[str, str] = body["strategy"]
        # Every entry's config, in file order: what the model's space is narrowed to.
        self.configs = [entry["config"] for entry in body["entries"]]
        self.by_bucket: dict[tuple, TunedConfig] = {}
        # Per bucket whose entry says what it measured: what calibrates the model near it.
        self.measured: dict[tuple, Measurement] = {}
        # Per dtype, in file order: (log sizes, the entry's config and its alternates, each
        # answering as "nearest").
        self.neighbours: dict[str, list[tuple[tuple[float, ...], list[TunedConfig]]]] = {}
        for entry in body["entries"]:
            bucket = bucket_key(entry["key"], self.strategy)
            self.by_bucket[bucket] = TunedConfig(entry["config"], "table", bucket)
            measurement = Measurement.of(entry)
            if measurement is not None:
                self.measured[bucket] = measurement
            self.neighbours.setdefault(bucket[_DTYPE_FIELD], []).append(
                (_log_sizes(bucket), [TunedConfig(config, "nearest", bucket) for config in
                                      (entry["config"], *entry.get("alternates", ()))]))

    def exact(self, key: Mapping[str, object]) -> TunedConfig | None:
        """The config of the key's bucket, if the table has it."""
        return self.by_bucket.get(bucket_key(key, self.strategy))

    def has_dtype(self, dtype: str) -> bool:
        """Whether the op has an entry of this dtype (else only the model's pick answers)."""
        return bool(self.neighbours.get(dtype))

    def nearest(self, key: Mapping[str, object], allowed: Callable[[Mapping], bool],
                max_octaves: float = math.inf) -> list[TunedConfig]:
        """The allowed configs, then alternates, of the closest buckets of the key's dtype no
        farther than max_octaves, closest first (file order on a tie), each config once, until
        NEAREST_BUCKETS distinct entry configs are in; none without such a bucket. An entry
        whose own config is not allowed (cannot run the key) stands for its first allowed
        alternate, and one with none is passed over: the count is of configs that can answer."""
        bucket = bucket_key(key, self.strategy)
        here = _log_sizes(bucket)
        by_distance = sorted(((_log_distance(here, sizes), configs) for sizes, configs
                              in self.neighbours.get(bucket[_DTYPE_FIELD], ())),
                             key=lambda neighbour: neighbour[0])
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


def _layout(M: int, N: int, K: int, stride_am: int, stride_bk: int) -> str:
    """Shape.layout from a call's strides, inverting Shape.stride_am and stride_bk: an operand
    whose leading stride is not its row length is read transposed."""
    return ("n" if stride_am == K else "t") + ("n" if stride_bk == N else "t")


def _shape_of(key: Mapping):
    from tuner.shapes import Shape

    sizes = (key["M"], key["N"], key["K"])
    return Shape(*sizes, key["dtype"], _layout(*sizes, key["stride_am"], key["stride_bk"]))


def _runnability(op: str) -> Callable[[Mapping], Callable[[Mapping], bool]] | None:
    """A function giving, for a raw key, whether the op's kernel can run a config on it: the
    kernel's own verdict (Kernel.unsupported) on the key's GEMM as meta tensors (_key_gemm).
    None when the kernels cannot be imported: every config then counts as runnable."""
    try:
        from tuner.kernels import KERNELS
    except ImportError:
        return None
    kernel = KERNELS.get(op)
    if kernel is None:
        return None

    def on(key: Mapping) -> Callable[[Mapping], bool]:
        gemm = _key_gemm(key)
        return lambda config: (config["variant"] in kernel.variant
                               and kernel.unsupported(config, gemm) is None)

    return on


def _key_gemm(key: Mapping):
    """The key's GEMM on meta tensors, A and B with the key's own row strides. The key holds
    no pointer, so the pointers count as 16-byte aligned (a meta tensor's is 0); the
    dispatcher checks the call itself. _layout reads a row stride that is neither 1 nor the
    row's length (a slice of a wider matrix) as a transposed operand; here it is kept."""
    from tuner.execution.measure import meta_gemm

    gemm = meta_gemm(_shape_of(key))
    return gemm.with_operands(_row_strided(gemm.a, key["stride_am"]),
                              _row_strided(gemm.b, key["stride_bk"]), gemm.out)


def _row_strided(operand, stride: int):
    """The operand as laid out by _layout, or row-major with `stride` between its rows where
    the stride is neither 1 (a transposed operand) nor what _layout gave it."""
    import torch

    if stride == 1 or operand.stride(0) == stride:
        return operand
    return torch.empty_strided(operand.shape, (stride, 1), dtype=operand.dtype, device="meta")


def _variation_maker(op: str, device_name: str | None
                     ) -> Callable[[Mapping, list, Callable[[Mapping], bool]], list] | None:
    """A function giving the variations of a key's candidates that suit the key rather than
    the neighbour they were tuned for, each once and none a candidate itself; None when the
    kernels cannot be imported (the candidates then stay as they are). Each variation must be
    allowed (run on the key: the lookup's predicate). A neighbour's config was tuned for the
    neighbour's split of the work; the parts of a config that follow from the call's size are
    re-chosen for the key:

    - Each split-K candidate at every other SPLIT_K of the op's built-in space. How many
      slices K is cut into is a matter of the call's shape, not of the tile: it should fill
      the SMs given the output tiles, and leave each slice enough K steps. On an H200, the
      hold-out shape 96x3584x18944 (M=96, a K 4.6 times the tuned shapes') took its
      neighbours' split-K configs at their own 2 or 4 splits, 16.5-37.6% slower than a fresh
      tune of it, with the three committed tables; at the split the model chose (4 or 8),
      -0.1% to 1.0% (benchmarks/results/h200-issue6/validate-extra-*-resplit.md).
    - The K pipeline of each candidate whose loads TMA issues (TMA_FED): every num_stages of
      the space, at its BLOCK_K and at the space's BLOCK_K half and twice it. How deep a
      pipeline must be, and how long its steps, follows from how many programs share an SM
      and how many K steps each has. Pointer-fed loops keep theirs: there the model misses
      costs that depend on both (an unaligned 4097x4095x4100 ran a BLOCK_K 128 general tile
      33x slower than its BLOCK_K 64 on an H200, and 5000x1024x4096 a 2-stage general tile
      1.68x behind the tma one the model predicts the same).
    - Each of these one-pass tiles with BLOCK_M or BLOCK_N halved, where each SM runs its
      tiles one at a time (a grid under one wave of the table's device's SMs, or a persistent
      program) and the halved grid fills its rounds of SMs better (_wave_fill). A neighbour's
      tile fits the neighbour's grid: on a smaller output it leaves SMs idle, and over a few
      rounds the last one may be nearly empty. 5000x1024x4096 split into 160 persistent
      tiles of 128x256 (two rounds on 132 SMs, the second a fifth full) ran 1.28x its best
      config on an H200, into 320 of 128x128 (three rounds, 81% full), 1.11x.
    """
    try:
        from tuner.kernels import kernel_variants
        from tuner.space import builtin_spaces
        from tuner.suggest import suggest_device
    except ImportError:
        return None
    space = builtin_spaces(kernel_variants()).get(op)
    params = space.params if space is not None else {}
    splits, stages = params.get("SPLIT_K", ()), params.get("num_stages", ())
    block_ks = params.get("BLOCK_K", ())
    sm_count = suggest_device(device_name)[1].sm_count

    def pipelines(config: Mapping) -> Iterator[dict]:
        """The config and, when TMA feeds it, its other K pipelines (each once)."""
        yield dict(config)
        if config["variant"] in TMA_FED:
            step, depth = config["BLOCK_K"], config["num_stages"]
            for block_k in (k for k in block_ks if step // 2 <= k <= 2 * step):
                yield from ({**config, "BLOCK_K": block_k, "num_stages": n} for n in stages
                            if (block_k, n) != (step, depth))

    def halved(key: Mapping, config: dict) -> Iterator[dict]:
        """The tile with BLOCK_M, then BLOCK_N, halved, where that fills the SMs better."""
        sizes = {"BLOCK_M": key["M"], "BLOCK_N": key["N"]}
        tiles = _tiles(sizes, config)
        if tiles >= sm_count and config["variant"] != "persistent":
            return
        for block in sizes:
            smaller = {**config, block: config[block] // 2}
            if (smaller[block] >= MIN_HALVED_BLOCK and _fits(sizes, smaller)
                    and _wave_fill(_tiles(sizes, smaller), sm_count)
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
        for config in configs:
            for other in variations(key, config):
                signature = config_signature(other)
                if signature not in taken and signature not in made and allowed(other):
                    made[signature] = TunedConfig(other, config.source, config.bucket)
        return list(made.values())

    return of_candidates


def _fits(sizes: Mapping[str, int], config: Mapping) -> bool:
    """Whether no block of the tile is twice the call's size or more (sizes as in _tiles): a
    halved tile still that tall computes mostly padding rows, and there the model is least
    right (at M <= 48 it underrated 128-row tiles on 4 warps 1.7-1.9x on an H200)."""
    return all(config[block] < 2 * size for block, size in sizes.items())


def _wave_fill(tiles: int, sm_count: int) -> float:
    """The share of its rounds of sm_count programs that a grid of `tiles` fills."""
    return tiles / (-(-tiles // sm_count) * sm_count)


def _tiles(sizes: Mapping[str, int], config: Mapping) -> int:
    """Output tiles of a grid: sizes maps BLOCK_M and BLOCK_N to the call's M and N."""
    return math.prod(-(-size // config[block]) for block, size in sizes.items())


def _fastest_predicted(device_name: str | None
                       ) -> Callable[[Mapping, list, list, Mapping], TunedConfig] | None:
    """A function giving, for a raw key, the candidate (a measured config, or cuBLAS) predicted
    fastest, or the variation predicted fastest where that is VARIATION_MARGIN faster still;
    None when the model cannot be imported.

    Predictions are the analytical model's (tuner.model.predict), calibrated by the measurements of
    the buckets the candidates came from (`measured`, per bucket): how much the model
    overrates a tile against cuBLAS changes slowly with the shape, and a neighbour's
    measurement says how much it did there.
    """
    try:
        from tuner.model.predict import predicted_or_inf
        from tuner.shapes import Shape
        from tuner.suggest import suggest_device
    except ImportError:
        return None
    spec = suggest_device(device_name)[1]

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

    def fastest(key: Mapping, candidates: list, variations: list,
                measured: Mapping[tuple, Measurement]) -> TunedConfig:
        shape = _shape_of(key)

        def calibrated(config: TunedConfig) -> float:
            """The predicted time, with cuBLAS's as the model gives it and each tile's
            scaled by its bucket's overrating."""
            return (predicted_or_inf(shape, config, spec)
                    * overrating(config, measured.get(config.bucket)))

        pick = min(candidates, key=calibrated)  # the first on a tie
        if variations:
            challenger = min(variations, key=calibrated)
            if calibrated(challenger) < (1 - VARIATION_MARGIN) * calibrated(pick):
                return challenger
        return pick

    return fastest


def _model_picker(op: str, configs: list[Mapping], device_name: str | None,
                  excluded: frozenset[str]) -> Callable[[Mapping], TunedConfig | None] | None:
    """A function giving the analytical model's best config for a raw key, or None when the
    model cannot be imported or there is nothing to rank.

    The model ranks the op's built-in space narrowed to the values (variants included, less
    the excluded ones) that the table's configs of the op use: a small space (the cost of one
    new key stays a few ms), and one that stays near what tuning chose on this device.
    Predictions are for the table's device.
    """
    try:
        from tuner.kernels import KERNELS, kernel_variants
        from tuner.model.predict import rank_configs
        from tuner.space import builtin_spaces
        from tuner.suggest import suggest_device
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
    kernel, spec = KERNELS[op], suggest_device(device_name)[1]

    def pick(key: Mapping) -> TunedConfig | None:
        ranked = rank_configs(_shape_of(key), space, kernel, spec, k=1)
        return TunedConfig(ranked[0][1], "model") if ranked else None

    return pick


def _show_log_lines() -> None:
    """Make TUNE_LOG's INFO lines visible where logging was never configured: one stderr
    handler on our logger, attached only when no handler would receive them otherwise."""
    if not _LOG.hasHandlers():
        _LOG.addHandler(logging.StreamHandler(sys.stderr))
        if _LOG.level == logging.NOTSET:
            _LOG.setLevel(logging.INFO)


class TunedTable:
    """One loaded table file (or none: every key gets cuBLAS or its default), and its answers
    so far."""

    def __init__(self, path: Path | None):
        self.path = path
        self.ops: dict[str, OpTable] = {}
        self.device_name: str | None = None
        # Per raw key (and, from get_tuned_config_without, the variants left out): the answer.
        self.memo: dict[tuple, TunedConfig] = {}
        # Per op and excluded variants, once the model was needed: its picker (None: the model
        # cannot answer).
        self.model_pickers: dict[tuple[str, frozenset[str]],
                                 Callable[[Mapping], TunedConfig | None] | None] = {}
        # Per op, once a key was answered from neighbours: its _variation_maker (None: no
        # kernels).
        self.variation_makers: dict[str, Callable | None] = {}
        # Per op, once a key needed it: its _runnability (None: no kernels).
        self.runnability: dict[str, Callable[[Mapping], Callable[[Mapping], bool]] | None] = {}
        self.log = os.environ.get(LOG_ENV_VAR) == "1"
        if self.log:
            _show_log_lines()
        if path is None:
            return
        try:
            doc = yaml.safe_load(path.read_text())
        except OSError as e:
            raise FileNotFoundError(f"gemm-tuner table {path}: {e.strerror}") from None
        if not isinstance(doc, dict) or doc.get("format") != TABLE_FORMAT:
            raise ValueError(f"gemm-tuner table {path}: not a '{TABLE_FORMAT}' file "
                             "(write one with `tune export --format table`)")
        self.device_name = (doc.get("device") or {}).get("name")
        try:
            self.ops = {op: OpTable(body) for op, body in (doc.get("ops") or {}).items()}
        except BucketingError as e:  # e.g. a user strategy whose module this process lacks
            raise BucketingError(f"gemm-tuner table {path}: {e}") from None

    def lookup(self, raw: tuple, excluded: frozenset[str] = frozenset()) -> TunedConfig:
        """Answer a raw key seen for the first time (the op, then KEY_FIELDS' values, then
        anything else the memo tells apart), leaving out configs of the excluded variants, and
        memoise the answer under `raw`."""
        op, key = raw[0], dict(zip(KEY_FIELDS, raw[1:1 + len(KEY_FIELDS)]))
        config = self._answer(op, key, excluded)
        if config is None:
            config = DEFAULT_CONFIGS[op]
        if config.source == "default" or (config is CUBLAS_CONFIG
                                          and not self._has_entries(op, key["dtype"])):
            warnings.warn(f"gemm-tuner: no tuned {op} config for {key} in "
                          f"{self.path or '(no table: set ' + ENV_VAR + ')'}; using "
                          f"{config.source} {dict(config)}", RuntimeWarning, stacklevel=3)
        self.memo[raw] = config
        if self.log:
            self._log_answer(op, key, config)
        return config

    def _has_entries(self, op: str, dtype: str) -> bool:
        return op in self.ops and self.ops[op].has_dtype(dtype)

    def _answer(self, op: str, key: dict, excluded: frozenset[str]) -> TunedConfig | None:
        """The answer of the first source that has one (module docstring), None for the
        default. The table's own entry needs no kernel: it answers before any is loaded."""
        op_table = self.ops.get(op)
        exact = op_table.exact(key) if op_table is not None else None
        if exact is not None and exact["variant"] not in excluded:
            return exact
        allowed = self._allowed(op, key, excluded)
        cublas = CUBLAS_CONFIG if allowed(CUBLAS_CONFIG) else None
        if op_table is None or not op_table.by_bucket:
            return cublas
        if not op_table.has_dtype(key["dtype"]):
            return self._modelled(op, key, allowed, excluded, cublas)
        return self._from_neighbours(op_table, op, key, allowed, excluded, cublas)

    def _from_neighbours(self, op_table: OpTable, op: str, key: dict,
                         allowed: Callable[[Mapping], bool], excluded: frozenset[str],
                         cublas: TunedConfig | None) -> TunedConfig | None:
        """For a key whose dtype the op has entries of: its neighbours' configs within
        MAX_NEIGHBOUR_OCTAVES (or cuBLAS where the model predicts it faster), else cuBLAS, else
        the neighbours farther away, else the model's pick."""
        trusted = op_table.nearest(key, allowed, MAX_NEIGHBOUR_OCTAVES)
        if trusted:
            return self._fastest_of(op, key, trusted, allowed, cublas)
        if cublas is not None:
            return cublas
        farther = op_table.nearest(key, allowed)
        if farther:
            return self._fastest_of(op, key, farther, allowed, None)
        return self._modelled(op, key, allowed, excluded, None)

    def _allowed(self, op: str, key: dict, excluded: frozenset[str]
                 ) -> Callable[[Mapping], bool]:
        """Whether a config may answer the key: not of an excluded variant, and runnable on it
        (_runnability, loaded once per op; each config judged once per key)."""
        if op not in self.runnability:
            self.runnability[op] = _runnability(op)
        on = self.runnability[op]
        runnable = on(key) if on is not None else lambda config: True
        verdicts: dict[tuple, bool] = {}

        def allowed(config: Mapping) -> bool:
            signature = config_signature(config)
            if signature not in verdicts:
                verdicts[signature] = config["variant"] not in excluded and runnable(config)
            return verdicts[signature]

        return allowed

    def _fastest_of(self, op: str, key: dict, candidates: list,
                    allowed: Callable[[Mapping], bool],
                    cublas: TunedConfig | None) -> TunedConfig:
        """The model's choice among neighbour candidates, their variations and cuBLAS (listed
        last, so that a tie goes to a tuned config; not again where a neighbour was tuned to
        it); the first candidate without the model."""
        variations = self._variations(op, key, candidates, allowed)
        if cublas is not None and all(config["variant"] != CUBLAS for config in candidates):
            candidates = [*candidates, cublas]
        if (len(candidates) == 1 and not variations) or self.fastest is None:
            return candidates[0]
        return self.fastest(key, candidates, variations, self.ops[op].measured)

    def _modelled(self, op: str, key: dict, allowed: Callable[[Mapping], bool],
                  excluded: frozenset[str], cublas: TunedConfig | None) -> TunedConfig | None:
        """The model's pick for a key no neighbour answers (_model_picker), or cuBLAS where it
        has none or predicts cuBLAS faster. Only for an op the table has entries of: with no
        tuning of the op at all, nothing says which of its configs to trust."""
        picker_key = (op, excluded)
        if picker_key not in self.model_pickers:
            self.model_pickers[picker_key] = _model_picker(op, self.ops[op].configs,
                                                           self.device_name, excluded)
        pick_for = self.model_pickers[picker_key]
        pick = pick_for(key) if pick_for is not None else None
        if pick is None or not allowed(pick):
            return cublas
        if cublas is None or self.fastest is None:
            return pick
        return self.fastest(key, [pick, cublas], [], {})

    def _variations(self, op: str, key: dict, candidates: list,
                    allowed: Callable[[Mapping], bool]) -> list:
        """The candidates' variations for the key (_variation_maker, loaded on first need,
        once per op)."""
        if op not in self.variation_makers:
            self.variation_makers[op] = _variation_maker(op, self.device_name)
        make = self.variation_makers[op]
        return [] if make is None else make(key, candidates, allowed)

    @cached_property
    def fastest(self) -> Callable[[Mapping, list, list, Mapping], TunedConfig] | None:
        """The model's choice among candidates and their variations, loaded on first need
        (None: no model)."""
        return _fastest_predicted(self.device_name)

    def _log_answer(self, op: str, key: dict, config: TunedConfig) -> None:
        answer = config.source if config.bucket is None else (f"{config.source} bucket "
                                                              f"{config.bucket}")
        where = f"from {self.path}" if self.path else f"(no table: set {ENV_VAR})"
        _LOG.info("gemm-tuner: %s M=%s N=%s K=%s %s strides %s,%s -> %s %s", op, key["M"],
                  key["N"], key["K"], key["dtype"], key["stride_am"], key["stride_bk"], answer,
                  where)


_tables: dict[str, TunedTable] = {}
_default_table: TunedTable | None = None


def _load(path: str | os.PathLike) -> TunedTable:
    table = _tables[path] = TunedTable(Path(path))
    return table


def _load_default() -> TunedTable:
    global _default_table
    name = os.environ.get(ENV_VAR)
    _default_table = TunedTable(Path(name) if name else None)
    return _default_table


def get_tuned_config(op: str, *, M: int, N: int, K: int, dtype: str, stride_am: int,
                     stride_bk: int, path: str | os.PathLike | None = None) -> TunedConfig:
    """The config for op ("mm" or "gemv") at this key, from the table at `path` (default:
    $TUNE_CONFIG, read on first use): see the module docstring for which source answers. The
    returned mapping is read-only and the same object on every call of the key.

    Cost: a memoised key is one dict lookup (benchmarks/lookup_latency.py). A new key costs a
    bucketing and at most a scan of the op's entries. One answered by the model took 7-9 ms
    on one CPU core (measured on a 4-config mm table; 16-22 ms for the op's first, which also
    loads its space); one answered from its neighbours, 3-6 ms with their 60-120 variations
    (tuned-retune4.yaml in benchmarks/results/h200-issue6), plus, once per process, 1.6 s to
    import torch, Triton and the model if the caller had not (tuner.matmul has).
    """
    if path is None:
        table = _default_table or _load_default()
    else:
        table = _tables.get(path) or _load(path)
    raw = (op, M, N, K, stride_am, stride_bk, dtype)
    config = table.memo.get(raw)
    return config if config is not None else table.lookup(raw)


def get_tuned_config_without(variants: Iterable[str], op: str, *, M: int, N: int, K: int,
                             dtype: str, stride_am: int, stride_bk: int,
                             path: str | os.PathLike | None = None) -> TunedConfig:
    """get_tuned_config's answer were the named variants never tuned nor callable: with
    ("cublas",), the best Triton config for the key (a cuBLAS table entry gives way to its
    alternates and neighbours, and cuBLAS never answers). Memoised as get_tuned_config is;
    a function of its own, so that get_tuned_config's memoised path stays one dict lookup."""
    table = _table_at(path)
    excluded = frozenset(variants)
    raw = (op, M, N, K, stride_am, stride_bk, dtype, excluded)
    config = table.memo.get(raw)
    return config if config is not None else table.lookup(raw, excluded)


def _table_at(path: str | os.PathLike | None) -> TunedTable:
    """The loaded table at `path` (None: $TUNE_CONFIG's), as get_tuned_config finds it (which
    inlines this: a call costs more than its memoised lookup)."""
    if path is None:
        return _default_table or _load_default()
    return _tables.get(path) or _load(path)


def clear_cache() -> None:
    """Forget loaded tables and their answers, e.g. after the file, $TUNE_CONFIG or $TUNE_LOG
    changed."""
    global _default_table
    _tables.clear()
    _default_table = None
