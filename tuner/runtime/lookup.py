"""Loading tables and answering keys: `get_tuned_config` and its memo.

A table is loaded once per path; after that a call is one dict lookup on the raw key (the
first sight of a key answers it, `TunedTable.lookup`, and memoises the answer), since the
dispatcher asks on every new call signature and host time decides decode shapes
(benchmarks/lookup_latency.py measures a hit). `TunedTable._answer` decides which source
answers a key, in the order tuner.runtime's docstring gives; tuner.runtime.fallback supplies
the parts that need the model or the kernels, each loaded on first need.
"""
from __future__ import annotations

import logging
import math
import os
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping
from functools import cached_property
from pathlib import Path

from tuner.bucketing.strategies import KEY_FIELDS, BucketingError, bucket_key
from tuner.formats.table import (
    Measurement,
    TableError,
    is_table_document,
    read_document,
    read_table,
)
from tuner.runtime import fallback
from tuner.runtime.answer import CUBLAS, CUBLAS_CONFIG, DEFAULT_CONFIGS, TunedConfig
from tuner.runtime.runnable import runnability
from tuner.space import config_signature

ENV_VAR = "TUNE_CONFIG"
LOG_ENV_VAR = "TUNE_LOG"

_LOG = logging.getLogger("tuner.runtime")
_DTYPE_FIELD = KEY_FIELDS.index("dtype")
_SIZE_FIELDS = tuple(KEY_FIELDS.index(f) for f in ("M", "N", "K"))


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
        self.neighbours: dict[str, list[fallback.Neighbour]] = {}
        for entry in body["entries"]:
            bucket = bucket_key(entry["key"], self.strategy)
            self.by_bucket[bucket] = TunedConfig(entry["config"], "table", bucket)
            measurement = Measurement.of(entry)
            if measurement is not None:
                self.measured[bucket] = measurement
            self.neighbours.setdefault(bucket[_DTYPE_FIELD], []).append(
                (fallback.log_sizes(bucket, _SIZE_FIELDS),
                 [TunedConfig(config, "nearest", bucket) for config in
                  (entry["config"], *entry.get("alternates", ()))]))

    def exact(self, key: Mapping[str, object]) -> TunedConfig | None:
        """The config of the key's bucket, if the table has it."""
        return self.by_bucket.get(bucket_key(key, self.strategy))

    def has_dtype(self, dtype: str) -> bool:
        """Whether the op has an entry of this dtype (else only the model's pick answers)."""
        return bool(self.neighbours.get(dtype))

    def nearest(self, key: Mapping[str, object], allowed: Callable[[Mapping], bool],
                max_octaves: float = math.inf) -> list[TunedConfig]:
        """fallback.nearest among the entries of the key's dtype, in file order."""
        bucket = bucket_key(key, self.strategy)
        return fallback.nearest(fallback.log_sizes(bucket, _SIZE_FIELDS),
                                self.neighbours.get(bucket[_DTYPE_FIELD], ()), allowed,
                                max_octaves)


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

    def __init__(self, path: Path | None, doc: object = None):
        self.path = path
        self.ops: dict[str, OpTable] = {}
        self.device_name: str | None = None
        # Per raw key (and, from get_tuned_config_without, the variants left out): the answer.
        self.memo: dict[tuple, TunedConfig] = {}
        # Per op and excluded variants, once the model was needed: its picker (None: the model
        # cannot answer).
        self.model_pickers: dict[tuple[str, frozenset[str]],
                                 Callable[[Mapping], TunedConfig | None] | None] = {}
        # Per op, once a key was answered from neighbours: its variation maker (None: no
        # kernels).
        self.variation_makers: dict[str, Callable | None] = {}
        # Per op, once a key needed it: its runnability (None: no kernels).
        self.runnability: dict[str, Callable[[Mapping], Callable[[Mapping], bool]] | None] = {}
        self.log = os.environ.get(LOG_ENV_VAR) == "1"
        if self.log:
            _show_log_lines()
        if path is None:
            return
        table = read_table(path, doc)
        self.device_name = table.device_name
        try:
            self.ops = {op: OpTable(body) for op, body in table.ops.items()}
        except BucketingError as e:  # e.g. a user strategy whose module this process lacks
            raise BucketingError(f"gemm-tuner table {path}: {e}") from None
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
            raise TableError(f"gemm-tuner table {path}: an entry the runtime cannot read "
                             f"({type(e).__name__}: {' '.join(str(e).split())})") from None

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
        """The answer of the first source that has one (tuner.runtime's docstring), None for
        the default. The table's own entry needs no kernel: it answers before any is loaded."""
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
        """For a key whose dtype the op has entries of: cuBLAS where the closest neighbour
        within MAX_NEIGHBOUR_OCTAVES was tuned to it, else those neighbours' configs (or cuBLAS
        where the model predicts it clearly faster), else cuBLAS, else the neighbours farther
        away, else the model's pick.

        The closest neighbour's measurement decides between cuBLAS and Triton because the
        model cannot: it misjudges their ratio by more than the few percent that usually part
        them (benchmarks/fallback_pool.py), while which of the two wins changes slowly with the
        shape. Among Triton configs the model's calibrated ranking is what chooses."""
        trusted = op_table.nearest(key, allowed, fallback.MAX_NEIGHBOUR_OCTAVES)
        if trusted and trusted[0]["variant"] == CUBLAS:
            return trusted[0]
        if trusted:
            return self._fastest_of(op, key, trusted, allowed, cublas)
        if cublas is not None:
            return cublas
        farther = op_table.nearest(key, allowed)
        if farther:
            return self._fastest_of(op, key, farther, allowed, None)
        return self._modelled(op, key, allowed, excluded, None)

    def neighbour_pool(self, op: str, key: dict) -> tuple[list[TunedConfig], list]:
        """What the nearest fallback weighs for a key its table has no entry of: the configs
        of the neighbours within MAX_NEIGHBOUR_OCTAVES that can run it (closest first, cuBLAS
        where a neighbour was tuned to it) and the variations of their tiles
        (benchmarks/fallback_pool.py times them)."""
        allowed = self._allowed(op, key, frozenset())
        candidates = self.ops[op].nearest(key, allowed, fallback.MAX_NEIGHBOUR_OCTAVES)
        return candidates, self._variations(op, key, candidates, allowed)

    def _allowed(self, op: str, key: dict, excluded: frozenset[str]
                 ) -> Callable[[Mapping], bool]:
        """Whether a config may answer the key: not of an excluded variant, and runnable on it
        (runnability, loaded once per op; each config judged once per key)."""
        if op not in self.runnability:
            self.runnability[op] = runnability(op)
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
        """The model's choice among the neighbour candidates' tiles and their variations, or
        cuBLAS (a neighbour tuned to it standing for it); the first candidate without the
        model."""
        variations = self._variations(op, key, candidates, allowed)
        cublas = next((config for config in candidates if config["variant"] == CUBLAS), cublas)
        tiles = [config for config in candidates if config["variant"] != CUBLAS]
        if self.fastest is None or (len(tiles) == 1 and not variations and cublas is None):
            return candidates[0]
        return self.fastest(key, tiles, variations, self.ops[op].measured, cublas)

    def _modelled(self, op: str, key: dict, allowed: Callable[[Mapping], bool],
                  excluded: frozenset[str], cublas: TunedConfig | None) -> TunedConfig | None:
        """The model's pick for a key no neighbour answers (fallback.model_picker), or cuBLAS
        where it has none or predicts cuBLAS faster. Only for an op the table has entries of:
        with no tuning of the op at all, nothing says which of its configs to trust."""
        picker_key = (op, excluded)
        if picker_key not in self.model_pickers:
            self.model_pickers[picker_key] = fallback.model_picker(
                op, self.ops[op].configs, self.device_name, excluded)
        pick_for = self.model_pickers[picker_key]
        pick = pick_for(key) if pick_for is not None else None
        if pick is None or not allowed(pick):
            return cublas
        if cublas is None or self.fastest is None:
            return pick
        return self.fastest(key, [pick, cublas], [], {})

    def _variations(self, op: str, key: dict, candidates: list,
                    allowed: Callable[[Mapping], bool]) -> list:
        """The candidates' variations for the key (fallback.variation_maker, loaded on first
        need, once per op)."""
        if op not in self.variation_makers:
            self.variation_makers[op] = fallback.variation_maker(op, self.device_name)
        make = self.variation_makers[op]
        return [] if make is None else make(key, candidates, allowed)

    @cached_property
    def fastest(self) -> Callable[..., TunedConfig] | None:
        """The model's choice among candidates and their variations, loaded on first need
        (None: no model)."""
        return fallback.fastest_predicted(self.device_name)

    def _log_answer(self, op: str, key: dict, config: TunedConfig) -> None:
        answer = config.source if config.bucket is None else (f"{config.source} bucket "
                                                              f"{config.bucket}")
        where = f"from {self.path}" if self.path else f"(no table: set {ENV_VAR})"
        _LOG.info("gemm-tuner: %s M=%s N=%s K=%s %s strides %s,%s -> %s %s", op, key["M"],
                  key["N"], key["K"], key["dtype"], key["stride_am"], key["stride_bk"], answer,
                  where)


