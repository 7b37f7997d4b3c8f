"""The executor's compile pool: which worker compiles next, and the rule for compiles that
take far longer than their peers."""
import collections

from tuner.execution.executor import (
    STRAGGLER_FLOOR_S,
    STRAGGLER_SAMPLES,
    Executor,
    ExecutorOptions,
    compile_limit,
    idle_pool,
)
from tuner.shapes import Shape


def test_a_compile_may_run_ten_medians_within_the_floor_and_the_cap():
    assert compile_limit([1.0] * (STRAGGLER_SAMPLES - 1), 120.0) == 120.0  # nothing known yet
    assert compile_limit([1.0] * STRAGGLER_SAMPLES, 120.0) == STRAGGLER_FLOOR_S
    assert compile_limit([2.0, 4.0, 5.0, 5.0, 5.0, 6.0, 9.0, 60.0], 120.0) == 50.0
    assert compile_limit([20.0] * STRAGGLER_SAMPLES, 120.0) == 120.0
    assert compile_limit([20.0] * STRAGGLER_SAMPLES, 10.0) == 10.0  # the cap wins over the floor


class CompileWorker:
    """Stands in for a compile worker: says which one compiled."""

    def __init__(self, name, compiled):
        self.name, self.compiled = name, compiled

    def call(self, fn, *args, timeout):
        self.compiled.append(self.name)
        return 0.5


def test_the_worker_idle_the_shortest_time_compiles_next():
    """A worker that compiled lately is warm (Triton's driver up, the kernels' sources
    hashed): one config after another goes to the same worker, not round the pool."""
    compiled = []
    executor = Executor.__new__(Executor)  # its compile pool alone: no processes
    executor.options = ExecutorOptions("gpu", (0,), 3)
    executor.recent_compiles_s = collections.deque()
    executor.idle_compilers = idle_pool([CompileWorker(name, compiled) for name in "abc"])
    shape, config = Shape(64, 64, 64, "fp16", "nn"), {"variant": "cublas", "pad": 0}
    for _ in range(3):
        assert executor._compile_one(shape, "mm", config) == 0.5
    assert compiled == ["c", "c", "c"] and executor.idle_compilers.qsize() == 3
