"""The deployment-side lookup: which config to launch for a GEMM, from an exported table.

`get_tuned_config` loads the table YAML once per path; after that a call is one dict lookup
on the raw key (first sight of a key answers it and memoises the answer). A key is answered,
in this order, by:

- `table`: the entry of its bucket (bucket_key under the op's strategy, as the tuner grouped
  shapes and the export keyed them);
- `nearest`: among the configs of the NEAREST_BUCKETS tuned buckets of the same op and dtype
  closest in log2 of M, N and K, and their entries' alternates (runner-up tiles their studies
  measured), the one the analytical model predicts fastest for the key (the closest bucket's,
  without the model): a config measured fast at a neighbouring size is a far better guess
  than a generic one, and the model tells a split-K neighbour from a large-tile one. Variations
  of the candidates that suit the key better (a split-K candidate at the key's other splits, a
  TMA-fed one with another BLOCK_K or num_stages, a tile that would leave SMs idle with BLOCK_M
  or BLOCK_N halved: `_variation_maker`) answer instead when the model predicts one
  VARIATION_MARGIN faster than every measured candidate;
- `model`: for a dtype the op has no entry of, the analytical model's pick among the values
  the op's tuned configs use (tuner.model; imported on first need, so only then torch);
- `default`: DEFAULT_CONFIGS[op], with one RuntimeWarning per key.

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
from collections.abc import Callable, Iterator, Mapping
from functools import cached_property
from pathlib import Path
from types import MappingProxyType

import yaml

from tuner.bucketing import KEY_FIELDS, BucketingError, bucket_key
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
# The mm variants whose K loop TMA feeds (kernels/tma.py, kernels/persistent.py): the ones
# whose pipeline a variation may re-choose (_variation_maker).
TMA_FED = ("tma", "persistent")


class TunedConfig(Mapping):
    """A config to launch, read-only (the runtime hands the same object to every call of a key),
    with where it came from: `source` is "table", "nearest", "model" or "default"; `bucket` is
    the bucket key of the table entry it came from (None for "model" and "default")."""

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


# What a key that was never tuned gets: safe on any CUDA GPU for every dtype (fits shared
# memory on pre-Hopper parts too) and reasonable on large shapes; the variants they name run
# any call of their kernel (the pointer GEMM; gemv for a single row or column).
DEFAULT_CONFIGS: dict[str, TunedConfig] = {
    "mm": TunedConfig({"variant": "general", "pad": 0, "BLOCK_M": 128, "BLOCK_N": 128,
                       "BLOCK_K": 32, "GROUP_M": 8, "num_stages": 3, "num_warps": 8}, "default"),
    "gemv": TunedConfig({"variant": "gemv", "pad": 0, "BLOCK_M": 64, "BLOCK_K": 128,
                         "num_stages": 2, "num_warps": 4}, "default"),
}


def _log_sizes(bucket: tuple) -> tuple[float, ...]:
    """log2 of a bucket key's M, N and K (0 counted as 1): where `nearest` measures from."""
    return tuple(math.log2(max(bucket[i], 1)) for i in _SIZE_FIELDS)


