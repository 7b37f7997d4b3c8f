"""The tuning database, as SQLAlchemy 2.x typed ORM models.

Tables are prefixed `tuner_` because Optuna's RDB storage keeps its own `studies` and
`trials` tables in the same database. A *study* searches one bucketed key for one (device,
kernel source, search space); each of its *trials* is committed as it finishes, so a killed
run loses at most the trials in flight. The *winner* table holds one config per (device,
kernel source, bucketed key): what exports ship. *Failures* remember configs that cannot work
for a specialization; *claims* let several `tune run` processes share one database.
"""
from __future__ import annotations

import enum
from datetime import datetime, timezone

from sqlalchemy import JSON, Enum, ForeignKey, Index, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from tuner.shapes import Shape
from tuner.statuses import RunStatus, StudyStatus, TrialStatus


def utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def _stored_as_value(statuses: type[enum.Enum]) -> Enum:
    """A status column: the enum's value in a VARCHAR(16), as the bare strings were stored
    (no migration, no CHECK constraint), read back as the enum; a write of any other string
    is refused."""
    return Enum(statuses, native_enum=False, length=16, validate_strings=True,
                values_callable=lambda members: [m.value for m in members])


class Base(DeclarativeBase):
    type_annotation_map = {dict: JSON, list: JSON,
                           **{s: _stored_as_value(s) for s in (TrialStatus, StudyStatus,
                                                                RunStatus)}}


class Device(Base):
    """A GPU (or the CPU interpreter) together with the software stack that measured on it."""
    __tablename__ = "tuner_devices"

    id: Mapped[int] = mapped_column(primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(32), unique=True)
    name: Mapped[str] = mapped_column(String(128))
    compute_capability: Mapped[str] = mapped_column(String(16))
    sm_count: Mapped[int]
    smem_per_block: Mapped[int]
    driver: Mapped[str] = mapped_column(String(64))
    cuda: Mapped[str] = mapped_column(String(32))
    torch_version: Mapped[str] = mapped_column(String(64))
    triton_version: Mapped[str] = mapped_column(String(64))


