"""Timing: quantiles, ties, the interpreter's wall clock, interleaved re-timing, and on a GPU
the two measurement methods (flushed launches between events, CUDA-graph replays)."""
import statistics
import time

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tuner.execution.timing import (
    LOOP_SAMPLES,
    CallLoop,
    Timing,
    retime_interleaved,
    time_calls,
    time_cpu,
    time_gpu,
)
from tuner.objective import is_tie


def timing(p20, p50, p80):
    return Timing(p20, p50, p80, runs=10, method="test")


@pytest.mark.parametrize("samples, quantiles", [
    ([2.0], (2.0, 2.0, 2.0)),
    ([3.0, 1.0], (1.4, 2.0, 2.6)),
    ([float(x) for x in range(10, 0, -1)], (2.8, 5.5, 8.2)),
])
def test_quantiles_of_known_samples(samples, quantiles):
    t = Timing.from_samples(samples, "m")
    assert (t.p20_ms, t.p50_ms, t.p80_ms) == pytest.approx(quantiles)
    assert t.runs == len(samples) and t.method == "m"


@given(st.lists(st.floats(0, 1e3), min_size=2, max_size=50))
def test_quantiles_agree_with_statistics_inclusive(samples):
    t = Timing.from_samples(samples, "m")
    deciles = statistics.quantiles(samples, n=10, method="inclusive")
    assert t.p20_ms == pytest.approx(deciles[1])
    assert t.p50_ms == pytest.approx(statistics.median(samples))
    assert t.p80_ms == pytest.approx(deciles[7])
    assert t.p20_ms <= t.p50_ms <= t.p80_ms


def test_no_samples_is_an_error():
    with pytest.raises(ValueError):
        Timing.from_samples([], "m")


@pytest.mark.parametrize("a, b", [
    (timing(1.0, 1.0, 1.0), timing(1.0, 1.0, 1.0)),    # identical
    (timing(0.9, 1.0, 1.1), timing(0.95, 1.05, 1.15)),  # within half the spread
    (timing(1.0, 1.0, 1.0), timing(1.005, 1.005, 1.005)),  # tight, within the 1% floor
])
def test_timings_within_the_noise_tie(a, b):
    assert is_tie(a, b) and is_tie(b, a)


@pytest.mark.parametrize("a, b", [
    (timing(0.98, 1.0, 1.02), timing(1.96, 2.0, 2.04)),  # 2x slower
    (timing(1.0, 1.0, 1.0), timing(1.02, 1.02, 1.02)),   # tight, 2% apart
])
def test_timings_apart_beyond_the_noise_do_not_tie(a, b):
    assert not is_tie(a, b) and not is_tie(b, a)


def test_time_cpu_warms_up_then_times_each_run_rotating_sets():
    sets_used = []

    def launch(i):
        sets_used.append(i)
        time.sleep(0.002 * (1 + len(sets_used) % 2))  # alternately about 2 and 4 ms

    t = time_cpu(launch, n_sets=3, runs=6)
    assert sets_used == [0, 1, 2, 0, 1, 2, 0]  # the warm-up call, then the 6 timed runs
    assert t.runs == 6 and "wall clock" in t.method and "6 runs" in t.method
    assert 2.0 <= t.p20_ms <= t.p50_ms <= t.p80_ms
    assert t.p80_ms >= 4.0


def test_retime_interleaved_on_cpu_rotates_configs_every_round():
    calls = []

    def config(name):
        return lambda i: calls.append(name)

    timings = retime_interleaved([config("a"), config("b"), config("c")], n_sets=2, rounds=4,
                                 gpu=False)
    warmups, timed = calls[:3], calls[3:]
    assert warmups == ["a", "b", "c"]
    assert timed == ["a", "b", "c", "b", "c", "a", "c", "a", "b", "a", "b", "c"]
    assert [t.runs for t in timings] == [4, 4, 4]
    assert all("interleaved" in t.method for t in timings)


def test_call_loop_reads_host_time_before_the_final_synchronize():
    """Calls of ~1 ms, a synchronize of ~20 ms: host_us holds the calls alone, loop_ms the
    calls and the synchronize spread over them; every sample rotates over the sets."""
    used = []

    def run(gemm):
        used.append(gemm)
        time.sleep(0.001)

    loop = CallLoop(run, ["a", "b", "c"], lambda: time.sleep(0.02), sample_ms=0.0, min_calls=4)
    cost = time_calls(loop)
    assert used == ["a", "b", "c", "a"] * (1 + LOOP_SAMPLES)  # a sizing probe, then samples
    assert 1000 <= cost.host_us < 5000
    assert cost.loop_ms >= (4 * 1.0 + 20) / 4
    assert loop.timing().runs == LOOP_SAMPLES and "4 back-to-back calls" in loop.timing().method


