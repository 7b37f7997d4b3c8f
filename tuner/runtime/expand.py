"""Answering keys from a FlagGems expand file (tuner.formats.flaggems; `tune export expand`)
instead of our table: every bucketed key gets one config of its op's Cartesian product of
value lists.

An expand file holds, per FlagGems op, a list whose first element has the value lists and a
`param_map` (META: kernel parameter -> list name; `num_stages`, `num_warps` -> theirs) and
whose second holds the op's bucketing `strategy` (a field it lacks takes FlagGems' default:
align32, dtype exact). Its ops map to ours:

- `mm_general_tma` (FlagGems 5.x), else `matmul` (the reference Hopper mm.py): the mm kernel,
  as the `tma` variant where the kernel's own check (Kernel.unsupported on the key's meta
  GEMM, as the table fallback asks) lets TMA read the key's operands, else `general`;
- `mm_splitk`, where present: more mm candidates, of the `splitk` variant;
- `gemv`: the gemv kernel.

A parameter the lists lack takes the op's default config's value (GROUP_M 8); pad is 0.
Which config of the product answers a bucket, decided on the first key seen in it:

- by default the analytical model's pick (tuner.model.predict.fastest_of) among the configs
  that fit the key, for the device the file's header comment names (`# device: NAME`), else
  the visible GPU, else an H100 (tuner.model.named_devices); no GPU work. Source
  "expand-model";
- with TUNE_ONLINE=1, the winner of timing the product's candidates (the model's top
  TUNE_ONLINE_TOP_K where it is larger) and cuBLAS on this process's GPU, remembered in a
  table-format cache shared by processes (tuner.runtime.online). Source "expand-online".

A later key of the bucket gets the same config where it can run it, else its own pick. An op
the file lacks answers cuBLAS (warned), as a table without the op does.
"""
from __future__ import annotations

import itertools
import logging
import os
import sys
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path

from tuner.bucketing.strategies import KEY_FIELDS, BucketingError, bucket_key
from tuner.formats.device import header_device
from tuner.formats.flaggems import (
    GEMV_OP,
    MM_OP,
    REFERENCE_MATMUL,
    SPLITK_OP,
    op_bodies,
    read_op,
)
from tuner.runtime.answer import CUBLAS_CONFIG, DEFAULT_CONFIGS, TunedConfig
from tuner.runtime.runnable import runnability, shape_of

ONLINE_ENV_VAR = "TUNE_ONLINE"
LOG_ENV_VAR = "TUNE_LOG"  # lookup.LOG_ENV_VAR (not imported: lookup imports this module)
MODEL, ONLINE = "expand-model", "expand-online"

# Per our op: the FlagGems ops whose products answer it, each with the variants its configs
# run as (the first that can run the key). The first op present gives the bucketing.
SOURCES: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "mm": ((MM_OP, ("tma", "general")), (REFERENCE_MATMUL, ("tma", "general")),
           (SPLITK_OP, ("splitk",))),
    "gemv": ((GEMV_OP, ("gemv",)),),
}

_LOG = logging.getLogger("tuner.runtime")


class ExpandOp:
    """One FlagGems op of the file: its value lists under our parameter names, and its
    bucketing strategy (every KEY_FIELDS field)."""

    def __init__(self, name: str, body: list):
        lists = read_op(name, body)
        self.name = name
        self.values: dict[str, list] = dict(lists.lists)
        self.strategy: dict[str, str] = dict(lists.strategy)

    def product(self, variant: str, params: tuple[str, ...], defaults: Mapping) -> list[dict]:
        """The configs of the product of the lists for a variant with these parameters (a
        parameter without a list takes `defaults`' value); none where one has neither."""
        lists = []
        for param in params:
            if param in self.values:
                lists.append(self.values[param])
            elif param in defaults:
                lists.append([defaults[param]])
            else:
                return []
        return [{"variant": variant, "pad": 0, **dict(zip(params, combo))}
                for combo in itertools.product(*lists)]

    def size(self) -> int:
        """How many configs the consumer enumerates (the product of every list)."""
        count = 1
        for values in self.values.values():
            count *= len(values)
        return count


