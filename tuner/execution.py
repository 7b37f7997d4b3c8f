"""Running one config on one shape: feasibility → compile → correctness → timing.

Whatever a config does (too big, fails to compile, raises, computes garbage) becomes a
`TrialResult` with a status and a reason; it never stops the run.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch

from tuner.backends import Backend
from tuner.dtypes import DTYPES
from tuner.kernels.base import Kernel
from tuner.shapes import Shape


@dataclass(frozen=True)
class TrialResult:
    status: str  # ok | infeasible | compile_error | runtime_error | wrong
    reason: str | None = None
    p20_ms: float | None = None
    p50_ms: float | None = None
    p80_ms: float | None = None
    tflops: float | None = None
    rel_error: float | None = None
    compile_s: float | None = None

    def as_columns(self) -> dict:
        return asdict(self)


def random_operands(shape: Shape, device: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Fresh random A (M×K) and B (K×N) in the shape's dtype and layout (`t`: a transposed view).

    Never zeros: zeros hide unwritten outputs and can run faster than real data.
    """
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = DTYPES[shape.dtype].torch

    def make(rows, cols, transposed):
        dims = (cols, rows) if transposed else (rows, cols)
        x = torch.randn(dims, generator=gen, device=device, dtype=torch.float32).to(dtype)
        return x.t() if transposed else x

    return make(shape.M, shape.K, shape.layout[0] == "t"), make(shape.K, shape.N,
                                                                 shape.layout[1] == "t")


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref||_F / ||ref||_F in float64; NaN anywhere gives NaN (which fails any bar)."""
    diff = torch.linalg.vector_norm(out.double() - ref)
    return (diff / torch.linalg.vector_norm(ref).clamp_min(1e-300)).item()


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".strip()


def _is_compile_error(e: BaseException) -> bool:
    # CompilationError, OutOfResources and friends all live in triton's own modules.
    return type(e).__module__.split(".")[0] == "triton"


class ShapeBench:
    """Inputs, reference and baseline for one shape, reused by every trial of a study.

    Timing inputs and correctness inputs are separate random draws, so a config is checked
    on data it was not timed on.
    """

    def __init__(self, backend: Backend, shape: Shape, seed: int):
        self.backend, self.shape = backend, shape
        device = backend.torch_device
        self.a, self.b = random_operands(shape, device, seed)
        self.check_a, self.check_b = random_operands(shape, device, seed + 1)
        self.reference = self.check_a.double() @ self.check_b.double()
        self.tolerance = DTYPES[shape.dtype].tolerance
        self.out = torch.empty((shape.M, shape.N), dtype=self.a.dtype, device=device)

    def baseline_ms(self) -> float:
        """torch.matmul (cuBLAS on a GPU) on the same inputs, timed the same way."""
        return self.backend.time(lambda: torch.matmul(self.a, self.b, out=self.out))[1]

    def run(self, kernel: Kernel, config: dict) -> TrialResult:
        reason = kernel.feasible(config, self.a.element_size(), self.backend.info.smem_per_block)
        if reason:
            return TrialResult("infeasible", reason)

        check_out = torch.full_like(self.out, float("nan"))
        start = time.perf_counter()
        try:
            kernel.launch(self.check_a, self.check_b, check_out, config)  # compiles
            self.backend.synchronize()
        except Exception as e:  # noqa: BLE001 - any failure of a config is a recorded trial
            status = "compile_error" if _is_compile_error(e) else "runtime_error"
            return TrialResult(status, _first_line(e))
        compile_s = time.perf_counter() - start

        err = relative_error(check_out, self.reference)
        if not err <= self.tolerance:
            return TrialResult("wrong", f"relative error {err:.3g} > {self.tolerance:g}",
                               rel_error=err, compile_s=compile_s)
        try:
            p20, p50, p80 = self.backend.time(
                lambda: kernel.launch(self.a, self.b, self.out, config))
        except Exception as e:  # noqa: BLE001
            return TrialResult("runtime_error", _first_line(e), rel_error=err,
                               compile_s=compile_s)
        tflops = self.shape.flops / (p50 * 1e-3) / 1e12
        return TrialResult("ok", None, p20, p50, p80, tflops, err, compile_s)
