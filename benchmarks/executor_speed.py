"""The parallel executor against sequential compile-then-time, same trial budget, per shape.

    python benchmarks/executor_speed.py [--rows 1-8] [--trials 40] [--modes parallel,sequential]
                                        [--no-warm] [--results FILE] [--stop-after-s S]

"sequential" is one config at a time (--jobs 1 --batch 1): compile, then check and time, as
before the executor; "parallel" is the default (--jobs = CPU cores, batches of 8 compiled at
once). Each shape is one `tune run`, cold (the mode's Triton cache holds only what earlier
shapes of this invocation compiled, as in one run over the file), then warm (same cache,
--retune). Per shape: wall time of its study (created to finished: baseline and re-timing
included, process start excluded) and of the whole `tune run` process, the winner's TFLOP/s,
how many configs were compiled and timed, the slowest compile and the failed trials.

A full comparison outlasts one 10-minute GPU call, so it resumes: each finished (mode, shape)
is appended to --results (JSON lines) as it finishes, an invocation skips what the file
already holds, starts no new shape after --stop-after-s, and prints the table of everything
in the file. A shape measured in a later invocation starts from an empty Triton cache, so it
is, if anything, colder than in one long run.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from _tune_runs import ROOT, StudyStats, device_line, study_stats, tune, write_rows

MODES = {"sequential": ("--jobs", "1", "--batch", "1"), "parallel": ()}


def _cell(stats: StudyStats | None, field: str) -> str:
    """A number for the table, or '-' for a warm run that was skipped or a missing value."""
    value = None if stats is None else getattr(stats, field)
    if value is None:
        return "-"
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def _load(path: Path) -> dict[tuple[str, int], dict]:
    if not path.exists():
        return {}
    records = (json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return {(r["mode"], r["row"]): r for r in records}


def _measure(shapes: Path, row: int, mode: str, trials: str, warm: bool, tmp: Path) -> dict:
    """One shape in one mode: a cold `tune run`, then (if warm) the same with --retune."""
    shape = write_rows(shapes, str(row), tmp / f"row{row}.csv")
    db, cache = tmp / f"{mode}-{row}.db", tmp / f"{mode}-cache"
    common = ("--trials", trials, "--devices", "0", *MODES[mode])
    cold_run_s = tune(shape, db, cache, *common)
    (cold,) = study_stats(db)
    record = {"mode": mode, "row": row, "cold": asdict(cold), "warm": None,
              "run_s": {"cold": cold_run_s}}
    if warm:
        record["run_s"]["warm"] = tune(shape, db, cache, *common, "--retune")
        record["warm"] = asdict(study_stats(db)[0])
    return record


def _print_table(header: str, records: dict[tuple[str, int], dict], modes: list[str]) -> None:
    print(header)
    print("| shape | mode | cold s | warm s | process cold/warm s | cold TF/s | warm TF/s | "
          "compiled cold/warm | timed cold/warm | slowest compile cold s | failed cold |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for mode in modes:
        rows = sorted(r for m, r in records if m == mode)
        for row in rows:
            rec = records[(mode, row)]
            cold = StudyStats(**rec["cold"])
            warm = StudyStats(**rec["warm"]) if rec["warm"] else None
            process = "/".join(f"{s:.1f}" for s in rec.get("run_s", {}).values()) or "-"
            print(f"| {cold.shape} | {mode} | {cold.wall_s:.1f} | {_cell(warm, 'wall_s')} | "
                  f"{process} | {cold.best_tflops or 0:.1f} | {_cell(warm, 'best_tflops')} | "
                  f"{cold.compiled}/{_cell(warm, 'compiled')} | "
                  f"{cold.timed}/{_cell(warm, 'timed')} | {_cell(cold, 'slowest_compile_s')} | "
                  f"{cold.failures or '-'} |")
    print()
    for mode in modes:
        recs = [rec for (m, _), rec in sorted(records.items()) if m == mode]
        if not recs:
            continue
        cold = sum(r["cold"]["wall_s"] for r in recs) / len(recs)
        warms = [r["warm"]["wall_s"] for r in recs if r["warm"]]
        warm = f", warm {sum(warms) / len(warms):.1f} s" if warms else ""
        print(f"{mode}: {len(recs)} shapes, mean study wall time per shape cold {cold:.1f} s"
              f"{warm}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=str(ROOT / "benchmarks/shapes/shapes-dev.csv"))
    parser.add_argument("--rows", default="1-8")
    parser.add_argument("--trials", default="40")
    parser.add_argument("--modes", default="parallel,sequential")
    parser.add_argument("--no-warm", action="store_true", help="cold runs only")
    parser.add_argument("--results", type=Path, default=None,
                        help="JSON-lines file of finished measurements, resumed from")
    parser.add_argument("--stop-after-s", type=float, default=None,
                        help="start no new shape after this many seconds")
    args = parser.parse_args()
    modes = args.modes.split(",")
    first, _, last = args.rows.partition("-")
    rows = range(int(first), int(last or first) + 1)
    started = time.monotonic()
    records = _load(args.results) if args.results else {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in modes:
            for row in rows:
                if (mode, row) in records:
                    continue
                if args.stop_after_s and time.monotonic() - started > args.stop_after_s:
                    break
                record = _measure(Path(args.shapes), row, mode, args.trials, not args.no_warm,
                                  Path(tmp))
                records[(mode, row)] = record
                if args.results:
                    with args.results.open("a") as f:
                        f.write(json.dumps(record) + "\n")
                print(f"done: {mode} row {row}: {record['cold']['shape']} cold "
                      f"{record['cold']['wall_s']:.1f} s", flush=True)
    missing = [(m, r) for m in modes for r in rows if (m, r) not in records]
    _print_table(f"# executor vs sequential — {device_line()}\n\nrows {args.rows} of "
                 f"{Path(args.shapes).name}, {args.trials} trials per study, GPU 0"
                 + (f"; STILL MISSING: {missing}" if missing else "") + "\n",
                 records, modes)


if __name__ == "__main__":
    main()
