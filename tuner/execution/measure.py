"""Measuring configs on one shape, inside a device worker: correctness, then timing.

`ShapeBench` owns the inputs of one shape: timing inputs (several equivalent sets when the
problem is small, so rotating through them keeps it out of L2), separate inputs for the
correctness check, and the float64 reference. The module-level `*_task` functions are what
the tuner sends to a device worker
(tuner.execution.workers); the worker keeps the bench of its current
shape between tasks.

A trial measures a config twice on the same inputs: its device time (tuner.execution.timing),
and its call as the dispatcher makes it, back to back (host µs and ms per call through a final
synchronize), so that a study can optimise either (tuner.objective).
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import torch

from tuner.dtypes import DTYPES
from tuner.execution.backends import Backend, backend_in_worker
from tuner.execution.timing import (
    CallLoop,
    Timing,
    call_loop,
    retime_calls,
    retime_interleaved,
    time_calls,
)
from tuner.execution.workers import is_sticky_cuda_error, one_line
from tuner.kernels import KERNELS
from tuner.kernels.base import Gemm, Kernel
from tuner.kernels.calls import fp8_scales, laid_out, meta_gemm
from tuner.kernels.launches import prepare
from tuner.objective import GRAPH
from tuner.shapes import Shape
from tuner.statuses import TrialStatus

# Small problems get this many bytes of rotating input sets (a few times any Hopper L2),
# so that timed runs read operands from device memory, as they would in a model.
ROTATION_BYTES = 256 * 2**20
MAX_INPUT_SETS = 16


@dataclass(frozen=True)
class TrialResult:
    status: TrialStatus
    reason: str | None = None
    p20_ms: float | None = None
    p50_ms: float | None = None
    p80_ms: float | None = None
    tflops: float | None = None
    rel_error: float | None = None
    compile_s: float | None = None
    timing_method: str | None = None
    host_us: float | None = None  # host time per back-to-back call of the launch path
    loop_ms: float | None = None  # wall time per back-to-back call, final synchronize included
    loop_p20_ms: float | None = None  # the spread of loop_ms's samples (its p20 and p80)
    loop_p80_ms: float | None = None

    def __post_init__(self) -> None:  # a status given as its stored string is the enum too
        object.__setattr__(self, "status", TrialStatus(self.status))

    def as_columns(self) -> dict:
        return asdict(self)


def random_operands(shape: Shape, device: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Fresh random A and B in the shape's dtype and layout.

    Never zeros: zeros hide unwritten outputs and can run faster than real data.
    """
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = DTYPES[shape.dtype].torch
    return laid_out(shape, lambda dims: torch.randn(dims, generator=gen, device=device,
                                                     dtype=torch.float32).to(dtype))


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref||_F / ||ref||_F in float64; NaN anywhere gives NaN (which fails any bar)."""
    diff = torch.linalg.vector_norm(out.double() - ref)
    return (diff / torch.linalg.vector_norm(ref).clamp_min(1e-300)).item()


def random_gemm(shape: Shape, device: str, seed: int) -> Gemm:
    """A GEMM of the shape on fresh random operands, with an uninitialised output (and fixed
    scales for fp8, where random inputs already exercise every code path)."""
    a, b = random_operands(shape, device, seed)
    out = torch.empty((shape.M, shape.N), dtype=DTYPES[shape.dtype].out, device=device)
    return Gemm(a, b, out, **fp8_scales(shape, lambda v: torch.tensor([v], device=device)))


def reference(gemm: Gemm) -> torch.Tensor:
    """The exact product of the input values, in float64 (scales and bias included)."""
    a, b = gemm.a.double(), gemm.b.double()
    if gemm.scale_a is not None:
        a, b = a * gemm.scale_a.double(), b * gemm.scale_b.double()
    ref = a @ b
    return ref if gemm.bias is None else ref + gemm.bias.double()


def timing_sets(shape: Shape, device: str, seed: int) -> list[Gemm]:
    """Equivalent random GEMMs to time on in rotation: on a GPU, as many as it takes (at most
    MAX_INPUT_SETS) to exceed ROTATION_BYTES together, so no timed run finds its operands in
    L2; one on the CPU. Seeds seed, seed + 1, ..."""
    dtype = DTYPES[shape.dtype]
    set_bytes = ((shape.M * shape.K + shape.K * shape.N) * dtype.torch.itemsize
                 + shape.M * shape.N * dtype.out.itemsize)
    n_sets = (min(MAX_INPUT_SETS, max(1, math.ceil(ROTATION_BYTES / set_bytes)))
              if device != "cpu" else 1)
    return [random_gemm(shape, device, seed + i) for i in range(n_sets)]


class ShapeBench:
    """Inputs, reference and baselines for one shape, reused by every trial of a study."""

    def __init__(self, backend: Backend, shape: Shape, seed: int):
        self.backend, self.shape = backend, shape
        self.sets = timing_sets(shape, backend.torch_device, seed + 2)
        self.check = random_gemm(shape, backend.torch_device, seed + 1)
        self.reference = reference(self.check)
        self.tolerance = DTYPES[shape.dtype].tolerance

    def _launcher(self, kernel, config):
        def launch(i):
            kernel.launch(self.sets[i], config)
        return launch

    def _call_loop(self, kernel: Kernel, config: dict) -> CallLoop:
        """The config's call as the dispatcher makes it (recorded once on the first input
        set, then replayed where it can be, into a new output per call), ready to time back
        to back over the sets."""
        run = prepare(kernel, config, self.sets[0]).as_repeated(self.sets[0])
        return call_loop(run, self.sets, self.backend.synchronize, gpu=self.backend.gpu)

    def _tflops(self, timing: Timing) -> float:
        return self.shape.flops / (timing.p50_ms * 1e-3) / 1e12

    def baseline(self) -> Timing | None:
        """cuBLAS (torch.matmul; torch._scaled_mm for fp8) on the same inputs, timed the same
        way. None where torch has no such GEMM: _scaled_mm takes only row-major A with
        column-major B (the `nt` layout)."""
        def launch(i):
            g = self.sets[i]
            if g.scale_a is None:
                torch.matmul(g.a, g.b, out=g.out)
            else:
                torch._scaled_mm(g.a, g.b, g.scale_a, g.scale_b, out_dtype=g.out.dtype,
                                 out=g.out)
        try:
            launch(0)
        except RuntimeError:
            return None
        return self.backend.time(launch, len(self.sets))

    def check_error(self, kernel_name: str, config: dict) -> tuple[float, float]:
        """The config's relative error on the check inputs against the float64 reference, and
        the seconds its launch took (compiling if not cached). Apart from `run` so that a
        benchmark checks a config by the tuner's own rule."""
        kernel = KERNELS[kernel_name]
        check_out = self.check.out.fill_(float("nan"))  # anything left unwritten fails
        start = time.perf_counter()
        kernel.launch(self.check, config)
        self.backend.synchronize()
        launch_s = time.perf_counter() - start
        return relative_error(check_out, self.reference), launch_s

    def run(self, kernel_name: str, config: dict, short: bool = False) -> TrialResult:
        """Correctness on the check inputs (first launch, compiling if not cached), then
        device time, then the cost of back-to-back calls; `short`: a short device measure
        alone (no call loop), for a study to judge whether the full one is worth taking."""
        kernel = KERNELS[kernel_name]
        err, first_launch_s = self.check_error(kernel_name, config)
        if not err <= self.tolerance:
            return TrialResult(TrialStatus.WRONG, f"relative error {err:.3g} > {self.tolerance:g}",
                               rel_error=err, compile_s=first_launch_s)
        timing = self.backend.time(self._launcher(kernel, config), len(self.sets), short)
        if short:
            return TrialResult(TrialStatus.OK, None, timing.p20_ms, timing.p50_ms, timing.p80_ms,
                               self._tflops(timing), err, None, timing.method)
        loop = self._call_loop(kernel, config)
        calls, spread = time_calls(loop), loop.timing()
        return TrialResult(TrialStatus.OK, None, timing.p20_ms, timing.p50_ms, timing.p80_ms,
                           self._tflops(timing), err, None, timing.method, calls.host_us,
                           calls.loop_ms, spread.p20_ms, spread.p80_ms)

    def retime(self, kernel_name: str, configs: list[dict], launch: str) -> list[Timing]:
        """The configs re-timed side by side by the figure `launch` ranks (tuner.objective):
        device time for graph, ms per back-to-back call for eager."""
        kernel = KERNELS[kernel_name]
        if launch == GRAPH:
            return retime_interleaved([self._launcher(kernel, c) for c in configs],
                                      len(self.sets), gpu=self.backend.gpu)
        return retime_calls([self._call_loop(kernel, c) for c in configs])


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


