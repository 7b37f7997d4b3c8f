"""`tune run` on PostgreSQL: the schema, one run, and two runs sharing the database at once.

Runs only where TUNE_TEST_PG_URL names a PostgreSQL database whose role may create databases
(.ci/postgres.sh sets one up and prints its URL); skipped otherwise, except under
TUNE_REQUIRE_PG=1 (CI), where a missing URL fails. Each test works in a database of its own,
created from that URL and dropped afterwards, so runs never see each other's rows.
The tool runs as a subprocess (`python cli.py ...`), as users run it: --backend interpret
switches triton's mode, which must happen before triton is imported.
"""
import os
import re
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, select, text
from sqlalchemy.engine import make_url

from tests.factories import SMALL_SPACE
from tuner.bucketing.strategies import KEY_FIELDS
from tuner.db.models import Study, Trial, Winner
from tuner.db.optuna_storage import optuna_storage
from tuner.db.session import open_engine

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow  # whole runs, as subprocesses, on a PostgreSQL server
SUBPROCESS_TIMEOUT_S = 600  # for all the processes of one finish() together
# A run's last line: "tuned 3, already tuned 1, busy elsewhere 0, failed 0".
SUMMARY = re.compile(r"^tuned \d+(?:, [a-z ]+ \d+)*$", re.MULTILINE)

# Four shapes in four buckets: two mm (N > 1) and two gemv (N == 1), in bf16 and fp16.
SHAPES = """M,N,K,dtype,layout,weight
40,48,64,bf16,nn,1
100,72,40,fp16,nt,1
24,1,70,bf16,tn,1
200,1,96,fp16,nn,1
"""
KEYS = 4


def key_columns(model):
    """A study's or winner's key: one device and one space per kernel here, so kernel + bucket."""
    return [model.kernel_id, *(getattr(model, field) for field in KEY_FIELDS)]


@pytest.fixture
def pg_url():
    """The URL of a new, empty database on the test server; dropped after the test."""
    base = os.environ.get("TUNE_TEST_PG_URL")
    if not base:
        if os.environ.get("TUNE_REQUIRE_PG") == "1":
            pytest.fail("TUNE_REQUIRE_PG=1 but TUNE_TEST_PG_URL is not set (see .ci/postgres.sh)")
        pytest.skip("TUNE_TEST_PG_URL is not set (see .ci/postgres.sh)")
    # Set but unusable (server down, no driver, no CREATEDB) is an error, never a skip.
    name = f"tune_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")  # CREATE DATABASE needs it
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(base).set(database=name).render_as_string(hide_password=False)
    finally:
        # FORCE: a run killed on timeout may leave its connections behind.
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def workdir(tmp_path):
    (tmp_path / "shapes.csv").write_text(SHAPES)
    (tmp_path / "space.yaml").write_text(SMALL_SPACE)
    return tmp_path


def tune_command(url, *args):
    return [sys.executable, str(ROOT / "cli.py"), *args, "--db", url]


POLISH = 2  # trials each study may add past --trials, descending from its best config


def run_command(workdir, url, trials):
    return tune_command(url, "run", "--shapes", str(workdir / "shapes.csv"),
                        "--space", str(workdir / "space.yaml"), "--backend", "interpret",
                        "--trials", str(trials), "--polish", str(POLISH))


def start(command, cwd):
    # COLUMNS: rich draws `tune show`'s table at this width when stdout is not a terminal.
    return subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "COLUMNS": "200"})


def finish(procs) -> list[str]:
    """Wait for every process (bounded); fail with all their output unless each exited 0."""
    deadline = time.monotonic() + SUBPROCESS_TIMEOUT_S
    outputs, codes = [], []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        outputs.append(out)
        codes.append(proc.returncode)
    if any(codes):
        report = "\n".join(f"--- process {i}: exit {code}\n{out}"
                           for i, (code, out) in enumerate(zip(codes, outputs)))
        pytest.fail(f"exit codes {codes}\n{report}", pytrace=False)
    return outputs


def summary(output: str) -> dict[str, int]:
    """A run's summary line as counts: {"tuned": 3, "already tuned": 1, ...}."""
    found = SUMMARY.findall(output)
    assert found, f"no summary line in:\n{output}"
    return {name: int(n) for name, _, n in (part.rpartition(" ") for part in found[-1].split(", "))}


def test_schema_run_and_show(pg_url, workdir):
    [out] = finish([start(run_command(workdir, pg_url, trials=4), workdir)])
    counts = summary(out)
    assert (counts["tuned"], counts["already tuned"], counts["failed"]) == (KEYS, 0, 0), out

    engine = create_engine(pg_url)
    try:
        tables = set(inspect(engine).get_table_names())
    finally:
        engine.dispose()
    assert {"tuner_studies", "tuner_trials", "tuner_winners", "tuner_runs"} <= tables

    [shown] = finish([start(tune_command(pg_url, "show"), workdir)])
    for label in ("40x48x64 bf16 nn", "100x72x40 fp16 nt", "24x1x70 bf16 tn",
                  "200x1x96 fp16 nn"):
        assert label in shown, shown


@pytest.mark.parametrize("schema", ["empty database", "schema created"])
def test_concurrent_runs_tune_each_key_once(pg_url, workdir, schema):
    """Two runs of the same shapes on one database at once: every key is tuned by one of them.

    On an empty database both runs also create the schema (ours and Optuna's) at the same
    moment; with the schema already there, they share only the rows.
    """
    if schema == "schema created":
        open_engine(pg_url).dispose()
        optuna_storage(pg_url).engine.dispose()
    trials = 6
    procs = [start(run_command(workdir, pg_url, trials), workdir) for _ in range(2)]
    outputs = finish(procs)
    summaries = [summary(out) for out in outputs]
    assert [counts["failed"] for counts in summaries] == [0, 0], outputs
    assert sum(counts["tuned"] for counts in summaries) == KEYS, outputs

    # Only the columns asserted on: the tool may add columns without touching this test.
    engine = create_engine(pg_url)
    try:
        with engine.connect() as conn:
            studies = conn.execute(select(Study.id, Study.status, *key_columns(Study))).all()
            trials_rows = conn.execute(
                select(Trial.id, Trial.study_id, Trial.number, Trial.params, Trial.status)).all()
            winners = conn.execute(
                select(Winner.study_id, Winner.trial_id, *key_columns(Winner))).all()
    finally:
        engine.dispose()

    done = defaultdict(list)  # key -> ids of its finished studies
    for study_id, status, *key in studies:
        if status == "done":
            done[tuple(key)].append(study_id)
    assert len({tuple(key) for _, _, *key in studies}) == KEYS
    assert {key: ids for key, ids in done.items() if len(ids) != 1} == {}, "keys tuned twice"
    assert len(done) == KEYS

    trials_of = defaultdict(list)
    for trial in trials_rows:
        trials_of[trial.study_id].append(trial)
    for key, [study_id] in done.items():
        rows = trials_of[study_id]
        assert sorted(t.number for t in rows) == list(range(len(rows))), key
        # Configs found infeasible before compiling cost no budget; the rest are the budget.
        assert 1 <= sum(t.status != "infeasible" for t in rows) <= trials + POLISH, key
        configs = [tuple(sorted(t.params.items())) for t in rows]
        assert len(set(configs)) == len(configs), f"{key}: a config ran twice"

    assert len(winners) == KEYS and len({tuple(key) for _, _, *key in winners}) == KEYS
    for study_id, trial_id, *key in winners:
        assert [study_id] == done[tuple(key)], key
        assert trial_id in {t.id for t in trials_of[study_id]}, key
