"""How long `tune run` takes per shape, and what its winners lose, against the full search.

    python benchmarks/tune_speed.py --shapes benchmarks/shapes/holdout-dev.csv [--rows 1-12]
        [--work DIR] [--passes reference,new,warm,compare] [-o table.md]

Passes, each in this process, on GPU 0, each cold (an empty database and Triton cache):
- reference: the search before issue 40, pinned by its flags (--no-early-stop --patience 24
  --polish 12): the winners and seconds the new defaults are held to;
- new: `tune run`'s defaults;
- warm: each shape's neighbour (its M doubled, N where M is 1; 1.5x where that shape is
  listed) tuned with the new pass's database and Triton cache, so that a tuned key sits
  next to it, as the next M of a sweep would;
- compare: per shape, the reference's and the new pass's winners re-timed side by side
  (tuner.execution: L2 flushed, interleaved), by device time and by eager time per call.

Seconds per shape are each study's wall (created to finished: model ranking, search, final
re-timing and cuBLAS baseline; the workers' start-up, once per pass, excluded). Each row also
keeps where its study's seconds went (tuner.search.phases: claim, set-up, warm start, compile
waits, measures, records, re-timing, finish), and the table ends with the warm studies'
breakdown: what a warm study costs beyond its device steps. Every pass
appends its rows to DIR/results.jsonl and skips the shapes that file already holds, so the
passes can run in separate calls sharing --work (one 10-minute GPU call fits all four on
about 12 shapes). The table ends with the issue's three lines once the file holds them all.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _tune_runs import write_rows  # noqa: E402

PASSES = ("reference", "new", "warm", "compare")


def budget(name: str, seed: int):
    """The StudyBudget of a pass: the reference's pinned flags, or the defaults."""
    from tuner.search.budget import (
        DEFAULT_PATIENCE,
        DEFAULT_POLISH,
        DEFAULT_TRIALS,
        REFERENCE_PATIENCE,
        REFERENCE_POLISH,
        StudyBudget,
    )
    from tuner.tuning import MAX_DEFAULT_BATCH

    batch = min(os.cpu_count() or 1, MAX_DEFAULT_BATCH)
    if name == "reference":
        return StudyBudget(DEFAULT_TRIALS, None, seed, batch, REFERENCE_PATIENCE,
                           polish=REFERENCE_POLISH)
    return StudyBudget(DEFAULT_TRIALS, None, seed, batch, DEFAULT_PATIENCE,
                       polish=DEFAULT_POLISH, early_stop=True)


