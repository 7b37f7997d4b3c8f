"""Alembic's environment for the tuning database: our tables only (Optuna manages its own,
with its own version table), our revisions recorded in tuner_alembic_version."""
from alembic import context

from tuner.db.migrations import VERSION_TABLE, ours
from tuner.db.models import Base

config = context.config


def _run(connection) -> None:
    context.configure(connection=connection, target_metadata=Base.metadata,
                      version_table=VERSION_TABLE, include_object=ours,
                      render_as_batch=True)  # SQLite alters a table by copying it
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:  # tuner.db.migrations.upgrade_schema: the caller's connection
    _run(connection)
else:  # the alembic command line: -x url=... or sqlalchemy.url
    from sqlalchemy import create_engine

    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option(
        "sqlalchemy.url")
    engine = create_engine(url)
    with engine.connect() as conn:
        _run(conn)
        conn.commit()
    engine.dispose()
