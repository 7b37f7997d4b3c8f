"""The fallback policy: which config answers a key, as an ordered list of named steps.

A key gets the answer of the first step that has one, and the answer's `.source` is that
step's name. Our table's policy (`TABLE_POLICY`):

1. `table`: the entry of the key's bucket, as it is (the dispatcher checks the call); where
   its variant is excluded, the first of its alternates that can run the key.
2. `online`: with TUNE_ONLINE=1, for an op the table has entries of, the online cache's
   winner of the key's bucket (the table's strategy); else, on the bucket's first call, the
   winner of timing on this GPU, within TUNE_ONLINE_BUDGET_S and best first, cuBLAS, the
   answer the next steps give, and the model's calibrated ranking of the closest buckets'
   configs, alternates and variations and of its own pick (TUNE_ONLINE_TOP_K of them),
   remembered in the cache (tuner.runtime.online: other processes and restarts time nothing).
3. `trusted`: for a key where tuner.model.regimes trusts a variant's term (kreduce: a few
   outputs along a long K), the model's best config of it where predicted VARIATION_MARGIN
   faster than cuBLAS, unless a tuned bucket near the key speaks for it: one that `nearest`
   weighs (MAX_NEIGHBOUR_OCTAVES) offering such a variant, or tuned in the same regime.
4. `nearest`: a config of the closest tuned buckets of the key's op and dtype (log2 of M, N
   and K; the NEAREST_BUCKETS closest within MAX_NEIGHBOUR_OCTAVES), an alternate of theirs,
   or a variation that suits the key better: the model's pick, calibrated by what they
   measured; a tile twice the key's M or N (past MIN_BLOCK) does not answer. cuBLAS where
   the closest was tuned to it; the next steps where the model predicts cuBLAS
   VARIATION_MARGIN faster. Only where cuBLAS cannot run the key (fp8 in another layout than
   torch._scaled_mm's), farther neighbours too.
5. `model`: for a dtype the op has no entry of, the model's pick among the values the op's
   entries use, unless it predicts cuBLAS faster; likewise where nothing else but the
   default could run the key.
6. `cublas`: torch's own GEMM, where no tuned config is to be trusted or the model predicts
   cuBLAS faster, or the table has no entry of the op.
7. `default`: DEFAULT_CONFIGS[op], where nothing above can run the key.

Every step but `table` and `default` answers only with configs that can run the key, and none
but `default` with an excluded variant. An expand file's policy (tuner.runtime.expand) is
`expand-online`, `expand-model`, `cublas`, `default`. The model's parts are
tuner.runtime.fallback's.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from tuner.bucketing.strategies import bucket_key
from tuner.model.regimes import TRUSTED_REGIMES, trusted_variants
from tuner.runtime import fallback
from tuner.runtime.answer import CUBLAS, CUBLAS_CONFIG, DEFAULT_CONFIGS, TunedConfig
from tuner.space import config_signature

if TYPE_CHECKING:
    from tuner.runtime.lookup import TunedTable
    from tuner.runtime.source import TableSource


class Question:
    """A key asked of a source for the first time, and what the steps share about it, each
    worked out on first need (a table hit loads no kernel)."""

    def __init__(self, source: TableSource, op: str, key: dict, excluded: frozenset[str]):
        self.source, self.op, self.key, self.excluded = source, op, key, excluded

    @cached_property
    def allowed(self) -> Callable[[Mapping], bool]:
        """Whether a config may answer the key: not of an excluded variant, and runnable on it
        (each config judged once)."""
        runnable = self.source.runnable(self.op, self.key)
        verdicts: dict[tuple, bool] = {}

        def allowed(config: Mapping) -> bool:
            signature = config_signature(config)
            if signature not in verdicts:
                verdicts[signature] = config["variant"] not in self.excluded and runnable(config)
            return verdicts[signature]

        return allowed

    @cached_property
    def cublas(self) -> TunedConfig | None:
        """CUBLAS_CONFIG where it may answer the key, else None."""
        return CUBLAS_CONFIG if self.allowed(CUBLAS_CONFIG) else None


@dataclass(frozen=True)
class Step:
    """One step of a policy: its name (the `.source` of its answers) and its job, which
    answers a question or passes (None)."""
    name: str
    answer: Callable[[Question], TunedConfig | None]


@dataclass(frozen=True)
class Policy:
    """Steps in order; the last (`default`) always answers."""
    steps: tuple[Step, ...]

    def answer(self, question: Question) -> TunedConfig:
        answers = (step.answer(question) for step in self.steps)
        return next(config for config in answers if config is not None)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(step.name for step in self.steps)


# -- the steps every policy ends with ------------------------------------------------------------
CUBLAS_STEP = Step("cublas", lambda question: question.cublas)
DEFAULT_STEP = Step("default", lambda question: DEFAULT_CONFIGS[question.op])


# -- our table's steps -------------------------------------------------------------------------
def _table(question: Question) -> TunedConfig | None:
    """The entry of the key's bucket; where its variant is excluded, the first of its
    alternates that may answer: measured on this very bucket, a runner-up beats any
    neighbour's tile or the model's guess (get_tuned_config_without(("cublas",)) on a key
    tuned to cuBLAS answers the best Triton config its study timed)."""
    entries = question.source.ops.get(question.op)
    exact = entries.exact(question.key) if entries is not None else None
    if exact is None or exact["variant"] not in question.excluded:
        return exact
    return next((alternate for alternate in entries.exact_alternates(question.key)
                 if question.allowed(alternate)), None)


def _trusted(question: Question) -> TunedConfig | None:
    """The model's pick of a variant whose term is trusted for the key, where predicted
    faster than cuBLAS (fallback.trusted_picker), unless a tuned bucket near the key speaks
    for it: one of those `nearest` weighs that offers such a variant (`nearest` then chooses
    with their measurements) or was tuned in the same regime (its measurement, whatever it
    chose, beats the model). Nearby buckets tuned elsewhere do not: cuBLAS's kernels and the
    tiles' costs change at the regime's edge, which their measurements do not see."""
    key = question.key
    variants = trusted_variants(key["M"], key["N"], key["K"], question.excluded)
    if not variants:
        return None
    table: TunedTable = question.source
    entries = table.ops.get(question.op)
    if entries is not None and entries.has_dtype(key["dtype"]):
        near = entries.nearest(key, lambda config: True, fallback.MAX_NEIGHBOUR_OCTAVES)
        if any(config["variant"] in variants
               or any(TRUSTED_REGIMES[name](*entries.tuned_sizes(config.bucket))
                      for name in variants) for config in near):
            return None
    pick = table.parts.trusted(question.op, key, variants)
    return pick if pick is not None and question.allowed(pick) else None


def _nearest(question: Question) -> TunedConfig | None:
    """The neighbours' answer for a key whose dtype the op has entries of.

    The closest neighbour's measurement decides between cuBLAS and Triton because the model
    cannot: it misjudges their ratio by more than the few percent that usually part them
    (benchmarks/fallback_pool.py), while which of the two wins changes slowly with the shape.
    Among Triton configs the model's calibrated ranking is what chooses."""
    table: TunedTable = question.source
    entries = table.ops.get(question.op)
    if entries is None or not entries.has_dtype(question.key["dtype"]):
        return None
    trusted = entries.nearest(question.key, question.allowed, fallback.MAX_NEIGHBOUR_OCTAVES)
    if trusted:
        if trusted[0]["variant"] == CUBLAS:
            return trusted[0]
        pick = fastest_of(question, trusted, question.cublas)
        return None if pick is CUBLAS_CONFIG else pick
    if question.cublas is not None:
        return None
    farther = entries.nearest(question.key, question.allowed)
    return fastest_of(question, farther, None) if farther else None


