"""Which shapes share a config: per-bucket choice, regrets, and the search over strategies.

A strategy assignment gives each key field a bucketing strategy (tuner.bucketing.strategies); listed
shapes whose bucketed keys match share a bucket, and a bucket ships one config. A shape that
runs a bucket-mate's config instead of its own winner loses

    regret = time with the shared config / time with its own winner - 1.

Given each shape's time with every config it could share (tuner.execution.cross_timing measures
them), this module picks each bucket's config, the one whose worst weighted regret over the members
is least; scores an assignment by its buckets, geometric-mean regret and worst regret; and
searches the assignments for the smallest table within the user's regret budget, returning the
Pareto table of the others. Pure computation: no GPU, no database.

A table's size counts its rows plus its widened singletons: buckets that hold one listed shape
yet reach keys around it (any field whose strategy joins the shape's value with a neighbour).
Such a bucket answers those keys with a config measured only on its one shape, where the
runtime's fallback for a key outside every bucket, the model's choice among the nearest tuned
configs, would answer them better (benchmarks/nearest_fallback.py compares the two on
hold-out shapes). Widening pays off only where it merges more shapes than the singletons it
widens.

A sweep over M (`tune run --m`, `tune buckets --m`: serving's varying batch × tokens) asks
the opposite of M: every M from 1 to the largest swept one must fall in a bucket of a swept
shape, so that any M serving runs gets a measured config. There M's candidates are the
sweep's own breakpoints (each swept M its own bucket, reaching down to the previous one) and
those of the others that also cover the range (`sweep_candidates`), and reaching M values
between the swept ones is not counted as widening.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from tuner.bucketing.strategies import BUILTIN_STRATEGIES, KEY_FIELDS, strategy_function
from tuner.errors import UserError
from tuner.shapes import Shape
from tuner.space import config_signature as signature

# The fields whose strategy is searched; dtype stays exact (no config is shared across dtypes).
SEARCHED_FIELDS = ("M", "N", "K", "stride_am", "stride_bk")
# What `tune buckets` tries per field unless told otherwise, finest first: the built-ins,
# then breakpoints 8x and 32x apart, coarse enough to join a model's large shapes (where one
# config tends to serve all) and its decode sizes.
DEFAULT_CANDIDATES = (*BUILTIN_STRATEGIES, "buckets:[1,16,128,1024,8192,65536]",
                      "buckets:[1,32,1024,32768,1048576]")
# Past this many assignments the search samples them with an Optuna study (NSGA-II over
# buckets, geomean and worst regret) instead of scoring every one.
EXHAUSTIVE_LIMIT = 100_000
SAMPLED_ASSIGNMENTS = 4_000

# (shape, config_signature(config)) -> ms; None: the config cannot run that shape (fails, is
# wrong, or the kernel refuses it there).
Times = Mapping[tuple[Shape, tuple], "float | None"]


class BucketSearchError(UserError, ValueError):
    """No assignment of the candidate strategies keeps the shapes within the budget."""


def sweep_breakpoints(swept: Sequence[int]) -> str:
    """The strategy whose buckets end at the swept values: an M between two swept values gets
    the larger one's bucket, an M past the last stays exact."""
    return f"buckets:[{','.join(map(str, sorted(set(swept))))}]"


def covers(strategy: Callable[[int], int], swept: Sequence[int]) -> bool:
    """Whether every value from 1 to the largest swept one falls in the bucket of a swept
    value. Strategies bucket monotonically, so below the first swept value everything must
    share its bucket, and between two swept values a and b the bucket may step once, from
    a's to b's: found by bisection, not by trying every value."""
    values = sorted(set(swept))
    if strategy(1) != strategy(values[0]):
        return False
    for a, b in zip(values, values[1:]):
        low, high = strategy(a), strategy(b)
        first, last = a + 1, b  # bisect for the first value past a out of a's bucket
        while first < last:
            middle = (first + last) // 2
            if strategy(middle) != low:
                last = middle
            else:
                first = middle + 1
        if strategy(first) != high:
            return False
    return True


def sweep_candidates(swept: Sequence[int], candidates: Sequence[str]) -> tuple[str, ...]:
    """M's candidates for a sweep over `swept`: the sweep's breakpoints, then those of
    `candidates` that cover it (finest first, as given)."""
    own = sweep_breakpoints(swept)
    return (own, *(name for name in candidates
                   if name != own and covers(strategy_function(name), swept)))


@dataclass(frozen=True)
class Member:
    """A listed shape of one kernel and the config its own study chose."""
    shape: Shape
    winner: dict


@dataclass(frozen=True)
class Bucket:
    key: tuple  # the bucketed key, in KEY_FIELDS order
    config: dict  # the config its members share
    members: tuple[Member, ...]
    regrets: tuple[float, ...]  # per member, running `config`


