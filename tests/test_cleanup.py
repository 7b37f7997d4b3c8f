"""What killed runs leave behind is settled by the next `tune run`: their run rows marked
`interrupted`, their Optuna trials failed (a dead local process, or a stale heartbeat on any
host), and studies named for what they tune, so that optuna-dashboard can tell them apart."""
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from sqlalchemy import event, select, text

from tests.factories import H100, SMALL_SPACE
from tuner.db.database import Database
from tuner.db.models import Run, SearchSpaceRecord, Study
from tuner.db.optuna_storage import (
    OWNER_ATTR,
    STUDY_ID_ATTR,
    optuna_storage,
    settle_dead_trials,
    tuner_study_id,
)
from tuner.db.session import session_factory, sqlite_lock_path
from tuner.db.store import Store

ROOT = Path(__file__).resolve().parent.parent
HOST = socket.gethostname()


def dead_pid() -> int:
    """The pid of a process of this host that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.fixture
def db(tmp_path):
    url = f"sqlite:///{tmp_path / 'tune.db'}"
    store = Store(session_factory(url))
    device = store.device(H100)
    kernel = store.kernel("mm", "abc")
    with store.sessions() as s:
        space = SearchSpaceRecord(hash="h", kernel_name="mm", strategy={}, yaml="")
        s.add(space)
        s.commit()

    def study(status: str) -> Study:
        with store.sessions() as s:
            row = Study(device_id=device.id, kernel_id=kernel.id, space_id=space.id, M=64,
                        N=64, K=64, stride_am=64, stride_bk=64, dtype="fp16", shape_M=64,
                        shape_N=64, shape_K=64, shape_layout="nn", seed=0, launch="eager",
                        status=status)
            s.add(row)
            s.commit()
            return row

    return url, store, device, study


def test_running_runs_whose_process_is_gone_are_marked_interrupted(db):
    _, store, device, _ = db
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with store.sessions() as s:
            rows = {name: Run(device_id=device.id, backend="interpret", hostname=host, pid=pid,
                              command=["tune"])
                    for name, host, pid in [("dead", HOST, dead_pid()),
                                            ("alive", HOST, sleeper.pid),
                                            ("elsewhere", "another-host", dead_pid()),
                                            ("no pid", HOST, None)]}
            s.add_all(rows.values())
            s.commit()
        mine = store.start_run(device, "interpret", ["tune", "run"])
        assert (mine.pid, mine.hostname) == (os.getpid(), HOST)
        with store.sessions() as s:
            status = {name: s.get(Run, row.id) for name, row in rows.items()}
        assert {name: run.status for name, run in status.items()} == {
            "dead": "interrupted", "alive": "running", "elsewhere": "running",
            "no pid": "running"}
        assert status["dead"].finished_at == status["dead"].started_at  # no trial stored
        assert store.interrupt_dead_runs() == []  # settled once
    finally:
        sleeper.kill()
        sleeper.wait()


def test_trials_left_by_dead_processes_are_failed_and_redone_where_the_study_resumes(db):
    url, store, _, study = db
    storage = optuna_storage(url)
    open_row, done_row = study("running"), study("done")
    opened = optuna.create_study(study_name="open", storage=storage, direction="maximize")
    opened.set_user_attr(STUDY_ID_ATTR, open_row.id)
    closed = optuna.create_study(study_name=f"tuner-study-{done_row.id}", storage=storage)
    foreign = optuna.create_study(study_name="not the tuner's", storage=storage)

    me = f"{HOST}:{os.getpid()}"

    def running(study, x: int, owner: str = me):
        """A trial popped from the queue and RUNNING, as if `owner` held it."""
        study.enqueue_trial({"x": x})
        trial = study.ask()
        assert trial.suggest_int("x", 0, 100) == x
        assert storage.get_trial(trial._trial_id).system_attrs[OWNER_ATTR] == me
        storage.set_trial_system_attr(trial._trial_id, OWNER_ATTR, owner)
        return trial

    killed = running(opened, 1, f"{HOST}:{dead_pid()}")
    live = opened.ask()  # created by this process's ask: alive
    live.suggest_int("x", 0, 100)
    assert storage.get_trial(live._trial_id).system_attrs[OWNER_ATTR] == me
    stale = running(opened, 3, "another-host:77")
    fresh = running(opened, 4, "another-host:78")
    with storage.engine.begin() as conn:  # another host's heartbeat an hour old
        conn.execute(text("UPDATE trial_heartbeats SET heartbeat = datetime('now', '-1 hour') "
                          "WHERE trial_id = :id"), {"id": stale._trial_id})
    opened.enqueue_trial({"x": 5})  # the queue of an open study: asked first on resume
    # stored before owners were kept: by Optuna's own storage
    closed_running = optuna.load_study(study_name=closed.study_name,
                                       storage=optuna.storages.RDBStorage(url)).ask()
    closed.enqueue_trial({"x": 7})
    foreign_running = running(foreign, 8, f"{HOST}:{dead_pid()}")

    assert settle_dead_trials(storage, store) == 4
    state = {t.number: t for t in opened.get_trials()}
    assert {n: state[n].state for n in (killed.number, live.number, stale.number,
                                        fresh.number)} == {
        killed.number: TrialState.FAIL, live.number: TrialState.RUNNING,
        stale.number: TrialState.FAIL, fresh.number: TrialState.RUNNING}
    waiting = [t.system_attrs["fixed_params"] for t in opened.get_trials(
        states=(TrialState.WAITING,))]
    assert sorted(w["x"] for w in waiting) == [1, 3, 5]  # the dead ones redone, then the queue
    # a closed study: nothing resumes it, so its running and queued trials are residue
    assert [t.state for t in closed.get_trials()] == [TrialState.FAIL] * 2
    assert closed_running.number == 0
    assert foreign.trials[foreign_running.number].state == TrialState.RUNNING  # not ours
    assert settle_dead_trials(storage, store) == 0  # nothing twice


def test_a_trial_becomes_running_and_owned_in_one_commit(db):
    """A kill between two commits must not leave a RUNNING trial nobody is known to hold: at
    every commit, each RUNNING trial, asked new or popped from the queue, names its owner."""
    url, *_ = db
    storage = optuna_storage(url)
    study = optuna.create_study(storage=storage)
    unowned: list[int] = []

    def check(_session):
        with storage.engine.connect() as conn:
            unowned.extend(conn.execute(text(
                "SELECT trial_id FROM trials WHERE state = 'RUNNING' AND trial_id NOT IN "
                "(SELECT trial_id FROM trial_system_attributes WHERE key = :key)"),
                {"key": OWNER_ATTR}).scalars())

    event.listen(storage.scoped_session, "after_commit", check)
    asked = study.ask()
    study.enqueue_trial({"x": 1})
    popped = study.ask()
    assert popped.suggest_int("x", 0, 9) == 1
    assert unowned == []
    me = f"{HOST}:{os.getpid()}"
    assert [storage.get_trial(t._trial_id).system_attrs[OWNER_ATTR]
            for t in (asked, popped)] == [me, me]


def test_opening_the_storage_for_a_run_settles_what_dead_runs_left(db):
    url, store, device, study = db
    with store.sessions() as s:
        s.add(Run(device_id=device.id, backend="interpret", hostname=HOST, pid=dead_pid(),
                  command=["tune"]))
        s.commit()
    row = study("running")
    storage = optuna_storage(url)
    opened = optuna.create_study(study_name="x", storage=storage)
    opened.set_user_attr(STUDY_ID_ATTR, row.id)
    trial = opened.ask()
    storage.set_trial_system_attr(trial._trial_id, OWNER_ATTR, f"{HOST}:{dead_pid()}")

    Database(url).optuna_storage  # noqa: B018 (what `tune run` opens before its workers)
    assert opened.trials[trial.number].state == TrialState.FAIL
    with store.sessions() as s:
        assert s.scalars(select(Run.status)).all() == ["interrupted"]


def test_studies_are_named_for_what_they_tune_and_carry_its_attributes(world):
    from tests.test_search import ScriptedExecutor
    runner, record = world.runner(ScriptedExecutor(), trials=2)
    study = runner._open()
    assert study.study_name == (
        f"mm 256x256x256 fp16 nn [bucket M=256 N=256 K=256 stride_am=256 stride_bk=256] "
        f"graph #{record.id}")
    attrs = study.user_attrs
    assert attrs["shape"] == {"M": 256, "N": 256, "K": 256, "dtype": "fp16", "layout": "nn",
                              "label": "256x256x256 fp16 nn"}
    assert attrs["bucket"] == record.key
    assert (attrs["kernel"], attrs["launch"], attrs["device"]) == ("mm", "graph", H100.name)
    assert tuner_study_id(study) == record.id


def test_a_study_stored_under_its_old_name_resumes_under_it(world):
    from tests.test_search import ScriptedExecutor
    runner, record = world.runner(ScriptedExecutor(), trials=2)
    old = optuna.create_study(study_name=f"tuner-study-{record.id}",
                              storage=optuna_storage(world.url), direction="maximize")
    old.add_trial(optuna.trial.create_trial(value=1.0))
    study = runner._open()
    assert study.study_name == f"tuner-study-{record.id}" and len(study.trials) == 1
    assert study.user_attrs[STUDY_ID_ATTR] == record.id


def test_sqlite_lock_file_sits_beside_a_file_database_only(tmp_path):
    assert sqlite_lock_path(str(tmp_path / "t.db")) == str(tmp_path / "t.db") + ".lock"
    assert sqlite_lock_path("file:x.db?mode=ro") == os.path.abspath("x.db") + ".lock"
    assert sqlite_lock_path(None) is None and sqlite_lock_path(":memory:") is None


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="interpreter CLI tests run on CPU-only machines")
def test_kill_9_then_another_run_leaves_nothing_running(tmp_path):
    """kill -9 mid-study, then a run of another shape: the killed run reads interrupted and
    Optuna holds no RUNNING trial; the killed study, still open, keeps its redo queue."""
    (tmp_path / "space.yaml").write_text(SMALL_SPACE)
    (tmp_path / "a.csv").write_text("M,N,K,dtype,layout\n96,80,160,fp32,nn\n")
    (tmp_path / "b.csv").write_text("M,N,K,dtype,layout\n32,32,32,fp32,nn\n")
    db = tmp_path / "tune.db"

    def command(shapes, trials):
        return [sys.executable, str(ROOT / "cli.py"), "run", "--shapes", shapes, "--space",
                "space.yaml", "--backend", "interpret", "--trials", str(trials), "--batch", "3",
                "--db", f"sqlite:///{db}"]

    first = subprocess.Popen(command("a.csv", 30), cwd=tmp_path, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and first.poll() is None:
        try:
            with sqlite3.connect(db, timeout=30) as c:  # mid-study: some trial in flight
                if (c.execute("select count(*) from tuner_trials").fetchone()[0] >= 3
                        and c.execute("select count(*) from trials where state = 'RUNNING'")
                        .fetchone()[0]):
                    break
        except sqlite3.OperationalError:  # not created yet
            pass
        time.sleep(0.05)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    storage = optuna.storages.RDBStorage(f"sqlite:///{db}")
    (killed,) = optuna.get_all_study_summaries(storage)
    in_flight = [t.params for t in optuna.load_study(study_name=killed.study_name,
                                                     storage=storage).get_trials(
        states=(TrialState.RUNNING,))]
    assert in_flight, first.stderr.read().decode()[-2000:]

    second = subprocess.run(command("b.csv", 2), cwd=tmp_path, capture_output=True, text=True,
                            timeout=600)
    assert second.returncode == 0 and "Traceback" not in second.stderr, second.stderr[-2000:]
    with sqlite3.connect(db) as c:
        assert c.execute("select status from tuner_runs order by id").fetchall() == [
            ("interrupted",), ("finished",)]
    summaries = {s.study_name: s for s in optuna.get_all_study_summaries(storage)}
    assert killed.study_name.startswith("mm 96x80x160 fp32 nn [bucket M=96 N=96 K=160 ")
    assert any(name.startswith("mm 32x32x32 fp32 nn [bucket ") for name in summaries)
    study = optuna.load_study(study_name=killed.study_name, storage=storage)
    assert not study.get_trials(states=(TrialState.RUNNING,))
    redo = [t.system_attrs["fixed_params"] for t in study.get_trials(
        states=(TrialState.WAITING,)) if "tuner:redo_of" in t.system_attrs]
    # (a trial killed between ask and its suggestions holds no config: nothing to redo)
    assert sorted(map(str, redo)) == sorted(map(str, filter(None, in_flight)))
