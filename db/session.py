"""Opening the tuning database from a URL, with one clear error line when that fails."""
from __future__ import annotations

import json
import os
import socket
import threading
import time
import warnings
from contextlib import contextmanager

from sqlalchemy import create_engine, event, inspect, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from tuner.errors import UserError

DEFAULT_URL = "sqlite:///tune.db"
# SQLite waits this long for a lock held by another local process instead of failing.
SQLITE_BUSY_TIMEOUT_MS = 30_000
# Lock taken while creating tables (ours and Optuna's): `tune run` processes starting together
# on an empty database would otherwise both CREATE the same table or type, or both stamp
# Optuna's alembic_version. PostgreSQL: an advisory lock; SQLite: an exclusive flock on a
# file beside the database (`tune.db.lock`, kept like SQLite's own -wal and -shm).
_SCHEMA_LOCK = 0x74756E65  # "tune"
SQLITE_LOCK_SUFFIX = ".lock"
# Optuna's heartbeat: each process records one for its RUNNING trials every HEARTBEAT_S; a
# RUNNING trial whose heartbeat is older than HEARTBEAT_GRACE_S belongs to a dead process
# (on any host) and is failed when the next `tune run` opens the storage.
HEARTBEAT_S = 30
HEARTBEAT_GRACE_S = 120
# The system attribute naming the process ("host:pid") that holds a RUNNING Optuna trial.
OWNER_ATTR = "tuner:owner"


class DatabaseError(UserError, RuntimeError):
    """The database URL is malformed, its driver is missing, or it cannot be reached."""


def resolve_url(url: str | None) -> str:
    """--db, else TUNE_DB, else ./tune.db."""
    return url or os.environ.get("TUNE_DB") or DEFAULT_URL


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    # WAL lets readers (tune show/export) work while a run writes; foreign keys are off by
    # default in SQLite.
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")  # first: WAL waits too
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def open_engine(url: str | None = None, on_schema=None) -> Engine:
    """An engine for the URL with the schema created or upgraded to the code's
    (tuner.db.migrations: one line on stderr when an older database is upgraded, one-line
    DatabaseError for a newer one); DatabaseError with one line otherwise.
    on_schema(revision before, head) is called once the schema is at head."""
    url = resolve_url(url)
    try:
        parsed = make_url(url)
        engine = create_engine(parsed)
    except (NoSuchModuleError, ModuleNotFoundError) as e:
        raise DatabaseError(f"database URL {url!r}: driver not available ({e})") from None
    except ArgumentError as e:
        raise DatabaseError(f"bad database URL {url!r}: {e}") from None
    if parsed.get_backend_name() == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
    try:
        with engine.connect() as conn, _schema_lock(conn):
            from tuner.db.migrations import SchemaTooNewError, upgrade_schema
            try:
                revisions = upgrade_schema(conn, parsed.render_as_string())
            except SchemaTooNewError as e:
                raise DatabaseError(str(e)) from None
            conn.commit()
    except SQLAlchemyError as e:
        first = str(e.orig if getattr(e, "orig", None) else e).splitlines()[0]
        raise DatabaseError(f"cannot open database {parsed.render_as_string()}: {first}") from None
    if on_schema is not None:
        on_schema(*revisions)
    return engine


@contextmanager
def _file_lock(path: str):
    """An exclusive flock on `path` (created if need be), released on exit. Where no lock
    file can be made (read-only folder, no fcntl) it goes on unlocked: opening the database
    then fails, or not, with SQLite's own message."""
    try:
        import fcntl
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except (ImportError, OSError):
        fd = None
    if fd is None:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the flock


def sqlite_lock_path(database: str | None) -> str | None:
    """The lock file of a SQLite database path (URL.database); None for an in-memory one."""
    if database and database.startswith("file:"):  # a URI filename
        database = database[len("file:"):].partition("?")[0]
    if not database or database == ":memory:":
        return None
    return os.path.abspath(database) + SQLITE_LOCK_SUFFIX


@contextmanager
def _schema_lock(conn):
    """Serialize schema creation across processes: PostgreSQL's advisory lock; on SQLite an
    exclusive flock on the database's lock file (SQLite's own locking does not cover the
    check-then-CREATE of SQLAlchemy's and Optuna's create_all)."""
    if conn.dialect.name == "sqlite":
        lock_path = sqlite_lock_path(conn.engine.url.database)
        if lock_path is None:
            yield
            return
        with _file_lock(lock_path):
            yield
        return
    postgres = conn.dialect.name == "postgresql"
    if postgres:
        conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": _SCHEMA_LOCK})
    try:
        yield
    finally:
        if postgres:
            conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": _SCHEMA_LOCK})
            conn.commit()


def session_factory(url: str | None = None) -> sessionmaker[Session]:
    return sessionmaker(open_engine(url), expire_on_commit=False)


def process_owner() -> str:
    """This process as OWNER_ATTR and tuner_runs name it: "host:pid"."""
    return f"{socket.gethostname()}:{os.getpid()}"


