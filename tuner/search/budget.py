"""A study's tuning knobs, as one frozen object: `tune run` builds it from its options, and
every study of the run (tuner.search.study.StudyRunner) takes it. Imports nothing heavy, so
the CLI builds it before anything imports triton."""
from __future__ import annotations

from dataclasses import dataclass

from tuner.objective import DEFAULT_LAUNCH

DEFAULT_SAMPLER = "tpe"  # tuner.search.samplers


@dataclass(frozen=True)
class StudyBudget:
    """What a study may spend, and how it searches."""
    trials: int
    timeout_s: float | None
    seed: int
    batch: int = 8  # configs in flight at once: compiling, or compiled and awaiting measure
    # Stop once this many trials in a row improved the best by no more than IMPROVEMENT
    # (tuner.search.study).
    patience: int | None = None
    sampler: str = DEFAULT_SAMPLER  # tuner.search.samplers
    # Measure every feasible config of the study's space, in order, whatever `trials` says:
    # a recording for `tune replay`.
    exhaustive: bool = False
    launch: str = DEFAULT_LAUNCH  # what the study optimises: eager or graph (tuner.objective)
    # Trials, past the sampler's, that step from the best config to its neighbours.
    polish: int = 0
