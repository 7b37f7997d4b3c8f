"""`tune validate`: what an exported table costs on shapes it was not tuned for.

For each hold-out shape, the config the runtime would launch (tuner.runtime.get_tuned_config
on the table, then what the dispatcher does with it) is timed side by side with the winner of
a fresh short tune of that very shape (tuner.execution.cross_timing). The regret, runtime
time / tuned time - 1, says how much a deployment loses on the shape by not having tuned it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

from tuner.bucketing.job import distinct_shapes, percent
from tuner.bucketing.search import weighted_geomean_regret
from tuner.errors import UserError
from tuner.execution.cross_timing import SideBySide, time_side_by_side
from tuner.kernels import KERNELS, kernel_for, source_hashes
from tuner.kernels.base import config_label
from tuner.kernels.calls import meta_gemm, runnable_config
from tuner.objective import GRAPH
from tuner.runtime import DEFAULT_CONFIGS, get_tuned_config
from tuner.shapes import Shape, load_shapes


class ValidationError(UserError, RuntimeError):
    """A hold-out shape the fresh tune found no config for."""


@dataclass(frozen=True)
class RuntimePick:
    config: dict
    source: str  # which lookup answered (tuner.runtime), or that the dispatcher fell back


def runtime_pick(table: Path, shape: Shape) -> RuntimePick:
    """The config a deployment with this table launches for the shape."""
    kernel = kernel_for(shape.M, shape.N)
    answer = get_tuned_config(kernel.name, **shape.key(), path=table)
    config, refusal = runnable_config(kernel, answer, meta_gemm(shape))
    if refusal:
        return RuntimePick(dict(DEFAULT_CONFIGS[kernel.name]), f"default ({answer.source} "
                           f"config refused: {refusal})")
    return RuntimePick(dict(config), answer.source)


@dataclass(frozen=True)
class Validation:
    shape: Shape
    pick: RuntimePick
    tuned: dict
    runtime: SideBySide
    fresh: SideBySide

    @property
    def regret(self) -> float:
        if self.runtime.p50_ms is None or self.fresh.p50_ms is None:
            return math.inf
        return self.runtime.p50_ms / self.fresh.p50_ms - 1


def summary(rows: list[Validation]) -> tuple[float, float]:
    """Geometric-mean regret (weighted by the CSV's weights) and worst regret."""
    regrets = [r.regret for r in rows]
    return weighted_geomean_regret(regrets, [r.shape.weight for r in rows]), max(regrets)


def report(table: Path, rows: list[Validation], device: str, trials: int) -> str:
    geomean, worst = summary(rows)
    lines = [f"# hold-out validation of {table} on {device}", "",
             f"Each shape: the runtime's config against the winner of a fresh {trials}-trial "
             "tune of the shape, timed side by side (interleaved, L2 flushed, checked).", "",
             "| shape | runtime answer | runtime config | fresh tune's config | runtime ms | "
             "tuned ms | regret |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        ms = [f"{t.p50_ms:.4f}" if t.p50_ms else t.status for t in (r.runtime, r.fresh)]
        lines.append(f"| {r.shape} | {r.pick.source} | {config_label(r.pick.config)} | "
                     f"{config_label(r.tuned)} | {ms[0]} | {ms[1]} | {percent(r.regret)} |")
    lines += ["", f"{len(rows)} shapes: geomean regret {percent(geomean)}, max "
              f"{percent(worst)}"]
    return "\n".join(lines)


def validate_table(db, table_path: str | Path, shapes_path: str | Path, trials: int, seed: int,
                   workers, devices: tuple[int, ...], command: list[str],
                   output: str | Path | None = None) -> str:
    """`tune validate`: tune each hold-out shape afresh into `db` (a tuner.db.database.Database,
    not the tuning database), time it side by side with the config the runtime picks from
    the table, and return the report (also written to `output` if given).

    workers: a tuner.tuning.Workers whose check() gave `devices` before triton was imported.
    """
    from tuner.export.picks import current_only
    from tuner.formats.files import write_text_atomic
    from tuner.search.budget import StudyBudget
    from tuner.search.planning import plan_studies
    from tuner.tuning import load_spaces, tune_plans

    table_path = Path(table_path)
    shapes = distinct_shapes(load_shapes(shapes_path))
    picks = {shape: runtime_pick(table_path, shape) for shape in shapes}  # bad table: now
    spaces = load_spaces()
    # Each fresh tune is its own shape's best, the reference of a regret: no bucket to hold
    # at fewer rows (tuner.search.study's check would hand some keys to cuBLAS for those).
    plans = [replace(plan, low_end=None) for plan in plan_studies(shapes, spaces, kernel_for)]
    store = db.store
    executor = workers.executor(devices)
    try:
        # graph: the fresh winner is the reference for device-time regrets
        budget = StudyBudget(trials, None, seed, workers.default_batch, launch=GRAPH)
        tune_plans(db, executor, spaces, plans, budget, False, command)
        info = executor.device_info()
        current, _ = current_only(store.winners(), source_hashes())
        winners = {(w.kernel.name, tuple(w.key.values())): dict(w.trial.params)
                   for w in current if w.device.fingerprint == info.fingerprint}
        rows = []
        for plan in plans:
            tuned = winners.get((plan.kernel, tuple(plan.key.values())))
            for shape in plan.members:
                if tuned is None:
                    raise ValidationError(f"the fresh tune of {shape} found no config")
                runtime, fresh = time_side_by_side(executor, KERNELS[plan.kernel], shape, seed,
                                                   [picks[shape].config, tuned])
                rows.append(Validation(shape, picks[shape], tuned, runtime, fresh))
    finally:
        executor.close()
    text = report(table_path, rows, info.name, trials)
    if output:
        write_text_atomic(output, text + "\n")
    return text
