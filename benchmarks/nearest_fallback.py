"""How well the runtime answers shapes that were never tuned, and how many nearest buckets the
model should choose among (tuner.runtime.fallback.NEAREST_BUCKETS).

    # on the GPU, once: every listed and hold-out shape timed with every winner of its
    # kernel and dtype, and every listed shape's alternates (the winners of both CSVs must be
    # in --db: tune both into it)
    python benchmarks/nearest_fallback.py measure --db sqlite:///all.db \
        --shapes shapes.csv --holdout holdout.csv -o cross_timings.json
    # anywhere: the regrets, per number of nearest buckets
    python benchmarks/nearest_fallback.py report cross_timings.json

`report` builds one-row-per-shape tables of the listed shapes, as `tune export --exact` writes
them (with their alternates, and again without), and asks the runtime itself
(tuner.validate.runtime_pick) for each shape's config:
- leave-one-out: each listed shape answered from a table of the other listed shapes;
- hold-out: each hold-out shape answered from the table of all listed shapes.
Regret is the answer's time over the shape's own winner's, both from the one side-by-side
timing of the shape (interleaved, L2 flushed, outputs checked; tuner.execution.cross_timing).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

from tuner import runtime
from tuner.bucketing.search import signature, weighted_geomean_regret
from tuner.runtime import fallback
from tuner.shapes import Shape

NEAREST_COUNTS = (1, 2, 3, 4, 5, 6, 8, 12)
EXACT = {"M": "default", "N": "default", "K": "default", "stride_am": "default",
         "stride_bk": "default", "dtype": "default"}


def measure(args) -> None:
    """Time every shape with every winner of its kernel and dtype; write them as JSON."""
    from tuner.execution.backends import require_gpu, visible_gpus

    require_gpu()
    from tuner.bucketing.job import distinct_shapes, exact_members, gather_times
    from tuner.db.session import session_factory
    from tuner.db.store import Store
    from tuner.execution.cross_timing import time_side_by_side
    from tuner.execution.executor import Executor, ExecutorOptions
    from tuner.export.picks import current_only, runner_ups, study_trials
    from tuner.kernels import KERNELS, kernel_for, source_hashes
    from tuner.shapes import load_shapes

    store = Store(session_factory(args.db))
    winners, _ = current_only(store.winners(), source_hashes())
    device = winners[0].device
    listed = distinct_shapes(load_shapes(args.shapes))
    holdout = distinct_shapes(load_shapes(args.holdout))
    members = exact_members(winners, listed + holdout)
    kernel_rows = {w.kernel.name: w.kernel for w in winners}
    executor = Executor(ExecutorOptions("gpu", tuple(visible_gpus()), args.jobs, 120.0))
    shapes = {}
    try:
        for kernel_name in sorted({kernel_for(m.shape.M, m.shape.N).name for m in members}):
            mates = [m for m in members if kernel_for(m.shape.M, m.shape.N).name == kernel_name]
            trials = study_trials(store, device, kernel_rows[kernel_name])
            # what an exact table of the listed shapes carries, as `tune export` writes it
            alternates = {m.shape: runner_ups(trials(m.shape), m.winner)
                          for m in mates if m.shape in listed}
            needed = {m.shape: list({signature(c): c for o in [m, *mates]
                                     if o.shape.dtype == m.shape.dtype
                                     for c in [o.winner, *alternates.get(o.shape, ())]
                                     }.values())
                      for m in mates}
            times = gather_times(store, device, kernel_rows[kernel_name], needed,
                                 lambda shape, configs, kernel=KERNELS[kernel_name]:
                                 time_side_by_side(executor, kernel, shape, 0, configs),
                                 lambda shape: print(f"timed {shape}", file=sys.stderr))
            for m in mates:
                shapes[str(m.shape)] = {
                    "kernel": kernel_name, "listed": m.shape in listed, "own": m.winner,
                    "alternates": alternates.get(m.shape, []),
                    "times": [[c, times[m.shape, signature(c)]] for c in needed[m.shape]]}
    finally:
        executor.close()
    info = executor.device_info()
    Path(args.output).write_text(json.dumps({"device": info.name, "shapes": shapes}))


def _table(path: Path, rows: dict, device: str, alternates: bool) -> Path:
    """An exact table (one row per listed shape) of the given shapes' winners, and their
    alternates if asked."""
    from tuner.formats.files import write_atomic

    ops: dict[str, dict] = {}
    for label, row in rows.items():
        op = ops.setdefault(row["kernel"], {"strategy": EXACT, "entries": []})
        op["entries"].append({"key": Shape.from_label(label).key(), "config": row["own"],
                              "alternates": row["alternates"] if alternates else []})
    # the device names the model's spec, with which the runtime chooses among nearest buckets
    write_atomic(path, {"format": runtime.TABLE_FORMAT, "device": {"name": device},
                        "ops": ops})
    return path


def _regret(row: dict, config: dict) -> float | None:
    """The answer's time over the own winner's - 1; inf where it cannot run the shape, None
    where it was not timed (the runtime's default, for a dtype no other shape has, or a
    variation of a neighbour's config: another split or pipeline, a halved tile)."""
    by_signature = {signature(c): ms for c, ms in row["times"]}
    if signature(config) not in by_signature:
        return None
    answer = by_signature[signature(config)]
    return math.inf if answer is None else answer / by_signature[signature(row["own"])] - 1


def _answers(shapes: dict, device: str, k: int, alternates: bool,
             tmp: Path) -> dict[str, tuple[list[float], list[str]]]:
    """Per question (leave-one-out, hold-out): the regrets, and the shapes left unanswered."""
    from tuner.validate import runtime_pick

    fallback.NEAREST_BUCKETS = k
    listed = {label: row for label, row in shapes.items() if row["listed"]}
    questions = {"leave-one-out": [(label, {o: r for o, r in listed.items() if o != label})
                                   for label in listed],
                 "hold-out": [(label, listed) for label, row in shapes.items()
                              if not row["listed"]]}
    results = {}
    for name, asked in questions.items():
        regrets, missed = [], []
        for i, (label, table_rows) in enumerate(asked):
            runtime.clear_cache()
            table = _table(tmp / f"{name}-{i}.yaml", table_rows, device, alternates)
            regret = _regret(shapes[label], runtime_pick(table, Shape.from_label(label)).config)
            if regret is None:
                missed.append(label)
            else:
                regrets.append(regret)
        results[name] = regrets, missed
    return results


def report(args) -> None:
    doc = json.loads(Path(args.times).read_text())
    shapes, device = doc["shapes"], doc["device"]
    print(f"# never-tuned shapes answered by the runtime ({device})\n")
    print("regret against the shape's own winner, from exact tables of the listed shapes, "
          "with and without the entries' alternates\n")
    print("| candidates | nearest buckets | leave-one-out geomean | max | hold-out geomean | "
          "max |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for alternates in (False, True):
            for k in NEAREST_COUNTS:
                cells = []
                answers = _answers(shapes, device, k, alternates, Path(tmp))
                for regrets, _ in answers.values():
                    finite = [r for r in regrets if math.isfinite(r)]
                    cells += [f"{weighted_geomean_regret(finite, [1.0] * len(finite)):.1%}",
                              f"{max(regrets):.1%}"]
                which = "configs and alternates" if alternates else "configs"
                print(f"| {which} | {k} | " + " | ".join(cells) + " |")
    print("\nGeomeans leave out answers that cannot run the shape (the dispatcher would run "
          "the default instead); the max counts them as inf. Left out, as answers the file "
          "did not time (the default, for a dtype no other shape has, or a variation of a "
          "winner no shape won with: another split or pipeline, a halved tile), in the last "
          "row: " + ", ".join(
              f"{name}: {'; '.join(missed) or 'none'}" for name, (_, missed) in answers.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    m = commands.add_parser("measure")
    m.add_argument("--db", required=True)
    m.add_argument("--shapes", required=True)
    m.add_argument("--holdout", required=True)
    m.add_argument("--jobs", type=int, default=16)
    m.add_argument("-o", "--output", required=True)
    r = commands.add_parser("report")
    r.add_argument("times")
    args = parser.parse_args()
    (measure if args.command == "measure" else report)(args)


if __name__ == "__main__":
    main()
