"""The bucket search on made-up timings: regrets, each bucket's choice, the budget, Pareto."""
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.factories import examples
from tuner.bucketing.search import (
    DEFAULT_CANDIDATES,
    SEARCHED_FIELDS,
    BucketSearchError,
    Member,
    could_share,
    covers,
    needed_configs,
    search,
    signature,
    sweep_candidates,
)
from tuner.bucketing.strategies import strategy_function
from tuner.shapes import Shape

FINE_AND_LOG = {f: ("default", "log") for f in SEARCHED_FIELDS}


def member(m, n=4096, k=4096, dtype="bf16", weight=1.0, tile=None):
    return Member(Shape(m, n, k, dtype, "nt", weight), {"variant": "general", "pad": 0,
                                                        "BLOCK_M": tile or m})


def times_from(table):
    """{(member index, winner index): ms} -> the search's Times."""
    def build(members):
        return {(members[i].shape, signature(members[j].winner)): ms
                for (i, j), ms in table.items()}
    return build


def test_shapes_share_only_within_a_dtype_and_a_common_bucket():
    a, b, c, d = member(3), member(4), member(5), member(4, dtype="fp16")
    assert could_share(a.shape, b.shape, FINE_AND_LOG)  # log: 3 and 4 -> 4
    assert not could_share(b.shape, c.shape, FINE_AND_LOG)  # 4 -> 4, 5 -> 8
    assert not could_share(b.shape, d.shape, FINE_AND_LOG)
    needed = needed_configs([a, b, c, d], FINE_AND_LOG)
    assert needed[a.shape] == [a.winner, b.winner] and needed[c.shape] == [c.winner]


def test_a_cheap_merge_is_taken_and_a_costly_one_is_not():
    a, b = member(3), member(4)
    members = [a, b]
    cheap = times_from({(0, 0): 1.0, (0, 1): 1.01, (1, 1): 2.0, (1, 0): 2.5})(members)
    merged = search(members, cheap, FINE_AND_LOG, max_regret=0.02).chosen
    assert merged.rows == 1 and merged.strategy["M"] == "log"
    assert merged.buckets[0].config == b.winner  # a loses 1%, b would lose 25% with a's
    assert merged.max_regret == pytest.approx(0.01)
    separate = search(members, cheap, FINE_AND_LOG, max_regret=0.005).chosen
    assert separate.rows == 2 and separate.max_regret == 0


def test_weights_decide_whose_config_a_bucket_keeps():
    light, heavy = member(3, weight=1.0), member(4, weight=10.0)
    times = times_from({(0, 0): 1.0, (0, 1): 1.2, (1, 1): 1.0, (1, 0): 1.1})([light, heavy])
    chosen = search([light, heavy], times, FINE_AND_LOG, max_regret=1.0).chosen
    # unweighted, light's config (worst 10%) beats heavy's (worst 20%); weighted, heavy's
    # 20% on the light shape counts a tenth
    assert chosen.buckets[0].config == heavy.winner


def test_a_config_that_cannot_run_a_member_is_never_shared():
    a, b = member(3), member(4)
    times = times_from({(0, 0): 1.0, (0, 1): None, (1, 1): 1.0, (1, 0): 5.0})([a, b])
    result = search([a, b], times, FINE_AND_LOG, max_regret=10.0)
    assert result.chosen.rows == 1 and result.chosen.buckets[0].config == a.winner
    with pytest.raises(BucketSearchError, match="within 1.0%"):
        search([a, b], times, {f: ("log",) for f in SEARCHED_FIELDS}, max_regret=0.01)


def test_widening_must_merge_more_shapes_than_it_leaves_alone_in_wide_buckets():
    def cheap_sharing(members):
        return {(m.shape, signature(o.winner)): 1.0 if m is o else 1.005
                for m in members for o in members}

    # log joins 3 and 4 (one row saved) but leaves 7 alone in the bucket 5..8: no gain.
    members = [member(3), member(4), member(7)]
    result = search(members, cheap_sharing(members), FINE_AND_LOG, max_regret=0.02)
    assert result.chosen.strategy["M"] == "default" and result.chosen.rows == 3
    log = next(a for a in result.pareto if a.strategy["M"] == "log")
    assert (log.rows, log.widened, log.size) == (2, 1, 3)
    # with 8 listed too, log's buckets 3..4 and 5..8 each hold two shapes: 2 rows for 4.
    members.append(member(8))
    chosen = search(members, cheap_sharing(members), FINE_AND_LOG, max_regret=0.02).chosen
    assert chosen.strategy["M"] == "log" and (chosen.rows, chosen.widened) == (2, 0)


