"""Honest kernel timing: medians of many runs, cold L2, no launch gaps, ties called as ties.

Every timing is a `Timing`: the p20/p50/p80 of its samples, how many samples there were and
one line saying how they were taken, so that a stored number can be judged later.

On a GPU, a config whose single launch takes at least `graph_below_ms` is timed launch by
launch between CUDA events, with L2 flushed before each launch so that no run reads what the
previous one left in cache. The flush reads a buffer twice L2's size: writing it (zeroing)
would leave L2 full of dirty lines, and the timed kernel would pay for writing them back (on
an H100, 10-20% of a decode GEMM that streams its weight; benchmarks/results/vs-cublas/
README.md). After the flush the GPU spins for longer than the host takes to
queue the launch (measured per config while warming up), so the start event fires only once
the launch is queued: a config with a slow host path (Python-built TMA descriptors, padding
copies) is then timed for what it does on the GPU, not for the gap the host left before it.
Host cost per call is a separate question, measured by benchmarks/host_overhead.py.

A shorter kernel is timed as a CUDA graph of many launches that cycle through several input
sets: launching one at a time would measure the CPU's launch overhead rather than the kernel,
and that overhead would decide the ranking. The caller gives
enough input sets that together they exceed L2, so the rotation keeps the data cold. Configs
re-timed side by side (`retime_interleaved`) all take one method, graphs if any of them is
short: a launch timed alone also holds the GPU's ramp to the kernel, a microsecond or two
that a graph amortizes, which would otherwise favour whichever config fell under the line.

Results are read only after the last sample is queued: the CPU never waits on the GPU
between samples, and nothing here sleeps or touches clocks.

Device time is what a CUDA graph of the calls costs. Eager code pays for the call as well:
`CallLoop` times a config's launch path (what the dispatcher runs) back to back, for the host
microseconds per call and the wall milliseconds per call through a final synchronize, the
larger of host and device time where they overlap.
"""
from __future__ import annotations

import functools
import math
import statistics
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import torch

WARMUP_LAUNCHES = 5
# Flushed single launches whose median decides between the event and the graph method.
ESTIMATE_SAMPLES = 10
MAX_RUNS = 1000
# A graph replay should last at least this long, so that the two events around it are noise.
GRAPH_REPLAY_MS = 1.0
MAX_GRAPH_LAUNCHES = 1000
MIN_FLUSH_BYTES = 64 * 2**20
# A flushed sample's GPU spin lasts this many times the host's time to queue one launch.
HOST_COVER_FACTOR = 2.0
MAX_HOST_COVER_MS = 1.0
SPIN_CALIBRATION_CYCLES = 2_000_000  # about a millisecond at Hopper's clocks
# CUDA events resolve about half a microsecond; a shorter reading says only "very short".
EVENT_RESOLUTION_MS = 0.0005
# Back-to-back calls (CallLoop): a trial takes LOOP_SAMPLES samples, each of enough calls to
# last about LOOP_SAMPLE_MS and at least MIN_LOOP_CALLS on a GPU (so ~30 ms and 21 calls or
# more a trial), at most MAX_LOOP_CALLS; a final re-timing takes LOOP_RETIME_ROUNDS.
LOOP_SAMPLES = 3
LOOP_SAMPLE_MS = 10.0
MIN_LOOP_CALLS = 7
MAX_LOOP_CALLS = 10_000
LOOP_RETIME_ROUNDS = 10
# A short device measure (a study's first look at a config, tuner.search.screening): the
# same method (cold L2, graphs for short kernels), a tenth of time_gpu's default samples.
SHORT_TIME_MS = 10.0
SHORT_MIN_RUNS = 5
# A sample's host time is read after its first HOST_CALLS calls: few enough that their
# launches fit in CUDA's launch queue (about a thousand entries), so the host never waits for
# the GPU while issuing them, and host_us stays host time even for kernels slower than it.
HOST_CALLS = 64


@dataclass(frozen=True)
class Timing:
    """One config's time per launch: quantiles over `runs` samples, and how they were taken."""

    p20_ms: float
    p50_ms: float
    p80_ms: float
    runs: int  # how many timed samples the quantiles come from
    method: str  # one line saying how the samples were taken

    @classmethod
    def from_samples(cls, samples_ms: list[float], method: str) -> Timing:
        """The p20/p50/p80 of the samples, interpolated linearly between order statistics.

        This is `statistics.quantiles(..., method="inclusive")` (and numpy's default), but it
        also accepts one sample, which is then all three quantiles.
        """
        if not samples_ms:
            raise ValueError("no timing samples")
        ordered = sorted(samples_ms)

        def quantile(q: float) -> float:
            position = q * (len(ordered) - 1)
            below = math.floor(position)
            above = min(below + 1, len(ordered) - 1)
            return ordered[below] + (ordered[above] - ordered[below]) * (position - below)

        return cls(quantile(0.2), quantile(0.5), quantile(0.8), len(ordered), method)


