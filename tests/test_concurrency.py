"""Several `tune run` processes starting at once on one fresh SQLite file all start cleanly:
our schema and Optuna's are created under one lock (tuner.db.session.schema_lock), and the
key is tuned once, by whichever process claims it. Runs through the interpreter."""
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.factories import SMALL_SPACE

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="interpreter CLI tests run on CPU-only machines")
PROCESSES, REPEATS = 4, 5


@pytest.mark.slow
def test_four_runs_starting_together_on_a_fresh_file_all_succeed(tmp_path):
    (tmp_path / "shapes.csv").write_text("M,N,K,dtype,layout\n32,32,32,fp32,nn\n")
    (tmp_path / "space.yaml").write_text(SMALL_SPACE)
    for repeat in range(REPEATS):
        db = tmp_path / f"fresh{repeat}.db"
        command = [sys.executable, str(ROOT / "cli.py"), "run", "--shapes", "shapes.csv",
                   "--space", "space.yaml", "--backend", "interpret", "--trials", "2",
                   "--db", f"sqlite:///{db}"]
        runs = [subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for _ in range(PROCESSES)]
        errs = [run.communicate(timeout=600)[1] for run in runs]
        ended = [(run.returncode, err) for run, err in zip(runs, errs)]
        for code, err in ended:
            assert code == 0 and "Traceback" not in err, f"repeat {repeat}:\n{err[-3000:]}"
        tuned = sum(err.splitlines()[-1].startswith("tuned 1,") for _, err in ended)
        assert tuned == 1, [err.splitlines()[-1] for _, err in ended]  # each key once
        with sqlite3.connect(db) as c:
            assert c.execute("PRAGMA integrity_check").fetchone() == ("ok",)
            assert c.execute("select count(*) from tuner_studies").fetchone() == (1,)
            assert c.execute("select count(*) from studies").fetchone() == (1,)  # Optuna's
            assert c.execute("select status, count(*) from tuner_runs group by status"
                             ).fetchall() == [("finished", PROCESSES)]