@dataclass(frozen=True)
class Assessment:
    """One strategy assignment scored on the listed shapes."""
    strategy: dict[str, str]
    buckets: tuple[Bucket, ...]
    geomean_regret: float  # weighted by the CSV's weights
    max_regret: float
    coarseness: int  # the sum of each field's position in its candidate list
    widened: int  # buckets of one listed shape that also answer keys around it

    @property
    def rows(self) -> int:
        return len(self.buckets)

    @property
    def size(self) -> int:
        """What the search minimises: rows, plus the widened singletons (see the module)."""
        return self.rows + self.widened


def could_share(a: Shape, b: Shape, candidates: Mapping[str, Sequence[str]]) -> bool:
    """Whether some assignment of the candidate strategies puts a and b in one bucket."""
    if a.dtype != b.dtype:
        return False
    key_a, key_b = a.key(), b.key()
    return all(any(strategy_function(s)(key_a[f]) == strategy_function(s)(key_b[f])
                   for s in candidates[f]) for f in SEARCHED_FIELDS)


def needed_configs(members: Sequence[Member],
                   candidates: Mapping[str, Sequence[str]]) -> dict[Shape, list[dict]]:
    """Per shape, the configs to time it with: its own winner first, then the winners of
    every shape it could share a bucket with."""
    needed = {}
    for m in members:
        configs = {signature(m.winner): m.winner}
        for other in members:
            if other is not m and could_share(m.shape, other.shape, candidates):
                configs.setdefault(signature(other.winner), other.winner)
        needed[m.shape] = list(configs.values())
    return needed


@dataclass
class _Regrets:
    """regret[i][j]: member i running member j's winner (inf where it cannot run, or was not
    timed), and the memo of each group's choice."""
    members: Sequence[Member]
    times: Times
    chosen: dict[frozenset, tuple[int, tuple[float, ...]]] = field(default_factory=dict)

    @cached_property
    def matrix(self) -> list[list[float]]:
        rows = []
        for m in self.members:
            own = self.times.get((m.shape, signature(m.winner)))
            row = []
            for other in self.members:
                ms = self.times.get((m.shape, signature(other.winner)))
                row.append(ms / own - 1 if ms is not None and own else math.inf)
            rows.append(row)
        return rows

    def choose(self, group: frozenset[int]) -> tuple[int, tuple[float, ...]]:
        """The member whose winner the group shares, and each member's regret with it: the
        least worst regret, each weighted by its shape's share of the heaviest's weight; then
        the least weighted mean regret; then the first listed."""
        if group not in self.chosen:
            order = sorted(group)
            heaviest = max(self.members[i].shape.weight for i in order)

            def score(j: int) -> tuple[float, float, int]:
                weighted = [self.members[i].shape.weight / heaviest * self.matrix[i][j]
                            for i in order]
                return max(weighted), sum(weighted), j

            best = min(order, key=score)
            self.chosen[group] = best, tuple(self.matrix[i][best] for i in order)
        return self.chosen[group]


def weighted_geomean_regret(regrets: Sequence[float], weights: Sequence[float]) -> float:
    """exp(weighted mean of log(1 + regret)) - 1; infinite if any regret is."""
    if any(math.isinf(r) for r in regrets):
        return math.inf
    log_sum = sum(w * math.log1p(r) for r, w in zip(regrets, weights))
    return math.expm1(log_sum / sum(weights))


class _Scorer:
    """Scores assignments of one kernel's members, with every bucketed value computed once."""

    def __init__(self, members: Sequence[Member], times: Times,
                 candidates: Mapping[str, Sequence[str]], swept: tuple[str, ...] = ()):
        self.members, self.candidates = members, candidates
        self.regrets = _Regrets(members, times)
        keys = [m.shape.key() for m in members]
        self.bucketed = {(f, s): [strategy_function(s)(k[f]) for k in keys]
                         for f in SEARCHED_FIELDS for s in candidates[f]}
        # (field, strategy) -> per member, whether the strategy joins its value with a
        # neighbour; never along a swept field, whose values between the swept ones must join
        self.widens = {(f, s): [f not in swept and _joins_a_neighbour(strategy_function(s),
                                                                        k[f]) for k in keys]
                       for f in SEARCHED_FIELDS for s in candidates[f]}
        self.dtypes = [k["dtype"] for k in keys]

    def assess(self, strategy: Mapping[str, str]) -> Assessment:
        groups: dict[tuple, list[int]] = {}
        for i in range(len(self.members)):
            key = tuple(self.dtypes[i] if f == "dtype" else self.bucketed[f, strategy[f]][i]
                        for f in KEY_FIELDS)
            groups.setdefault(key, []).append(i)
        buckets, regrets, weights = [], [], []
        for key, indices in groups.items():
            best, group_regrets = self.regrets.choose(frozenset(indices))
            buckets.append(Bucket(key, self.members[best].winner,
                                  tuple(self.members[i] for i in sorted(indices)),
                                  group_regrets))
            regrets += group_regrets
            weights += [self.members[i].shape.weight for i in sorted(indices)]
        coarseness = sum(self.candidates[f].index(strategy[f]) for f in SEARCHED_FIELDS)
        widened = sum(any(self.widens[f, strategy[f]][indices[0]] for f in SEARCHED_FIELDS)
                      for indices in groups.values() if len(indices) == 1)
        return Assessment({**strategy, "dtype": "default"}, tuple(buckets),
                          weighted_geomean_regret(regrets, weights), max(regrets), coarseness,
                          widened)