class _SetCycle:
    """Launches the kernel on input sets 0, 1, …, n_sets - 1, 0, 1, … call after call."""

    def __init__(self, launch: Callable[[int], None], n_sets: int):
        self._launch, self._n_sets, self._calls = launch, n_sets, 0

    def __call__(self) -> None:
        self._launch(self._calls % self._n_sets)
        self._calls += 1


class _Sampler(Protocol):
    """Takes the samples of one config; the same kind serves a lone timing and a re-timing."""

    def take(self) -> None:
        """Queue (GPU) or take (CPU) one more sample."""

    def timing(self) -> Timing:
        """Everything taken so far, summarized."""


class _EventSampler(ABC):
    """Samples bracketed by CUDA events, read once at the end so the CPU never stalls."""

    launches_per_sample = 1

    def __init__(self, cycle: _SetCycle):
        self._cycle = cycle
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    def take(self) -> None:
        self._prepare()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        self._run()
        end.record()
        self._events.append((start, end))

    def timing(self) -> Timing:
        torch.cuda.synchronize()
        samples = [start.elapsed_time(end) / self.launches_per_sample
                   for start, end in self._events]
        return Timing.from_samples(samples, self._describe(len(samples)))

    def _prepare(self) -> None:  # noqa: B027 - optional hook: most samplers need nothing
        """Untimed work before each sample (none by default)."""

    @abstractmethod
    def _run(self) -> None:
        """The timed work of one sample."""

    @abstractmethod
    def _describe(self, runs: int) -> str:
        """The method line for `runs` samples."""


@functools.cache
def _l2_flush_buffer(device: int) -> torch.Tensor:
    """Twice the L2 (at least 64 MiB): reading it evicts everything a kernel left there, and
    leaves only clean lines behind.

    Allocated once per device and process: a fresh allocation per sample would cost more
    than the kernels being timed.
    """
    l2_bytes = torch.cuda.get_device_properties(device).L2_cache_size
    return torch.zeros(max(2 * l2_bytes, MIN_FLUSH_BYTES) // 8, dtype=torch.int64,
                       device=f"cuda:{device}")


@functools.cache
def _spin_cycles_per_ms(device: int) -> float:
    """GPU clock cycles per millisecond of torch.cuda._sleep, measured once per device and
    process (after the first config's warm-up, so at working clocks)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(SPIN_CALIBRATION_CYCLES)  # wakes the clocks up
    start.record()
    torch.cuda._sleep(SPIN_CALIBRATION_CYCLES)
    end.record()
    end.synchronize()
    return SPIN_CALIBRATION_CYCLES / start.elapsed_time(end)


class _FlushedLaunches(_EventSampler):
    """One launch per sample, L2 flushed before it.

    The flush and then a spin of `host_cover_ms` keep the GPU busy while the CPU queues the
    launch, so the sample holds the kernel rather than the CPU's launch overhead.
    """

    def __init__(self, cycle: _SetCycle, host_cover_ms: float):
        super().__init__(cycle)
        device = torch.cuda.current_device()
        self._flush_buffer = _l2_flush_buffer(device)
        self._host_cover_ms = host_cover_ms
        self._spin_cycles = int(host_cover_ms * _spin_cycles_per_ms(device))

    def _prepare(self) -> None:
        self._flush_buffer.sum()
        if self._spin_cycles:
            torch.cuda._sleep(self._spin_cycles)

    def _run(self) -> None:
        self._cycle()

    def _describe(self, runs: int) -> str:
        return (f"cuda events, L2 flushed and a {self._host_cover_ms * 1e3:.0f} us spin "
                f"covering the host's launch before each of {runs} runs")


class _GraphReplays(_EventSampler):
    """One replay of a CUDA graph of `launches` launches per sample, reported per launch."""

    def __init__(self, cycle: _SetCycle, launches: int, n_sets: int):
        super().__init__(cycle)
        self.launches_per_sample, self._n_sets = launches, n_sets
        self._graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._graph):  # on a side stream: the default one can't be captured
            for _ in range(launches):
                cycle()
        self._graph.replay()  # the first replay uploads the graph: keep it out of the samples
        torch.cuda.synchronize()

    def _run(self) -> None:
        self._graph.replay()

    def _describe(self, runs: int) -> str:
        return (f"cuda graph of {self.launches_per_sample} launches over {self._n_sets} "
                f"input sets, {runs} replays")


@dataclass
class _Warmed:
    """A config warmed up: its launch cycle, the spin that covers its host path, and its
    flushed launch's time."""
    cycle: _SetCycle
    host_cover_ms: float
    launch_ms: float


