"""Which databases the tool may open: its own, and, for the commands that tune, new ones.

A SQLite file is looked at read-only before anything connects to it (connecting would set
WAL mode, and upgrading would add our tables): one that holds tables neither ours nor
Optuna's, or our table names with other columns, is another application's and is refused
unchanged. Commands that only read (`tune show`, `tune export`, ...) open no file that is
missing, empty or without our tables: they would otherwise create a database, or write our
schema into someone's file.

Tables are created whole, one statement each, so what a `tune run` starting beside us has
created so far passes these checks: no lock is needed to look.
"""
from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from tuner.db.migrations import TABLE_PREFIX, VERSION_TABLE
from tuner.textfiles import file_kind

# Optuna's RDB storage tables (optuna.storages._rdb.models) and its own version table: they
# share the database with ours (tuner.db.optuna_storage).
OPTUNA_TABLES = frozenset({
    "alembic_version", "studies", "study_directions", "study_system_attributes",
    "study_user_attributes", "trial_heartbeats", "trial_intermediate_values", "trial_params",
    "trial_system_attributes", "trial_user_attributes", "trial_values", "trials",
    "version_info"})
# How many foreign names a refusal lists.
_NAMED = 5


def sqlite_file(database: str | None, query: dict | None = None) -> str | None:
    """The file of a SQLite URL's database part (URL.database; its query says whether it is
    a URI); None for an in-memory database."""
    if database and (database.startswith("file:") or (query or {}).get("uri") == "true"):
        database = database.removeprefix("file:").partition("?")[0]
    if not database or database == ":memory:":
        return None
    return database


def sqlite_refusal(path: str, create: bool, shown_url: str) -> str | None:
    """Why the SQLite file at `path` must not be opened (None: it may). `create`: the
    command may create a database there (a missing or 0-byte file, or one without tables)."""
    if not os.path.lexists(path):
        return None if create else (f"no database at {path} (--db {shown_url}); `tune run` "
                                    "creates one")
    if os.path.isdir(path):
        return f"{path} is a folder, not a database file (--db {shown_url})"
    if not os.path.isfile(path):  # SQLite would block on a FIFO, or read /dev/zero as empty
        kind = file_kind(os.stat(path).st_mode) if os.path.exists(path) else "a broken link"
        return f"{path} is {kind}, not a database file (--db {shown_url})"
    if os.path.getsize(path) == 0:
        return None if create else (f"{path} is an empty file, not a gemm-tuner database; "
                                    "`tune run` creates one")
    try:
        objects, columns = _read_schema(path)
    except sqlite3.OperationalError:
        return None  # unreadable or locked: opening it says so
    except sqlite3.DatabaseError as e:
        return f"{path} is not a SQLite database ({e}); refusing to open it"
    names = {name for _, name in objects}
    foreign = sorted(name if kind == "table" else f"{kind} {name}" for kind, name in objects
                     if kind != "table" or not _ours_or_optunas(name))
    if foreign:
        return (f"{path} is not a gemm-tuner database: it holds {_listed(foreign)}, neither "
                "gemm-tuner's nor Optuna's; refusing to open it (nothing changed)")
    unlike = [] if VERSION_TABLE in names else _unlike_ours(columns)
    if unlike:
        tables = "table " + unlike[0] + " lacks" if len(unlike) == 1 else (
            f"tables {_listed(unlike)} lack")
        return (f"{path} is not a gemm-tuner database: its {tables} gemm-tuner's columns; "
                "refusing to open it (nothing changed)")
    return None if create else tables_refusal(names, path)


def _listed(names: list[str]) -> str:
    more = len(names) - _NAMED
    return ", ".join(names[:_NAMED]) + (f" and {more} more" if more > 0 else "")


def tables_refusal(tables: set[str], where: str) -> str | None:
    """Why a command that only reads must not open a database holding these tables: none of
    them ours (opening it would write our schema into it)."""
    if any(name.startswith(TABLE_PREFIX) for name in tables):
        return None
    return f"{where} holds no gemm-tuner tables; `tune run` creates them"


def _ours_or_optunas(table: str) -> bool:
    return table.startswith(TABLE_PREFIX) or table in OPTUNA_TABLES


def _read_schema(path: str) -> tuple[list[tuple[str, str]], dict[str, set[str]]]:
    """(kind, name) of each table, view and trigger, and the columns of each table, read
    through a read-only connection."""
    uri = Path(path).absolute().as_uri() + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True, timeout=30)
    try:
        objects = [(kind, name) for kind, name in conn.execute(
            "SELECT type, name FROM sqlite_master WHERE type IN ('table', 'view', 'trigger')")
            if not name.startswith("sqlite_")]
        columns = {name: {row[1] for row in conn.execute(
            "SELECT * FROM pragma_table_info(?)", (name,))}
            for kind, name in objects if kind == "table" and name.startswith(TABLE_PREFIX)}
        return objects, columns
    finally:
        conn.close()


def _unlike_ours(columns: dict[str, set[str]]) -> list[str]:
    """The tables named like ours, in a database without our version table (one written
    before versioning), that lack the required columns of our first versioned schema."""
    if not columns:
        return []
    from tuner.db.migrations import baseline_tables

    baseline = baseline_tables()
    return sorted(name for name, have in columns.items()
                  if name in baseline
                  and not {c.name for c in baseline[name].columns if not c.nullable} <= have)
