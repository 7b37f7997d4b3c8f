"""The parallel executor against sequential compile-then-time, same trial budget, per shape.

    python benchmarks/executor_speed.py [--rows 1-8] [--trials 40] [--modes parallel,sequential]
                                        [--no-warm]

"sequential" is one config at a time (--jobs 1 --batch 1): compile, then check and time, as
before the executor; "parallel" is the default (--jobs = CPU cores, batches of 8 compiled at
once). Each shape is one `tune run`, cold (the mode's Triton cache holds only what earlier
shapes compiled, as in one run over the file), then warm (same cache, --retune). Per shape:
wall time of its study (created to finished: baseline and re-timing included, process start
excluded), the winner's TFLOP/s, and how many configs were compiled and timed. Rows print as
they finish.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _tune_runs import ROOT, device_line, study_stats, tune, write_rows

MODES = {"sequential": ("--jobs", "1", "--batch", "1"), "parallel": ()}


def _or_dash(stats, field: str) -> str:
    """A warm-run number for the table, or '-' when warm runs were skipped."""
    if stats is None:
        return "-"
    value = getattr(stats, field) or 0
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=str(ROOT / "benchmarks/shapes/shapes-dev.csv"))
    parser.add_argument("--rows", default="1-8")
    parser.add_argument("--trials", default="40")
    parser.add_argument("--modes", default="parallel,sequential")
    parser.add_argument("--no-warm", action="store_true", help="cold runs only")
    args = parser.parse_args()
    print(f"# executor vs sequential — {device_line()}\n")
    print(f"rows {args.rows} of {Path(args.shapes).name}, {args.trials} trials per study, GPU 0\n")
    print("| shape | mode | cold s | warm s | cold TF/s | warm TF/s | compiled cold/warm | "
          "timed cold/warm |")
    print("|---|---|---|---|---|---|---|---|", flush=True)
    first, _, last = args.rows.partition("-")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        totals = {}
        for mode in args.modes.split(","):
            cache = tmp / f"{mode}-cache"
            common = ("--trials", args.trials, "--devices", "0", *MODES[mode])
            walls = []
            for row in range(int(first), int(last or first) + 1):
                shape = write_rows(Path(args.shapes), str(row), tmp / f"row{row}.csv")
                db = tmp / f"{mode}-{row}.db"
                tune(shape, db, cache, *common)
                (cold,) = study_stats(db)
                warm = None
                if not args.no_warm:
                    tune(shape, db, cache, *common, "--retune")
                    (warm,) = study_stats(db)
                walls.append((cold.wall_s, warm.wall_s if warm else None))
                print(f"| {cold.shape} | {mode} | {cold.wall_s:.1f} | {_or_dash(warm, 'wall_s')} "
                      f"| {cold.best_tflops or 0:.1f} | {_or_dash(warm, 'best_tflops')} | "
                      f"{cold.compiled}/{_or_dash(warm, 'compiled')} | "
                      f"{cold.timed}/{_or_dash(warm, 'timed')} |", flush=True)
            totals[mode] = walls
    print()
    for mode, walls in totals.items():
        cold = sum(c for c, _ in walls) / len(walls)
        warm = "" if args.no_warm else f", warm {sum(w for _, w in walls) / len(walls):.1f}"
        print(f"{mode}: mean study wall time per shape cold {cold:.1f} s{warm}")


if __name__ == "__main__":
    main()
