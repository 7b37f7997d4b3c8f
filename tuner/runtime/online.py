"""Tuning once at runtime and remembering it: the online cache of a table or an expand file
(TUNE_ONLINE=1; the `online` step of tuner.runtime.policy, `expand-online` of
tuner.runtime.expand).

The first key of a bucket that no process has tuned is tuned here, in-process, on this
process's GPU (Triton's interpreter where TRITON_INTERPRET=1): the policy names the
candidates, best first (cuBLAS first: it compiles nothing and is the bar every tile must
beat); each is checked against the float64 reference and timed with the tuner's own
machinery while the budget (TUNE_ONLINE_BUDGET_S) lasts, the fastest few re-timed side by
side if time remains, and the winner ranked by the launch mode's figure (TUNE_ONLINE_LAUNCH,
tuner.objective's default: eager) is written to the cache. The budget bounds what the first
call of an unseen bucket costs a server: a candidate is started only while time remains (the
first always; one compile is not cut short), and the best so far wins. The measuring is
reached through tuner.execution.in_process alone, imported on first need: the runtime's one
door into the tuning machinery.

The cache is a table file (tuner.formats.table's format: `tune export table --merge` takes it
in): TUNE_ONLINE_CACHE, else `<stem>.online.yaml` beside the file TUNE_CONFIG names. Its
entries are keyed by the buckets of the strategy the file gives the op. Processes share it
safely:

- each write is read-merge-write of the whole file under an exclusive lock of
  `<cache>.lock` (tuner.filelock), the file replaced atomically (temp file + os.replace): no
  entry of another process is lost, no reader sees half a file;
- the lock is held while a bucket is tuned, and the cache is read again once it is taken: of
  processes starting together on one key, one tunes, the others wait and then read its
  winner (measuring nothing), and no two time on one GPU at once;
- a key already in the cache is answered from it, timing nothing: a second process, or a
  restart, measures nothing again. Entries of another device or of other kernel source are
  not used (and a cache of another device is never written).

A cached winner the caller may not take (an excluded variant, or a config this key's strides
cannot run) passes the key to the policy's next step; it is not tuned again, so the shared
cache keeps the winner of the bucket as measured without exclusions.

`stats()` counts, per process, the configs timed, the buckets tuned and the answers the cache
gave; TUNE_LOG=1 logs each tuning and each cache answer.
"""
from __future__ import annotations

import logging
import math
import os
import time
import warnings
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from pathlib import Path

from tuner.bucketing.strategies import KEY_FIELDS, bucket_key
from tuner.filelock import locked_beside
from tuner.formats.device import device_block
from tuner.formats.files import OutputError, check_writable, write_atomic
from tuner.formats.table import (
    checked_document,
    document_device,
    merge_entry,
    read_document,
    table_document,
    table_entry,
)
from tuner.runtime.runnable import shape_of
from tuner.textfiles import quoted

CACHE_ENV_VAR = "TUNE_ONLINE_CACHE"
TOP_K_ENV_VAR = "TUNE_ONLINE_TOP_K"
BUDGET_ENV_VAR = "TUNE_ONLINE_BUDGET_S"
LAUNCH_ENV_VAR = "TUNE_ONLINE_LAUNCH"
# How many of the model's best candidates a bucket times at most (TUNE_ONLINE_TOP_K).
DEFAULT_TOP_K = 16
# Seconds a bucket's tuning may start candidates for (TUNE_ONLINE_BUDGET_S): what a server's
# first call of an unseen bucket may cost, once. benchmarks/online_budget.py measures what
# budgets buy against a full tune.
DEFAULT_BUDGET_S = 5.0
SEED = 0

_LOG = logging.getLogger("tuner.runtime")
_STATS = {"configs_timed": 0, "buckets_tuned": 0, "cache_answers": 0}


def stats() -> dict[str, int]:
    """This process's counts so far: `configs_timed` (candidate configs checked and timed),
    `buckets_tuned` (buckets whose winner this process measured and wrote), `cache_answers`
    (buckets answered from the cache, timing nothing)."""
    return dict(_STATS)


def reset_stats() -> None:
    for name in _STATS:
        _STATS[name] = 0


def cache_path(source_path: str | os.PathLike) -> Path:
    """Where the online cache of a table or expand file lies: $TUNE_ONLINE_CACHE, else beside
    it."""
    named = os.environ.get(CACHE_ENV_VAR)
    if named:
        return Path(named)
    source_path = Path(source_path)
    return source_path.with_name(f"{source_path.stem}.online.yaml")


