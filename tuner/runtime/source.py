"""What a loaded file promises the lookup: the base of every table source.

`get_tuned_config` loads the file at a path once (tuner.runtime.lookup.open_table: our table
as a TunedTable, a FlagGems expand file as an ExpandTable) and from then on asks it only
through this interface. The sources differ in how they answer a new key (their policy: an
ordered list of named steps); the promises below, the memo, the warning and the log line are
kept here, once.
"""
from __future__ import annotations

import logging
import os
import sys
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from pathlib import Path

from tuner.bucketing.strategies import KEY_FIELDS
from tuner.runtime.answer import TunedConfig
from tuner.runtime.runnable import runnability

LOG_ENV_VAR = "TUNE_LOG"
ONLINE_ENV_VAR = "TUNE_ONLINE"

_LOG = logging.getLogger("tuner.runtime")


def _show_log_lines() -> None:
    """Make TUNE_LOG's INFO lines visible where logging was never configured: one stderr
    handler on our logger, attached only when no handler would receive them otherwise."""
    if not _LOG.hasHandlers():
        _LOG.addHandler(logging.StreamHandler(sys.stderr))
        if _LOG.level == logging.NOTSET:
            _LOG.setLevel(logging.INFO)


class TableSource(ABC):
    """A loaded file that answers keys, whatever its format.

    What `lookup` promises for a key (op, KEY_FIELDS' values; checked by get_tuned_config):

    - an answer, always: a read-only TunedConfig whose `.source` names the step of the
      source's policy that gave it; DEFAULT_CONFIGS[op] where no other step can;
    - a config the op's kernel can run on the key (its own verdict on the key's GEMM as meta
      tensors, `runnable`), except a table's exact entry, which the dispatcher checks per call;
      none of an excluded variant but the default;
    - the first answer of a raw key memoised in `memo` under that key, and the same object on
      every later call: get_tuned_config reads `memo` itself, so a repeated key costs one dict
      lookup and nothing here runs;
    - one RuntimeWarning per key answered for want of a tuned config (`shortfall`), pointing
      at the caller of get_tuned_config;
    - with TUNE_LOG=1, one line per key on the "tuner.runtime" logger.

    A file is checked whole as it loads (our table's entries against the installed kernels,
    tuner.formats.table.read_table; an expand file's lists by the same rules,
    tuner.formats.flaggems.read_op): a bad entry is one error then, not one at its key's
    first call. The model loads on the first key that needs it.
    """

    def __init__(self, path: Path | None, device_name: str | None):
        self.path = path
        # The device the file was tuned for (the model predicts for it), or None.
        self.device_name = device_name
        # Per raw key (and, from get_tuned_config_without, the variants left out): the answer.
        self.memo: dict[tuple, TunedConfig] = {}
        # Per op, once a key needed it: its runnability (None: no kernels, all runnable).
        self._runnability: dict[str, Callable[[Mapping], Callable[[Mapping], bool]] | None] = {}
        self.log = os.environ.get(LOG_ENV_VAR) == "1"
        if self.log:
            _show_log_lines()
        # With TUNE_ONLINE=1, the cache the policy's online step tunes unseen buckets into and
        # answers them from (tuner.runtime.online), one per file whatever its format; else None.
        self.online = None
        if path is not None and os.environ.get(ONLINE_ENV_VAR) == "1":
            from tuner.runtime.online import OnlineCache

            self.online = OnlineCache.beside(path, self.log)

    def lookup(self, raw: tuple, excluded: frozenset[str] = frozenset()) -> TunedConfig:
        """Answer a raw key seen for the first time (the op, then KEY_FIELDS' values, then
        anything else the memo tells apart), leaving out configs of the excluded variants, and
        memoise the answer under `raw`."""
        op, key = raw[0], dict(zip(KEY_FIELDS, raw[1:1 + len(KEY_FIELDS)]))
        config = self.answer(op, key, excluded)
        why = self.shortfall(op, key, config)
        if why is not None:
            warnings.warn(f"{why}; using {config.source} {dict(config)}", RuntimeWarning,
                          stacklevel=3)
        self.memo[raw] = config
        if self.log:
            self._log_answer(op, key, config)
        return config

    @abstractmethod
    def answer(self, op: str, key: dict, excluded: frozenset[str]) -> TunedConfig:
        """The key's answer by the source's policy (never None: the last step is the
        default)."""

    @abstractmethod
    def shortfall(self, op: str, key: dict, config: TunedConfig) -> str | None:
        """Why `config` answers the key for want of a tuned one (the warning's first words),
        or None where it is what the file meant."""

    def runnable(self, op: str, key: Mapping) -> Callable[[Mapping], bool]:
        """Whether the op's kernel can run a config on the key (tuner.runtime.runnable,
        loaded once per op; every config where the kernels cannot be imported)."""
        if op not in self._runnability:
            self._runnability[op] = runnability(op)
        on = self._runnability[op]
        return on(key) if on is not None else (lambda config: True)

    def where(self) -> str:
        """Where answers come from, as the log line says it."""
        return f"from {self.path}"

    def _log_answer(self, op: str, key: dict, config: TunedConfig) -> None:
        answer = config.source if config.bucket is None else (f"{config.source} bucket "
                                                              f"{config.bucket}")
        _LOG.info("gemm-tuner: %s M=%s N=%s K=%s %s strides %s,%s -> %s %s", op, key["M"],
                  key["N"], key["K"], key["dtype"], key["stride_am"], key["stride_bk"], answer,
                  self.where())