@settings(max_examples=examples(40), deadline=None)
@given(st.lists(st.integers(1, 64), min_size=2, max_size=6, unique=True),
       st.data(), st.floats(0, 0.3))
def test_the_choice_keeps_the_budget_and_the_front_is_undominated(ms, data, budget):
    members = [member(m) for m in ms]
    ratios = st.floats(1.0, 1.5)
    times = {}
    for i, m in enumerate(members):
        for j, other in enumerate(members):
            times[m.shape, signature(other.winner)] = 1.0 if i == j else data.draw(ratios)
    result = search(members, times, FINE_AND_LOG, budget)
    assert result.chosen.max_regret <= budget
    assert result.chosen.rows <= len(members)
    assert sum(len(b.members) for b in result.chosen.buckets) == len(members)
    scores = [(a.rows, a.widened, a.geomean_regret, a.max_regret) for a in result.pareto]
    for x in scores:
        assert not any(y != x and all(p <= q for p, q in zip(y, x)) for y in scores)
    # all exact has no regret: it is on the front, or a merge costing nothing beats it
    assert any(worst == 0.0 and rows <= len(members) for rows, _, _, worst in scores)
    assert result.chosen.size <= len(members)  # never larger than all exact
    assert all(math.isfinite(a.max_regret) for a in result.pareto)


# -- a sweep over M (tune run --m, tune buckets --m) ----------------------------------------------
SWEEP = (1, 2, 4, 8, 16, 32, 64)


def test_a_sweeps_m_candidates_are_those_covering_every_m_up_to_its_largest():
    candidates = sweep_candidates(SWEEP, DEFAULT_CANDIDATES)
    assert candidates[0] == "buckets:[1,2,4,8,16,32,64]"
    # exact, align8 and align16 leave Ms between swept ones (3; 24; 48) in buckets of their own
    assert candidates[1:] == ("align32", "align64", "align128", "log",
                              "buckets:[1,16,128,1024,8192,65536]",
                              "buckets:[1,32,1024,32768,1048576]")
    for name in DEFAULT_CANDIDATES:
        strategy = strategy_function(name)
        every_m = all(strategy(m) in {strategy(s) for s in SWEEP} for m in range(1, 65))
        assert covers(strategy, SWEEP) == every_m, name
    # a sweep from 16 up: below it only a bucket reaching down to 1 covers
    assert sweep_candidates((16, 32, 64), ("default", "log", "buckets:[64]")) == (
        "buckets:[16,32,64]", "buckets:[64]")


def _sweep_search(sharing_costs: float, swept=("M",)):
    members = [member(m) for m in SWEEP[1:]]  # M = 1 is gemv's
    times = {(m.shape, signature(o.winner)): 1.0 if m is o else 1.0 + sharing_costs
             for m in members for o in members}
    candidates = dict(FINE_AND_LOG)
    if swept:
        candidates["M"] = sweep_candidates(SWEEP, DEFAULT_CANDIDATES)
    return members, search(members, times, candidates, max_regret=0.02, swept=swept).chosen


@pytest.mark.parametrize("sharing_costs, rows", [(0.5, 6), (0.01, 2)])
def test_a_swept_m_shares_by_regret_and_every_m_falls_in_a_bucket(sharing_costs, rows):
    """Each M gets its own winner where sharing costs more than the budget; where it costs
    less, the coarsest candidates' two buckets (2..16 and 32..64, or 2..32 and 64); either
    way, every M from 2 to 64 falls in a bucket of the sweep."""
    members, chosen = _sweep_search(sharing_costs)
    assert chosen.rows == rows and chosen.widened == 0
    strategy = strategy_function(chosen.strategy["M"])
    buckets = {b.key[0] for b in chosen.buckets}
    assert all(strategy(m) in buckets for m in range(2, 65))


def test_without_the_sweep_the_unshared_ms_stay_exact():
    """The same shapes listed, not swept: a bucket of one shape reaching Ms nobody listed is a
    widened singleton, left to the runtime's nearest fallback."""
    _, chosen = _sweep_search(0.5, swept=())
    assert chosen.strategy["M"] == "default" and chosen.rows == 6
