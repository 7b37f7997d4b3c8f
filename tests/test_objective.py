"""Which measured config wins (tuner.objective.ranked and finalists): the one rule the study's
final re-timing, the runtime's online tuning and the export's other-mode pick share."""
from types import SimpleNamespace

from tuner.objective import EAGER, GRAPH, finalists, ranked


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
