"""kill -9 `tune run` mid-study, run the same command again: nothing finished is lost or
redone, and the trials in flight at the kill are redone. Runs through the interpreter."""
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="interpreter CLI tests run on CPU-only machines")
SPACE = """kernel: mm
params: {variant: [general], pad: [0], BLOCK_M: [16, 32, 64], BLOCK_N: [16, 32, 64],
         BLOCK_K: [32, 64], GROUP_M: [1, 4],
         num_stages: [2], num_warps: [2, 4]}
strategy: {M: align32, N: align32, K: align32, stride_am: align32, stride_bk: align32,
           dtype: default}
"""
TRIALS = 14


def stored_trials(db: Path) -> list[tuple]:
    if not db.exists():
        return []
    with sqlite3.connect(db, timeout=30) as c:
        try:
            return c.execute("select study_id, number, params from tuner_trials").fetchall()
        except sqlite3.OperationalError:  # schema not created yet
            return []


@pytest.mark.slow
def test_kill_9_then_rerun_loses_and_repeats_nothing(tmp_path):
    (tmp_path / "shapes.csv").write_text("M,N,K,dtype,layout\n96,80,160,fp32,nn\n")
    (tmp_path / "space.yaml").write_text(SPACE)
    db = tmp_path / "tune.db"
    command = [sys.executable, str(ROOT / "cli.py"), "run", "--shapes", "shapes.csv",
               "--space", "space.yaml", "--backend", "interpret", "--trials", str(TRIALS),
               "--polish", "0", "--patience", str(TRIALS), "--batch", "3",
               "--db", f"sqlite:///{db}"]  # patience: the trial budget alone ends the study
    first = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 180
    while len(stored_trials(db)) < 4 and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.05)
    os.killpg(first.pid, signal.SIGKILL)  # the tuner and its workers, mid-study
    first.wait()
    before = stored_trials(db)
    assert 4 <= len(before) < TRIALS, first.stderr.read().decode()[-2000:]

    storage = optuna.storages.RDBStorage(f"sqlite:///{db}")
    (summary,) = optuna.get_all_study_summaries(storage)
    in_flight = [t.params for t in optuna.load_study(study_name=summary.study_name,
                                                     storage=storage).get_trials(
        states=(optuna.trial.TrialState.RUNNING,))]

    second = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "tuned 1" in second.stderr
    after = stored_trials(db)
    assert set(before) <= set(after)  # nothing finished was lost
    assert sorted(n for _, n, _ in after) == list(range(TRIALS))
    assert len({p for _, _, p in after}) == TRIALS  # nothing measured twice
    import json
    stored_params = [json.loads(p) for _, _, p in after]
    assert all(p in stored_params for p in in_flight)  # the interrupted trials were redone
    study = optuna.load_study(study_name=summary.study_name, storage=storage)
    assert not study.get_trials(states=(optuna.trial.TrialState.RUNNING,))


def _tune(shapes: Path, db: Path) -> tuple[float, str]:
    """`tune run --trials 2 --no-early-stop` of a shapes file on the interpreter: seconds
    taken, stderr. Without early stop a new key always runs its two trials: with it, whether
    the near keys' winners confirm the warm start (1 s) or not (the model's ranking and two
    trials, 8 s) turns on the interpreter's wall-clock timings, a coin toss per run."""
    command = [sys.executable, str(ROOT / "cli.py"), "run", "--shapes", str(shapes),
               "--backend", "interpret", "--trials", "2", "--no-early-stop",
               "--db", f"sqlite:///{db}"]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=shapes.parent, capture_output=True, text=True,
                          timeout=900)
    seconds = time.perf_counter() - start
    assert done.returncode == 0, done.stderr[-2000:]
    return seconds, done.stderr


def _copy(db: Path, to: Path) -> Path:
    """A copy of a SQLite database, its WAL included (sqlite3's backup)."""
    with sqlite3.connect(db) as source, sqlite3.connect(to) as target:
        source.backup(target)
    return to


@pytest.mark.slow
def test_resume_over_tuned_keys_costs_what_the_new_key_costs(tmp_path):
    """20 keys tuned, then a run over them plus one new key: at most 1.2x the new key alone.
    The built-in space, whose model ranking takes seconds per shape: a resume that ranked the
    tuned keys (or waited for them to be ranked) would cost 20 of those."""
    header = "M,N,K,dtype,layout\n"
    tuned = [f"{32 * i},32,32,fp32,nn\n" for i in range(1, 21)]  # 20 align32 keys
    new = "32,64,32,fp32,nn\n"
    (tmp_path / "tuned.csv").write_text(header + "".join(tuned))
    (tmp_path / "all.csv").write_text(header + "".join(tuned) + new)
    (tmp_path / "new.csv").write_text(header + new)
    base = tmp_path / "base.db"
    _, err = _tune(tmp_path / "tuned.csv", base)
    assert "tuned 20," in err

    alone, resumed = [], []
    for attempt in range(3):  # interleaved, the fastest of each: timings on a shared CPU
        seconds, err = _tune(tmp_path / "new.csv", _copy(base, tmp_path / f"new{attempt}.db"))
        assert "tuned 1, already tuned 0," in err
        alone.append(seconds)
        seconds, err = _tune(tmp_path / "all.csv", _copy(base, tmp_path / f"all{attempt}.db"))
        assert "tuned 1, already tuned 20," in err
        resumed.append(seconds)
    assert min(resumed) <= 1.2 * min(alone), (alone, resumed)
