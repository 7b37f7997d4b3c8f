"""Shapes tuned per minute on one GPU and on all visible GPUs, cold Triton cache each time.

    python benchmarks/multi_gpu_scaling.py [--rows 1-8] [--trials 40]

One `tune run` with --devices 0, then one with every visible GPU, each with a new database and
an empty Triton cache; the compile pool is --jobs = CPU cores in both.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from _tune_runs import ROOT, device_line, study_stats, tune, write_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=str(ROOT / "benchmarks/shapes/shapes-dev.csv"))
    parser.add_argument("--rows", default="1-8")
    parser.add_argument("--trials", default="40")
    args = parser.parse_args()
    gpus = torch.cuda.device_count()
    print(f"# multi-GPU scaling — {device_line()}\n")
    print(f"rows {args.rows} of {Path(args.shapes).name}, {args.trials} trials per study\n")
    print("| GPUs | wall s | shapes | shapes/min | speed-up | mean winner TF/s |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        shapes = write_rows(Path(args.shapes), args.rows, tmp / "shapes.csv")
        base = None
        for count in sorted({1, gpus}):
            devices = ",".join(map(str, range(count)))
            wall = tune(shapes, tmp / f"{count}.db", tmp / f"cache-{count}", "--trials",
                        args.trials, "--devices", devices)
            stats = study_stats(tmp / f"{count}.db")
            rate = len(stats) / wall * 60
            base = base or rate
            mean_tf = sum(s.best_tflops or 0 for s in stats) / len(stats)
            print(f"| {count} | {wall:.0f} | {len(stats)} | {rate:.2f} | {rate / base:.2f}x | "
                  f"{mean_tf:.1f} |", flush=True)


if __name__ == "__main__":
    main()
