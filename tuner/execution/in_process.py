"""Measuring configs in this process: the one door from the deployment side into the tuning
machinery.

Online tuning (tuner.runtime.online, with TUNE_ONLINE=1) times a table's or an expand file's
candidates in the process that asked, on its own GPU, within a time budget; everything else
the runtime does needs no part of tuner.execution. So the runtime imports this module alone,
and only when a key is tuned online (tests/test_architecture.py holds it to that): a change
behind this door cannot break a deployment that does not tune online. The checks and figures
are `tune run`'s (tuner.execution.measure.ShapeBench).
"""
from __future__ import annotations

import os
import time
from typing import NamedTuple

from tuner.execution.backends import Backend, gpu_backend, interpreter_backend
from tuner.execution.measure import ShapeBench
from tuner.execution.workers import is_sticky_cuda_error
from tuner.objective import call_ms, finalists
from tuner.shapes import Shape


def this_process() -> Backend:
    """Where candidates run: Triton's interpreter under TRITON_INTERPRET=1, else this
    process's current CUDA device."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return interpreter_backend()
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("gemm-tuner: TUNE_ONLINE=1 times candidates on this process's GPU, "
                           "and torch sees none: run on a GPU, set TRITON_INTERPRET=1 to time "
                           "them in Triton's interpreter (slow), or unset TUNE_ONLINE")
    return gpu_backend(torch.cuda.current_device())


class Fastest(NamedTuple):
    """What timing candidates found: the winner and its ms per call by the launch mode's
    figure (None, None where no candidate ran correctly), and how many were run."""
    config: dict | None
    ms: float | None
    timed: int


def fastest(backend: Backend, op: str, shape: Shape, candidates: list[dict], launch: str,
            seed: int, deadline: float | None = None) -> Fastest:
    """The fastest of the candidates that run correctly on the shape.

    Each candidate, in the order given, is checked against the float64 reference and timed;
    with a `deadline` (a time.perf_counter() value) a candidate is started only before it (the
    first always), so the caller's best-first order decides what a short budget times. A
    candidate that raises only loses (a sticky CUDA error is re-raised: the context is gone).
    The finalists by the one winner rule (tuner.objective.finalists) are re-timed side by
    side where time remains, so that their order carries no drift.
    """
    def time_left() -> bool:
        return deadline is None or time.perf_counter() < deadline

    bench = ShapeBench(backend, shape, seed)
    measured, timed = [], 0
    for config in candidates:
        if timed and not time_left():
            break
        timed += 1
        try:
            result = bench.run(op, config)
        except Exception as e:  # noqa: BLE001 - a failing candidate only loses
            if is_sticky_cuda_error(str(e)):
                raise
            continue
        measured.append((config, result))
    config_of = {id(result): config for config, result in measured}
    chosen = finalists([result for _, result in measured], launch)
    if not chosen:
        return Fastest(None, None, timed)
    configs = [config_of[id(result)] for result in chosen]
    if len(chosen) == 1 or not time_left():
        return Fastest(configs[0], call_ms(chosen[0], launch), timed)
    timings = bench.retime(op, configs, launch)
    best = min(range(len(configs)), key=lambda i: (timings[i].p50_ms, i))
    return Fastest(configs[best], timings[best].p50_ms, timed)