def neighbour(shape, listed=()):
    """The key next to a tuned one: M doubled (N where M is 1: the gemv kernel's key), or
    times 1.5 where that is a listed shape (tuned in the new pass already)."""
    from dataclasses import replace
    field = "N" if shape.M == 1 else "M"
    size = getattr(shape, field)
    doubled = replace(shape, **{field: size * 2})
    if str(doubled) not in {str(s) for s in listed}:
        return doubled
    return replace(shape, **{field: size + size // 2})


def studies(db_path: Path) -> dict[str, dict]:
    """Per tuned shape of a pass's database: seconds, trials, why it ended, and its winner."""
    from tuner.db.database import Database

    store = Database(f"sqlite:///{db_path}").store
    rows = {}
    for w in store.winners():
        study = w.study
        rows[study.shape_label] = {
            "seconds": (study.finished_at - study.created_at).total_seconds(),
            "trials": sum(t.status != "infeasible" for t in store.trials_of(study)),
            "ended_by": study.reason, "kernel": w.kernel.name, "config": w.trial.params,
            "device_ms": w.trial.p50_ms, "eager_ms": w.trial.loop_ms}
    return rows


def tune_pass(name: str, shapes, work: Path, args) -> None:
    """One tuning pass into its own database and Triton cache (warm: copies of new's)."""
    from tuner.db.database import Database
    from tuner.reporting import Silent
    from tuner.tuning import Workers, tune_run

    db, cache = work / f"{name}.db", work / f"cache-{name}"
    if name == "warm":
        with sqlite3.connect(work / "new.db") as source, sqlite3.connect(db) as copy:
            source.backup(copy)  # with what the write-ahead log still holds
        if (work / "cache-new").exists():  # the interpreter compiles nothing
            shutil.copytree(work / "cache-new", cache, dirs_exist_ok=True)
        shapes = [neighbour(s, shapes) for s in shapes]
    os.environ["TRITON_CACHE_DIR"] = str(cache)  # the workers this pass starts inherit it
    workers = Workers(args.backend, os.cpu_count() or 1, 120.0, (0,) if args.backend == "gpu"
                      else None)
    summary = tune_run(Database(f"sqlite:///{db}", create=True), shapes, args.space,
                       budget(name, args.seed), workers, [f"tune_speed {name}"],
                       reporter=Silent())
    tuned = studies(db)
    labels = [str(s) for s in shapes]
    with (work / "results.jsonl").open("a") as out:
        for label in labels:
            if label in tuned:
                phases = summary.phases[f"{tuned[label]['kernel']} {label}"].seconds
                out.write(json.dumps({"pass": name, "shape": label, **tuned[label],
                                      "phases": phases}) + "\n")
    if summary.failed:
        print(f"{name}: no correct config for {'; '.join(summary.failed)}", file=sys.stderr)


def compare_pass(results: dict, work: Path, args) -> None:
    """The reference's and the new winners of each shape, re-timed side by side."""
    from tuner.objective import EAGER, GRAPH
    from tuner.shapes import Shape
    from tuner.tuning import Workers

    pairs = [(label, results["reference"][label], results["new"][label])
             for label in results["new"] if label in results["reference"]
             and label not in results["compare"]]
    workers = Workers(args.backend, 1, 120.0, (0,) if args.backend == "gpu" else None)
    executor = workers.executor(workers.check())
    try:
        with (work / "results.jsonl").open("a") as out:
            for label, ref, new in pairs:
                row = {"pass": "compare", "shape": label}
                for launch in (GRAPH, EAGER):
                    ratio = 1.0
                    if ref["config"] != new["config"]:
                        ref_t, new_t = executor.retime(0, Shape.from_label(label), args.seed,
                                                       new["kernel"],
                                                       [ref["config"], new["config"]], launch)
                        ratio = ref_t.p50_ms / new_t.p50_ms
                    row["device" if launch == GRAPH else "eager"] = ratio
                out.write(json.dumps(row) + "\n")
    finally:
        executor.close()


def load(work: Path) -> dict[str, dict[str, dict]]:
    results: dict[str, dict[str, dict]] = {name: {} for name in PASSES}
    path = work / "results.jsonl"
    for line in path.read_text().splitlines() if path.exists() else ():
        row = json.loads(line)
        results[row["pass"]][row["shape"]] = row
    return results


def report(results: dict, shapes) -> str:
    """The per-shape table and, once every pass is in, the issue's three bottom lines."""
    lines = ["| shape | ref s | ref trials | new s | new trials | ended by | device vs ref | "
             "eager vs ref | warm shape | warm s | warm trials |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for shape in shapes:
        label, warm_label = str(shape), str(neighbour(shape, shapes))
        ref, new = results["reference"].get(label), results["new"].get(label)
        cmp, warm = results["compare"].get(label), results["warm"].get(warm_label)

        def cell(row, key, fmt="{:.1f}"):
            return "-" if row is None or row.get(key) is None else fmt.format(row[key])
        ended = "-" if new is None else (new["ended_by"] or "-").split(":")[0].split(";")[0]
        lines.append(f"| {label} | {cell(ref, 'seconds')} | {cell(ref, 'trials', '{}')} | "
                     f"{cell(new, 'seconds')} | {cell(new, 'trials', '{}')} | {ended} | "
                     f"{cell(cmp, 'device', '{:.3f}')} | {cell(cmp, 'eager', '{:.3f}')} | "
                     f"{warm_label} | {cell(warm, 'seconds')} | {cell(warm, 'trials', '{}')} |")
    labels = [str(s) for s in shapes]
    new_s = [results["new"][label]["seconds"] for label in labels if label in results["new"]]
    ref_s = [results["reference"][label]["seconds"] for label in labels
             if label in results["reference"]]
    if ref_s:
        lines.append(f"\nreference seconds per shape: median {statistics.median(ref_s):.1f}, "
                     f"max {max(ref_s):.1f} over {len(ref_s)} shapes")
    compared = [results["compare"][label] for label in labels if label in results["compare"]]
    warm_s = [results["warm"][str(neighbour(s, shapes))]["seconds"] for s in shapes
              if str(neighbour(s, shapes)) in results["warm"]]
    if new_s and compared and warm_s:
        device, eager = [c["device"] for c in compared], [c["eager"] for c in compared]
        lines += [
            f"seconds per shape: median {statistics.median(new_s):.1f}, max {max(new_s):.1f} "
            f"over {len(new_s)} shapes",
            f"quality vs reference: device geomean {statistics.geometric_mean(device):.3f}, "
            f"min {min(device):.3f}; eager geomean {statistics.geometric_mean(eager):.3f}, "
            f"min {min(eager):.3f}",
            f"warm seconds per shape: median {statistics.median(warm_s):.1f} over "
            f"{len(warm_s)} shapes"]
    return "\n".join(lines)


def phase_breakdown(rows: list[dict]) -> str:
    """Where the studies' seconds went: per study its phases, costliest first (those over
    5 ms), then each phase's median over the studies. Rows written before phases were
    recorded are left out."""
    rows = [row for row in rows if row.get("phases")]
    if not rows:
        return ""
    lines = ["| shape | s | trials | phases (s) |", "|---|---|---|---|"]
    for row in rows:
        phases = sorted(row["phases"].items(), key=lambda kv: -kv[1])
        shown = ", ".join(f"{phase} {s:.3f}" for phase, s in phases if s >= 0.005)
        lines.append(f"| {row['shape']} | {row['seconds']:.2f} | {row['trials']} | {shown} |")
    median = {phase: statistics.median(row["phases"].get(phase, 0.0) for row in rows)
              for phase in {phase for row in rows for phase in row["phases"]}}
    medians = ", ".join(f"{phase} {s:.3f}" for phase, s in
                        sorted(median.items(), key=lambda kv: -kv[1]))
    return "\n".join([*lines, f"\nmedian seconds per phase over {len(rows)} studies: {medians}"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=Path, required=True)
    parser.add_argument("--rows", help="1-based data rows of --shapes, e.g. 1-12")
    parser.add_argument("--work", type=Path, default=Path("tune-speed"),
                        help="Databases, Triton caches and results.jsonl, shared by calls.")
    parser.add_argument("--passes", default=",".join(PASSES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", choices=("gpu", "interpret"), default="gpu",
                        help="interpret: a CPU smoke test of the script (no GPU timings).")
    parser.add_argument("--space", action="append", default=[],
                        help="A search space replacing the built-in one (smoke tests).")
    parser.add_argument("-o", "--output", type=Path, help="Also write the table here.")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    shapes_csv = args.shapes
    if args.rows:
        shapes_csv = write_rows(args.shapes, args.rows, args.work / "shapes.csv")

    from tuner.shapes import load_shapes
    from tuner.tuning import Workers

    Workers(args.backend, 1, 120.0).check()  # before anything imports triton
    shapes = load_shapes(shapes_csv)
    for name in args.passes.split(","):
        if name not in PASSES:
            raise SystemExit(f"--passes: {name!r} is not one of {', '.join(PASSES)}")
        done = load(args.work)[name]
        if name == "compare":
            compare_pass(load(args.work), args.work, args)
        elif not any(str(neighbour(s, shapes) if name == "warm" else s) in done
                     for s in shapes):
            tune_pass(name, shapes, args.work, args)
    results = load(args.work)
    table = report(results, shapes)
    warm = [results["warm"][str(neighbour(s, shapes))] for s in shapes
            if str(neighbour(s, shapes)) in results["warm"]]
    if breakdown := phase_breakdown(warm):
        table += "\n\n## Where the warm studies' seconds went\n\n" + breakdown
    print(table)
    if args.output:
        from tuner.formats.files import write_text_atomic
        write_text_atomic(args.output, table + "\n")


if __name__ == "__main__":
    main()
