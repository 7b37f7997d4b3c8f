"""Opening the tuning database from a URL, with one clear error line when that fails."""
from __future__ import annotations

import os
from contextlib import contextmanager

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from tuner.errors import UserError
from tuner.filelock import exclusive_lock

DEFAULT_URL = "sqlite:///tune.db"
# SQLite waits this long for a lock held by another local process instead of failing.
SQLITE_BUSY_TIMEOUT_MS = 30_000
# Lock taken while creating tables (ours and Optuna's): `tune run` processes starting together
# on an empty database would otherwise both CREATE the same table or type, or both stamp
# Optuna's alembic_version. PostgreSQL: an advisory lock; SQLite: an exclusive flock on a
# file beside the database (`tune.db.lock`, kept like SQLite's own -wal and -shm).
_SCHEMA_LOCK = 0x74756E65  # "tune"
SQLITE_LOCK_SUFFIX = ".lock"


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
        with engine.connect() as conn, schema_lock(conn):
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


def sqlite_lock_path(database: str | None) -> str | None:
    """The lock file of a SQLite database path (URL.database); None for an in-memory one."""
    if database and database.startswith("file:"):  # a URI filename
        database = database[len("file:"):].partition("?")[0]
    if not database or database == ":memory:":
        return None
    return os.path.abspath(database) + SQLITE_LOCK_SUFFIX


@contextmanager
def schema_lock(conn):
    """Serialize schema creation across processes: PostgreSQL's advisory lock; on SQLite an
    exclusive flock on the database's lock file (SQLite's own locking does not cover the
    check-then-CREATE of SQLAlchemy's and Optuna's create_all)."""
    if conn.dialect.name == "sqlite":
        lock_path = sqlite_lock_path(conn.engine.url.database)
        if lock_path is None:
            yield
            return
        # Where no lock file can be made (a read-only folder) it goes on unlocked: opening the
        # database then fails, or not, with SQLite's own message.
        with exclusive_lock(lock_path, required=False):
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
