"""Measuring configs on one shape, inside a device worker: correctness, then timing.

`ShapeBench` owns the inputs of one shape: timing inputs (several equivalent sets when the
problem is small, so rotating through them keeps it out of L2), separate inputs for the
correctness check, and the float64 reference. The module-level `*_task` functions are what
the tuner sends to a device worker (tuner.workers); the worker keeps the bench of its current
shape between tasks.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import torch

from tuner.backends import Backend, backend_in_worker
from tuner.dtypes import DTYPES
from tuner.kernels import KERNELS
from tuner.shapes import Shape
from tuner.timing import Timing, retime_interleaved
from tuner.workers import is_sticky_cuda_error, one_line

# Small problems get this many bytes of rotating input sets (a few times any Hopper L2),
# so that timed runs read operands from device memory, as they would in a model.
ROTATION_BYTES = 256 * 2**20
MAX_INPUT_SETS = 16


@dataclass(frozen=True)
class TrialResult:
    status: str  # ok | infeasible | compile_error | timeout | runtime_error | crashed | wrong
    reason: str | None = None
    p20_ms: float | None = None
    p50_ms: float | None = None
    p80_ms: float | None = None
    tflops: float | None = None
    rel_error: float | None = None
    compile_s: float | None = None
    timing_method: str | None = None

    def as_columns(self) -> dict:
        return asdict(self)


def _laid_out(shape: Shape, allocate) -> tuple[torch.Tensor, torch.Tensor]:
    """A (M×K) and B (K×N) in the shape's layout: a `t` operand is the transposed view of
    storage allocated the other way round. allocate(dims) makes the storage."""
    def operand(rows, cols, transposed):
        return allocate((cols, rows)).t() if transposed else allocate((rows, cols))

    return (operand(shape.M, shape.K, shape.layout[0] == "t"),
            operand(shape.K, shape.N, shape.layout[1] == "t"))


def random_operands(shape: Shape, device: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Fresh random A and B in the shape's dtype and layout.

    Never zeros: zeros hide unwritten outputs and can run faster than real data.
    """
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = DTYPES[shape.dtype].torch
    return _laid_out(shape, lambda dims: torch.randn(dims, generator=gen, device=device,
                                                     dtype=torch.float32).to(dtype))


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref||_F / ||ref||_F in float64; NaN anywhere gives NaN (which fails any bar)."""
    diff = torch.linalg.vector_norm(out.double() - ref)
    return (diff / torch.linalg.vector_norm(ref).clamp_min(1e-300)).item()


def meta_operands(shape: Shape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A, B, out as meta tensors (shapes, strides, dtype; no data): what a compile needs."""
    dtype = DTYPES[shape.dtype].torch

    def allocate(dims):
        return torch.empty(dims, dtype=dtype, device="meta")

    return (*_laid_out(shape, allocate), allocate((shape.M, shape.N)))


class ShapeBench:
    """Inputs, reference and baselines for one shape, reused by every trial of a study."""

    def __init__(self, backend: Backend, shape: Shape, seed: int):
        self.backend, self.shape = backend, shape
        device = backend.torch_device
        itemsize = DTYPES[shape.dtype].torch.itemsize
        set_bytes = (shape.M * shape.K + shape.K * shape.N + shape.M * shape.N) * itemsize
        n_sets = (min(MAX_INPUT_SETS, max(1, math.ceil(ROTATION_BYTES / set_bytes)))
                  if backend.gpu else 1)
        self.sets = []
        for i in range(n_sets):
            a, b = random_operands(shape, device, seed + 2 + i)
            self.sets.append((a, b, torch.empty((shape.M, shape.N), dtype=a.dtype,
                                                device=device)))
        self.check_a, self.check_b = random_operands(shape, device, seed + 1)
        self.reference = self.check_a.double() @ self.check_b.double()
        self.tolerance = DTYPES[shape.dtype].tolerance

    def _launcher(self, kernel, config):
        def launch(i):
            a, b, out = self.sets[i]
            kernel.launch(a, b, out, config)
        return launch

    def _tflops(self, timing: Timing) -> float:
        return self.shape.flops / (timing.p50_ms * 1e-3) / 1e12

    def baseline(self) -> Timing:
        """torch.matmul (cuBLAS on a GPU) on the same inputs, timed the same way."""
        def launch(i):
            a, b, out = self.sets[i]
            torch.matmul(a, b, out=out)
        return self.backend.time(launch, len(self.sets))

    def run(self, kernel_name: str, config: dict) -> TrialResult:
        """Correctness on the check inputs (first launch, compiling if not cached), then timing."""
        kernel = KERNELS[kernel_name]
        check_out = torch.full((self.shape.M, self.shape.N), float("nan"),
                               dtype=self.check_a.dtype, device=self.backend.torch_device)
        start = time.perf_counter()
        kernel.launch(self.check_a, self.check_b, check_out, config)
        self.backend.synchronize()
        first_launch_s = time.perf_counter() - start
        err = relative_error(check_out, self.reference)
        if not err <= self.tolerance:
            return TrialResult("wrong", f"relative error {err:.3g} > {self.tolerance:g}",
                               rel_error=err, compile_s=first_launch_s)
        timing = self.backend.time(self._launcher(kernel, config), len(self.sets))
        return TrialResult("ok", None, timing.p20_ms, timing.p50_ms, timing.p80_ms,
                           self._tflops(timing), err, None, timing.method)

    def retime(self, kernel_name: str, configs: list[dict]) -> list[Timing]:
        kernel = KERNELS[kernel_name]
        return retime_interleaved([self._launcher(kernel, c) for c in configs], len(self.sets),
                                  gpu=self.backend.gpu)


# -- tasks run inside a device worker -------------------------------------------------------
_bench: ShapeBench | None = None
_bench_key = None


def _bench_for(shape: Shape, seed: int) -> ShapeBench:
    global _bench, _bench_key
    if _bench_key != (shape, seed):
        _bench = None  # free the previous shape's buffers before allocating the next
        _bench = ShapeBench(backend_in_worker(), shape, seed)
        _bench_key = (shape, seed)
    return _bench


def measure_task(shape: Shape, seed: int, kernel_name: str, config: dict) -> TrialResult:
    """A trial's result, whatever the config does short of poisoning the CUDA context.

    A sticky CUDA error is re-raised: the worker reports it and exits (tuner.workers).
    """
    try:
        return _bench_for(shape, seed).run(kernel_name, config)
    except Exception as e:  # noqa: BLE001 - every failure of a config is a recorded trial
        if is_sticky_cuda_error(str(e)):
            raise
        # CompilationError, OutOfResources and friends all live in triton's own modules.
        triton_error = type(e).__module__.split(".")[0] == "triton"
        return TrialResult("compile_error" if triton_error else "runtime_error", one_line(e))


def baseline_task(shape: Shape, seed: int) -> Timing:
    return _bench_for(shape, seed).baseline()


def retime_task(shape: Shape, seed: int, kernel_name: str, configs: list[dict]) -> list[Timing]:
    return _bench_for(shape, seed).retime(kernel_name, configs)


def compile_task(shape: Shape, kernel_name: str, config: dict) -> float:
    """Compile one config for this shape's exact specialization; returns seconds taken."""
    start = time.perf_counter()
    KERNELS[kernel_name].compile(*meta_operands(shape), config)
    return time.perf_counter() - start


def device_info_task():
    return backend_in_worker().info
