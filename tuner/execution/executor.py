"""Where the tuner's work runs: a pool of compile workers and one measuring worker per device.

The tuner process never touches CUDA. Configs compile in parallel in `jobs` compile workers,
each under a time limit; the binaries land in Triton's on-disk cache, so the device worker
that then checks and times each config only loads them. A worker that crashes or hangs costs
the trial it held (status `crashed` or `timeout`, with the reason) and is replaced; the run
goes on.
"""
from __future__ import annotations

import collections
import statistics
import threading
from collections.abc import Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from dataclasses import dataclass

from tuner.devices import DeviceInfo
from tuner.execution import measure as execution
from tuner.execution.measure import TrialResult
from tuner.execution.timing import Timing
from tuner.execution.workers import TaskFailed, Worker, WorkerLost
from tuner.shapes import Shape
from tuner.space import config_signature
from tuner.statuses import TrialStatus


@dataclass(frozen=True)
class ExecutorOptions:
    backend: str  # "gpu" | "interpret"
    devices: tuple[int, ...]  # CUDA device indices; the interpreter uses one CPU worker
    jobs: int  # compile workers (GPU backend only: the interpreter compiles nothing)
    compile_timeout_s: float = 120.0
    trial_timeout_s: float = 600.0


# Workers import these as they start, before their first task arrives.
_PRELOAD = ("tuner.execution.measure",)
# Compile workers run this much nicer than the device workers: a core they kept busy would
# slow the host path of the calls a device worker times (host_us and loop_ms of a trial).
COMPILE_NICENESS = 10
# A compile is a straggler once it runs STRAGGLER_FACTOR times longer than the median of the
# run's recent compiles (known once STRAGGLER_SAMPLES have finished), but never below
# STRAGGLER_FLOOR_S.
STRAGGLER_SAMPLES = 8
STRAGGLER_FACTOR = 10.0
STRAGGLER_FLOOR_S = 30.0
RECENT_COMPILES = 64
# At most 1/AHEAD_SHARE of the compile workers compile ahead at once (Executor.submit_compile):
# a study's burst of compiles finds the rest idle, and waits for none of the ahead compiles.
AHEAD_SHARE = 2


def compile_limit(recent_s: Sequence[float], cap_s: float) -> float:
    """Seconds a compile may run: `cap_s` (--compile-timeout), or less once enough compiles
    have finished to tell a straggler. A config compiling ten times longer than its peers
    holds its study back for minutes and is rarely a fast kernel, so it becomes a `timeout`."""
    if len(recent_s) < STRAGGLER_SAMPLES:
        return cap_s
    return min(cap_s, max(STRAGGLER_FLOOR_S, STRAGGLER_FACTOR * statistics.median(recent_s)))


class IdleWorkers:
    """The idle compile workers, and which compile gets one first.

    A study's compile gets the worker idle the shortest time: a worker that compiled lately
    has Triton's driver up and the kernels' sources hashed, which a fresh one pays for
    first, so the few configs of a warm study go to warm workers. A compile ahead (a study
    still to come) waits while any study's compile waits, and then takes the worker idle
    the longest: it only warms Triton's cache with workers the running studies leave idle,
    and never queues a study's compile behind its own. Closed, it hands out no more workers
    (those waiting are cancelled) and closes each worker as it comes back."""

    def __init__(self, workers: Sequence[Worker]):
        self._idle = list(workers)  # the one idle the longest first
        self._studies_waiting = 0
        self._closed = False
        self._changed = threading.Condition()

    def take(self, ahead: bool = False, prefer: Worker | None = None) -> Worker:
        """An idle worker (`prefer` where it is idle), once the rule above allows;
        CancelledError once closed."""
        with self._changed:
            self._studies_waiting += not ahead
            try:
                self._changed.wait_for(lambda: self._closed or self._idle and not (
                    ahead and self._studies_waiting))
            finally:
                self._studies_waiting -= not ahead
            if self._closed:
                raise CancelledError("the executor is closed")
            if prefer not in self._idle:
                prefer = self._idle[0 if ahead else -1]
            self._idle.remove(prefer)
            return prefer

    def put(self, worker: Worker) -> None:
        with self._changed:
            if self._closed:
                worker.close()
                return
            self._idle.append(worker)
            self._changed.notify_all()

    def __len__(self) -> int:
        return len(self._idle)

    def close(self) -> None:
        with self._changed:
            self._closed = True
            for worker in self._idle:
                worker.close()
            self._idle.clear()
            self._changed.notify_all()


def _lost(e: WorkerLost) -> TrialResult:
    reason = str(e)
    return TrialResult(TrialStatus.TIMEOUT if reason.startswith("timeout")
                       else TrialStatus.CRASHED, reason)


