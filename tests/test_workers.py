"""Supervised workers: whatever a task does to its process, the caller gets one line and the
next task gets a working process."""
import os

import pytest

from tests import worker_tasks as tasks
from tuner.execution.workers import TaskFailed, Worker, WorkerLost


@pytest.fixture
def worker():
    w = Worker("test", {"GEMM_TUNER_TEST_VAR": "42"})
    yield w
    w.close()


def test_results_environment_and_raised_errors(worker):
    assert worker.call(tasks.add, 2, 3, timeout=120) == 5
    assert worker.call(tasks.environment, "GEMM_TUNER_TEST_VAR", timeout=30) == "42"
    with pytest.raises(TaskFailed, match=r"^ValueError: bad config$"):
        worker.call(tasks.raise_value_error, timeout=30)
    first = worker.call(tasks.pid, timeout=30)
    assert worker.call(tasks.pid, timeout=30) == first  # an ordinary error keeps the worker


@pytest.mark.parametrize("task, reason", [
    (tasks.segfault, r"^worker killed by SIGSEGV$"),
    pytest.param(tasks.hang, r"^timeout after 2 s$", marks=pytest.mark.slow),
])
def test_a_dead_or_hung_worker_is_replaced(worker, task, reason):
    before = worker.call(tasks.pid, timeout=120)
    with pytest.raises(WorkerLost, match=reason):
        worker.call(task, timeout=2)
    assert worker.call(tasks.pid, timeout=120) != before
    assert worker.call(tasks.add, 1, 1, timeout=30) == 2


def test_a_sticky_cuda_error_retires_the_worker(worker):
    before = worker.call(tasks.pid, timeout=120)
    with pytest.raises(TaskFailed, match="illegal memory access"):
        worker.call(tasks.sticky_cuda_error, timeout=30)
    assert worker.call(tasks.pid, timeout=120) != before


@pytest.mark.slow
def test_a_time_limit_that_tightens_while_the_task_runs(worker):
    """The executor's straggler rule: a limit read again during the call cuts a task that
    started under a looser one."""
    worker.call(tasks.pid, timeout=120)  # started and imported: the next call only hangs
    limits = iter([60.0, 60.0])
    with pytest.raises(WorkerLost, match=r"^timeout after 1 s$"):
        worker.call(tasks.hang, timeout=lambda: next(limits, 1.0))


def test_a_nicer_worker_runs_at_lower_cpu_priority():
    nicer = Worker("nicer", niceness=5)
    try:
        assert nicer.call(os.nice, 0, timeout=120) == os.nice(0) + 5
    finally:
        nicer.close()
