"""Versioned schema of the tuning database (Alembic), and upgrading a database to it.

Revisions live in versions/: the baseline is the schema as of commit cea1d47, and each later
schema change is one revision on top. The revision a database is at is kept in its own table,
`tuner_alembic_version`: Optuna keeps its own (`alembic_version`) in the same database.

Opening a database (tuner.db.session.open_engine) upgrades it to the head revision, with one
line saying so; `tune db upgrade` (tuner.db.database.upgrade_database) does the same and says
where it stands. A database at a revision this code does not know (written by a newer
gemm-tuner) is refused with one line.

A new schema change: edit db/models.py, then add a revision beside the others, e.g.
    from alembic import command
    command.revision(alembic_config(), message="...", rev_id="0004")
and write its upgrade by hand (keep it idempotent, as the others are: a database written by
the code in between may already have what it adds). tests/test_migrations.py checks that the
head revision matches the models.
"""
from __future__ import annotations

from pathlib import Path

from tuner.errors import UserError
from tuner.reporting import STDERR, Reporter

VERSION_TABLE = "tuner_alembic_version"
HERE = Path(__file__).resolve().parent
# Our tables: a database holding any of these but no VERSION_TABLE predates versioning.
TABLE_PREFIX = "tuner_"


class SchemaTooNewError(UserError, RuntimeError):
    """The database was written by a newer gemm-tuner whose schema this code does not know
    (tuner.db.session.open_engine raises it as its DatabaseError)."""


def ours(obj, name, type_, reflected, compare_to) -> bool:
    """Alembic's include_object: our tables, less our version table (Optuna's share the
    database and are Optuna's to manage)."""
    table = name if type_ == "table" else getattr(getattr(obj, "table", None), "name", None)
    return table is None or (table.startswith(TABLE_PREFIX) and table != VERSION_TABLE)


def alembic_config(connection=None):
    """An Alembic Config over this folder; migrations run on `connection` when given."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(HERE))
    config.set_main_option("version_table", VERSION_TABLE)
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def _scripts():
    from alembic.script import ScriptDirectory
    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str:
    return _scripts().get_current_head()


def baseline_tables() -> dict:
    """The tables of the first revision (the schema before versioning), by name: what a
    database written before versioning holds (tuner.db.ownership)."""
    return dict(_scripts().get_revision("0001").module.schema().tables)


def current_revision(conn) -> str | None:
    """The revision a database is at (None: unversioned, or empty)."""
    from alembic.migration import MigrationContext
    return MigrationContext.configure(
        conn, opts={"version_table": VERSION_TABLE}).get_current_revision()


def upgrade_schema(conn, where: str, reporter: Reporter = STDERR) -> tuple[str | None, str]:
    """Bring the database on `conn` to the head revision; (revision before, head).

    The caller holds the schema lock and commits. An empty database gets the whole chain
    silently; an older one is upgraded with one line to the reporter; one at an unknown revision
    (newer code wrote it) raises SchemaTooNewError, with nothing changed.
    """
    from alembic import command
    from sqlalchemy import inspect

    scripts = _scripts()
    head = scripts.get_current_head()
    before = current_revision(conn)
    if before == head:
        return before, head
    if before is not None and before not in {s.revision for s in scripts.walk_revisions()}:
        raise SchemaTooNewError(
            f"database {where} is at schema revision {before!r}, newer than this gemm-tuner "
            f"knows (its newest is {head!r}): use the gemm-tuner that wrote it, or a newer one")
    existing = before is not None or any(
        name.startswith(TABLE_PREFIX) for name in inspect(conn).get_table_names())
    command.upgrade(alembic_config(conn), "head")
    if existing:
        was = before or "unversioned (before migrations)"
        reporter.note(f"upgraded database {where} schema from {was} to {head}")
    return before, head