class Executor:
    def __init__(self, options: ExecutorOptions):
        self.options = options
        interpret = options.backend == "interpret"
        base_env = {"TRITON_INTERPRET": "1"} if interpret else {}
        slots = (None,) if interpret else options.devices
        self.device_workers = [
            Worker(f"device-{d}", base_env if d is None else {**base_env,
                                                               "CUDA_VISIBLE_DEVICES": str(d)},
                   preload=_PRELOAD)
            for d in slots]
        compilers = [] if interpret else [
            Worker(f"compile-{i}", {"CUDA_VISIBLE_DEVICES": str(options.devices[0])},
                   preload=_PRELOAD, niceness=COMPILE_NICENESS) for i in range(options.jobs)]
        self.idle_compilers = IdleWorkers(compilers)
        # Every worker starts importing now, while the run reads its plans and the device.
        for worker in [*self.device_workers, *compilers]:
            worker.start()
        self.compile_threads = ThreadPoolExecutor(max(1, options.jobs),
                                                  thread_name_prefix="compile")
        self.ahead_threads = ThreadPoolExecutor(max(1, options.jobs // AHEAD_SHARE),
                                                thread_name_prefix="compile-ahead")
        # Which worker compiled a config ahead, until its study asks for it: that worker has
        # the kernel loaded already, where another would read it from Triton's cache.
        self.compiled_ahead: dict[tuple, Worker] = {}
        self.recent_compiles_s: collections.deque[float] = collections.deque(
            maxlen=RECENT_COMPILES)

    @property
    def slots(self) -> int:
        """How many studies can measure at once: one per device worker."""
        return len(self.device_workers)

    def device_info(self) -> DeviceInfo:
        return self.device_workers[0].call(execution.device_info_task, timeout=300)

    # -- compiling ------------------------------------------------------------------------
    def _compile_limit(self) -> float:
        return compile_limit(list(self.recent_compiles_s), self.options.compile_timeout_s)

    def _compile_one(self, shape: Shape, kernel_name: str, config: dict,
                     ahead: bool) -> float | TrialResult:
        compiled = (shape, kernel_name, config_signature(config))
        worker = self.idle_compilers.take(
            ahead, prefer=None if ahead else self.compiled_ahead.pop(compiled, None))
        try:
            # The limit is asked again while the compile runs: one that started before the
            # run knew its typical compile is still cut once it turns out a straggler.
            seconds = worker.call(execution.compile_task, shape, kernel_name, config,
                                  timeout=self._compile_limit)
            self.recent_compiles_s.append(seconds)
            if ahead:
                self.compiled_ahead[compiled] = worker
            return seconds
        except TaskFailed as e:
            return TrialResult(TrialStatus.COMPILE_ERROR, str(e))
        except WorkerLost as e:
            worker.start()  # its replacement imports while the pool works on
            limit, cap = self._compile_limit(), self.options.compile_timeout_s
            if str(e).startswith("timeout") and limit < cap:
                return TrialResult(TrialStatus.TIMEOUT, f"compile outlasted {limit:.0f} s, "
                                   f"{STRAGGLER_FACTOR:g}x the run's median compile "
                                   f"(--compile-timeout {cap:g} s)")
            return _lost(e)
        finally:
            self.idle_compilers.put(worker)

    def submit_compile(self, shape: Shape, kernel_name: str, config: dict,
                       ahead: bool = False) -> Future[float | TrialResult]:
        """Compile one config in the pool; the future holds its seconds or its failed
        TrialResult. Studies keep several in flight, so compiling the next configs overlaps
        measuring the last ones. `ahead`: a config of a study still to come, compiled on
        workers the studies leave idle (IdleWorkers), so that its study's own compile of it
        later finds it in Triton's cache, on the worker that compiled it where that one is
        idle."""
        if self.options.backend == "interpret":  # the interpreter has nothing to compile
            done: Future[float | TrialResult] = Future()
            done.set_result(0.0)
            return done
        threads = self.ahead_threads if ahead else self.compile_threads
        return threads.submit(self._compile_one, shape, kernel_name, config, ahead)

    # -- measuring on a device --------------------------------------------------------------
    def measure(self, slot: int, shape: Shape, seed: int, kernel_name: str,
                config: dict, short: bool = False) -> TrialResult:
        """A config checked and timed (`short`: by the short device measure alone)."""
        try:
            return self.device_workers[slot].call(execution.measure_task, shape, seed,
                                                  kernel_name, config, short,
                                                  timeout=self.options.trial_timeout_s)
        except TaskFailed as e:  # a sticky CUDA error: the worker has exited
            return TrialResult(TrialStatus.CRASHED, f"cuda: {e}")
        except WorkerLost as e:
            return _lost(e)

    def _device_call(self, slot: int, fn, *args):
        """A device task whose failure is not a trial's (baselines, re-timing): None if lost."""
        try:
            return self.device_workers[slot].call(fn, *args, timeout=self.options.trial_timeout_s)
        except (TaskFailed, WorkerLost):
            return None

    def baseline(self, slot: int, shape: Shape, seed: int) -> Timing | None:
        return self._device_call(slot, execution.baseline_task, shape, seed)

    def retime(self, slot: int, shape: Shape, seed: int, kernel_name: str, configs: list[dict],
               launch: str) -> list[Timing] | None:
        """The configs re-timed side by side by the `launch` mode's figure (tuner.objective)."""
        return self._device_call(slot, execution.retime_task, shape, seed, kernel_name, configs,
                                 launch)

    def close(self) -> None:
        for threads in (self.compile_threads, self.ahead_threads):
            threads.shutdown(wait=False, cancel_futures=True)
        for worker in self.device_workers:
            worker.close()
        self.idle_compilers.close()
