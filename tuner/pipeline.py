"""The `tune run` job: for every planned key, skip it if tuned, else search it and keep a winner."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from tuner.backends import Backend
from tuner.db.store import Store
from tuner.execution import ShapeBench, TrialResult
from tuner.kernels import KERNELS
from tuner.kernels.base import config_label
from tuner.planning import KeyPlan
from tuner.search import StudyBudget, run_study
from tuner.space import SearchSpace


class Reporter(Protocol):
    """What the job tells its user while it works (the CLI draws progress bars from it)."""

    def key_started(self, plan: KeyPlan, trials: int) -> None: ...
    def trial_done(self, done: int, result: TrialResult) -> None: ...
    def key_done(self, plan: KeyPlan, outcome: str) -> None: ...


@dataclass
class RunSummary:
    tuned: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def tune(store: Store, backend: Backend, plans: list[KeyPlan], spaces: dict[str, SearchSpace],
         budget: StudyBudget, retune: bool, command: list[str],
         reporter: Reporter) -> RunSummary:
    device = store.device(backend.info)
    run = store.start_run(device, backend.name, command)
    summary = RunSummary()
    kernel_rows = {name: store.kernel(name, KERNELS[name].source_hash) for name in spaces}
    space_rows = {name: store.space(space) for name, space in spaces.items()}
    status = "failed"
    try:
        for plan in plans:
            kernel, space = KERNELS[plan.kernel], spaces[plan.kernel]
            kernel_row, space_row = kernel_rows[plan.kernel], space_rows[plan.kernel]
            if not retune and store.finished_study(device, kernel_row, space_row, plan.key):
                summary.skipped.append(plan.label)
                reporter.key_done(plan, "already tuned")
                continue
            record = store.open_study(device, kernel_row, space_row, plan.key, plan.shape,
                                      budget.seed, retune)
            reporter.key_started(plan, budget.trials)
            found, outcome = _tune_key(store, run, record, backend, plan, kernel, space,
                                       budget, reporter)
            (summary.tuned if found else summary.failed).append(plan.label)
            reporter.key_done(plan, outcome)
        status = "finished"
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        store.finish_run(run, status)
    return summary


def _tune_key(store, run, record, backend, plan, kernel, space, budget,
              reporter) -> tuple[bool, str]:
    """Search one key and record its winner; returns whether one was found, and a summary line.

    The bench (inputs, fp64 reference) lives only for this call, so one large shape's
    buffers are freed before the next shape allocates its own.
    """
    bench = ShapeBench(backend, plan.shape, budget.seed)
    best = run_study(store, run, record, bench, kernel, space, budget, reporter.trial_done)
    if best is None:
        store.finish_study(record, None, None, "no config ran correctly")
        return False, "no config ran correctly"
    baseline = bench.baseline_ms()
    store.finish_study(record, best, baseline)
    speedup = baseline / best.p50_ms
    return True, (f"best {best.tflops:.4g} TFLOP/s, {speedup:.2f}x torch.matmul, "
                  f"{config_label(best.params)}")
