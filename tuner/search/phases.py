"""Where a study's wall goes: seconds per phase of `tune run`'s work on one key (its claim,
set-up, warm-start lookup, compile waits, measures, database writes, final re-timing, ...).

A warm study should cost little more than its device steps; what else it spends is only
found by timing each step where it runs. The job (tuner.search.pipeline) and the study
(tuner.search.study) wrap their steps in `Phases.timed`: two perf_counter reads a step, a
few dozen steps a study, nothing measurable. `tune run` returns every study's phases in its
RunSummary, and benchmarks/tune_speed.py prints those of its warm pass.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

# The phases a study's steps are filed under, as the breakdown names them.
CLAIM = "claim"  # the key's claim in the database, and its release
OPEN = "open study"  # our study row and Optuna's (created, or read back to resume)
WARM_START = "warm start"  # the near keys' winners looked up, the model's picks ranked
RANK_AHEAD = "rank ahead"  # the next studies' rankings (and compiles) started
SET_UP = "set-up"  # the warm start enqueued, stored trials and known failures read
ASK = "ask"  # the sampler asked and its answers checked (feasibility, known failures)
COMPILE_WAIT = "compile wait"  # waiting for the compile pool with nothing to measure
SHORT_MEASURE = "short measure"
MEASURE = "measure"  # a config checked and timed in full (the shape's first: its inputs)
RECORD = "record"  # a trial stored and told to the sampler
RETIME = "re-time"  # the finalists timed side by side
FINISH = "finish"  # the baseline (where not measured) and the winner stored


class Phases:
    """Seconds and steps per phase of one study, in the order the phases first ran. Used by
    the one thread that runs the study."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.steps: dict[str, int] = {}

    @contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        """Files the seconds the block takes under `phase`."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(phase, time.perf_counter() - start)

    def add(self, phase: str, seconds: float) -> None:
        self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds
        self.steps[phase] = self.steps.get(phase, 0) + 1

    @property
    def total(self) -> float:
        return sum(self.seconds.values())

    def __str__(self) -> str:
        """e.g. `measure 0.231 s (2), open study 0.012 s, ...`: the costliest phase first,
        with its steps where it took more than one."""
        return ", ".join(
            f"{phase} {seconds:.3f} s" + (f" ({self.steps[phase]})"
                                          if self.steps[phase] > 1 else "")
            for phase, seconds in sorted(self.seconds.items(), key=lambda kv: -kv[1]))
