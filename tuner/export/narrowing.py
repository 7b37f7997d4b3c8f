"""Narrowing one expand op's value lists to a bounded Cartesian product.

FlagGems autotunes, on the first call of each bucketed key, every combination of an expand
op's value lists (block_m × block_n × ... × stages × warps). `narrow` chooses per parameter a
subset of the values the tuned shapes' winners use, such that the product of the list
lengths is at most `max_configs`, minimising the regret of "the best config inside the
product" against each tuned shape's own winner:

    regret(shape) = min(time(shape, c) for c in product) / winner_ms(shape) - 1  (>= 0)

weighed by each shape's weight, as a weighted geometric mean (mean of log(1 + regret)),
then the worst shape, then the weight of winners kept exactly. Times come from each `Case`
(tuner.export.cases: measured where the database or table holds them, else the analytical
model's prediction scaled to the shape's measured winner); a case without a time for a
config answers math.inf.

The search is deterministic and local: it starts from the most-winning value of each
parameter (and, where the union's product is small, from the union with the cheapest values
dropped one at a time until it fits), then takes the best move among adding a value, swapping
one for another, or moving a slot from one parameter to another, while it improves. With
`max_configs` 0, or a union that already fits, the union is kept (every winner inside: no
regret). This module imports nothing heavy; it knows nothing of kernels or FlagGems.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

DEFAULT_MAX_CONFIGS = 16
# The largest union product the drop-from-the-union start is tried from (each of its steps
# times every remaining config on every shape).
DROP_START_LIMIT = 1024
_MAX_ROUNDS = 200


@dataclass
class Case:
    """One tuned shape: its winner (values in the narrowing's parameter order; None for a
    parameter its variant has not), the winner's time, and the time of any other config."""
    label: str
    winner: tuple
    winner_ms: float
    time: Callable[[tuple], float]  # ms of a config (values in parameter order); inf unknown
    weight: float = 1.0
    measured: Callable[[tuple], bool] = field(default=lambda values: True, repr=False)
    _memo: dict = field(default_factory=dict, repr=False)

    def ms(self, values: tuple) -> float:
        if values not in self._memo:
            self._memo[values] = self.time(values)
        return self._memo[values]

    def holds(self, values: tuple) -> bool:
        """Whether `values` runs this case's winner (parameters it has not are free)."""
        return all(w is None or w == v for w, v in zip(self.winner, values))


@dataclass(frozen=True)
class Outcome:
    """One tuned shape under the chosen lists: its regret and the config that answers it."""
    regret: float
    replacement: tuple | None  # the fastest config inside the product, None if none runs
    measured: bool  # whether the replacement's time was measured (else the model's)
    own: bool = False  # whether the replacement runs the shape's own winner (Case.holds)


@dataclass(frozen=True)
class Narrowing:
    params: tuple[str, ...]
    lists: dict[str, list]
    union: dict[str, list]
    outcomes: dict[str, Outcome]  # by case label
    weights: dict[str, float]

    @property
    def product(self) -> int:
        return math.prod(len(v) for v in self.lists.values())

    @property
    def union_product(self) -> int:
        return math.prod(len(v) for v in self.union.values())

    @property
    def geomean_regret(self) -> float:
        if not self.outcomes:
            return 0.0
        total = sum(self.weights.values())
        logs = sum(self.weights[label] * math.log1p(o.regret)
                   for label, o in self.outcomes.items())
        return math.expm1(logs / total)

    @property
    def max_regret(self) -> float:
        return max((o.regret for o in self.outcomes.values()), default=0.0)


def union_lists(params: Sequence[str], configs: Iterable[tuple]) -> dict[str, list]:
    """Per parameter, the sorted values the configs use (None: a parameter a config lacks)."""
    values = {p: set() for p in params}
    for config in configs:
        for p, v in zip(params, config):
            if v is not None:
                values[p].add(v)
    return {p: sorted(vs) for p, vs in values.items()}


def narrow(params: Sequence[str], cases: Sequence[Case], max_configs: int,
           extra: Iterable[tuple] = ()) -> Narrowing:
    """The value lists of `params` (product <= max_configs; 0: the union) chosen from the
    values of the cases' winners and the `extra` configs (an export's picks), minimising the
    cases' weighted regret."""
    params = tuple(params)
    extra = list(extra)
    union = union_lists(params, [c.winner for c in cases] + extra)
    full = tuple(tuple(union[p]) for p in params)
    targets = [(c.winner, c.weight) for c in cases] + [(e, 1.0) for e in extra]
    search = _Search(params, full, cases, targets)
    if max_configs <= 0 or math.prod(map(len, full)) <= max_configs:
        chosen = full
    else:
        starts = [_most_winning(full, targets)]
        if math.prod(map(len, full)) <= DROP_START_LIMIT:
            starts.append(search.dropped_to(max_configs))
        results = [search.improved(start, max_configs) for start in starts]
        chosen = min(results, key=search.objective)  # the first on a tie
    return Narrowing(params, {p: list(vs) for p, vs in zip(params, chosen)}, union,
                     search.outcomes(chosen), {c.label: c.weight for c in cases})


