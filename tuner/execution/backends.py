"""Where trials run and how they are timed: a real GPU, or Triton's interpreter on the CPU.

Each backend carries the fingerprint its results are stored under, so interpreter timings
(meaningless as speed) never mix with GPU measurements in the database or an export. The
tuner process itself never builds a GPU backend: device workers do (`backend_in_worker`), so
a config that poisons a CUDA context only takes a worker down.
"""
from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from tuner.devices import DeviceInfo, gpu_info, interpreter_info
from tuner.errors import UserError


class NoGpuError(UserError, RuntimeError):
    """The GPU backend was asked for on a machine where torch sees no CUDA device."""


@dataclass(frozen=True)
class Backend:
    name: str  # "gpu" | "interpret"
    torch_device: str
    info: DeviceInfo

    @property
    def gpu(self) -> bool:
        return self.name == "gpu"

    def time(self, launch: Callable[[int], None], n_sets: int, short: bool = False):
        """A tuner.execution.timing.Timing of launch(i) over the n_sets equivalent input sets;
        `short`: the short measure's fewer samples, taken the same way."""
        from tuner.execution.timing import SHORT_MIN_RUNS, SHORT_TIME_MS, time_cpu, time_gpu
        if not self.gpu:
            return time_cpu(launch, n_sets, runs=1 if short else 3)
        if short:
            return time_gpu(launch, n_sets, min_runs=SHORT_MIN_RUNS, min_time_ms=SHORT_TIME_MS)
        return time_gpu(launch, n_sets)

    def synchronize(self) -> None:
        if self.gpu:
            torch.cuda.synchronize(self.torch_device)


def require_gpu() -> None:
    """NoGpuError unless torch sees a CUDA device (checked without creating a context)."""
    if not torch.cuda.is_available():
        raise NoGpuError("no CUDA GPU visible (torch.cuda.is_available() is False); "
                         "use --backend interpret to run on the CPU through Triton's interpreter")


def visible_gpus() -> list[int]:
    return list(range(torch.cuda.device_count()))


def gpu_backend(index: int = 0) -> Backend:
    """The CUDA device `index` of this process."""
    require_gpu()
    return Backend("gpu", f"cuda:{index}", gpu_info(index))


def interpreter_backend() -> Backend:
    """Triton's interpreter on the CPU: correctness is real, timings are only the interpreter's.

    TRITON_INTERPRET must be set before triton is first imported; workers get it in their
    environment.
    """
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("TRITON_INTERPRET=1 must be set before triton is imported")
    return Backend("interpret", "cpu", interpreter_info())


@functools.cache
def backend_in_worker() -> Backend:
    """This worker's backend: the interpreter if TRITON_INTERPRET=1, else its one visible GPU."""
    return interpreter_backend() if os.environ.get("TRITON_INTERPRET") == "1" else gpu_backend(0)
