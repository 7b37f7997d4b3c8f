"""Loading tables and answering keys: `get_tuned_config` and its memo.

A file is loaded once per path, as a table source (tuner.runtime.source); after that a call is
one dict lookup on the raw key (the first sight of a key answers it, `TableSource.lookup`, and
memoises the answer), since the dispatcher asks on every new call signature and host time
decides decode shapes (benchmarks/lookup_latency.py measures a hit). Our table answers a new
key by the fallback policy (tuner.runtime.policy); tuner.runtime.fallback supplies the parts
that need the model or the kernels, each loaded on first need.
"""
from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping
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
from tuner.runtime.answer import CUBLAS_CONFIG, DEFAULT_CONFIGS, TunedConfig
from tuner.runtime.exclude import checked_variant_names
from tuner.runtime.policy import TABLE_POLICY, Question
from tuner.runtime.runnable import installed_variants
from tuner.runtime.source import TableSource
from tuner.shapes import Shape
from tuner.textfiles import quoted

ENV_VAR = "TUNE_CONFIG"

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
        # Per bucket: its entry's alternates, the runners-up measured on the bucket itself.
        self.alternates: dict[tuple, tuple[TunedConfig, ...]] = {}
        # Per bucket whose entry says what it measured: what calibrates the model near it.
        self.measured: dict[tuple, Measurement] = {}
        # Per dtype, in file order: (log sizes, the entry's config and its alternates, each
        # answering as "nearest").
        self.neighbours: dict[str, list[fallback.Neighbour]] = {}
        for entry in body["entries"]:
            bucket = bucket_key(entry["key"], self.strategy)
            self.by_bucket[bucket] = TunedConfig(entry["config"], "table", bucket)
            self.alternates[bucket] = tuple(TunedConfig(config, "table", bucket)
                                            for config in entry.get("alternates", ()))
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

    def exact_alternates(self, key: Mapping[str, object]) -> tuple[TunedConfig, ...]:
        """The alternates of the key's bucket, in the entry's order (none without an entry)."""
        return self.alternates.get(bucket_key(key, self.strategy), ())

    def has_dtype(self, dtype: str) -> bool:
        """Whether the op has an entry of this dtype (else only the model's pick answers)."""
        return bool(self.neighbours.get(dtype))

    def tuned_sizes(self, bucket: tuple) -> tuple[int, int, int]:
        """M, N and K of the shape the bucket's entry was tuned on (the bucket's own where the
        entry does not say)."""
        measurement = self.measured.get(bucket)
        if measurement is None:
            return tuple(bucket[i] for i in _SIZE_FIELDS)
        shape = Shape.from_label(measurement.tuned_shape)
        return shape.M, shape.N, shape.K

    def nearest(self, key: Mapping[str, object], allowed: Callable[[Mapping], bool],
                max_octaves: float = math.inf) -> list[TunedConfig]:
        """fallback.nearest among the entries of the key's dtype, in file order."""
        bucket = bucket_key(key, self.strategy)
        return fallback.nearest(fallback.log_sizes(bucket, _SIZE_FIELDS),
                                self.neighbours.get(bucket[_DTYPE_FIELD], ()), allowed,
                                max_octaves)


class TunedTable(TableSource):
    """Our table file (or none: every key gets cuBLAS or its default), answering new keys by
    the fallback policy (tuner.runtime.policy.TABLE_POLICY)."""

    policy = TABLE_POLICY

    def __init__(self, path: Path | None, doc: object = None):
        table = read_table(path, doc, installed_variants()) if path is not None else None
        super().__init__(path, table.device_name if table is not None else None)
        self.ops: dict[str, OpTable] = {}
        self.parts = fallback.ModelParts(self.device_name)
        if table is None:
            return
        try:
            self.ops = {op: OpTable(body) for op, body in table.ops.items()}
        except BucketingError as e:  # e.g. a user strategy whose module this process lacks
            raise BucketingError(f"gemm-tuner table {path}: {e}") from None
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
            raise TableError(f"gemm-tuner table {path}: an entry the runtime cannot read "
                             f"({type(e).__name__}: {' '.join(str(e).split())})") from None

    def answer(self, op: str, key: dict, excluded: frozenset[str]) -> TunedConfig:
        return self.policy.answer(Question(self, op, key, excluded))

    def shortfall(self, op: str, key: dict, config: TunedConfig) -> str | None:
        """The default, or cuBLAS for want of any entry of the op and dtype."""
        if config.source == "default" or (config is CUBLAS_CONFIG
                                          and not self._has_entries(op, key["dtype"])):
            return (f"gemm-tuner: no tuned {op} config for {key} in "
                    f"{self.path or '(no table: set ' + ENV_VAR + ')'}")
        return None

    def where(self) -> str:
        return super().where() if self.path else f"(no table: set {ENV_VAR})"

    def _has_entries(self, op: str, dtype: str) -> bool:
        return op in self.ops and self.ops[op].has_dtype(dtype)

    def neighbour_pool(self, op: str, key: dict) -> tuple[list[TunedConfig], list]:
        """What the nearest step weighs for a key its table has no entry of: the configs of
        the neighbours within MAX_NEIGHBOUR_OCTAVES that can run it (closest first, cuBLAS
        where a neighbour was tuned to it) and the variations of their tiles
        (benchmarks/fallback_pool.py times them)."""
        question = Question(self, op, key, frozenset())
        candidates = self.ops[op].nearest(key, question.allowed, fallback.MAX_NEIGHBOUR_OCTAVES)
        return candidates, self.parts.variations(op, key, candidates, question.allowed)


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
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"gemm-tuner: path must be a table file's path (str or os.PathLike) "
                        f"or None, got {quoted(path)} ({type(path).__name__})")
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
        try:
            table = _tables.get(path)
        except TypeError:  # unhashable: no path; _load says so
            table = None
        table = table or _load(path)
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
    table = table_at(path)
    if isinstance(variants, str) or not isinstance(variants, Iterable):
        raise TypeError(f"gemm-tuner: get_tuned_config_without's variants must be a collection "
                        f"of variant names, e.g. ('cublas',), got {quoted(variants)}")
    excluded = frozenset(variants)
    raw = (op, M, N, K, stride_am, stride_bk, dtype, excluded)
    config = table.memo.get(raw)
    if config is not None:
        return config
    checked_variant_names(excluded, "get_tuned_config_without")
    return table.lookup(_checked(raw), excluded)


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


def table_at(path: str | os.PathLike | None) -> TunedTable:
    """The loaded table at `path` (None: $TUNE_CONFIG's), as get_tuned_config finds it (which
    inlines this: a call costs more than its memoised lookup)."""
    if path is None:
        return _default_table or _load_default()
    try:
        table = _tables.get(path)
    except TypeError:  # unhashable: no path; _load says so
        table = None
    return table or _load(path)


def clear_cache() -> None:
    """Forget loaded tables and their answers, e.g. after the file, $TUNE_CONFIG or $TUNE_LOG
    changed."""
    global _default_table
    _tables.clear()
    _default_table = None
