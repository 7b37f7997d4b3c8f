"""Which measured config wins (tuner.objective: ranked, finalists, final_field and
final_winner): the one rule the study's final re-timing, the runtime's online tuning and the
export's other-mode pick share; and whether a tile holds its bucket's fewest rows
(bucket_loss)."""
from types import SimpleNamespace

import pytest

from tuner.objective import (
    DEVICE_SLACK,
    EAGER,
    GRAPH,
    LIBRARY_REACH,
    Pair,
    bucket_loss,
    final_field,
    final_winner,
    finalists,
    ranked,
)


def measured(name, p50_ms, loop_ms=None, status="ok", spread=0.0):
    """A record whose device samples spread `spread` of its median either side (p20, p80)."""
    return SimpleNamespace(name=name, status=status, p50_ms=p50_ms, loop_ms=loop_ms,
                           p20_ms=p50_ms * (1 - spread), p80_ms=p50_ms * (1 + spread))


def names(records):
    return [r.name for r in records]


def test_ranked_keeps_correct_timed_records_the_mode_may_choose_fastest_call_first():
    records = [measured("slow", 0.30, 0.31), measured("wrong", 0.01, 0.02, "wrong"),
               measured("fast", 0.10, 0.12), measured("untimed", 0.11, None),
               measured("slow kernel", 0.20, 0.05)]
    assert names(ranked(records, GRAPH)) == ["fast", "untimed", "slow kernel", "slow"]
    # eager: a call figure needed, and the kernel within DEVICE_SLACK of the fastest timed one
    assert names(ranked(records, EAGER)) == ["fast"]


def test_eager_slack_is_drawn_up_to_the_noise_of_the_two_kernels():
    """A host-paced library call (5 us kernel, 20 us call) against a tile whose kernel is 5.7%
    behind it and whose call takes half: the tile may win where the two kernels' timings
    cannot tell 5.7% from DEVICE_SLACK's 5%; 6.5% behind, with tight spreads, it may not."""
    library, tile = 0.005, 0.005 * 1.057
    noisy = [measured("cublas", library, 0.020, spread=0.01),
             measured("tile", tile, 0.010, spread=0.02)]
    assert names(ranked(noisy, EAGER)) == ["tile", "cublas"]
    tight = [measured("cublas", library, 0.020, spread=0.001),
             measured("tile", 0.005 * 1.065, 0.010, spread=0.001)]
    assert names(ranked(tight, EAGER)) == ["cublas"]  # beyond TIE_FLOOR's 1% of the slack
    far = [measured("cublas", library, 0.020, spread=0.01),
           measured("tile", 0.005 * 1.10, 0.010, spread=0.02)]
    assert names(ranked(far, EAGER)) == ["cublas"]
    assert names(ranked(noisy, GRAPH)) == ["cublas", "tile"]


def test_eager_finalists_lead_with_the_fastest_kernel_among_calls_of_the_same_time():
    records = [measured("a", 0.104, 0.100), measured("b", 0.100, 0.105),
               measured("c", 0.102, 0.150), measured("d", 0.103, 0.101)]
    assert names(finalists(records, GRAPH)) == ["b", "c", "d"]
    # a, b and d call within CALL_NOISE of the fastest: the fastest kernel first, then c
    assert names(finalists(records, EAGER)) == ["b", "d", "a"]
    assert names(finalists(records, EAGER, top=4)) == ["b", "d", "a", "c"]
    assert finalists([], EAGER) == []


def is_cublas(record) -> bool:
    return record.name == "cublas"


def test_the_library_call_joins_the_final_within_reach_of_the_leader_else_leaves_it():
    """A tile's lead over cuBLAS from trials timed apart is settled in pairs when within
    LIBRARY_REACH (the power state's swing), though eager's slack would not rank cuBLAS."""
    tiles = [measured("persistent", 0.600, 0.600), measured("tma", 0.640, 0.640)]
    near = measured("cublas", 0.600 * (1 + LIBRARY_REACH * 0.9), 0.600 * 1.1)
    assert names(ranked([*tiles, near], EAGER)) == ["persistent"]  # past DEVICE_SLACK
    assert names(final_field([*tiles, near], EAGER, is_cublas)) == ["persistent", "cublas"]
    assert names(final_field([*tiles, near], GRAPH, is_cublas)) == ["persistent", "tma",
                                                                    "cublas"]
    far = measured("cublas", 0.600 * (1 + LIBRARY_REACH * 1.1), 0.600 * 1.2)
    assert names(final_field([*tiles, far], GRAPH, is_cublas)) == ["persistent", "tma"]
    leading = measured("cublas", 0.500, 0.500)
    assert names(final_field([*tiles, leading], GRAPH, is_cublas)) == ["cublas", "persistent",
                                                                       "tma"]
    assert final_field([measured("cublas", 0.5, 0.5, status="wrong")], GRAPH, is_cublas) == []


