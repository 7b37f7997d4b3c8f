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

A parameter the lists lack takes the op's default config's value (GROUP_M 8); pad is 0. The
file is checked whole as it loads: each list's values by the rules a table's configs are
checked by, each list FlagGems reads there, each op able to make configs of its variants.
Which config of the product answers a bucket, decided on the first key seen in it:

- by default the analytical model's pick (tuner.model.predict.fastest_of) among the configs
  that fit the key, for the device the file's header comment names (`# device: NAME`), else
  the visible GPU, else an H100 (tuner.model.named_devices); no GPU work. Source
  "expand-model";
- with TUNE_ONLINE=1, the winner of timing cuBLAS and the product's candidates (the model's
  top TUNE_ONLINE_TOP_K where it is larger, best first, within TUNE_ONLINE_BUDGET_S) on this
  process's GPU, remembered in a table-format cache shared by processes
  (tuner.runtime.online). Source "expand-online".

A later key of the bucket gets the same config where it can run it, else its own pick. An op
the file lacks answers cuBLAS (warned), as a table without the op does.
"""
from __future__ import annotations

import itertools
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path

from tuner.bucketing.strategies import KEY_FIELDS, BucketingError, bucket_key
from tuner.formats.device import header_device
from tuner.formats.flaggems import (
    GEMV_OP,
    MM_OP,
    REFERENCE_MATMUL,
    SPLITK_OP,
    ExpandError,
    op_bodies,
    read_op,
)
from tuner.runtime.answer import DEFAULT_CONFIGS, TunedConfig
from tuner.runtime.policy import CUBLAS_STEP, DEFAULT_STEP, Policy, Question, Step
from tuner.runtime.runnable import shape_of
from tuner.runtime.source import TableSource

MODEL, ONLINE = "expand-model", "expand-online"

# Per our op: the FlagGems ops whose products answer it, each with the variants its configs
# run as (the first that can run the key). The first op present gives the bucketing.
SOURCES: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "mm": ((MM_OP, ("tma", "general")), (REFERENCE_MATMUL, ("tma", "general")),
           (SPLITK_OP, ("splitk",))),
    "gemv": ((GEMV_OP, ("gemv",)),),
}


class ExpandOp:
    """One FlagGems op of the file: its value lists under our parameter names, and its
    bucketing strategy (every KEY_FIELDS field)."""

    def __init__(self, name: str, body: list, label: str):
        lists = read_op(name, body, label)
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


def _check_sources(label: str, sources: Mapping[str, list[tuple[ExpandOp, tuple]]]) -> None:
    """ExpandError or BucketingError, starting with `label`, where an op's lists cannot make a
    config of each variant it answers with (a parameter with neither a list nor a default,
    e.g. mm_splitk without SPLIT_K) or its strategy cannot bucket a key: at load, not at the
    first key of the op."""
    from tuner.runtime.runnable import installed_variants

    installed = installed_variants() or {}
    probe = dict.fromkeys(KEY_FIELDS, 1) | {"dtype": "bf16"}
    for op, present in sources.items():
        for source, variants in present:
            try:
                bucket_key(probe, source.strategy)
            except BucketingError as e:
                raise BucketingError(f"{label}: field '{source.name}.strategy': {e}") from None
            for variant in variants:
                params = installed.get(op, {}).get(variant, ())
                missing = [p for p in params if p not in ("variant", "pad")
                           and p not in source.values and p not in DEFAULT_CONFIGS[op]]
                if missing:
                    raise ExpandError(f"{label}: field '{source.name}': {variant} configs "
                                      f"need a list for each of {', '.join(missing)}")


class ExpandQuestion(Question):
    """A key asked of an expand file: the bucket it falls in, and the op's product ranked for
    it, each worked out on first need."""

    source: ExpandTable

    @cached_property
    def strategy(self) -> dict[str, str] | None:
        return self.source.strategy(self.op)

    @cached_property
    def bucket(self) -> tuple | None:
        """The key's bucket under the op's strategy; None for an op the file lacks."""
        return None if self.strategy is None else bucket_key(self.key, self.strategy)

    @cached_property
    def ranked(self) -> list[dict]:
        """The op's product as configs that can run the key, predicted fastest first."""
        if self.bucket is None:
            return []
        return self.source.ranked(self.key, self.source.candidates(self.op, self.key,
                                                                   self.excluded))


