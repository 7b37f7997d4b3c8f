"""Where trials run and how they are timed: a real GPU, or Triton's interpreter on the CPU.

Each backend carries the fingerprint its results are stored under, so interpreter timings
(meaningless as speed) never mix with GPU measurements in the database or an export.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch

# Hopper's opt-in shared memory per block: the interpreter applies the same feasibility
# check as an H100/H200, so a space behaves alike on both backends.
HOPPER_SMEM_PER_BLOCK = 232448
QUANTILES = (0.2, 0.5, 0.8)


class NoGpuError(RuntimeError):
    """The GPU backend was asked for on a machine where torch sees no CUDA device."""


@dataclass(frozen=True)
class DeviceInfo:
    name: str
    compute_capability: str
    sm_count: int
    smem_per_block: int
    driver: str
    cuda: str
    torch_version: str
    triton_version: str

    @property
    def fingerprint(self) -> str:
        """Same hardware and software stack, same fingerprint: results are comparable."""
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Backend:
    name: str
    torch_device: str
    info: DeviceInfo
    # timing method, stored with every trial
    method: str
    # time(fn) -> (p20, p50, p80) in milliseconds
    time: Callable[[Callable[[], object]], tuple[float, float, float]]

    def synchronize(self) -> None:
        if self.torch_device.startswith("cuda"):
            torch.cuda.synchronize(self.torch_device)


def _triton_version() -> str:
    import triton
    return triton.__version__


def _driver_version() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


def gpu_backend(index: int = 0) -> Backend:
    """The CUDA device `index`, timed with triton.testing.do_bench (median, L2 flushed)."""
    if not torch.cuda.is_available():
        raise NoGpuError("no CUDA GPU visible (torch.cuda.is_available() is False); "
                         "use --backend interpret to run on the CPU through Triton's interpreter")
    import triton
    import triton.testing

    props = torch.cuda.get_device_properties(index)
    smem = triton.runtime.driver.active.utils.get_device_properties(index)["max_shared_mem"]
    info = DeviceInfo(
        name=props.name, compute_capability=f"{props.major}.{props.minor}",
        sm_count=props.multi_processor_count, smem_per_block=smem, driver=_driver_version(),
        cuda=torch.version.cuda or "unknown", torch_version=torch.__version__,
        triton_version=triton.__version__)
    device = f"cuda:{index}"

    def time_gpu(fn):
        with torch.cuda.device(index):
            return tuple(triton.testing.do_bench(fn, quantiles=list(QUANTILES)))

    return Backend("gpu", device, info,
                   "triton.testing.do_bench quantiles (p20/p50/p80), L2 flushed per run",
                   time_gpu)


def interpreter_backend(repeats: int = 3) -> Backend:
    """Triton's interpreter on the CPU: correctness is real, timings are only the interpreter's.

    TRITON_INTERPRET must be set before triton is first imported; the CLI does it.
    """
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("TRITON_INTERPRET=1 must be set before triton is imported")
    info = DeviceInfo(
        name="cpu-interpreter", compute_capability="none", sm_count=os.cpu_count() or 1,
        smem_per_block=HOPPER_SMEM_PER_BLOCK, driver="none", cuda="none",
        torch_version=torch.__version__, triton_version=_triton_version())

    def time_cpu(fn):
        fn()
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e3)
        q = statistics.quantiles(samples, n=10, method="inclusive")
        return q[1], statistics.median(samples), q[7]

    return Backend("interpret", "cpu", info,
                   f"interpreter wall clock over {repeats} runs on {platform.machine()}",
                   time_cpu)