def _joins_a_neighbour(strategy: Callable[[int], int], value: int) -> bool:
    """Whether the bucket of `value` also holds value - 1 or value + 1 (strategies bucket
    monotonically, so a bucket that holds any other value holds a neighbour)."""
    bucket = strategy(value)
    return (value > 0 and strategy(value - 1) == bucket) or strategy(value + 1) == bucket


def _every_assignment(candidates: Mapping[str, Sequence[str]]) -> Iterator[dict[str, str]]:
    for choice in itertools.product(*(candidates[f] for f in SEARCHED_FIELDS)):
        yield dict(zip(SEARCHED_FIELDS, choice))


def _sampled_assessments(scorer: _Scorer, candidates: Mapping[str, Sequence[str]],
                         seed: int) -> Iterator[Assessment]:
    """Assignments proposed by a multi-objective Optuna study (NSGA-II), for candidate lists
    whose product is too large to score whole."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(directions=["minimize"] * 3,
                                sampler=optuna.samplers.NSGAIISampler(seed=seed))
    for _ in range(SAMPLED_ASSIGNMENTS):
        trial = study.ask()
        assessment = scorer.assess({f: trial.suggest_categorical(f, list(candidates[f]))
                                    for f in SEARCHED_FIELDS})
        study.tell(trial, [assessment.rows, min(assessment.geomean_regret, 1e9),
                           min(assessment.max_regret, 1e9)])
        yield assessment


def _partition(assessment: Assessment) -> frozenset:
    return frozenset(frozenset(m.shape for m in b.members) for b in assessment.buckets)


def _pareto_front(assessments: Sequence[Assessment]) -> list[Assessment]:
    """Those no other beats or ties on all of rows, widened singletons, geomean and worst
    regret, by rows. In lexicographic order a dominating assessment comes first, so one pass
    suffices."""
    def scores(a: Assessment) -> tuple[int, int, float, float]:
        return a.rows, a.widened, a.geomean_regret, a.max_regret

    front: list[Assessment] = []
    for a in sorted(assessments, key=scores):
        if not any(all(x <= y for x, y in zip(scores(b), scores(a))) for b in front):
            front.append(a)
    return front


@dataclass(frozen=True)
class SearchResult:
    chosen: Assessment  # the least size within the budget
    pareto: tuple[Assessment, ...]  # by rows, none worse than another on all four scores


def search(members: Sequence[Member], times: Times, candidates: Mapping[str, Sequence[str]],
           max_regret: float, seed: int = 0, swept: tuple[str, ...] = ()) -> SearchResult:
    """The assignment of the least size (rows plus widened singletons) whose worst regret is
    within max_regret (ties: the lower geomean regret, then the finer strategies), and the
    Pareto table. `swept`: the fields the members sweep (see the module), whose candidates
    must cover the sweep (sweep_candidates).

    Assignments that bucket the listed shapes alike count once, as the one widening fewest
    singletons, then the finest: a bucket wider than the listed shapes need hands unlisted
    shapes a config nobody measured against them, where the runtime's fallback would choose.
    All-exact (each candidate list's first entry should be `default`, a swept field's its
    sweep's breakpoints) always qualifies: it has no regret."""
    scorer = _Scorer(members, times, candidates, swept)
    if math.prod(len(candidates[f]) for f in SEARCHED_FIELDS) <= EXHAUSTIVE_LIMIT:
        assessments: Iterator[Assessment] = map(scorer.assess, _every_assignment(candidates))
    else:
        assessments = _sampled_assessments(scorer, candidates, seed)
    by_partition: dict[frozenset, Assessment] = {}
    for assessment in assessments:
        part = _partition(assessment)
        kept = by_partition.get(part)
        if kept is None or ((assessment.widened, assessment.coarseness)
                            < (kept.widened, kept.coarseness)):
            by_partition[part] = assessment
    distinct = list(by_partition.values())
    within = [a for a in distinct if a.max_regret <= max_regret]
    if not within:
        raise BucketSearchError(
            f"no assignment of the candidate strategies keeps every shape within "
            f"{max_regret:.1%} (list 'default' first among each field's candidates)")
    chosen = min(within, key=lambda a: (a.size, a.geomean_regret, a.coarseness))
    return SearchResult(chosen, tuple(_pareto_front(distinct)))
