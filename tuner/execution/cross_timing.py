"""Timing several configs on one shape, side by side, for `tune buckets` and `tune validate`.

A config chosen for one shape may be refused by the kernel on another (TMA needs aligned
strides), fail to compile for its specialization, or even compute wrongly there; so each
config is first run alone through the executor, which checks it against the reference. The
correct ones are then re-timed interleaved (Executor.retime: every round times each once, in
rotating order), so that their ratios, the regrets, carry no clock or temperature drift.

Configs run as the dispatcher would run them on the shape (tuner.kernels.calls.runnable_config):
a padded config on a shape already aligned to its pad runs unpadded.
"""
from __future__ import annotations

from dataclasses import dataclass

from tuner.execution.executor import Executor
from tuner.kernels.base import Kernel
from tuner.kernels.calls import meta_gemm, runnable_config
from tuner.objective import GRAPH
from tuner.shapes import Shape
from tuner.statuses import TrialStatus


@dataclass(frozen=True)
class SideBySide:
    """One config's outcome on the shape: p50_ms is set only when it ran correctly."""
    config: dict  # as asked (the runnable form may differ in pad)
    status: TrialStatus
    reason: str | None
    p50_ms: float | None
    method: str | None


def time_side_by_side(executor: Executor, kernel: Kernel, shape: Shape, seed: int,
                      configs: list[dict]) -> list[SideBySide]:
    """Each config's outcome on `shape`, in order (on the executor's first device)."""
    gemm = meta_gemm(shape)
    runnable: dict[int, dict] = {}
    outcomes: dict[int, SideBySide] = {}
    for i, config in enumerate(configs):
        launched, refusal = runnable_config(kernel, config, gemm)
        if refusal:
            outcomes[i] = SideBySide(config, TrialStatus.UNSUPPORTED, refusal, None, None)
        else:
            runnable[i] = dict(launched)
    compiles = {i: executor.submit_compile(shape, kernel.name, c) for i, c in runnable.items()}
    correct = []
    for i, config in runnable.items():
        compiled = compiles[i].result()
        result = (compiled if not isinstance(compiled, float)
                  else executor.measure(0, shape, seed, kernel.name, config))
        if result.status == TrialStatus.OK:
            correct.append(i)
        else:
            outcomes[i] = SideBySide(configs[i], result.status, result.reason, None, None)
    # Device time: the regrets `tune buckets` weighs are those of the kernels themselves.
    timings = executor.retime(0, shape, seed, kernel.name, [runnable[i] for i in correct],
                              GRAPH)
    if timings is None:  # the device worker was lost re-timing: no ratio can be trusted
        timings = [None] * len(correct)
    for i, timing in zip(correct, timings):
        outcomes[i] = (
            SideBySide(configs[i], TrialStatus.OK, None, timing.p50_ms, timing.method)
            if timing else SideBySide(configs[i], TrialStatus.CRASHED, "lost while re-timing",
                                      None, None))
    return [outcomes[i] for i in range(len(configs))]
