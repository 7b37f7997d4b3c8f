"""The parallel executor against sequential compile-then-time, same trial budget, per shape.

    python benchmarks/executor_speed.py [--rows 1-8] [--trials 40] [--modes parallel,sequential]

"sequential" is one config at a time (--jobs 1 --batch 1): compile, then check and time, as
before the executor; "parallel" is the default (--jobs = CPU cores, batch of 8 compiled at
once). Each mode runs cold (empty Triton cache, new database) and then warm (same cache,
--retune). Per shape: wall time of its study (created to finished, baseline and re-timing
included), the winner's TFLOP/s, and how many configs were compiled and timed.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _tune_runs import ROOT, device_line, study_stats, tune, write_rows

MODES = {"sequential": ("--jobs", "1", "--batch", "1"), "parallel": ()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=str(ROOT / "benchmarks/shapes/shapes-dev.csv"))
    parser.add_argument("--rows", default="1-8")
    parser.add_argument("--trials", default="40")
    parser.add_argument("--modes", default="parallel,sequential")
    args = parser.parse_args()
    print(f"# executor vs sequential — {device_line()}\n")
    print(f"rows {args.rows} of {Path(args.shapes).name}, {args.trials} trials per study, GPU 0\n")
    print("| shape | mode | cold s | warm s | cold TF/s | warm TF/s | compiled cold/warm | "
          "timed cold/warm |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        shapes = write_rows(Path(args.shapes), args.rows, tmp / "shapes.csv")
        totals = {}
        for mode in args.modes.split(","):
            db, cache = tmp / f"{mode}.db", tmp / f"{mode}-cache"
            common = ("--trials", args.trials, "--devices", "0", *MODES[mode])
            cold_total = tune(shapes, db, cache, *common)
            cold = study_stats(db)
            warm_total = tune(shapes, db, cache, *common, "--retune")
            warm = study_stats(db)
            totals[mode] = (cold_total, warm_total)
            for c, w in zip(cold, warm):
                print(f"| {c.shape} | {mode} | {c.wall_s:.1f} | {w.wall_s:.1f} | "
                      f"{c.best_tflops or 0:.1f} | {w.best_tflops or 0:.1f} | "
                      f"{c.compiled}/{w.compiled} | {c.timed}/{w.timed} |", flush=True)
    print()
    for mode, (cold_total, warm_total) in totals.items():
        n = len(cold)
        print(f"{mode}: whole run cold {cold_total:.0f} s ({cold_total / n:.1f} s/shape), "
              f"warm {warm_total:.0f} s ({warm_total / n:.1f} s/shape)")


if __name__ == "__main__":
    main()
