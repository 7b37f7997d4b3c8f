"""Where the tuner's work runs: a pool of compile workers and one measuring worker per device.

The tuner process never touches CUDA. Compiling a batch of configs happens in parallel in
`jobs` compile workers, each under a time limit; the binaries land in Triton's on-disk cache,
so the device worker that then checks and times each config only loads them. A worker that
crashes or hangs costs the trial it held (status `crashed` or `timeout`, with the reason) and
is replaced; the run goes on.
"""
from __future__ import annotations

import queue
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tuner import execution
from tuner.backends import DeviceInfo
from tuner.execution import TrialResult
from tuner.shapes import Shape
from tuner.timing import Timing
from tuner.workers import TaskFailed, Worker, WorkerLost


@dataclass(frozen=True)
class ExecutorOptions:
    backend: str  # "gpu" | "interpret"
    devices: tuple[int, ...]  # CUDA device indices; the interpreter uses one CPU worker
    jobs: int  # compile workers (GPU backend only: the interpreter compiles nothing)
    compile_timeout_s: float = 120.0
    trial_timeout_s: float = 600.0


def _lost(e: WorkerLost) -> TrialResult:
    reason = str(e)
    return TrialResult("timeout" if reason.startswith("timeout") else "crashed", reason)


class Executor:
    def __init__(self, options: ExecutorOptions):
        self.options = options
        interpret = options.backend == "interpret"
        base_env = {"TRITON_INTERPRET": "1"} if interpret else {}
        slots = (None,) if interpret else options.devices
        self.device_workers = [
            Worker(f"device-{d}", base_env if d is None else {**base_env,
                                                               "CUDA_VISIBLE_DEVICES": str(d)})
            for d in slots]
        self.idle_compilers: queue.Queue[Worker] = queue.Queue()
        if not interpret:
            for i in range(options.jobs):
                self.idle_compilers.put(Worker(f"compile-{i}",
                                               {"CUDA_VISIBLE_DEVICES": str(options.devices[0])}))
        self.compile_threads = ThreadPoolExecutor(max(1, options.jobs))

    @property
    def slots(self) -> int:
        """How many studies can measure at once: one per device worker."""
        return len(self.device_workers)

    def device_info(self) -> DeviceInfo:
        return self.device_workers[0].call(execution.device_info_task, timeout=300)

    # -- compiling ------------------------------------------------------------------------
    def _compile_one(self, shape: Shape, kernel_name: str, config: dict) -> float | TrialResult:
        worker = self.idle_compilers.get()
        try:
            return worker.call(execution.compile_task, shape, kernel_name, config,
                               timeout=self.options.compile_timeout_s)
        except TaskFailed as e:
            return TrialResult("compile_error", str(e))
        except WorkerLost as e:
            return _lost(e)
        finally:
            self.idle_compilers.put(worker)

    def compile(self, shape: Shape, kernel_name: str,
                configs: list[dict]) -> list[float | TrialResult]:
        """Per config: compile seconds, or the failed TrialResult. In parallel, in order."""
        if self.options.backend == "interpret":  # the interpreter has nothing to compile
            return [0.0] * len(configs)
        futures = [self.compile_threads.submit(self._compile_one, shape, kernel_name, c)
                   for c in configs]
        return [f.result() for f in futures]

    # -- measuring on a device --------------------------------------------------------------
    def measure(self, slot: int, shape: Shape, seed: int, kernel_name: str,
                config: dict) -> TrialResult:
        try:
            return self.device_workers[slot].call(execution.measure_task, shape, seed,
                                                  kernel_name, config,
                                                  timeout=self.options.trial_timeout_s)
        except TaskFailed as e:  # a sticky CUDA error: the worker has exited
            return TrialResult("crashed", f"cuda: {e}")
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

    def retime(self, slot: int, shape: Shape, seed: int, kernel_name: str,
               configs: list[dict]) -> list[Timing] | None:
        return self._device_call(slot, execution.retime_task, shape, seed, kernel_name, configs)

    def close(self) -> None:
        self.compile_threads.shutdown(wait=False, cancel_futures=True)
        for worker in self.device_workers:
            worker.close()
        while not self.idle_compilers.empty():
            self.idle_compilers.get().close()
