"""Running `tune run` as a user would, and reading back per-study times and results.

Shared by the executor and scaling benchmarks. Each run gets its own database and, when
asked, its own empty Triton cache (TRITON_CACHE_DIR), so "cold" really compiles everything.
"""
from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from tuner.statuses import TrialStatus

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class StudyStats:
    shape: str
    wall_s: float
    best_tflops: float | None
    compiled: int  # trials that got past the feasibility check (compiled or failed to)
    timed: int  # trials that ran correctly and were timed
    slowest_compile_s: float | None = None  # of the configs that compiled
    failures: str = ""  # e.g. "timeout 1, wrong 2": trials that compiled or ran and failed


def write_rows(shapes_csv: Path, rows: str, out: Path) -> Path:
    """The 1-based data rows `first-last` of a shapes CSV, as a CSV of their own."""
    lines = shapes_csv.read_text().splitlines()
    first, _, last = rows.partition("-")
    out.write_text("\n".join([lines[0], *lines[int(first):int(last or first) + 1]]) + "\n")
    return out


def tune(shapes: Path, db: Path, cache_dir: Path, *extra: str) -> float:
    """Run `tune run` to completion; returns its wall time in seconds."""
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache_dir)}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, str(ROOT / "cli.py"), "run", "--shapes", str(shapes),
                           "--db", f"sqlite:///{db}", *extra], env=env, capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise SystemExit(f"tune run failed:\n{proc.stderr[-3000:]}")
    return time.perf_counter() - start


def study_stats(db: Path) -> list[StudyStats]:
    """Per finished study of the latest run in `db`, in the order they were created."""
    with sqlite3.connect(db) as c:
        (run_id,) = c.execute("select max(id) from tuner_runs").fetchone()
        rows = c.execute(
            "select s.id, s.shape_M, s.shape_N, s.shape_K, s.dtype, s.shape_layout, "
            "s.created_at, s.finished_at from tuner_studies s where s.id in "
            "(select distinct study_id from tuner_trials where run_id = ?) order by s.id",
            (run_id,)).fetchall()
        stats = []
        for sid, m, n, k, dtype, layout, created, finished in rows:
            trials = c.execute("select status, tflops, compile_s from tuner_trials where "
                               "study_id = ? and run_id = ?", (sid, run_id)).fetchall()
            ok = [tf for status, tf, _ in trials if status == TrialStatus.OK]
            compile_s = [s for _, _, s in trials if s is not None]
            failed = Counter(status for status, _, _ in trials
                             if status not in (TrialStatus.OK, TrialStatus.INFEASIBLE))
            wall = (datetime.fromisoformat(finished) - datetime.fromisoformat(created))
            stats.append(StudyStats(
                f"{m}x{n}x{k} {dtype} {layout}", wall.total_seconds(), max(ok) if ok else None,
                sum(1 for status, _, _ in trials if status != TrialStatus.INFEASIBLE), len(ok),
                max(compile_s) if compile_s else None,
                ", ".join(f"{status} {count}" for status, count in sorted(failed.items()))))
    return stats


def device_line() -> str:
    import torch
    import triton
    names = {torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())}
    return (f"{torch.cuda.device_count()}x {', '.join(sorted(names))}, {os.cpu_count()} CPU "
            f"cores, torch {torch.__version__}, triton {triton.__version__}, CUDA "
            f"{torch.version.cuda}")
