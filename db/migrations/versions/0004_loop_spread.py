"""Issue 40: the spread of a trial's back-to-back call loop (trials.loop_p20_ms,
trials.loop_p80_ms), so that an eager study tells a gain from noise as a graph study does
from its device timing's p20/p80. Nullable, NULL in older rows (no spread known).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-27
"""
import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

COLUMNS = ("loop_p20_ms", "loop_p80_ms")


def upgrade() -> None:
    have = {c["name"] for c in sa.inspect(op.get_bind()).get_columns("tuner_trials")}
    for name in COLUMNS:
        if name not in have:
            op.add_column("tuner_trials", sa.Column(name, sa.Double(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tuner_trials") as batch:
        for name in COLUMNS:
            batch.drop_column(name)
