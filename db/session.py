"""Opening the tuning database from a URL, with one clear error line when that fails."""
from __future__ import annotations

import os
from contextlib import contextmanager

from sqlalchemy import create_engine, event, inspect, text
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from tuner.db.ownership import sqlite_file, sqlite_refusal, tables_refusal
from tuner.db.urls import masked_message, masked_url, resolve_url
from tuner.errors import UserError
from tuner.filelock import exclusive_lock

# SQLite waits this long for a lock held by another local process instead of failing.
SQLITE_BUSY_TIMEOUT_MS = 30_000
# Lock taken while creating tables (ours and Optuna's): `tune run` processes starting together
# on an empty database would otherwise both CREATE the same table or type, or both stamp
# Optuna's alembic_version. PostgreSQL: an advisory lock; SQLite: an exclusive flock on a
# file beside the database (`tune.db.lock`, kept like SQLite's own -wal and -shm).
_SCHEMA_LOCK = 0x74756E65  # "tune"
SQLITE_LOCK_SUFFIX = ".lock"


class DatabaseError(UserError, RuntimeError):
    """The database URL is malformed, its driver is missing, it cannot be reached, or it is
    not ours to open (tuner.db.ownership). Its message shows the URL masked."""


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    # WAL lets readers (tune show/export) work while a run writes; foreign keys are off by
    # default in SQLite.
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")  # first: WAL waits too
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def parse_url(url: str) -> URL:
    """The URL as SQLAlchemy parses it; DatabaseError (the URL masked) where it cannot."""
    try:
        return make_url(url)
    except ArgumentError:
        raise DatabaseError(f"bad database URL {masked_url(url)!r}: expected "
                            "dialect[+driver]://user:password@host[:port]/database") from None
    except ValueError:  # what make_url raises for a port that is no number
        raise DatabaseError(f"bad database URL {masked_url(url)!r}: its port must be a "
                            "number") from None


def open_engine(url: str | None = None, on_schema=None, create: bool = True) -> Engine:
    """An engine for the URL with the schema created or upgraded to the code's
    (tuner.db.migrations: one line on stderr when an older database is upgraded, one-line
    DatabaseError for a newer one); DatabaseError with one line otherwise, the URL masked.

    Only a database of ours is opened (tuner.db.ownership); without `create`, only one that
    exists and holds our tables (a command that reads must not create one).
    on_schema(revision before, head) is called once the schema is at head."""
    url = resolve_url(url)
    shown = masked_url(url)
    parsed = parse_url(url)
    try:
        engine = create_engine(parsed)
    except (NoSuchModuleError, ModuleNotFoundError) as e:
        raise DatabaseError(f"database URL {shown!r}: driver not available "
                            f"({masked_message(str(e), url)})") from None
    except (ArgumentError, ValueError, TypeError) as e:  # e.g. a query argument of bad type
        first = masked_message(str(e).splitlines()[0] if str(e) else type(e).__name__, url)
        raise DatabaseError(f"bad database URL {shown!r}: {first}") from None
    sqlite = parsed.get_backend_name() == "sqlite"
    path = sqlite_file(parsed.database, dict(parsed.query)) if sqlite else None
    refused = path and sqlite_refusal(path, create, shown)
    if refused:
        engine.dispose()
        raise DatabaseError(refused)
    if sqlite:
        event.listen(engine, "connect", _sqlite_pragmas)
    try:
        with engine.connect() as conn:
            refused = None if create or sqlite else tables_refusal(
                set(inspect(conn).get_table_names()), f"database {shown}")
            if refused:
                raise DatabaseError(refused)
            with schema_lock(conn):
                from tuner.db.migrations import SchemaTooNewError, upgrade_schema
                try:
                    revisions = upgrade_schema(conn, shown)
                except SchemaTooNewError as e:
                    raise DatabaseError(str(e)) from None
                conn.commit()
    except SQLAlchemyError as e:
        engine.dispose()
        first = str(e.orig if getattr(e, "orig", None) else e).splitlines()[0]
        raise DatabaseError(f"cannot open database {shown}: "
                            f"{masked_message(first, url)}") from None
    except DatabaseError:
        engine.dispose()
        raise
    if on_schema is not None:
        on_schema(*revisions)
    return engine


def sqlite_lock_path(database: str | None) -> str | None:
    """The lock file of a SQLite database path (URL.database); None for an in-memory one."""
    path = sqlite_file(database)
    return None if path is None else os.path.abspath(path) + SQLITE_LOCK_SUFFIX


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


def session_factory(url: str | None = None, create: bool = True) -> sessionmaker[Session]:
    """Sessions on the database at `url` (open_engine: without `create`, one that exists)."""
    return sessionmaker(open_engine(url, create=create), expire_on_commit=False)