def timing(p50_ms, spread=0.001):
    return SimpleNamespace(p20_ms=p50_ms * (1 - spread), p50_ms=p50_ms,
                           p80_ms=p50_ms * (1 + spread))


def by_cost(record):
    return ({"persistent": 2, "tma": 1, "cublas": 3}[record.name],)


def test_the_final_keeps_the_library_call_on_a_tie_and_the_cheaper_tile_otherwise():
    field = [measured("persistent", 0.60), measured("tma", 0.61), measured("cublas", 0.66)]
    # timed in pairs, persistent and cuBLAS tie within TIE_FLOOR: the incumbent stays
    kernels = [timing(0.600), timing(0.640), timing(0.603)]
    assert final_winner(field, kernels, kernels, GRAPH, is_cublas, by_cost) == (2, [0, 2])
    # persistent ahead beyond the noise: it replaces cuBLAS
    kernels = [timing(0.600), timing(0.640), timing(0.620)]
    assert final_winner(field, kernels, kernels, GRAPH, is_cublas, by_cost) == (0, [0])
    # two tiles tie without cuBLAS: the cheaper one
    kernels = [timing(0.600), timing(0.602), timing(0.640)]
    assert final_winner(field, kernels, kernels, GRAPH, is_cublas, by_cost) == (1, [0, 1])


def test_the_eager_final_weighs_calls_then_kernels_re_timed_not_the_trials():
    field = [measured("persistent", 0.010), measured("tma", 0.011), measured("cublas", 0.012)]
    calls = [timing(0.020), timing(0.020), timing(0.020)]  # host-paced: one call time
    kernels = [timing(0.010), timing(0.0097), timing(0.012)]
    # the fastest kernel of the tied calls, re-timed: tma, though persistent's trial led
    assert final_winner(field, kernels, calls, EAGER, is_cublas, by_cost) == (1, [0, 1])
    # a call ahead whose kernel falls past DEVICE_SLACK of the fastest kernel may not win
    calls = [timing(0.015), timing(0.020), timing(0.020)]
    kernels = [timing(0.010 * (1 + DEVICE_SLACK * 2)), timing(0.010), timing(0.010)]
    assert final_winner(field, kernels, calls, EAGER, is_cublas, by_cost) == (2, [1, 2])


def pair(tile_kernel, library_kernel, tile_call=None, library_call=None):
    return Pair(timing(tile_kernel), timing(library_kernel), timing(tile_call or tile_kernel),
                timing(library_call or library_kernel))


def test_a_tile_keeps_its_bucket_unless_its_fewest_rows_lose_more_than_its_top_gains():
    top = pair(0.950, 1.000)  # the tile 5.3% ahead
    assert bucket_loss(top, pair(0.500, 0.600), GRAPH) is None  # ahead there too
    assert bucket_loss(top, pair(0.500, 0.497), GRAPH) is None  # a tie
    assert bucket_loss(top, pair(0.500, 0.480), GRAPH) is None  # loses 4.2%, gains 5.3%
    assert bucket_loss(top, pair(0.500, 0.470), GRAPH) == pytest.approx(0.500 / 0.470)
    assert bucket_loss(top, pair(0.500, 0.430), GRAPH) == pytest.approx(1.163, abs=1e-3)


def test_an_eager_bucket_is_read_as_the_final_reads_calls_then_kernels():
    # Host-paced calls tie at the representative, so the kernels decide there (3.3% gain);
    # at the fewest rows the tile's call is 2% behind, its kernel ahead: calls decide, and
    # 2% is less than the 3.3% gained.
    top = pair(0.0150, 0.0155, 0.0200, 0.0200)
    assert bucket_loss(top, pair(0.0150, 0.0152, 0.0200, 0.0196), EAGER) is None
    assert bucket_loss(top, pair(0.0150, 0.0152, 0.0200, 0.0190), EAGER) == pytest.approx(
        0.0200 / 0.0190)
    # A call ahead whose kernel falls past DEVICE_SLACK of the library's loses by the kernel.
    slow_kernel = 0.0140 * (1 + 3 * DEVICE_SLACK)
    assert bucket_loss(top, pair(slow_kernel, 0.0140, 0.0180, 0.0200), EAGER) == (
        pytest.approx(slow_kernel / 0.0140))