def _warmed(launch: Callable[[int], None], n_sets: int) -> _Warmed:
    cycle = _SetCycle(launch, n_sets)
    host_ms = []
    for _ in range(WARMUP_LAUNCHES):
        start = time.perf_counter()
        cycle()
        host_ms.append((time.perf_counter() - start) * 1e3)
    torch.cuda.synchronize()
    # The least of the readings after the first (which may load the kernel): a launch the
    # host had to wait for (a full queue, an allocation) reads long without being slow.
    host_cover_ms = min(HOST_COVER_FACTOR * min(host_ms[1:]), MAX_HOST_COVER_MS)
    probe = _FlushedLaunches(cycle, host_cover_ms)
    for _ in range(ESTIMATE_SAMPLES):
        probe.take()
    # The low end, not the median: a sample the host was late for includes its launch gap,
    # and a kernel short enough to be overtaken by launch overhead is the one graphs are for.
    return _Warmed(cycle, host_cover_ms, max(probe.timing().p20_ms, EVENT_RESOLUTION_MS))


def _sampler(warmed: _Warmed, n_sets: int, graphed: bool) -> tuple[_EventSampler, float]:
    """The sampler of one warmed config, and its ms per sample."""
    if not graphed:
        return _FlushedLaunches(warmed.cycle, warmed.host_cover_ms), warmed.launch_ms
    launches = min(MAX_GRAPH_LAUNCHES, math.ceil(GRAPH_REPLAY_MS / warmed.launch_ms))
    return _GraphReplays(warmed.cycle, launches, n_sets), launches * warmed.launch_ms


def _gpu_sampler(launch: Callable[[int], None], n_sets: int,
                 graph_below_ms: float) -> tuple[_EventSampler, float]:
    """Warm one config up and pick its method; returns the sampler and its ms per sample."""
    warmed = _warmed(launch, n_sets)
    return _sampler(warmed, n_sets, warmed.launch_ms < graph_below_ms)


class _WallClock:
    """perf_counter around each launch, for Triton's interpreter, which runs synchronously."""

    def __init__(self, cycle: _SetCycle):
        self._cycle = cycle
        self._samples: list[float] = []
        cycle()  # the first call pays one-time costs (parsing, caches): keep it out of the samples

    def take(self) -> None:
        start = time.perf_counter()
        self._cycle()
        self._samples.append((time.perf_counter() - start) * 1e3)

    def timing(self) -> Timing:
        runs = len(self._samples)
        return Timing.from_samples(
            self._samples, f"wall clock (perf_counter), {runs} runs after a warm-up call")


def time_gpu(launch: Callable[[int], None], n_sets: int, *, min_runs: int = 10,
             min_time_ms: float = 100.0, graph_below_ms: float = 0.02) -> Timing:
    """launch(i) runs the kernel once on input set i (0 <= i < n_sets); all sets are equivalent.

    Takes max(min_runs, enough samples to fill min_time_ms) samples, at most MAX_RUNS unless
    min_runs asks for more, on the current CUDA device.
    """
    sampler, sample_ms = _gpu_sampler(launch, n_sets, graph_below_ms)
    runs_to_fill = math.ceil(min_time_ms / sample_ms)
    for _ in range(max(min_runs, min(MAX_RUNS, runs_to_fill))):
        sampler.take()
    return sampler.timing()


def time_cpu(launch: Callable[[int], None], n_sets: int, *, runs: int = 3) -> Timing:
    """Wall clock (perf_counter) for the CPU interpreter backend; warm-up call first."""
    sampler = _WallClock(_SetCycle(launch, n_sets))
    for _ in range(runs):
        sampler.take()
    return sampler.timing()


def retime_interleaved(launches: list[Callable[[int], None]], n_sets: int, *, rounds: int = 30,
                       gpu: bool = True, graph_below_ms: float = 0.02) -> list[Timing]:
    """Re-time several configs side by side: each round times every config once, in rotating
    order, so drift (clocks, temperature) hits them alike. Returns one Timing per launch, in
    order.

    Each config is sampled as a lone `time_gpu` (or `time_cpu`) would sample it, but all
    take one method: graphs if any of them is short (the module's docstring says why). All
    warm-up happens before the first round.
    """
    samplers: list[_Sampler]
    if gpu:
        warmed = [_warmed(launch, n_sets) for launch in launches]
        graphed = any(w.launch_ms < graph_below_ms for w in warmed)
        samplers = [_sampler(w, n_sets, graphed)[0] for w in warmed]
    else:
        samplers = [_WallClock(_SetCycle(launch, n_sets)) for launch in launches]
    return _interleaved(samplers, rounds)