def measure_task(shape: Shape, seed: int, kernel_name: str, config: dict,
                 short: bool = False) -> TrialResult:
    """A trial's result (`short`: of the short measure alone), whatever the config does short
    of poisoning the CUDA context.

    A sticky CUDA error is re-raised: the worker reports it and exits (tuner.execution.workers).
    """
    try:
        return _bench_for(shape, seed).run(kernel_name, config, short)
    except Exception as e:  # noqa: BLE001 - every failure of a config is a recorded trial
        if is_sticky_cuda_error(str(e)):
            raise
        # CompilationError, OutOfResources and friends all live in triton's own modules.
        triton_error = type(e).__module__.split(".")[0] == "triton"
        return TrialResult(TrialStatus.COMPILE_ERROR if triton_error
                           else TrialStatus.RUNTIME_ERROR, one_line(e))


def baseline_task(shape: Shape, seed: int) -> Timing | None:
    return _bench_for(shape, seed).baseline()


def retime_task(shape: Shape, seed: int, kernel_name: str, configs: list[dict],
                launch: str) -> list[Timing]:
    return _bench_for(shape, seed).retime(kernel_name, configs, launch)


def compile_task(shape: Shape, kernel_name: str, config: dict) -> float:
    """Compile one config for this shape's exact specialization; returns seconds taken."""
    start = time.perf_counter()
    KERNELS[kernel_name].compile(meta_gemm(shape), config)
    return time.perf_counter() - start


def device_info_task():
    return backend_in_worker().info