def _online(question: ExpandQuestion) -> TunedConfig | None:
    """With TUNE_ONLINE=1: the online cache's config of the key's bucket, else the winner of
    timing cuBLAS and the model's top candidates, written to the cache.

    cuBLAS is timed beside the product, as in every study (kernels/cublas.py): a FlagGems space
    narrowed for Triton must not make our call slower than torch's."""
    online = question.source.online
    if online is None or question.bucket is None:
        return None

    def candidates() -> list[dict]:
        if not question.ranked:  # the file has nothing for the key: not worth a tuning
            return []
        cublas = [question.cublas] if question.cublas is not None else []
        return cublas + question.ranked[:online.top_k()]

    won = online.answer(question.op, question.key, question.strategy, candidates,
                        question.allowed)
    return None if won is None else TunedConfig(won, ONLINE, question.bucket)


def _model(question: ExpandQuestion) -> TunedConfig | None:
    """The model's pick among the op's product."""
    return TunedConfig(question.ranked[0], MODEL, question.bucket) if question.ranked else None


EXPAND_POLICY = Policy((Step(ONLINE, _online), Step(MODEL, _model), CUBLAS_STEP, DEFAULT_STEP))


class ExpandTable(TableSource):
    """A loaded expand file, answering new keys by EXPAND_POLICY; a later key of a bucket
    gets the bucket's first answer where it can run it."""

    policy = EXPAND_POLICY

    def __init__(self, path: Path, doc: Mapping, text: str = ""):
        super().__init__(path, header_device(text))
        # Per (op, bucket, excluded variants): the answer of the bucket's first key.
        self.by_bucket: dict[tuple, TunedConfig] = {}
        label = f"gemm-tuner expand file {path}"
        read = {name for sources in SOURCES.values() for name, _ in sources}
        self.expand_ops: dict[str, ExpandOp] = {
            name: ExpandOp(name, body, label) for name, body in op_bodies(doc).items()
            if name in read}  # a FlagGems op of other kernels is neither read nor checked
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
        _check_sources(label, self.sources)
        self._spec = None

    def strategy(self, op: str) -> dict[str, str] | None:
        """The strategy buckets of the op are keyed by (its first source's), or None."""
        sources = self.sources.get(op)
        return None if not sources else sources[0][0].strategy

    def answer(self, op: str, key: dict, excluded: frozenset[str]) -> TunedConfig:
        question = ExpandQuestion(self, op, key, excluded)
        if question.bucket is None:
            return self.policy.answer(question)
        remembered = (op, question.bucket, excluded)
        known = self.by_bucket.get(remembered)
        if known is not None and question.allowed(known):
            return known
        config = self.policy.answer(question)
        if known is None and config.source in (ONLINE, MODEL):
            self.by_bucket[remembered] = config
        return config

    def shortfall(self, op: str, key: dict, config: TunedConfig) -> str | None:
        """cuBLAS or the default: no config of the file can run the key."""
        if config.source in ("default", "cublas"):
            return f"gemm-tuner: no {op} config of {self.path} can run {key}"
        return None

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
        from tuner.kernels import KERNELS
        from tuner.kernels.calls import meta_gemm

        kernel = KERNELS[op]
        gemm = meta_gemm(shape_of(key))
        runnable = self.runnable(op, key)
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

    def ranked(self, key: dict, configs: list[dict]) -> list[dict]:
        """The configs, predicted fastest first on the key (tuner.model.predict; the file's
        order on a tie)."""
        from tuner.model.predict import predicted_or_inf

        shape, spec = shape_of(key), self.spec
        predicted = [predicted_or_inf(shape, config, spec) for config in configs]
        order = sorted(range(len(configs)), key=lambda i: (predicted[i], i))
        return [configs[i] for i in order]
