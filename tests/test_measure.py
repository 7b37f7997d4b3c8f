"""The correctness check every trial starts with (tuner.execution.measure.ShapeBench), on
this process's device: cuBLAS's product passes, an output left unwritten or wrong fails."""
import math

import pytest

from tuner.execution.in_process import this_process
from tuner.execution.measure import ShapeBench
from tuner.kernels import KERNELS
from tuner.shapes import Shape
from tuner.statuses import TrialStatus

SHAPE = Shape(48, 32, 64, "bf16", "nt")
CUBLAS = {"variant": "cublas", "pad": 0}


class Writes:
    """A kernel whose launch leaves the output as `fill` left it (None: untouched)."""

    def __init__(self, fill: float | None):
        self.fill = fill

    def launch(self, gemm, config) -> None:
        if self.fill is not None:
            gemm.out.fill_(self.fill)


@pytest.fixture
def bench() -> ShapeBench:
    return ShapeBench(this_process(), SHAPE, seed=0)


def test_bench_check_error_passes_cublas(bench):
    err, launch_s = bench.check_error("mm", CUBLAS)
    assert err <= bench.tolerance and launch_s >= 0


@pytest.mark.parametrize("fill", [None, 0.0])
def test_bench_check_error_fails_an_unwritten_or_wrong_output(bench, monkeypatch, fill):
    monkeypatch.setitem(KERNELS, "scripted", Writes(fill))
    bench.check_error("mm", CUBLAS)  # a right output left behind must not hide the next
    err, _ = bench.check_error("scripted", CUBLAS)
    assert math.isnan(err) if fill is None else err == pytest.approx(1.0)
    result = bench.run("scripted", CUBLAS)
    assert result.status == TrialStatus.WRONG and result.reason.startswith("relative error")
