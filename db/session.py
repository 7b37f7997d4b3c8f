"""Opening the tuning database from a URL, with one clear error line when that fails."""
from __future__ import annotations

import os
from contextlib import contextmanager

from sqlalchemy import create_engine, event, inspect, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from tuner.db.models import Base
from tuner.errors import UserError

DEFAULT_URL = "sqlite:///tune.db"
# SQLite waits this long for a lock held by another local process instead of failing.
SQLITE_BUSY_TIMEOUT_MS = 30_000
# PostgreSQL advisory lock taken while creating tables: two `tune run` processes starting
# together on an empty database would otherwise both CREATE the same table or type.
_SCHEMA_LOCK = 0x74756E65  # "tune"


class DatabaseError(UserError, RuntimeError):
    """The database URL is malformed, its driver is missing, or it cannot be reached."""


def resolve_url(url: str | None) -> str:
    """--db, else TUNE_DB, else ./tune.db."""
    return url or os.environ.get("TUNE_DB") or DEFAULT_URL


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    # WAL lets readers (tune show/export) work while a run writes; foreign keys are off by
    # default in SQLite.
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def open_engine(url: str | None = None) -> Engine:
    """An engine for the URL with the schema created; DatabaseError with one line otherwise."""
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
            Base.metadata.create_all(conn)
            _add_nullable_columns(conn)
            conn.commit()
    except SQLAlchemyError as e:
        first = str(e.orig if getattr(e, "orig", None) else e).splitlines()[0]
        raise DatabaseError(f"cannot open database {parsed.render_as_string()}: {first}") from None
    return engine


def _add_nullable_columns(conn) -> None:
    """Add to existing tables the nullable columns the models have and they lack.

    create_all makes missing tables but never alters one, so a database written before a
    column was added (trials' host_us and loop_ms, studies' launch) could not be read: its
    rows get the column as NULL, which the code reads as "not measured". Nothing else about
    a schema changes here.
    """
    inspector = inspect(conn)
    quote = conn.dialect.identifier_preparer.quote
    for table in Base.metadata.sorted_tables:
        present = {column["name"] for column in inspector.get_columns(table.name)}
        for column in table.columns:
            if column.name not in present and column.nullable:
                conn.execute(text(f"ALTER TABLE {quote(table.name)} ADD COLUMN "
                                  f"{quote(column.name)} {column.type.compile(conn.dialect)}"))


@contextmanager
def _schema_lock(conn):
    """Serialize schema creation across processes (PostgreSQL; SQLite locks the file itself)."""
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


def optuna_storage(url: str):
    """Optuna's RDB storage in the same database, so studies resume and are shared by hosts."""
    import optuna

    connect_args = {"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000} if url.startswith("sqlite") else {}
    lock_engine = create_engine(url)
    try:
        with lock_engine.connect() as conn, _schema_lock(conn):  # Optuna creates tables too
            return optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": connect_args})
    finally:
        lock_engine.dispose()