def _log_distance(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    return sum(abs(x - y) for x, y in zip(a, b))


class OpTable:
    """One op's part of a table: its strategy, the config per bucket, and per dtype the
    buckets' log sizes (computed at load, so a new key's nearest search is a short scan)."""

    def __init__(self, body: Mapping):
        self.strategy: dict[str, str] = body["strategy"]
        # Every entry's config, in file order: what the model's space is narrowed to.
        self.configs = [entry["config"] for entry in body["entries"]]
        self.by_bucket: dict[tuple, TunedConfig] = {}
        # Per dtype, in file order: (log sizes, the entry's config and its alternates, each
        # answering as "nearest").
        self.neighbours: dict[str, list[tuple[tuple[float, ...], list[TunedConfig]]]] = {}
        for entry in body["entries"]:
            bucket = bucket_key(entry["key"], self.strategy)
            self.by_bucket[bucket] = TunedConfig(entry["config"], "table", bucket)
            self.neighbours.setdefault(bucket[_DTYPE_FIELD], []).append(
                (_log_sizes(bucket), [TunedConfig(config, "nearest", bucket) for config in
                                      (entry["config"], *entry.get("alternates", ()))]))

    def exact(self, key: Mapping[str, object]) -> TunedConfig | None:
        """The config of the key's bucket, if the table has it."""
        return self.by_bucket.get(bucket_key(key, self.strategy))

    def nearest(self, key: Mapping[str, object]) -> list[TunedConfig]:
        """The configs, then the alternates, of the closest buckets of the key's dtype,
        closest first (file order on a tie), each config once, until NEAREST_BUCKETS distinct
        entry configs are in; none without an entry of the dtype."""
        bucket = bucket_key(key, self.strategy)
        here = _log_sizes(bucket)
        closest = sorted(self.neighbours.get(bucket[_DTYPE_FIELD], ()),
                         key=lambda neighbour: _log_distance(here, neighbour[0]))
        candidates: dict[tuple, TunedConfig] = {}
        entry_configs: set[tuple] = set()
        for _, configs in closest:
            entry_configs.add(config_signature(configs[0]))
            for config in configs:
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


def _variation_maker(op: str, device_name: str | None
                     ) -> Callable[[Mapping, list], list] | None:
    """A function giving the variations of a key's candidates that suit the key rather than
    the neighbour they were tuned for, each once and none a candidate itself; None when the
    kernels cannot be imported (the candidates then stay as they are). Each variation must
    run on the key. A neighbour's config was tuned for the neighbour's split of the work; the
    parts of a config that follow from the call's size are re-chosen for the key:

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
        from tuner.execution import meta_gemm
        from tuner.kernels import KERNELS, kernel_variants
        from tuner.space import builtin_spaces
        from tuner.suggest import suggest_device
    except ImportError:
        return None
    space = builtin_spaces(kernel_variants()).get(op)
    params = space.params if space is not None else {}
    splits, stages = params.get("SPLIT_K", ()), params.get("num_stages", ())
    block_ks = params.get("BLOCK_K", ())
    kernel, sm_count = KERNELS[op], suggest_device(device_name)[1].sm_count

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

    def of_candidates(key: Mapping, configs: list) -> list:
        gemm = meta_gemm(_shape_of(key))
        taken = {config_signature(config) for config in configs}
        made = {}
        for config in configs:
            for other in variations(key, config):
                signature = config_signature(other)
                if signature not in taken and kernel.unsupported(other, gemm) is None:
                    made.setdefault(signature, TunedConfig(other, config.source, config.bucket))
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
                       ) -> Callable[[Mapping, list, list], TunedConfig] | None:
    """A function giving, for a raw key, the measured candidate the analytical model predicts
    fastest (tuner.model.fastest_of), or the variation it predicts fastest where that is
    VARIATION_MARGIN faster still; None when the model cannot be imported."""
    try:
        from tuner.model import fastest_of, predicted_or_inf
        from tuner.suggest import suggest_device
    except ImportError:
        return None
    spec = suggest_device(device_name)[1]

    def fastest(key: Mapping, measured: list, variations: list) -> TunedConfig:
        shape = _shape_of(key)
        pick = measured[fastest_of(shape, measured, spec)]
        if variations:
            challenger = variations[fastest_of(shape, variations, spec)]
            if (predicted_or_inf(shape, challenger, spec)
                    < (1 - VARIATION_MARGIN) * predicted_or_inf(shape, pick, spec)):
                return challenger
        return pick

    return fastest


def _model_picker(op: str, configs: list[Mapping],
                  device_name: str | None) -> Callable[[Mapping], TunedConfig | None] | None:
    """A function giving the analytical model's best config for a raw key, or None when the
    model cannot be imported or there is nothing to rank.

    The model ranks the op's built-in space narrowed to the values (variants included) that the
    table's configs of the op use: a small space (the cost of one new key stays a few ms), and
    one that stays near what tuning chose on this device. Predictions are for the table's device.
    """
    try:
        from tuner.kernels import KERNELS, kernel_variants
        from tuner.model import rank_configs
        from tuner.space import builtin_spaces
        from tuner.suggest import suggest_device
    except ImportError:
        return None
    space = builtin_spaces(kernel_variants()).get(op)
    if space is None:
        return None
    used = {name: {c[name] for c in configs if name in c} for name in space.params}
    try:
        space = space.narrowed(**{name: values for name, values in used.items() if values})
    except ValueError:  # the table's values of some parameter are none of the space's
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
    """One loaded table file (or none: every key gets its default), and its answers so far."""

    def __init__(self, path: Path | None):
        self.path = path
        self.ops: dict[str, OpTable] = {}
        self.device_name: str | None = None
        self.memo: dict[tuple, TunedConfig] = {}
        # Per op, once the model was needed: its picker (None: the model cannot answer).
        self.model_pickers: dict[str, Callable[[Mapping], TunedConfig | None] | None] = {}
        # Per op, once a key was answered from neighbours: its _variation_maker (None: no
        # kernels).
        self.variation_makers: dict[str, Callable[[Mapping, list], list] | None] = {}
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

    def lookup(self, op: str, raw: tuple) -> TunedConfig:
        """Answer a raw key seen for the first time (table, nearest, model, else default) and
        memoise the answer."""
        key = dict(zip(KEY_FIELDS, raw[1:]))
        config = self._tuned_or_modelled(op, key)
        if config is None:
            config = DEFAULT_CONFIGS[op]
            warnings.warn(f"gemm-tuner: no tuned {op} config for {key} in "
                          f"{self.path or '(no table: set ' + ENV_VAR + ')'}; using default "
                          f"{dict(config)}", RuntimeWarning, stacklevel=3)
        self.memo[raw] = config
        if self.log:
            self._log_answer(op, key, config)
        return config

    def _tuned_or_modelled(self, op: str, key: dict) -> TunedConfig | None:
        """The table's or nearest entry's config; the model's only for an op the table has
        entries of, none of them of this dtype (with no tuning of the op at all, nothing says
        which of its configs to trust, and the default is the safe choice)."""
        op_table = self.ops.get(op)
        if op_table is None or not op_table.by_bucket:
            return None
        config = op_table.exact(key)
        if config is not None:
            return config
        neighbours = op_table.nearest(key)
        if neighbours:
            variations = self._variations(op, key, neighbours)
            if (len(neighbours) == 1 and not variations) or self.fastest is None:
                return neighbours[0]
            return self.fastest(key, neighbours, variations)
        if op not in self.model_pickers:
            self.model_pickers[op] = _model_picker(op, op_table.configs, self.device_name)
        pick = self.model_pickers[op]
        return None if pick is None else pick(key)

    def _variations(self, op: str, key: dict, candidates: list) -> list:
        """The candidates' variations for the key (_variation_maker, loaded on first need,
        once per op)."""
        if op not in self.variation_makers:
            self.variation_makers[op] = _variation_maker(op, self.device_name)
        make = self.variation_makers[op]
        return [] if make is None else make(key, candidates)

    @cached_property
    def fastest(self) -> Callable[[Mapping, list, list], TunedConfig] | None:
        """The model's choice among nearest buckets and their variations, loaded on first need
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
    return config if config is not None else table.lookup(op, raw)


def clear_cache() -> None:
    """Forget loaded tables and their answers, e.g. after the file, $TUNE_CONFIG or $TUNE_LOG
    changed."""
    global _default_table
    _tables.clear()
    _default_table = None
