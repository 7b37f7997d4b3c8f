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
from tuner.kernels import KERNELS
from tuner.objective import call_ms, contested, final_field, final_winner, retimed
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
    The final field by the one winner rule (tuner.objective.final_field) is re-timed side by
    side where time remains and its trials leave the winner open, so that their order
    carries no drift; on a tie the library call, else the earlier candidate, wins.
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
    order = {id(result): i for i, (_, result) in enumerate(measured)}

    def is_library(result) -> bool:
        return KERNELS[op].calls_library(config_of[id(result)])

    field = final_field([result for _, result in measured], launch, is_library)
    if not field:
        return Fastest(None, None, timed)
    configs = [config_of[id(result)] for result in field]
    if not contested(field, launch, is_library) or not time_left():
        return Fastest(configs[0], call_ms(field[0], launch), timed)
    kernels, calls = retimed(lambda figure: bench.retime(op, configs, figure), launch)
    best, _ = final_winner(field, kernels, calls, launch, is_library,
                           lambda result: (order[id(result)],))
    return Fastest(configs[best], calls[best].p50_ms, timed)