class ExpandTable:
    """A loaded expand file answering keys (lookup.get_tuned_config finds it as it finds a
    TunedTable: `memo` and `lookup`)."""

    def __init__(self, path: Path, doc: Mapping, text: str = ""):
        self.path = path
        self.device_name = header_device(text)
        self.memo: dict[tuple, TunedConfig] = {}
        # Per (op, bucket, excluded variants): the answer of the bucket's first key.
        self.by_bucket: dict[tuple, TunedConfig] = {}
        self.log = os.environ.get(LOG_ENV_VAR) == "1"
        if self.log and not _LOG.hasHandlers():
            _LOG.addHandler(logging.StreamHandler(sys.stderr))
            if _LOG.level == logging.NOTSET:
                _LOG.setLevel(logging.INFO)
        self.expand_ops: dict[str, ExpandOp] = {}
        for name, body in op_bodies(doc).items():
            try:
                self.expand_ops[name] = ExpandOp(name, body)
            except (ValueError, TypeError, AttributeError) as e:
                raise ValueError(f"gemm-tuner expand file {path}: {e}") from None
        # Per our op: [(expand op, its variants)], the first giving the strategy.
        self.sources: dict[str, list[tuple[ExpandOp, tuple[str, ...]]]] = {}
        for op, sources in SOURCES.items():
            present = [(self.expand_ops[name], variants) for name, variants in sources
                       if name in self.expand_ops]
            if op == "mm":  # mm_general_tma and matmul are one path for two consumers
                general = [s for s in present if s[0].name != SPLITK_OP][:1]
                present = general + [s for s in present if s[0].name == SPLITK_OP]
            if present:
                self.sources[op] = present
        try:
            for sources in self.sources.values():
                bucket_key(dict.fromkeys(KEY_FIELDS, 1) | {"dtype": "bf16"},
                           sources[0][0].strategy)
        except BucketingError as e:
            raise BucketingError(f"gemm-tuner expand file {path}: {e}") from None
        self.online = None
        if os.environ.get(ONLINE_ENV_VAR) == "1":
            from tuner.runtime.online import OnlineCache

            self.online = OnlineCache.beside(path)
        self._runnability: dict[str, Callable | None] = {}
        self._spec = None

    def strategy(self, op: str) -> dict[str, str] | None:
        """The strategy buckets of the op are keyed by (its first source's), or None."""
        sources = self.sources.get(op)
        return None if not sources else sources[0][0].strategy

    def lookup(self, raw: tuple, excluded: frozenset[str] = frozenset()) -> TunedConfig:
        """Answer a raw key seen for the first time (as TunedTable.lookup) and memoise it."""
        op, key = raw[0], dict(zip(KEY_FIELDS, raw[1:1 + len(KEY_FIELDS)]))
        config = self._answer(op, key, excluded)
        if config.source in ("default", "cublas"):
            warnings.warn(f"gemm-tuner: no {op} config of {self.path} can run {key}; using "
                          f"{config.source} {dict(config)}", RuntimeWarning, stacklevel=3)
        self.memo[raw] = config
        if self.log:
            _LOG.info("gemm-tuner: %s M=%s N=%s K=%s %s strides %s,%s -> %s bucket %s from "
                      "%s", op, key["M"], key["N"], key["K"], key["dtype"], key["stride_am"],
                      key["stride_bk"], config.source, config.bucket, self.path)
        return config

    def _answer(self, op: str, key: dict, excluded: frozenset[str]) -> TunedConfig:
        strategy = self.strategy(op)
        runnable = self._runnable(op, key)
        if strategy is None:
            return self._last_resort(op, runnable, excluded)
        bucket = bucket_key(key, strategy)
        known = self.by_bucket.get((op, bucket, excluded))
        if known is not None and runnable(known):
            return known
        answer = None
        if self.online is not None:
            hit = self.online.lookup(op, key, strategy)
            if hit is not None and hit["variant"] not in excluded and runnable(hit):
                answer = TunedConfig(hit, ONLINE, bucket)
        if answer is None:
            candidates = self.candidates(op, key, excluded)
            if not candidates:
                return self._last_resort(op, runnable, excluded)
            if self.online is not None:
                # cuBLAS is timed beside the product, as in every study (kernels/cublas.py):
                # a FlagGems space narrowed for Triton must not make our call slower than
                # torch's. The model's top configs come first; cuBLAS is always timed.
                top = self._ranked(key, candidates)[:self.online.top_k()]
                if CUBLAS_CONFIG["variant"] not in excluded and runnable(CUBLAS_CONFIG):
                    top.append(dict(CUBLAS_CONFIG))
                won = self.online.tune(op, key, strategy, top, excluded)
                if won is not None:
                    answer = TunedConfig(won, ONLINE, bucket)
            if answer is None:
                answer = TunedConfig(self._ranked(key, candidates)[0], MODEL, bucket)
        if known is None:
            self.by_bucket[(op, bucket, excluded)] = answer
        return answer

    def _last_resort(self, op: str, runnable, excluded: frozenset[str]) -> TunedConfig:
        if CUBLAS_CONFIG["variant"] not in excluded and runnable(CUBLAS_CONFIG):
            return CUBLAS_CONFIG
        return DEFAULT_CONFIGS[op]

    def _runnable(self, op: str, key: dict) -> Callable[[Mapping], bool]:
        if op not in self._runnability:
            self._runnability[op] = runnability(op)
        on = self._runnability[op]
        return on(key) if on is not None else (lambda config: True)

    @property
    def spec(self):
        """The model's spec of the file's device (else the visible GPU, else an H100)."""
        if self._spec is None:
            from tuner.model.named_devices import named_spec

            self._spec = named_spec(self.device_name)
        return self._spec

    def candidates(self, op: str, key: dict, excluded: frozenset[str] = frozenset()
                   ) -> list[dict]:
        """The op's product as configs that can run the key, in file order, each once: per
        source, the first of its variants the kernel lets run the key's operands, and of
        its configs those the kernel finds feasible there (shared memory, registers)."""
        from tuner.execution.measure import meta_gemm
        from tuner.kernels import KERNELS

        kernel = KERNELS[op]
        gemm = meta_gemm(shape_of(key))
        runnable = self._runnable(op, key)
        smem_limit = self.online.smem_limit() if self.online is not None \
            else self.spec.smem_per_block
        configs: dict[tuple, dict] = {}
        for source, variants in self.sources.get(op, ()):
            for variant_name in variants:
                variant = kernel.variant.get(variant_name)
                if variant is None or variant_name in excluded:
                    continue
                product = source.product(variant_name, variant.params, DEFAULT_CONFIGS[op])
                feasible = [config for config in product if runnable(config)
                            and kernel.feasible(config, gemm, smem_limit) is None]
                for config in feasible:
                    configs.setdefault(tuple(sorted(config.items())), config)
                if feasible:
                    break
        return list(configs.values())

    def _ranked(self, key: dict, configs: list[dict]) -> list[dict]:
        """The configs, predicted fastest first on the key (tuner.model.predict; the file's
        order on a tie)."""
        from tuner.model.predict import predicted_or_inf

        shape, spec = shape_of(key), self.spec
        predicted = [predicted_or_inf(shape, config, spec) for config in configs]
        order = sorted(range(len(configs)), key=lambda i: (predicted[i], i))
        return [configs[i] for i in order]
