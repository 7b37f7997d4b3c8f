"""The deployment-side lookup: which config to launch for a GEMM, from an exported table.

`get_tuned_config` loads the table YAML once per path; after that a call is one dict lookup
on the raw key (first sight of a key buckets it and memoises the answer). It imports neither
optuna nor sqlalchemy, so deployments need neither.
"""
from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

import yaml

from tuner.bucketing import KEY_FIELDS, bucket_key

ENV_VAR = "TUNE_CONFIG"
TABLE_FORMAT = "gemm-tuner-table/2"  # /2: configs name their variant and pad

# What a key that was never tuned gets: safe on any CUDA GPU for every dtype (fits shared
# memory on pre-Hopper parts too) and reasonable on large shapes; the variants they name run
# any call of their kernel (the pointer GEMM; gemv for a single row or column).
DEFAULT_CONFIGS: dict[str, Mapping[str, int | str]] = {
    "mm": MappingProxyType({"variant": "general", "pad": 0, "BLOCK_M": 128, "BLOCK_N": 128,
                            "BLOCK_K": 32, "GROUP_M": 8, "num_stages": 3, "num_warps": 8}),
    "gemv": MappingProxyType({"variant": "gemv", "pad": 0, "BLOCK_M": 64, "BLOCK_K": 128,
                              "num_stages": 2, "num_warps": 4}),
}


class TunedTable:
    """One loaded table file: per op, its bucketing strategy and config per bucketed key."""

    def __init__(self, path: Path | None):
        self.path = path
        self.strategies: dict[str, dict] = {}
        self.configs: dict[str, dict[tuple, Mapping[str, int | str]]] = {}
        self.memo: dict[tuple, Mapping[str, int | str]] = {}
        if path is None:
            return
        try:
            doc = yaml.safe_load(path.read_text())
        except OSError as e:
            raise FileNotFoundError(f"gemm-tuner table {path}: {e.strerror}") from None
        if not isinstance(doc, dict) or doc.get("format") != TABLE_FORMAT:
            raise ValueError(f"gemm-tuner table {path}: not a '{TABLE_FORMAT}' file "
                             "(write one with `tune export --format table`)")
        for op, body in (doc.get("ops") or {}).items():
            strategy = body["strategy"]
            self.strategies[op] = strategy
            self.configs[op] = {bucket_key(e["key"], strategy): MappingProxyType(e["config"])
                                for e in body["entries"]}

    def lookup(self, op: str, raw: tuple) -> Mapping[str, int | str]:
        key = dict(zip(KEY_FIELDS, raw[1:]))
        strategy = self.strategies.get(op)
        config = None if strategy is None else self.configs[op].get(bucket_key(key, strategy))
        if config is None:
            config = DEFAULT_CONFIGS[op]
            warnings.warn(f"gemm-tuner: no tuned {op} config for {key} in "
                          f"{self.path or '(no table: set ' + ENV_VAR + ')'}; using default "
                          f"{dict(config)}", RuntimeWarning, stacklevel=3)
        self.memo[raw] = config
        return config


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
                     stride_bk: int,
                     path: str | os.PathLike | None = None) -> Mapping[str, int | str]:
    """The tuned config for op ("mm" or "gemv") at this key, from the table at `path`
    (default: $TUNE_CONFIG, read on first use). A key outside the table gets
    DEFAULT_CONFIGS[op], with one RuntimeWarning per key. The returned mapping is read-only
    and shared between calls.
    """
    if path is None:
        table = _default_table or _load_default()
    else:
        table = _tables.get(path) or _load(path)
    raw = (op, M, N, K, stride_am, stride_bk, dtype)
    config = table.memo.get(raw)
    return config if config is not None else table.lookup(op, raw)


def clear_cache() -> None:
    """Forget loaded tables, e.g. after the file or $TUNE_CONFIG changed."""
    global _default_table
    _tables.clear()
    _default_table = None