_tables: dict[str, TunedTable] = {}
_default_table: TunedTable | None = None


def open_table(path: Path | None) -> TunedTable:
    """The file at `path` loaded, by what it holds: our table (`format: TABLE_FORMAT`), or a
    FlagGems expand file (tuner.runtime.expand: its ops' value lists answer every key); None:
    no file (cuBLAS or the default answers)."""
    if path is None:
        return TunedTable(None)
    doc, text = read_document(path)
    if not is_table_document(doc):
        from tuner.formats.flaggems import is_expand_document
        from tuner.runtime import expand

        if is_expand_document(doc):
            return expand.ExpandTable(path, doc, text)
    return TunedTable(path, doc)


def _load(path: str | os.PathLike) -> TunedTable:
    table = _tables[path] = open_table(Path(path))
    return table


def _load_default() -> TunedTable:
    global _default_table
    name = os.environ.get(ENV_VAR)
    _default_table = open_table(Path(name) if name else None)
    return _default_table


def get_tuned_config(op: str, *, M: int, N: int, K: int, dtype: str, stride_am: int,
                     stride_bk: int, path: str | os.PathLike | None = None) -> TunedConfig:
    """The config for op ("mm" or "gemv") at this key, from the table at `path` (default:
    $TUNE_CONFIG, read on first use): see tuner.runtime's docstring for which source answers.
    The returned mapping is read-only and the same object on every call of the key.

    A memoised key is one dict lookup (benchmarks/lookup_latency.py). A new key costs a
    bucketing and at most a scan of the op's entries; one answered by the model or from its
    neighbours also a few ms of predictions, and the first such key of a process the import
    of torch, Triton and the model if the caller had not (tuner.matmul has).
    """
    if path is None:
        table = _default_table or _load_default()
    else:
        table = _tables.get(path) or _load(path)
    raw = (op, M, N, K, stride_am, stride_bk, dtype)
    config = table.memo.get(raw)
    return config if config is not None else table.lookup(_checked(raw))


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
    return config if config is not None else table.lookup(_checked(raw), excluded)


# The largest size a key may state: Triton's int32 arguments.
MAX_KEY_SIZE = 2**31 - 1


def _checked(raw: tuple) -> tuple:
    """The raw key of a first call, after checking its op, sizes and dtype: ValueError with
    one line naming the argument, its value and what was expected (a memoised key was checked
    on its first call, so a hit costs nothing more)."""
    from tuner.dtypes import DTYPES  # light: no torch

    op = raw[0]
    if op not in DEFAULT_CONFIGS:
        raise ValueError(f"gemm-tuner: op must be one of {', '.join(DEFAULT_CONFIGS)}, "
                         f"got {op!r}")
    for name, value, low in zip(("M", "N", "K", "stride_am", "stride_bk"), raw[1:6],
                                (1, 1, 1, 0, 0)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"gemm-tuner: {op} {name} must be an int, got {value!r} "
                             f"({type(value).__name__})")
        if not low <= value <= MAX_KEY_SIZE:
            raise ValueError(f"gemm-tuner: {op} {name} must be from {low} to 2**31-1, got "
                             f"{value}")
    dtype = raw[6]
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise ValueError(f"gemm-tuner: {op} dtype must be one of {', '.join(DTYPES)}, got "
                         f"{dtype!r}")
    return raw


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
