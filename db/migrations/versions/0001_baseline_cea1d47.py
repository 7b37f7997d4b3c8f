"""Baseline: the schema as of commit cea1d47 (issue 6), before the schema was versioned.

Idempotent, since databases written before versioning carry no revision: it creates the
tables a database lacks and, in tables it has, the nullable columns they lack (what opening
a database did before migrations). An empty database gets the whole schema.

Revision ID: 0001
Revises:
Create Date: 2026-11-25
"""
import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _key_columns() -> list[sa.Column]:
    return [sa.Column("M", sa.Integer(), nullable=False),
            sa.Column("N", sa.Integer(), nullable=False),
            sa.Column("K", sa.Integer(), nullable=False),
            sa.Column("stride_am", sa.Integer(), nullable=False),
            sa.Column("stride_bk", sa.Integer(), nullable=False),
            sa.Column("dtype", sa.String(length=8), nullable=False)]


def _device_kernel() -> list[sa.Column]:
    return [sa.Column("device_id", sa.Integer(), sa.ForeignKey("tuner_devices.id"),
                      nullable=False),
            sa.Column("kernel_id", sa.Integer(), sa.ForeignKey("tuner_kernels.id"),
                      nullable=False)]


def schema() -> sa.MetaData:
    """The tables at cea1d47 (db/models.py there), frozen here."""
    md = sa.MetaData()
    sa.Table("tuner_devices", md,
             sa.Column("id", sa.Integer(), primary_key=True),
             sa.Column("fingerprint", sa.String(length=32), nullable=False, unique=True),
             sa.Column("name", sa.String(length=128), nullable=False),
             sa.Column("compute_capability", sa.String(length=16), nullable=False),
             sa.Column("sm_count", sa.Integer(), nullable=False),
             sa.Column("smem_per_block", sa.Integer(), nullable=False),
             sa.Column("driver", sa.String(length=64), nullable=False),
             sa.Column("cuda", sa.String(length=32), nullable=False),
             sa.Column("torch_version", sa.String(length=64), nullable=False),
             sa.Column("triton_version", sa.String(length=64), nullable=False))
    sa.Table("tuner_kernels", md,
             sa.Column("id", sa.Integer(), primary_key=True),
             sa.Column("name", sa.String(length=64), nullable=False),
             sa.Column("source_hash", sa.String(length=32), nullable=False),
             sa.UniqueConstraint("name", "source_hash"))
    sa.Table("tuner_search_spaces", md,
             sa.Column("id", sa.Integer(), primary_key=True),
             sa.Column("hash", sa.String(length=32), nullable=False, unique=True),
             sa.Column("kernel_name", sa.String(length=64), nullable=False),
             sa.Column("strategy", sa.JSON(), nullable=False),
             sa.Column("yaml", sa.Text(), nullable=False))
    sa.Table("tuner_runs", md,
             sa.Column("id", sa.Integer(), primary_key=True),
             sa.Column("device_id", sa.Integer(), sa.ForeignKey("tuner_devices.id"),
                       nullable=False),
             sa.Column("backend", sa.String(length=16), nullable=False),
             sa.Column("hostname", sa.String(length=255), nullable=False),
             sa.Column("command", sa.JSON(), nullable=False),
             sa.Column("started_at", sa.DateTime(), nullable=False),
             sa.Column("finished_at", sa.DateTime(), nullable=True),
             sa.Column("status", sa.String(length=16), nullable=False))
    sa.Table("tuner_studies", md,
             sa.Column("id", sa.Integer(), primary_key=True),
             *_device_kernel(),
             sa.Column("space_id", sa.Integer(), sa.ForeignKey("tuner_search_spaces.id"),
                       nullable=False),
             sa.Column("shape_M", sa.Integer(), nullable=False),
             sa.Column("shape_N", sa.Integer(), nullable=False),
             sa.Column("shape_K", sa.Integer(), nullable=False),
             sa.Column("shape_layout", sa.String(length=2), nullable=False),
             sa.Column("seed", sa.Integer(), nullable=False),
             sa.Column("status", sa.String(length=16), nullable=False),
             sa.Column("reason", sa.Text(), nullable=True),
             sa.Column("baseline_ms", sa.Double(), nullable=True),
             sa.Column("final_p20_ms", sa.Double(), nullable=True),
             sa.Column("final_p50_ms", sa.Double(), nullable=True),
             sa.Column("final_p80_ms", sa.Double(), nullable=True),
             sa.Column("tied_trial_ids", sa.JSON(), nullable=True),
             sa.Column("created_at", sa.DateTime(), nullable=False),
             sa.Column("finished_at", sa.DateTime(), nullable=True),
             *_key_columns(),
             sa.Index("ix_study_lookup", "device_id", "kernel_id", "space_id", "M", "N", "K",
                      "stride_am", "stride_bk", "dtype"))
    sa.Table("tuner_trials", md,
             sa.Column("id", sa.Integer(), primary_key=True),
             sa.Column("study_id", sa.Integer(), sa.ForeignKey("tuner_studies.id"),
                       nullable=False, index=True),
             sa.Column("run_id", sa.Integer(), sa.ForeignKey("tuner_runs.id"), nullable=False),
             sa.Column("number", sa.Integer(), nullable=False),
             sa.Column("params", sa.JSON(), nullable=False),
             sa.Column("status", sa.String(length=16), nullable=False),
             sa.Column("reason", sa.Text(), nullable=True),
             sa.Column("p20_ms", sa.Double(), nullable=True),
             sa.Column("p50_ms", sa.Double(), nullable=True),
             sa.Column("p80_ms", sa.Double(), nullable=True),
             sa.Column("tflops", sa.Double(), nullable=True),
             sa.Column("rel_error", sa.Double(), nullable=True),
             sa.Column("compile_s", sa.Double(), nullable=True),
             sa.Column("timing_method", sa.Text(), nullable=True),
             sa.Column("created_at", sa.DateTime(), nullable=False),
             sa.UniqueConstraint("study_id", "number"))
    sa.Table("tuner_winners", md,
             sa.Column("id", sa.Integer(), primary_key=True),
             *_device_kernel(),
             sa.Column("study_id", sa.Integer(), sa.ForeignKey("tuner_studies.id"),
                       nullable=False),
             sa.Column("trial_id", sa.Integer(), sa.ForeignKey("tuner_trials.id"),
                       nullable=False),
             sa.Column("updated_at", sa.DateTime(), nullable=False),
             *_key_columns(),
             sa.UniqueConstraint("device_id", "kernel_id", "M", "N", "K", "stride_am",
                                 "stride_bk", "dtype"))
    sa.Table("tuner_failures", md,
             sa.Column("id", sa.Integer(), primary_key=True),
             *_device_kernel(),
             sa.Column("specialization", sa.String(length=255), nullable=False),
             sa.Column("params_key", sa.String(length=512), nullable=False),
             sa.Column("params", sa.JSON(), nullable=False),
             sa.Column("status", sa.String(length=16), nullable=False),
             sa.Column("reason", sa.Text(), nullable=True),
             sa.Column("created_at", sa.DateTime(), nullable=False),
             sa.UniqueConstraint("device_id", "kernel_id", "specialization", "params_key"))
    sa.Table("tuner_claims", md,
             sa.Column("claim_key", sa.String(length=512), primary_key=True),
             sa.Column("owner", sa.String(length=255), nullable=False),
             sa.Column("heartbeat_at", sa.DateTime(), nullable=False))
    sa.Table("tuner_cross_timings", md,
             sa.Column("id", sa.Integer(), primary_key=True),
             *_device_kernel(),
             sa.Column("shape_M", sa.Integer(), nullable=False),
             sa.Column("shape_N", sa.Integer(), nullable=False),
             sa.Column("shape_K", sa.Integer(), nullable=False),
             sa.Column("dtype", sa.String(length=8), nullable=False),
             sa.Column("shape_layout", sa.String(length=2), nullable=False),
             sa.Column("params_key", sa.String(length=512), nullable=False),
             sa.Column("params", sa.JSON(), nullable=False),
             sa.Column("status", sa.String(length=16), nullable=False),
             sa.Column("reason", sa.Text(), nullable=True),
             sa.Column("p50_ms", sa.Double(), nullable=True),
             sa.Column("timing_method", sa.Text(), nullable=True),
             sa.Column("created_at", sa.DateTime(), nullable=False),
             sa.UniqueConstraint("device_id", "kernel_id", "shape_M", "shape_N", "shape_K",
                                 "dtype", "shape_layout", "params_key"))
    sa.Table("tuner_bucketings", md,
             sa.Column("id", sa.Integer(), primary_key=True),
             *_device_kernel(),
             sa.Column("strategy", sa.JSON(), nullable=False),
             sa.Column("max_regret", sa.Double(), nullable=False),
             sa.Column("buckets", sa.JSON(), nullable=False),
             sa.Column("pareto", sa.JSON(), nullable=False),
             sa.Column("shapes_source", sa.Text(), nullable=False),
             sa.Column("created_at", sa.DateTime(), nullable=False))
    return md


def upgrade() -> None:
    bind = op.get_bind()
    md = schema()
    present = set(sa.inspect(bind).get_table_names())
    md.create_all(bind, tables=[t for t in md.sorted_tables if t.name not in present])
    for table in md.sorted_tables:  # a database from before the baseline
        if table.name not in present:
            continue
        have = {c["name"] for c in sa.inspect(bind).get_columns(table.name)}
        for column in table.columns:
            if column.name not in have and column.nullable:
                op.add_column(table.name, sa.Column(column.name, column.type, nullable=True))


def downgrade() -> None:
    bind = op.get_bind()
    schema().drop_all(bind)