class KernelVersion(Base):
    """A kernel by name and source hash: results measured with other source are not reused."""
    __tablename__ = "tuner_kernels"
    __table_args__ = (UniqueConstraint("name", "source_hash"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    source_hash: Mapped[str] = mapped_column(String(32))


class SearchSpaceRecord(Base):
    __tablename__ = "tuner_search_spaces"

    id: Mapped[int] = mapped_column(primary_key=True)
    hash: Mapped[str] = mapped_column(String(32), unique=True)
    kernel_name: Mapped[str] = mapped_column(String(64))
    strategy: Mapped[dict]
    yaml: Mapped[str] = mapped_column(Text)


class Run(Base):
    """One `tune run` invocation: who ran what, where, and how it ended."""
    __tablename__ = "tuner_runs"

    id: Mapped[int] = mapped_column(primary_key=True)
    device_id: Mapped[int] = mapped_column(ForeignKey("tuner_devices.id"))
    backend: Mapped[str] = mapped_column(String(16))
    hostname: Mapped[str] = mapped_column(String(255))
    # The process, with hostname: a `running` run whose local process is gone was killed
    # (None for runs stored before it was kept).
    pid: Mapped[int | None]
    command: Mapped[list]
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None]
    status: Mapped[RunStatus] = mapped_column(default=RunStatus.RUNNING)


class KeyColumns:
    """The six bucketed key fields, shared by studies and winners."""
    M: Mapped[int]
    N: Mapped[int]
    K: Mapped[int]
    stride_am: Mapped[int]
    stride_bk: Mapped[int]
    dtype: Mapped[str] = mapped_column(String(8))

    @property
    def key(self) -> dict:
        return {"M": self.M, "N": self.N, "K": self.K, "stride_am": self.stride_am,
                "stride_bk": self.stride_bk, "dtype": self.dtype}


class Study(KeyColumns, Base):
    """The search of one bucketed key, run on one representative shape of that bucket."""
    __tablename__ = "tuner_studies"
    __table_args__ = (Index("ix_study_lookup", "device_id", "kernel_id", "space_id", "M", "N",
                            "K", "stride_am", "stride_bk", "dtype"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    device_id: Mapped[int] = mapped_column(ForeignKey("tuner_devices.id"))
    kernel_id: Mapped[int] = mapped_column(ForeignKey("tuner_kernels.id"))
    space_id: Mapped[int] = mapped_column(ForeignKey("tuner_search_spaces.id"))
    # the shape actually timed (the bucket's representative)
    shape_M: Mapped[int]
    shape_N: Mapped[int]
    shape_K: Mapped[int]
    shape_layout: Mapped[str] = mapped_column(String(2))
    seed: Mapped[int]
    # What the study optimised (tuner.objective): eager (loop_ms) or graph (p50_ms); None for
    # a study stored before the choice existed.
    launch: Mapped[str | None] = mapped_column(String(8))
    status: Mapped[StudyStatus] = mapped_column(default=StudyStatus.RUNNING)
    reason: Mapped[str | None] = mapped_column(Text)
    baseline_ms: Mapped[float | None]  # cuBLAS (torch.matmul) device time on the same inputs
    # The winner's timing from the final interleaved re-timing of the top configs, by the
    # launch mode's figure (device ms for graph, ms per back-to-back call for eager), and the
    # trials that re-timed within the noise of it (a tie, broken by resources).
    final_p20_ms: Mapped[float | None]
    final_p50_ms: Mapped[float | None]
    final_p80_ms: Mapped[float | None]
    tied_trial_ids: Mapped[list | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None]

    trials: Mapped[list[Trial]] = relationship(back_populates="study", order_by="Trial.number")
    kernel: Mapped[KernelVersion] = relationship()
    space: Mapped[SearchSpaceRecord] = relationship()

    @property
    def shape(self) -> Shape:
        """The shape actually timed."""
        return Shape(self.shape_M, self.shape_N, self.shape_K, self.dtype, self.shape_layout)

    @property
    def shape_label(self) -> str:
        return str(self.shape)


class Trial(Base):
    """One config tried: its params, how it ended, and what it measured."""
    __tablename__ = "tuner_trials"
    __table_args__ = (UniqueConstraint("study_id", "number"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("tuner_studies.id"), index=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("tuner_runs.id"))
    number: Mapped[int]
    params: Mapped[dict]
    status: Mapped[TrialStatus]
    reason: Mapped[str | None] = mapped_column(Text)
    p20_ms: Mapped[float | None]
    p50_ms: Mapped[float | None]
    p80_ms: Mapped[float | None]
    tflops: Mapped[float | None]
    rel_error: Mapped[float | None]
    compile_s: Mapped[float | None]
    timing_method: Mapped[str | None] = mapped_column(Text)
    # The call as the dispatcher makes it, back to back on the same inputs: host µs per call,
    # and wall ms per call through the final synchronize (None before they were measured),
    # with the p20 and p80 of the loop's samples (None before they were stored).
    host_us: Mapped[float | None]
    loop_ms: Mapped[float | None]
    loop_p20_ms: Mapped[float | None]
    loop_p80_ms: Mapped[float | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    study: Mapped[Study] = relationship(back_populates="trials")


class Winner(KeyColumns, Base):
    """The config to ship for one (device, kernel source, bucketed key)."""
    __tablename__ = "tuner_winners"
    __table_args__ = (UniqueConstraint("device_id", "kernel_id", "M", "N", "K", "stride_am",
                                       "stride_bk", "dtype"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    device_id: Mapped[int] = mapped_column(ForeignKey("tuner_devices.id"))
    kernel_id: Mapped[int] = mapped_column(ForeignKey("tuner_kernels.id"))
    study_id: Mapped[int] = mapped_column(ForeignKey("tuner_studies.id"))
    trial_id: Mapped[int] = mapped_column(ForeignKey("tuner_trials.id"))
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)

    device: Mapped[Device] = relationship()
    kernel: Mapped[KernelVersion] = relationship()
    study: Mapped[Study] = relationship()
    trial: Mapped[Trial] = relationship()


class Failure(Base):
    """A config known not to work for a kernel source, device and Triton specialization.

    Later runs skip it without compiling or timing; `tune show --failures` lists them.
    """
    __tablename__ = "tuner_failures"
    __table_args__ = (UniqueConstraint("device_id", "kernel_id", "specialization", "params_key"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    device_id: Mapped[int] = mapped_column(ForeignKey("tuner_devices.id"))
    kernel_id: Mapped[int] = mapped_column(ForeignKey("tuner_kernels.id"))
    specialization: Mapped[str] = mapped_column(String(255))
    params_key: Mapped[str] = mapped_column(String(512))  # canonical JSON of params
    params: Mapped[dict]
    status: Mapped[TrialStatus]  # one of REMEMBERED (tuner.statuses)
    reason: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    kernel: Mapped[KernelVersion] = relationship()


class Claim(Base):
    """Which `tune run` process is tuning a key. A claim whose heartbeat is older than the
    lease belongs to a dead process and may be taken over."""
    __tablename__ = "tuner_claims"

    claim_key: Mapped[str] = mapped_column(String(512), primary_key=True)
    owner: Mapped[str] = mapped_column(String(255))
    heartbeat_at: Mapped[datetime] = mapped_column(default=utcnow)


class CrossTiming(Base):
    """A config timed on a shape it was not necessarily tuned for (`tune buckets`): the shapes
    of a bucket share one config, so each member's time with every candidate config is needed.
    All configs of one shape are timed together, interleaved (tuner.execution.cross_timing), so
    their ratios are free of drift; a later search with the same shapes reuses them."""
    __tablename__ = "tuner_cross_timings"
    __table_args__ = (UniqueConstraint("device_id", "kernel_id", "shape_M", "shape_N", "shape_K",
                                       "dtype", "shape_layout", "params_key"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    device_id: Mapped[int] = mapped_column(ForeignKey("tuner_devices.id"))
    kernel_id: Mapped[int] = mapped_column(ForeignKey("tuner_kernels.id"))
    shape_M: Mapped[int]
    shape_N: Mapped[int]
    shape_K: Mapped[int]
    dtype: Mapped[str] = mapped_column(String(8))
    shape_layout: Mapped[str] = mapped_column(String(2))
    params_key: Mapped[str] = mapped_column(String(512))  # canonical JSON of params
    params: Mapped[dict]
    status: Mapped[TrialStatus]
    reason: Mapped[str | None] = mapped_column(Text)
    p50_ms: Mapped[float | None]
    timing_method: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Bucketing(Base):
    """A `tune buckets` decision for one kernel on one device: the strategy chosen, the config
    each bucket shares (with its members' regrets), and the Pareto table it was chosen from.
    `tune export` ships the latest one for the kernel's current source."""
    __tablename__ = "tuner_bucketings"

    id: Mapped[int] = mapped_column(primary_key=True)
    device_id: Mapped[int] = mapped_column(ForeignKey("tuner_devices.id"))
    kernel_id: Mapped[int] = mapped_column(ForeignKey("tuner_kernels.id"))
    strategy: Mapped[dict]
    max_regret: Mapped[float]  # the budget it was chosen under
    # [{"key": bucket key, "config": ..., "members": [{"shape", "weight", "regret"}]}]
    buckets: Mapped[list]
    # [{"strategy": ..., "rows", "widened_singletons", "geomean_regret", "max_regret",
    #   "chosen"}]
    pareto: Mapped[list]
    shapes_source: Mapped[str] = mapped_column(Text)  # the shapes CSV it was run on
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    device: Mapped[Device] = relationship()
    kernel: Mapped[KernelVersion] = relationship()