def read_cache(path: str | os.PathLike) -> dict | None:
    """The cache's table document, None where there is no file yet; TableError (a
    ValueError) where the file is not a table the runtime can read."""
    try:
        doc = read_document(Path(path))[0]
    except FileNotFoundError:
        return None
    checked_document(doc, f"gemm-tuner online cache {path}")
    return doc


def remember(path: str | os.PathLike, device: Mapping, launch: str, op: str,
             strategy: Mapping[str, str], kernel_source_hash: str, entry: dict) -> None:
    """Add an entry to the cache at `path`: read, merge and write under the lock."""
    with locked_beside(path):
        _write_merged(Path(path), device, launch, op, strategy, kernel_source_hash, entry)


def _write_merged(path: Path, device: Mapping, launch: str, op: str,
                  strategy: Mapping[str, str], kernel_source_hash: str, entry: dict) -> None:
    """The read-merge-write itself; the caller holds the lock."""
    doc = read_cache(path) or table_document(dict(device), {}, launch)
    write_atomic(path, merge_entry(doc, op, strategy, kernel_source_hash, entry))


class OnlineCache:
    """One process's view of an online cache file, and the tuning that fills it; `log`: log
    each tuning and cache answer (the source's TUNE_LOG)."""

    def __init__(self, path: Path, log: bool = False):
        self.path, self.log = path, log
        self._stamp: tuple | None = None
        self._doc: dict | None = None
        self._backend = None
        self._hashes: dict[str, str] | None = None
        self._refused_device = False

    @classmethod
    def beside(cls, source_path: str | os.PathLike, log: bool = False) -> OnlineCache:
        """The cache of a table or expand file; OutputError now where it could not be written
        (a missing or read-only folder, a FIFO): at load, not at the first bucket's timing."""
        path = cache_path(source_path)
        try:
            check_writable(path)
        except OutputError as e:
            raise OutputError(f"gemm-tuner online cache (${CACHE_ENV_VAR}, else beside the "
                              f"table or expand file): {e}") from None
        return cls(path, log)

    # -- the environment ------------------------------------------------------------------
    @property
    def backend(self):
        """Where candidates run (tuner.execution.in_process.this_process), found on first
        need."""
        if self._backend is None:
            from tuner.execution import in_process

            self._backend = in_process.this_process()
        return self._backend

    def smem_limit(self) -> int:
        return self.backend.info.smem_per_block

    def device_name(self) -> str:
        return self.backend.info.name

    def source_hash(self, op: str) -> str:
        if self._hashes is None:
            from tuner.kernels import source_hashes

            self._hashes = source_hashes()
        return self._hashes[op]

    @staticmethod
    def launch() -> str:
        from tuner.objective import DEFAULT_LAUNCH, LAUNCH_MODES

        launch = os.environ.get(LAUNCH_ENV_VAR) or DEFAULT_LAUNCH
        if launch not in LAUNCH_MODES:
            raise ValueError(f"{LAUNCH_ENV_VAR}={quoted(launch)}: expected one of "
                             f"{', '.join(LAUNCH_MODES)}")
        return launch

    @staticmethod
    def top_k() -> int:
        text = os.environ.get(TOP_K_ENV_VAR) or str(DEFAULT_TOP_K)
        if not (text.strip().isascii() and text.strip().isdigit() and int(text) >= 1):
            raise ValueError(f"{TOP_K_ENV_VAR}={quoted(text)}: expected a positive integer (the "
                             f"most candidates a bucket times; default {DEFAULT_TOP_K})")
        return int(text)

    @staticmethod
    def budget_s() -> float:
        text = os.environ.get(BUDGET_ENV_VAR) or str(DEFAULT_BUDGET_S)
        try:
            budget = float(text)
        except ValueError:
            budget = math.nan
        if not (math.isfinite(budget) and budget > 0):
            raise ValueError(f"{BUDGET_ENV_VAR}={quoted(text)}: expected a positive number of "
                             f"seconds (how long a bucket's online tuning may start "
                             f"candidates; default {DEFAULT_BUDGET_S:g})")
        return budget

    # -- reading --------------------------------------------------------------------------
    def _refresh(self) -> None:
        """Re-read the file where it changed since last read (another process wrote)."""
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            stamp = None
        if stamp != self._stamp:
            self._doc = read_cache(self.path) if stamp is not None else None
            self._stamp = stamp

    def _usable(self) -> bool:
        """Whether the file's entries were measured on this device (a new file is)."""
        if self._doc is None:
            return True
        name = document_device(self._doc).get("name")
        if name is None or name == self.device_name():
            return True
        if not self._refused_device:
            self._refused_device = True
            warnings.warn(f"gemm-tuner: online cache {self.path} holds {name}'s configs, not "
                          f"{self.device_name()}'s: neither read nor written (set "
                          f"{CACHE_ENV_VAR} per device)", RuntimeWarning, stacklevel=5)
        return False

    def lookup(self, op: str, key: Mapping, strategy: Mapping[str, str]) -> dict | None:
        """The cached config of the key's bucket (under `strategy`), or None."""
        self._refresh()
        hit = self._cached(op, key, strategy)
        if hit is not None:
            _STATS["cache_answers"] += 1
            if self.log:
                _LOG.info("gemm-tuner: online: %s %s answered from %s, nothing timed", op,
                          _label(key), self.path)
        return hit

    def _cached(self, op: str, key: Mapping, strategy: Mapping[str, str]) -> dict | None:
        if self._doc is None or not self._usable():
            return None
        body = (self._doc.get("ops") or {}).get(op)
        if body is None or body.get("kernel_source_hash") != self.source_hash(op):
            return None
        bucket = bucket_key(key, strategy)
        for entry in body.get("entries") or ():
            if bucket_key(entry["key"], strategy) == bucket:
                return dict(entry["config"])
        return None

    # -- tuning ---------------------------------------------------------------------------
    def answer(self, op: str, key: Mapping, strategy: Mapping[str, str],
               candidates: Callable[[], list[Mapping]], allowed: Callable[[Mapping], bool]
               ) -> dict | None:
        """The winner of the key's bucket (under `strategy`): the cache's, else the fastest
        correct of `candidates()` (asked only then; best first) timed within the budget and
        written to the cache. None where the winner may not answer the key (`allowed`), or
        there is nothing to time, or nothing ran correctly."""
        won = self.lookup(op, key, strategy) or self._tune(op, key, strategy, candidates)
        return won if won is not None and allowed(won) else None

    def _tune(self, op: str, key: Mapping, strategy: Mapping[str, str],
              candidates: Callable[[], list[Mapping]]) -> dict | None:
        """Under the lock: the cache's winner where another process wrote it while this one
        waited; else the winner of timing the candidates, written to the cache. A bad
        setting, or nothing to time them on (no GPU), is said before a lock file is made."""
        budget_s, launch, backend = self.budget_s(), self.launch(), self.backend
        with locked_beside(self.path):
            hit = self.lookup(op, key, strategy)
            if hit is not None:
                return hit
            configs = [dict(config) for config in candidates()]
            if not configs:
                return None
            start = time.perf_counter()
            deadline = start + budget_s
            from tuner.execution import in_process

            won = in_process.fastest(backend, op, shape_of(key), configs, launch, SEED,
                                     deadline)
            _STATS["configs_timed"] += won.timed
            if won.config is None:
                warnings.warn(f"gemm-tuner: online: no candidate of {op} {_label(key)} ran "
                              "correctly; not cached", RuntimeWarning, stacklevel=5)
                return None
            bucket = bucket_key(key, strategy)
            entry = table_entry(dict(zip(KEY_FIELDS, bucket)), won.config, {
                "source": "online", "tuned_shape": str(shape_of(key)), "ms": float(won.ms),
                "launch": launch, "configs_timed": won.timed,
                "tuned_at": datetime.now(timezone.utc).isoformat(timespec="seconds")})
            _STATS["buckets_tuned"] += 1
            if self._usable():
                _write_merged(self.path, device_block(backend.info), launch, op,
                              strategy, self.source_hash(op), entry)
                self._refresh()
            if self.log:
                _LOG.info("gemm-tuner: online: %s %s timed %d of %d configs in %.1f s -> %s "
                          "(%.4g ms); wrote %s", op, _label(key), won.timed, len(configs),
                          time.perf_counter() - start, won.config, won.ms, self.path)
            return won.config


def _label(key: Mapping) -> str:
    return (f"M={key['M']} N={key['N']} K={key['K']} {key['dtype']} strides "
            f"{key['stride_am']},{key['stride_bk']}")
