"""The `tune buckets` job: the listed shapes' own winners, every shape timed with the winners
it could share, the strategy search (tuner.bucketing.search), and the decision stored.

Timings are per shape: all the configs a shape needs are timed together
(tuner.execution.cross_timing) and stored as they finish; a shape whose needed configs are all
in the database already is not measured again, so a second search over other candidates or
another budget is free.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from tuner.bucketing.search import (
    DEFAULT_CANDIDATES,
    SEARCHED_FIELDS,
    Member,
    SearchResult,
    Times,
    needed_configs,
    search,
    signature,
    sweep_candidates,
)
from tuner.bucketing.strategies import bucket_key, strategy_function
from tuner.db.models import Device, KernelVersion, Winner
from tuner.db.store import Store, params_key
from tuner.errors import UserError
from tuner.kernels import kernel_for
from tuner.reporting import STDERR, Reporter
from tuner.shapes import Shape, load_shapes, swept_m
from tuner.statuses import TrialStatus


class SharingError(UserError, RuntimeError):
    """The listed shapes cannot be bucketed yet (e.g. some were never tuned)."""


def distinct_shapes(shapes: Sequence[Shape]) -> list[Shape]:
    """The listed shapes once each (a repeated row keeps its largest weight), in list order."""
    heaviest: dict[tuple, Shape] = {}
    for s in shapes:
        ident = (s.M, s.N, s.K, s.dtype, s.layout)
        if ident not in heaviest or s.weight > heaviest[ident].weight:
            heaviest[ident] = s
    return list(heaviest.values())


def exact_members(winners: Sequence[Winner], shapes: Sequence[Shape]) -> list[Member]:
    """Each shape with the winner of its key, bucketed as its study's space bucketed it.

    Shapes that `tune run` already grouped (the space's own strategy, align32 for the
    built-in mm space) share that winner; the search then groups further, from there."""
    by_key = {(w.kernel.name, tuple(w.key.values())): w for w in winners}
    strategies = {w.kernel.name: w.study.space.strategy for w in winners}
    members, missing = [], []
    for shape in shapes:
        kernel = kernel_for(shape.M, shape.N).name
        strategy = strategies.get(kernel)
        winner = None if strategy is None else by_key.get(
            (kernel, bucket_key(shape.key(), strategy)))
        if winner is None:
            missing.append(str(shape))
        else:
            members.append(Member(shape, dict(winner.trial.params)))
    if missing:
        raise SharingError(f"{len(missing)} listed shapes have no winner ({'; '.join(missing)}): "
                           "tune them first with `tune run --shapes ...`")
    return members


def gather_times(store: Store, device: Device, kernel_row: KernelVersion,
                 needed: Mapping[Shape, list[dict]],
                 timer: Callable[[Shape, list[dict]], list],
                 on_shape: Callable[[Shape], None] = lambda shape: None) -> Times:
    """Every needed (shape, config) time: from the database where the shape has them all,
    else timed side by side now (timer: tuner.execution.cross_timing.time_side_by_side bound to an
    executor and kernel) and stored config by config."""
    times: dict[tuple, float | None] = {}
    for shape, configs in needed.items():
        stored = store.cross_timings(device, kernel_row, shape)
        missing = [c for c in configs if params_key(c) not in stored]
        if missing:
            for outcome in timer(shape, configs):
                store.save_cross_timing(device, kernel_row, shape, outcome.config,
                                        outcome.status, outcome.reason, outcome.p50_ms,
                                        outcome.method)
            stored = store.cross_timings(device, kernel_row, shape)
        for config in configs:
            row = stored[params_key(config)]
            times[shape, signature(config)] = row.p50_ms if row.status == TrialStatus.OK else None
        on_shape(shape)
    return times


def _json_number(value: float) -> float | None:
    """JSON has no infinity (PostgreSQL refuses it): a regret no config achieves is null."""
    return None if math.isinf(value) else value


def bucketing_record(result: SearchResult) -> tuple[list, list]:
    """The chosen buckets and the Pareto table as the JSON the database keeps."""
    chosen = result.chosen
    buckets = [{"key": list(b.key), "config": b.config,
                "members": [{"shape": str(m.shape), "weight": m.shape.weight, "regret": r}
                            for m, r in zip(b.members, b.regrets)]}
               for b in chosen.buckets]
    pareto = [{"strategy": a.strategy, "rows": a.rows, "widened_singletons": a.widened,
               "geomean_regret": _json_number(a.geomean_regret),
               "max_regret": _json_number(a.max_regret), "chosen": a.strategy == chosen.strategy}
              for a in result.pareto]
    return buckets, pareto


def percent(regret: float) -> str:
    return "cannot run" if math.isinf(regret) else f"{regret:.1%}"


def pareto_markdown(kernel: str, result: SearchResult, max_regret: float) -> str:
    """The Pareto table and the chosen buckets, as committable markdown."""
    from tuner.kernels.base import config_label

    fields = ("M", "N", "K", "stride_am", "stride_bk")
    lines = [f"## {kernel}: bucketings on the Pareto front (budget: worst regret "
             f"<= {max_regret:.1%})", "",
             "| buckets | widened singletons | geomean regret | max regret | "
             + " | ".join(fields) + " | |",
             "|---|---|---|---|" + "---|" * len(fields) + "---|"]
    chosen = result.chosen
    for a in result.pareto:
        mark = "**chosen**" if a.strategy == chosen.strategy else ""
        lines.append(f"| {a.rows} | {a.widened} | {percent(a.geomean_regret)} | "
                     f"{percent(a.max_regret)} | "
                     + " | ".join(f"`{a.strategy[f]}`" for f in fields) + f" | {mark} |")
    lines += ["", f"chosen: {chosen.rows} buckets for {sum(len(b.members) for b in chosen.buckets)}"
              f" shapes ({chosen.widened} of them single shapes in widened buckets), geomean "
              f"regret {percent(chosen.geomean_regret)}, max {percent(chosen.max_regret)}", "",
              "| bucket (M, N, K, stride_am, stride_bk, dtype) | shared config | members "
              "(regret) |", "|---|---|---|"]
    for b in chosen.buckets:
        members = "; ".join(f"{m.shape} ({percent(r)})" for m, r in zip(b.members, b.regrets))
        lines.append(f"| {', '.join(map(str, b.key))} | {config_label(b.config)} | {members} |")
    return "\n".join(lines)


def choose_buckets(db, shapes_path: str, max_regret: float, candidates: Sequence[str],
                   device_selector: str | None, seed: int, workers, devices: tuple[int, ...],
                   out: Callable[[str], None] = print,
                   reporter: Reporter = STDERR, m_values: Sequence[int] = ()) -> None:
    """`tune buckets` on `db` (a tuner.db.database.Database, opened once the input is read):
    time each listed shape with the winners it could share (those timings stored), search
    the candidate strategies (finest first; none: DEFAULT_CANDIDATES) for the smallest
    bucketing within max_regret, and store it per kernel for `tune export`.

    m_values: the M values `tune run --m` swept the listed shapes over (tuner.shapes.swept_m);
    then those swept shapes are bucketed, M by strategies that cover every M up to the
    largest (tuner.bucketing.search.sweep_candidates).

    workers: a tuner.tuning.Workers whose check() gave `devices` (before triton was
    imported); an executor starts only if something is left to time. out: each kernel's
    Pareto table as markdown; the reporter: progress lines.
    """
    from rich.console import Console
    from rich.progress import Progress

    from tuner.execution.cross_timing import time_side_by_side
    from tuner.export.picks import current_device_winners
    from tuner.kernels import KERNELS

    for name in candidates:
        strategy_function(name)  # a bad name is one line now, before any work
    per_field = {f: tuple(candidates or DEFAULT_CANDIDATES) for f in SEARCHED_FIELDS}
    shapes = load_shapes(shapes_path)
    if m_values:
        try:
            shapes = swept_m(shapes, m_values)
        except ValueError as e:
            raise SharingError(str(e)) from None
        per_field["M"] = sweep_candidates(m_values, per_field["M"])
    shapes = distinct_shapes(shapes)
    store = db.store
    device, winners = current_device_winners(store, device_selector, reporter)
    members = exact_members(winners, shapes)
    by_kernel: dict[str, list] = {}
    for m in members:
        by_kernel.setdefault(kernel_for(m.shape.M, m.shape.N).name, []).append(m)
    kernel_rows = {w.kernel.name: w.kernel for w in winners}
    needed = {k: needed_configs(ms, per_field) for k, ms in by_kernel.items()}
    to_time = sum(any(params_key(c) not in store.cross_timings(device, kernel_rows[k], shape)
                      for c in configs)
                  for k, per_shape in needed.items() for shape, configs in per_shape.items())
    pairs = sum(len(c) for n in needed.values() for c in n.values())
    reporter.note(f"{len(members)} shapes, {pairs} (shape, config) timings needed; "
                  f"{to_time} shapes to time")
    executor = workers.executor(devices) if to_time else None
    try:
        if executor is not None and executor.device_info().fingerprint != device.fingerprint:
            raise SharingError(f"the winners were measured on {device.name} "
                               f"[{device.fingerprint}], not on this machine's device")
        results = {}
        with Progress(console=Console(stderr=True)) as progress:
            task = progress.add_task("timing shapes", total=len(members))
            for kernel_name, kernel_needed in needed.items():
                times = gather_times(
                    store, device, kernel_rows[kernel_name], kernel_needed,
                    timer=lambda shape, configs, kernel=KERNELS[kernel_name]: time_side_by_side(
                        executor, kernel, shape, seed, configs),
                    on_shape=lambda shape: progress.advance(task))
                results[kernel_name] = search(by_kernel[kernel_name], times, per_field,
                                              max_regret, seed, ("M",) if m_values else ())
    finally:
        if executor is not None:
            executor.close()
    shapes_source = shapes_path + (f" --m {','.join(map(str, m_values))}" if m_values else "")
    for kernel_name, result in results.items():
        buckets_json, pareto_json = bucketing_record(result)
        store.save_bucketing(device, kernel_rows[kernel_name], result.chosen.strategy,
                             max_regret, buckets_json, pareto_json, shapes_source)
        out(pareto_markdown(kernel_name, result, max_regret) + "\n")
    reporter.note("stored; `tune export` now writes one row per bucket")
