"""Issue 27: the process of a run (runs.pid, with its hostname), so that a `running` run whose
local process is gone can be marked interrupted. NULL for runs stored before.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-25
"""
import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if "pid" not in {c["name"] for c in sa.inspect(op.get_bind()).get_columns("tuner_runs")}:
        op.add_column("tuner_runs", sa.Column("pid", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tuner_runs") as batch:
        batch.drop_column("pid")
