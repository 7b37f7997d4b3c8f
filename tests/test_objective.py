"""Which measured config wins (tuner.objective.ranked and finalists): the one rule the study's
final re-timing, the runtime's online tuning and the export's other-mode pick share."""
from types import SimpleNamespace

from tuner.objective import EAGER, GRAPH, finalists, ranked


def measured(name, p50_ms, loop_ms=None, status="ok"):
    return SimpleNamespace(name=name, status=status, p50_ms=p50_ms, loop_ms=loop_ms)


def names(records):
    return [r.name for r in records]


def test_ranked_keeps_correct_timed_records_the_mode_may_choose_fastest_call_first():
    records = [measured("slow", 0.30, 0.31), measured("wrong", 0.01, 0.02, "wrong"),
               measured("fast", 0.10, 0.12), measured("untimed", 0.11, None),
               measured("slow kernel", 0.20, 0.05)]
    assert names(ranked(records, GRAPH)) == ["fast", "untimed", "slow kernel", "slow"]
    # eager: a call figure needed, and the kernel within DEVICE_SLACK of the fastest timed one
    assert names(ranked(records, EAGER)) == ["fast"]


def test_eager_finalists_lead_with_the_fastest_kernel_among_calls_of_the_same_time():
    records = [measured("a", 0.104, 0.100), measured("b", 0.100, 0.105),
               measured("c", 0.102, 0.150), measured("d", 0.103, 0.101)]
    assert names(finalists(records, GRAPH)) == ["b", "c", "d"]
    # a, b and d call within CALL_NOISE of the fastest: the fastest kernel first, then c
    assert names(finalists(records, EAGER)) == ["b", "d", "a"]
    assert names(finalists(records, EAGER, top=4)) == ["b", "d", "a", "c"]
    assert finalists([], EAGER) == []
