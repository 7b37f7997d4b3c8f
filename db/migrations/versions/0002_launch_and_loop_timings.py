"""Issue 24: what a study optimised (studies.launch) and the call as the dispatcher makes it
(trials.host_us, trials.loop_ms): the schema at 92c7473. All nullable, NULL in older rows
("not measured"; a study of no stated launch mode).

Idempotent: a database written by the code between cea1d47 and versioning already has them.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-25
"""
import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

COLUMNS = {"tuner_studies": [("launch", sa.String(length=8))],
           "tuner_trials": [("host_us", sa.Double()), ("loop_ms", sa.Double())]}


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    for table, columns in COLUMNS.items():
        have = {c["name"] for c in inspector.get_columns(table)}
        for name, type_ in columns:
            if name not in have:
                op.add_column(table, sa.Column(name, type_, nullable=True))


def downgrade() -> None:
    for table, columns in COLUMNS.items():
        with op.batch_alter_table(table) as batch:
            for name, _ in columns:
                batch.drop_column(name)