def fastest_of(question: Question, candidates: list[TunedConfig],
               cublas: TunedConfig | None) -> TunedConfig:
    """The model's choice among the neighbour candidates' tiles and their variations, or
    cuBLAS (a neighbour tuned to it standing for it); the first candidate without the
    model."""
    table: TunedTable = question.source
    parts = table.parts
    variations = parts.variations(question.op, question.key, candidates, question.allowed)
    cublas = next((config for config in candidates if config["variant"] == CUBLAS), cublas)
    tiles = [config for config in candidates if config["variant"] != CUBLAS]
    if parts.fastest is None or (len(tiles) == 1 and not variations and cublas is None):
        return candidates[0]
    return parts.fastest(question.key, tiles, variations, table.ops[question.op].measured,
                         cublas)


def _model(question: Question) -> TunedConfig | None:
    """The model's pick, where the op has entries but none of the key's dtype, or where
    neither a neighbour (the step before) nor cuBLAS can run the key: with no tuning of the
    op at all, nothing says which of its configs to trust."""
    table: TunedTable = question.source
    entries = table.ops.get(question.op)
    if entries is None or not entries.by_bucket:
        return None
    cublas = question.cublas
    if cublas is not None and entries.has_dtype(question.key["dtype"]):
        return None
    pick = table.parts.pick(question.op, entries.configs, question.key, question.excluded)
    if pick is None or not question.allowed(pick):
        return None
    if cublas is None or table.parts.fastest is None:
        return pick
    best = table.parts.fastest(question.key, [pick, cublas], [], {})
    return None if best is CUBLAS_CONFIG else best


