"""One Optuna study per bucketed key: ask a config, run it, store it, tell the result.

The sampler is Optuna's TPE, seeded, maximising TFLOP/s; configs that fail in any way are
told as failed trials. Trials already stored for an unfinished study are replayed into the
sampler first, so an interrupted run resumes where it stopped.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial

from tuner.db.models import Run, Study, Trial
from tuner.db.store import Store
from tuner.execution import ShapeBench, TrialResult
from tuner.kernels.base import Kernel
from tuner.space import SearchSpace

optuna.logging.set_verbosity(optuna.logging.WARNING)


@dataclass(frozen=True)
class StudyBudget:
    trials: int
    timeout_s: float | None
    seed: int


def _tell(study: optuna.Study, trial: optuna.trial.Trial, tflops: float | None) -> None:
    if tflops is None:
        study.tell(trial, state=TrialState.FAIL)
    else:
        study.tell(trial, tflops)


def _replay(study: optuna.Study, distributions: dict, stored: list[Trial]) -> None:
    for t in stored:
        ok = t.status == "ok"
        study.add_trial(create_trial(params=t.params, distributions=distributions,
                                     value=t.tflops if ok else None,
                                     state=TrialState.COMPLETE if ok else TrialState.FAIL))


def run_study(store: Store, run: Run, record: Study, bench: ShapeBench, kernel: Kernel,
              space: SearchSpace, budget: StudyBudget,
              on_trial: Callable[[int, TrialResult], None]) -> Trial | None:
    """Search until the trial budget or the timeout is spent; return the best stored trial.

    A config the sampler proposes again is not re-run: its stored result is told again.
    """
    distributions = {name: CategoricalDistribution(values)
                     for name, values in space.params.items()}
    sampler = optuna.samplers.TPESampler(seed=record.seed)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    stored = list(record.trials)
    _replay(study, distributions, stored)
    seen = {tuple(sorted(t.params.items())): t for t in stored}
    number = len(stored)
    deadline = None if budget.timeout_s is None else time.monotonic() + budget.timeout_s

    while len(study.trials) < budget.trials:
        if deadline is not None and time.monotonic() >= deadline:
            break
        trial = study.ask(distributions)
        params = dict(trial.params)
        signature = tuple(sorted(params.items()))
        known = seen.get(signature)
        if known is not None:
            _tell(study, trial, known.tflops if known.status == "ok" else None)
            continue
        result = bench.run(kernel, params)
        row = store.add_trial(record, run, number, params, **result.as_columns(),
                              timing_method=bench.backend.method if result.status == "ok"
                              else None)
        number += 1
        seen[signature] = row
        _tell(study, trial, result.tflops)
        on_trial(len(study.trials), result)

    ok = [t for t in seen.values() if t.status == "ok"]
    return max(ok, key=lambda t: t.tflops) if ok else None
