"""The executor's compile pool: which worker compiles next, a study's compiles before those
ahead of their study, and the rule for compiles that take far longer than their peers."""
import collections
import threading
from concurrent.futures import CancelledError, ThreadPoolExecutor

import pytest

from tuner.execution.executor import (
    STRAGGLER_FLOOR_S,
    STRAGGLER_SAMPLES,
    Executor,
    ExecutorOptions,
    IdleWorkers,
    compile_limit,
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
    executor = pool([CompileWorker(name, compiled) for name in "abc"])
    for _ in range(3):
        assert executor._compile_one(SHAPE, "mm", TILE, ahead=False) == 0.5
    assert compiled == ["c", "c", "c"] and len(executor.idle_compilers) == 3


SHAPE = Shape(64, 64, 64, "fp16", "nn")
TILE = {"variant": "general", "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8,
        "num_warps": 4, "num_stages": 2, "pad": 0}


def pool(workers, ahead_threads: int = 1) -> Executor:
    """An Executor with its compile pool alone: these workers, no processes."""
    executor = Executor.__new__(Executor)
    executor.options = ExecutorOptions("gpu", (0,), len(workers))
    executor.recent_compiles_s = collections.deque()
    executor.compiled_ahead = {}
    executor.idle_compilers = IdleWorkers(workers)
    executor.compile_threads = ThreadPoolExecutor(len(workers))
    executor.ahead_threads = ThreadPoolExecutor(ahead_threads)
    return executor


class HeldWorker(CompileWorker):
    """A compile worker whose compiles end when the test lets them."""

    def __init__(self, name, compiled):
        super().__init__(name, compiled)
        self.release = threading.Event()

    def call(self, fn, shape, kernel_name, config, timeout):
        assert self.release.wait(10)
        self.compiled.append((config["BLOCK_M"], self.name))
        return 0.5

    def close(self):
        pass


def until(condition) -> None:
    """Waits (up to 5 s) for the compile threads to get where `condition` says."""
    for _ in range(1000):
        if condition():
            return
        threading.Event().wait(0.005)


def test_a_studys_compile_never_waits_behind_a_compile_ahead():
    """With the one worker busy and a compile ahead waiting for it, a study's compile
    submitted after it still gets the worker first: compiles ahead only use idle workers."""
    compiled = []
    worker = HeldWorker("a", compiled)
    executor = pool([worker], ahead_threads=2)
    idle = executor.idle_compilers
    first = executor.submit_compile(SHAPE, "mm", {**TILE, "BLOCK_M": 16}, ahead=True)
    until(lambda: not len(idle))
    later = executor.submit_compile(SHAPE, "mm", {**TILE, "BLOCK_M": 32}, ahead=True)
    own = executor.submit_compile(SHAPE, "mm", {**TILE, "BLOCK_M": 64})
    until(lambda: idle._studies_waiting)
    worker.release.set()
    assert [f.result(10) for f in (first, later, own)] == [0.5] * 3
    assert [m for m, _ in compiled] == [16, 64, 32]


def test_a_config_compiled_ahead_is_compiled_again_on_the_worker_that_has_it():
    """Its study still compiles it (the cache warmed ahead is no part of correctness), on
    the worker that compiled it ahead, though another was idle a shorter time; compiles
    ahead take the worker idle the longest, leaving the warm ones to the studies."""
    compiled = []
    workers = [HeldWorker(name, compiled) for name in "abc"]
    for worker in workers:
        worker.release.set()
    executor = pool(workers)
    assert executor.submit_compile(SHAPE, "mm", TILE, ahead=True).result(10) == 0.5
    idle = executor.idle_compilers
    idle.put(idle.take(prefer=workers[2]))  # "c" compiled since: the warmest
    executor.submit_compile(SHAPE, "mm", TILE).result(10)
    assert compiled == [(64, "a"), (64, "a")] and not executor.compiled_ahead
    executor.submit_compile(SHAPE, "mm", {**TILE, "BLOCK_M": 16}, ahead=True).result(10)
    assert compiled[-1] == (16, "b")


def test_closing_the_pool_cancels_the_compiles_waiting_for_a_worker():
    compiled = []
    worker = HeldWorker("a", compiled)
    executor = pool([worker])
    running = executor.submit_compile(SHAPE, "mm", TILE)
    until(lambda: not len(executor.idle_compilers))
    queued = executor.submit_compile(SHAPE, "mm", {**TILE, "BLOCK_M": 16}, ahead=True)
    executor.idle_compilers.close()
    with pytest.raises(CancelledError):
        queued.result(10)
    worker.release.set()
    assert running.result(10) == 0.5 and len(executor.idle_compilers) == 0
