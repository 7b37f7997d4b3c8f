"""The executor's rule for compiles that take far longer than their peers."""
from tuner.execution.executor import STRAGGLER_FLOOR_S, STRAGGLER_SAMPLES, compile_limit


def test_a_compile_may_run_ten_medians_within_the_floor_and_the_cap():
    assert compile_limit([1.0] * (STRAGGLER_SAMPLES - 1), 120.0) == 120.0  # nothing known yet
    assert compile_limit([1.0] * STRAGGLER_SAMPLES, 120.0) == STRAGGLER_FLOOR_S
    assert compile_limit([2.0, 4.0, 5.0, 5.0, 5.0, 6.0, 9.0, 60.0], 120.0) == 50.0
    assert compile_limit([20.0] * STRAGGLER_SAMPLES, 120.0) == 120.0
    assert compile_limit([20.0] * STRAGGLER_SAMPLES, 10.0) == 10.0  # the cap wins over the floor