def rotating_order(count: int, rounds: int) -> Iterator[int]:
    """Indices 0..count-1, once per round, rounds times, round r starting at index r: side by
    side timing, where drift hits every contender alike and none always runs right after
    the same neighbour."""
    for first in range(rounds):
        for offset in range(count):
            yield (first + offset) % count


def _interleaved(samplers: Sequence[_Sampler], rounds: int) -> list[Timing]:
    """Every sampler sampled once per round, rounds times, in rotating order."""
    for i in rotating_order(len(samplers), rounds):
        samplers[i].take()
    interleaving = f", one of {len(samplers)} configs interleaved over {rounds} rounds"
    return [replace(t, method=t.method + interleaving) for t in (s.timing() for s in samplers)]


# -- the call as eager code makes it --------------------------------------------------------
@dataclass(frozen=True)
class CallCost:
    """A config's call issued back to back: host µs per call, and ms per call through the
    final synchronize (what a model's eager forward pays per GEMM)."""
    host_us: float
    loop_ms: float


class CallLoop:
    """Samples of back-to-back calls of one config's launch path, rotating over input sets.

    `run(gemm)` is the path itself (tuner.kernels.launches.prepare); `synchronize` waits for
    the device. The first sample warms the path up and sizes the others: on a GPU, enough
    calls to last `sample_ms`, at least `min_calls`.
    """

    def __init__(self, run: Callable, gemms: Sequence, synchronize: Callable[[], None], *,
                 sample_ms: float, min_calls: int):
        self._run, self._gemms, self._synchronize = run, gemms, synchronize
        self._host_us: list[float] = []
        self._loop_ms: list[float] = []
        probe_ms = max(self._sample(min_calls)[1], 1e-6)
        self._calls = max(min_calls, min(MAX_LOOP_CALLS, math.ceil(sample_ms / probe_ms)))

    def _sample(self, calls: int) -> tuple[float, float]:
        """(host µs per call over the first HOST_CALLS calls, ms per call of all `calls`
        through the final synchronize), from one loop with no synchronize inside."""
        order = [self._gemms[i % len(self._gemms)] for i in range(calls)]
        first, rest = order[:HOST_CALLS], order[HOST_CALLS:]
        run = self._run  # a local: no attribute lookup inside the timed loops
        self._synchronize()
        start = time.perf_counter()
        for gemm in first:
            run(gemm)
        issued = time.perf_counter()
        for gemm in rest:
            run(gemm)
        self._synchronize()
        end = time.perf_counter()
        return (issued - start) / len(first) * 1e6, (end - start) / calls * 1e3

    def take(self) -> None:
        host_us, loop_ms = self._sample(self._calls)
        self._host_us.append(host_us)
        self._loop_ms.append(loop_ms)

    def timing(self) -> Timing:
        """The samples' ms per call."""
        return Timing.from_samples(
            self._loop_ms, f"{self._calls} back-to-back calls of the launch path over "
                           f"{len(self._gemms)} input sets, synchronized at the end, "
                           f"{len(self._loop_ms)} runs")

    def cost(self) -> CallCost:
        """The medians of the samples taken so far."""
        return CallCost(statistics.median(self._host_us), self.timing().p50_ms)


def call_loop(run: Callable, gemms: Sequence, synchronize: Callable[[], None], *,
              gpu: bool) -> CallLoop:
    """A CallLoop sized for the backend: on Triton's interpreter (tens of ms a call) one call
    per sample, wall clock of the same loop, comparable only with other interpreter runs."""
    if gpu:
        return CallLoop(run, gemms, synchronize, sample_ms=LOOP_SAMPLE_MS,
                        min_calls=MIN_LOOP_CALLS)
    return CallLoop(run, gemms, synchronize, sample_ms=0.0, min_calls=1)


def time_calls(loop: CallLoop) -> CallCost:
    """A trial's call cost: LOOP_SAMPLES samples of the loop."""
    for _ in range(LOOP_SAMPLES):
        loop.take()
    return loop.cost()


def retime_calls(loops: Sequence[CallLoop]) -> list[Timing]:
    """Re-time several configs' calls side by side, as `retime_interleaved` does their device
    time: LOOP_RETIME_ROUNDS samples each, sized as in a trial; each Timing is ms per call."""
    return _interleaved(loops, LOOP_RETIME_ROUNDS)