# --- GPU: run with `pytest -m gpu` on the GPU machine -----------------------------------------

def bf16_randn(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


@pytest.fixture(scope="module")
def big_matmul():
    """4096³ bf16 matmul (about 0.1–0.2 ms on an H100/H200): the flushed-launch method."""
    a, b = bf16_randn(4096, 4096), bf16_randn(4096, 4096)
    out = torch.empty_like(a)
    return lambda i: torch.matmul(a, b, out=out)


@pytest.mark.gpu
def test_long_kernel_is_timed_launch_by_launch_with_l2_flushed(big_matmul):
    t = time_gpu(big_matmul, n_sets=1)
    assert t.runs >= 10 and "L2 flushed" in t.method
    assert 0 < t.p20_ms <= t.p50_ms <= t.p80_ms


@pytest.mark.gpu
def test_tiny_kernel_is_timed_as_a_graph_without_launch_gaps():
    xs, ys, outs = bf16_randn(4, 4096), bf16_randn(4, 4096), bf16_randn(4, 4096)

    def small_add(i):
        torch.add(xs[i], ys[i], out=outs[i])

    graphed = time_gpu(small_add, n_sets=4)
    one_by_one = time_gpu(small_add, n_sets=4, graph_below_ms=0.0)
    assert "graph" in graphed.method and graphed.runs >= 10
    assert "L2 flushed" in one_by_one.method
    assert graphed.p50_ms < one_by_one.p50_ms


@pytest.mark.gpu
def test_side_by_side_a_short_and_a_long_config_take_one_method(big_matmul):
    xs, ys, outs = bf16_randn(4, 4096), bf16_randn(4, 4096), bf16_randn(4, 4096)

    def small_add(i):
        torch.add(xs[i], ys[i], out=outs[i])

    timings = retime_interleaved([small_add, big_matmul], n_sets=4, rounds=5)
    assert all("graph" in t.method for t in timings), [t.method for t in timings]


@pytest.mark.gpu
def test_the_flush_leaves_the_timed_kernel_no_write_back():
    """A 48 MiB read, flushed launch by launch, against the same read streamed over 8
    buffers in a graph (no flush at all): within 15% and a launch's ramp. A flush that
    zeroed its buffer left L2 full of dirty lines, and the read paid to write them back."""
    buffers = [torch.ones(24 * 2**20, device="cuda", dtype=torch.bfloat16) for _ in range(8)]

    def read(i):
        buffers[i].sum(dtype=torch.float32)

    flushed = time_gpu(read, n_sets=1, graph_below_ms=0.0)
    streamed = time_gpu(read, n_sets=8, graph_below_ms=1.0)
    assert "L2 flushed" in flushed.method and "graph" in streamed.method
    assert flushed.p50_ms <= 1.15 * streamed.p50_ms + 0.003, (flushed, streamed)


@pytest.mark.gpu
def test_a_slow_host_path_does_not_leak_into_flushed_samples():
    """A launch whose host side takes 300 us around a kernel of a few us: the event samples
    must hold the kernel, not the gap the host leaves (the spin after the flush covers it)."""
    xs, ys, outs = bf16_randn(4, 4096), bf16_randn(4, 4096), bf16_randn(4, 4096)

    def slow_host_add(i):
        time.sleep(0.0003)
        torch.add(xs[i], ys[i], out=outs[i])

    t = time_gpu(slow_host_add, n_sets=4, graph_below_ms=0.0, min_runs=20, min_time_ms=0.0)
    assert "spin" in t.method
    assert t.p50_ms < 0.1, t


@pytest.mark.gpu
def test_triton_kernel_is_capturable():
    from tuner.kernels import KERNELS
    from tuner.runtime import DEFAULT_CONFIGS
    a, b, out = bf16_randn(64, 64), bf16_randn(64, 64), bf16_randn(64, 64)
    from tuner.kernels.base import Gemm
    gemm = Gemm(a, b, out)
    # Any kernel under 1 ms is graphed: what is tested is capture, not the method choice.
    t = time_gpu(lambda i: KERNELS["mm"].launch(gemm, DEFAULT_CONFIGS["mm"]), n_sets=1,
                 graph_below_ms=1.0)
    assert "graph" in t.method
    torch.testing.assert_close(out.float(), a.float() @ b.float(), rtol=1e-2, atol=1e-2)


@pytest.mark.gpu
def test_retime_interleaved_on_gpu_separates_a_2x_slower_config(big_matmul):
    def twice(i):
        big_matmul(i)
        big_matmul(i)

    once_t, twice_t = retime_interleaved([big_matmul, twice], n_sets=1, rounds=10)
    assert once_t.runs == twice_t.runs == 10
    assert twice_t.p50_ms > 1.5 * once_t.p50_ms
    assert not is_tie(once_t, twice_t)
