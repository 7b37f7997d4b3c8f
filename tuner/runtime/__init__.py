"""The deployment side: which config to launch for a GEMM, from an exported table.

`get_tuned_config` answers a key (op, M, N, K, dtype, row strides) by the first of:

- `table`: the entry of its bucket (bucket_key under the op's strategy, as the export keyed
  them), as it is: the dispatcher checks that it can run the call;
- `nearest`: among the configs that can run the key, of the NEAREST_BUCKETS tuned buckets of
  the same op and dtype closest in log2 of M, N and K (no farther than
  MAX_NEIGHBOUR_OCTAVES) and their entries' alternates: where the closest of them was tuned
  to cuBLAS, cuBLAS (as that neighbour's answer); else the tile the analytical model
  predicts fastest, its rating calibrated by what each neighbour measured, or a variation
  of one that suits the key better, where predicted VARIATION_MARGIN faster, or cuBLAS where
  predicted VARIATION_MARGIN faster than both (tuner.runtime.fallback). A tile twice the
  key's M or N (past MIN_BLOCK) does not answer. A config measured fast at a neighbouring
  size is a far better guess than a generic one;
- `cublas`: torch's own GEMM (CUBLAS_CONFIG) where no tuned config is to be trusted: no
  runnable neighbour is near enough, no neighbour's tile fits the key, or the table has no
  entry of the op (or of the dtype, and the model has no better pick);
- `nearest` from farther neighbours, where cuBLAS cannot run the key (fp8 in another layout
  than torch._scaled_mm's);
- `model`: for a dtype the op has no entry of, the model's pick among the values the op's
  tuned configs use;
- `default`: DEFAULT_CONFIGS[op], where nothing above can run the key.

A key answered by the default, or by cuBLAS for want of any entry of its op and dtype, gets
one RuntimeWarning; with TUNE_LOG=1 each key's answer is logged once to the "tuner.runtime"
logger. `get_tuned_config_without` answers as if some variants did not exist.

A FlagGems expand file (told from a table by its content) answers instead: each bucketed key
gets one config of its op's product of value lists, the model's pick (`expand-model`) or,
with TUNE_ONLINE=1, the winner of timing the candidates once, remembered in a cache table
that processes share (`expand-online`; tuner.runtime.expand and tuner.runtime.online).

The files' formats are tuner.formats' (`table`, `flaggems`). The modules: `lookup` (loading,
the memo, the order above), `expand` and `online` (expand files and their online cache),
`fallback` (its model-driven parts), `runnable` (whether a config can run a key), `answer`
(TunedConfig and the fixed answers), `dispatch` (tuner.matmul/linear; imported only on use, it
needs torch and Triton). Deployments need neither optuna nor sqlalchemy: the package never
imports tuner.export or tuner.db (tests/test_architecture.py). Fallback
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
    LOG_ENV_VAR,
    OpTable,
    TunedTable,
    clear_cache,
    get_tuned_config,
    get_tuned_config_without,
)

__all__ = [
    "CUBLAS", "CUBLAS_CONFIG", "DEFAULT_CONFIGS", "ENV_VAR", "LOG_ENV_VAR",
    "MAX_NEIGHBOUR_OCTAVES", "MIN_BLOCK", "NEAREST_BUCKETS", "TABLE_FORMAT",
    "VARIATION_MARGIN", "Measurement", "OpTable", "TunedConfig", "TunedTable", "clear_cache",
    "get_tuned_config", "get_tuned_config_without",
]
