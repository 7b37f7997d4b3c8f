"""A study's tuning knobs, as one frozen object: `tune run` builds it from its options, and
every study of the run (tuner.search.study.StudyRunner) takes it. Imports nothing heavy, so
the CLI builds it before anything imports triton."""
from __future__ import annotations

from dataclasses import dataclass

from tuner.objective import DEFAULT_LAUNCH

DEFAULT_SAMPLER = "tpe"  # tuner.search.samplers
DEFAULT_TRIALS = 40
# How a study ends unless told otherwise (tuner.search.stopping): the model's bound ends it
# where nothing untried can win, and a shorter patience where the search has stopped
# improving; then a few polish steps. `tune replay` compares them with the reference's.
DEFAULT_PATIENCE = 8
DEFAULT_POLISH = 6
# The defaults before issue 40, the full search that benchmarks/tune_speed.py takes as its
# reference: patience 24 and 12 polish steps, no model bound.
REFERENCE_PATIENCE = 24
REFERENCE_POLISH = 12


@dataclass(frozen=True)
class StudyBudget:
    """What a study may spend, and how it searches."""
    trials: int
    budget_s: float | None  # seconds the study may search (`tune run --budget-s`)
    seed: int
    batch: int = 8  # configs in flight at once: compiling, or compiled and awaiting measure
    # Stop once this many trials in a row improved the best by no more than its noise
    # (tuner.search.stopping).
    patience: int | None = None
    sampler: str = DEFAULT_SAMPLER  # tuner.search.samplers
    # Measure every feasible config of the study's space, in order, whatever `trials` says:
    # a recording for `tune replay`.
    exhaustive: bool = False
    launch: str = DEFAULT_LAUNCH  # what the study optimises: eager or graph (tuner.objective)
    # Trials, past the sampler's, that step from the best config to its neighbours.
    polish: int = 0
    # The rules of issue 40 (tuner.search.stopping): the warm start measured before the
    # sampler is asked, the model's bound, a warm start from near keys ending once confirmed,
    # and a stopped search leaving its configs in flight unmeasured. Off: the search before.
    early_stop: bool = False