def pid_alive(pid: int) -> bool:
    """Whether a process of this host is alive (a zombie, killed and not yet reaped, is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def dead_local_owner(owner: str | None) -> bool:
    """Whether a "host:pid" owner ran on this host and its process is gone."""
    host, _, pid = (owner or "").rpartition(":")
    return host == socket.gethostname() and pid.isdigit() and not pid_alive(int(pid))


def _storage_class():
    """TunerStorage, defined on first use: importing this module must not import Optuna."""
    global _TunerStorage
    if _TunerStorage is not None:
        return _TunerStorage
    import optuna
    from optuna.storages._rdb import models
    from optuna.trial import TrialState

    class TunerStorage(optuna.storages.RDBStorage):
        """Optuna's RDB storage that says who holds each RUNNING trial: its process, as
        OWNER_ATTR, and a heartbeat from a background thread while the process lives. The
        tuner asks and tells (never Study.optimize, which would beat on its own), so the
        storage beats for every trial this process set RUNNING, whether created by ask or
        popped from the queue of enqueued configs."""

        def __init__(self, url: str, **kwargs):
            with warnings.catch_warnings():  # heartbeat_interval is "experimental"
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                super().__init__(url, heartbeat_interval=HEARTBEAT_S,
                                 grace_period=HEARTBEAT_GRACE_S, **kwargs)
            self._init_holding()

        def _init_holding(self) -> None:
            self.owner = process_owner()
            self._held: set[int] = set()
            self._held_lock = threading.Lock()
            self._beating: threading.Thread | None = None
            event.listen(self.scoped_session, "before_flush", self._own_popped)

        def __getstate__(self):
            state = super().__getstate__()
            for name in ("_held", "_held_lock", "_beating"):
                state.pop(name, None)
            return state

        def __setstate__(self, state) -> None:
            super().__setstate__(state)
            self._init_holding()

        def _create_new_trial(self, study_id, template_trial=None):
            # What create_new_trial and Optuna's cached storage (Study.ask) both call. A plain
            # ask becomes a RUNNING template that carries its owner, so that the trial and its
            # owner are one commit: a kill between two commits would leave a RUNNING trial
            # nobody is known to hold.
            if template_trial is None:
                template_trial = optuna.trial.create_trial(
                    state=TrialState.RUNNING, system_attrs={OWNER_ATTR: self.owner})
            trial = super()._create_new_trial(study_id, template_trial)
            if trial.state == TrialState.RUNNING:
                self._hold(trial._trial_id)
            return trial

        def set_trial_state_values(self, trial_id, state, values=None):
            # a WAITING trial popped into RUNNING gets its owner in the same flush (_own_popped)
            changed = super().set_trial_state_values(trial_id, state, values)
            if changed and state == TrialState.RUNNING:
                self._hold(trial_id)
            elif state.is_finished():
                with self._held_lock:
                    self._held.discard(trial_id)
            return changed

        def _own_popped(self, session, _flush_context, _instances) -> None:
            """before_flush: a trial this flush moves from WAITING to RUNNING is this
            process's; its OWNER_ATTR row joins the same transaction."""
            owner = json.dumps(self.owner)
            for trial in session.dirty:
                if not (isinstance(trial, models.TrialModel)
                        and trial.state == TrialState.RUNNING
                        and TrialState.WAITING in inspect(trial).attrs.state.history.deleted):
                    continue
                with session.no_autoflush:
                    held = models.TrialSystemAttributeModel.find_by_trial_and_key(
                        trial, OWNER_ATTR, session)
                if held is None:
                    session.add(models.TrialSystemAttributeModel(
                        trial_id=trial.trial_id, key=OWNER_ATTR, value_json=owner))
                else:
                    held.value_json = owner

        def _hold(self, trial_id: int) -> None:
            self.record_heartbeat(trial_id)
            with self._held_lock:
                self._held.add(trial_id)
                if self._beating is None:
                    self._beating = threading.Thread(target=self._beat, daemon=True,
                                                     name="optuna-heartbeat")
                    self._beating.start()

        def _beat(self) -> None:
            while True:
                time.sleep(HEARTBEAT_S)
                with self._held_lock:
                    held = list(self._held)
                for trial_id in held:
                    try:
                        self.record_heartbeat(trial_id)
                    except Exception:  # a busy database: the next beat, well within the grace
                        pass

    _TunerStorage = TunerStorage
    return TunerStorage


_TunerStorage = None


def optuna_storage(url: str):
    """Optuna's RDB storage in the same database, so studies resume and are shared by hosts:
    a TunerStorage (its trials' owner and heartbeat), its tables created under the schema
    lock."""
    # ask() warns on a storage with a heartbeat outside Study.optimize: ours beats itself.
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
    connect_args = {"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000} if url.startswith("sqlite") else {}
    lock_engine = create_engine(url)
    try:
        with lock_engine.connect() as conn, _schema_lock(conn):  # Optuna creates tables too
            return _storage_class()(url, engine_kwargs={"connect_args": connect_args})
    finally:
        lock_engine.dispose()