# The answer of a key the table has no entry of, timing nothing.
ZERO_SHOT = Policy((Step("trusted", _trusted), Step("nearest", _nearest), Step("model", _model),
                    CUBLAS_STEP, DEFAULT_STEP))


def _online(question: Question) -> TunedConfig | None:
    """With TUNE_ONLINE=1: the online cache's winner of the key's bucket, else the winner of
    timing _online_candidates, written to the cache (the op's strategy keys both)."""
    table: TunedTable = question.source
    entries = table.ops.get(question.op)
    if table.online is None or entries is None:
        return None
    won = table.online.answer(question.op, question.key, entries.strategy,
                              lambda: _online_candidates(question), question.allowed)
    return None if won is None else TunedConfig(won, "online",
                                                bucket_key(question.key, entries.strategy))


def _online_candidates(question: Question) -> list[TunedConfig]:
    """What the online step times, in this order, each once: cuBLAS (it compiles nothing and
    is the bar every tile must beat), the zero-shot answer (so that any budget can only
    improve on it), then the TUNE_ONLINE_TOP_K best by the model's calibrated ranking of the
    closest buckets' configs and alternates (NEAREST_BUCKETS of them, however far: here a
    measurement decides, not trust), their variations and the model's pick."""
    table: TunedTable = question.source
    op, key, allowed = question.op, question.key, question.allowed
    entries = table.ops[op]
    neighbours = entries.nearest(key, allowed)
    pool = [*neighbours, *table.parts.variations(op, key, neighbours, allowed)]
    pick = table.parts.pick(op, entries.configs, key, question.excluded)
    if pick is not None and allowed(pick):
        pool.append(pick)
    tiles = [config for config in pool if config["variant"] != CUBLAS]
    ranked = table.parts.ranked(key, tiles, entries.measured)[:table.online.top_k()]
    zero_shot = ZERO_SHOT.answer(question)
    first = [config for config in (question.cublas, zero_shot)
             if config is not None and allowed(config)]
    unique: dict[tuple, TunedConfig] = {}
    for config in [*first, *ranked]:
        unique.setdefault(config_signature(config), config)
    return list(unique.values())


TABLE_POLICY = Policy((Step("table", _table), Step("online", _online), *ZERO_SHOT.steps))
