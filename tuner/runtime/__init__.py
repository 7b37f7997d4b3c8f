"""The deployment side: which config to launch for a GEMM, from an exported table.

`get_tuned_config` answers a key (op, M, N, K, dtype, row strides) from the file loaded for
its path, a table source (tuner.runtime.source states what every answer promises). Our table
answers a new key by the first step of its fallback policy that has an answer: `table` (the
key's bucket), `online` (with TUNE_ONLINE=1: timed once on this GPU, remembered in a cache
that processes share), `nearest` (tuned neighbours' configs, the model choosing), `model`
(the model's pick for a dtype without entries), `cublas`, `default`; the answer's `.source`
names the step (tuner.runtime.policy lists them in full). A config measured fast at a
neighbouring size is a far better guess than a generic one, and cuBLAS a better one than a
tile nothing vouches for.

A key answered by the default, or by cuBLAS for want of any entry of its op and dtype, gets
one RuntimeWarning; with TUNE_LOG=1 each key's answer is logged once to the "tuner.runtime"
logger. `get_tuned_config_without` answers as if some variants did not exist.

A FlagGems expand file (told from a table by its content) answers instead: each bucketed key
gets one config of its op's product of value lists, the model's pick (`expand-model`) or,
with TUNE_ONLINE=1, the winner of timing the candidates once, remembered in a cache table
that processes share (`expand-online`; tuner.runtime.expand and tuner.runtime.online).

The files' formats are tuner.formats' (`table`, `flaggems`). The modules: `source` (the
contract of a loaded file), `lookup` (loading, the memo, our table), `policy` (the fallback's
steps, in order), `fallback` (its model-driven parts), `expand` (expand files), `online` (the
online cache of either), `runnable` (whether a config can run a key), `answer` (TunedConfig
and the fixed answers), `dispatch` (tuner.matmul/linear; imported only on use, it needs torch
and Triton). Deployments need neither optuna nor sqlalchemy: the package imports none of the
tuning side (tuner.execution, tuner.search, tuner.export, tuner.db) but online tuning's one
door, tuner.execution.in_process, opened on first need (tests/test_architecture.py). Fallback
constants are read from tuner.runtime.fallback: set them there.
"""
from tuner.formats.table import TABLE_FORMAT, Measurement
from tuner.runtime.answer import CUBLAS, CUBLAS_CONFIG, DEFAULT_CONFIGS, TunedConfig
from tuner.runtime.fallback import (
    MAX_NEIGHBOUR_OCTAVES,
    MIN_BLOCK,
    NEAREST_BUCKETS,
    VARIATION_MARGIN,
)
from tuner.runtime.lookup import (
    ENV_VAR,
    OpTable,
    TunedTable,
    clear_cache,
    get_tuned_config,
    get_tuned_config_without,
)
from tuner.runtime.source import LOG_ENV_VAR, TableSource

__all__ = [
    "CUBLAS", "CUBLAS_CONFIG", "DEFAULT_CONFIGS", "ENV_VAR", "LOG_ENV_VAR",
    "MAX_NEIGHBOUR_OCTAVES", "MIN_BLOCK", "NEAREST_BUCKETS", "TABLE_FORMAT",
    "VARIATION_MARGIN", "Measurement", "OpTable", "TableSource", "TunedConfig", "TunedTable",
    "clear_cache",
    "get_tuned_config", "get_tuned_config_without",
]