Lists = tuple  # of tuples of values, one per parameter, each sorted


def _most_winning(full: Lists, targets) -> Lists:
    """Per parameter, the one value the targets' weight favours most (the smaller on a tie)."""
    chosen = []
    for i, values in enumerate(full):
        weight = {v: 0.0 for v in values}
        for config, w in targets:
            if config[i] is not None:
                weight[config[i]] += w
        chosen.append((max(values, key=lambda v: (weight[v], -_order(v))),) if values else ())
    return tuple(chosen)


def _order(value) -> float:
    return value if isinstance(value, (int, float)) else 0


class _Search:
    def __init__(self, params, full: Lists, cases: Sequence[Case], targets):
        self.params, self.full, self.cases, self.targets = params, full, cases, targets
        self._scores: dict[Lists, tuple] = {}

    def _best(self, case: Case, lists: Lists) -> tuple[float, tuple | None]:
        best, best_config = math.inf, None
        for config in itertools.product(*lists):
            ms = case.ms(config)
            if ms < best:
                best, best_config = ms, config
        return best, best_config

    def outcomes(self, lists: Lists) -> dict[str, Outcome]:
        out = {}
        for case in self.cases:
            best, config = self._best(case, lists)
            regret = math.inf if best == math.inf else max(0.0, best / case.winner_ms - 1)
            out[case.label] = Outcome(regret, config,
                                      config is not None and case.measured(config),
                                      config is not None and case.holds(config))
        return out

    def objective(self, lists: Lists) -> tuple:
        """Smaller is better: shapes nothing inside runs, weighted mean log(1 + regret), the
        worst finite regret, less weight of targets kept exactly."""
        if lists not in self._scores:
            unanswered, logs, worst = 0, 0.0, 0.0
            for case in self.cases:
                best, _ = self._best(case, lists)
                if best == math.inf:
                    unanswered += 1
                    continue
                log = math.log(max(best / case.winner_ms, 1.0))
                logs += case.weight * log
                worst = max(worst, log)
            kept = sum(w for config, w in self.targets
                       if all(v is None or v in lists[i] for i, v in enumerate(config)))
            self._scores[lists] = (unanswered, round(logs, 12), round(worst, 12), -kept)
        return self._scores[lists]

    def dropped_to(self, max_configs: int) -> Lists:
        """The union with one value dropped at a time, the one whose loss costs least, until
        the product fits."""
        lists = self.full
        while math.prod(map(len, lists)) > max_configs:
            options = [_replaced(lists, i, tuple(x for x in values if x != v))
                       for i, values in enumerate(lists) if len(values) > 1 for v in values]
            lists = min(options, key=self.objective)
        return lists

    def improved(self, lists: Lists, max_configs: int) -> Lists:
        """Best-improvement local search from `lists` over add, swap and move steps."""
        for _ in range(_MAX_ROUNDS):
            best = min(self._neighbours(lists, max_configs), key=self.objective,
                       default=lists)
            if self.objective(best) >= self.objective(lists):
                return lists
            lists = best
        return lists

    def _neighbours(self, lists: Lists, max_configs: int):
        for i, values in enumerate(lists):
            for u in (x for x in self.full[i] if x not in values):
                added = _replaced(lists, i, tuple(sorted((*values, u), key=_order)))
                if math.prod(map(len, added)) <= max_configs:
                    yield added
                for v in values:  # swap v for u
                    yield _replaced(lists, i, tuple(sorted(
                        (*(x for x in values if x != v), u), key=_order)))
                for j, others in enumerate(lists):  # move a slot from parameter j to i
                    if j == i or len(others) < 2:
                        continue
                    for v in others:
                        moved = _replaced(added, j, tuple(x for x in others if x != v))
                        if math.prod(map(len, moved)) <= max_configs:
                            yield moved


def _replaced(lists: Lists, i: int, values: tuple) -> Lists:
    return (*lists[:i], values, *lists[i + 1:])


def regret_line(narrowing: Narrowing) -> str:
    """The narrowing's regret in one line, for the terminal and the file's header."""
    n = len(narrowing.outcomes)
    if not n:
        return "no measured shape to weigh it on"
    return (f"regret vs each tuned shape's own winner: geomean {_percent(narrowing.geomean_regret)}"
            f", max {_percent(narrowing.max_regret)} over {n} tuned shapes")


def _percent(regret: float) -> str:
    return "inf (a shape with no config inside that runs)" if regret == math.inf else (
        f"{regret * 100:.2f}%")

