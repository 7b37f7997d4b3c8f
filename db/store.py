"""The queries the tuner, the exporter and `tune show` need, each in its own short transaction.

Every write commits before returning: a run killed at any moment keeps all it finished.
Returned rows are detached (expire_on_commit=False) and carry what callers read.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from datetime import timedelta

from sqlalchemy import delete, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, selectinload, sessionmaker

from tuner.db.liveness import Owner
from tuner.db.models import (
    Bucketing,
    Claim,
    CrossTiming,
    Device,
    Failure,
    KernelVersion,
    Run,
    SearchSpaceRecord,
    Study,
    Trial,
    Winner,
    utcnow,
)
from tuner.db.urls import masked_command
from tuner.devices import DeviceInfo, device_matches
from tuner.shapes import Shape
from tuner.space import SearchSpace
from tuner.statuses import RunStatus, StudyStatus, TrialStatus


def params_key(params: dict) -> str:
    """Canonical text of a config, to compare configs across runs."""
    return json.dumps(params, sort_keys=True)


def _key_filter(model, key: dict):
    return [getattr(model, f) == v for f, v in key.items()]


def _shape_columns(shape: Shape) -> dict:
    """The columns that name one exact shape in studies and cross timings."""
    return dict(shape_M=shape.M, shape_N=shape.N, shape_K=shape.K, dtype=shape.dtype,
                shape_layout=shape.layout)


class Store:
    def __init__(self, sessions: sessionmaker[Session]):
        self.sessions = sessions

    def _get_or_create(self, model, unique: dict, **extra):
        """The row with these unique values, inserting it if absent (and if a concurrent run
        inserts it first, reading theirs)."""
        query = select(model).filter_by(**unique)
        with self.sessions() as s:
            row = s.scalars(query).first()
            if row is None:
                s.add(model(**unique, **extra))
                try:
                    s.commit()
                except IntegrityError:
                    s.rollback()
                row = s.scalars(query).one()
            return row

    # -- identities -----------------------------------------------------------------------
    def device(self, info: DeviceInfo) -> Device:
        return self._get_or_create(Device, {"fingerprint": info.fingerprint}, **asdict(info))

    def kernel(self, name: str, source_hash: str) -> KernelVersion:
        return self._get_or_create(KernelVersion, {"name": name, "source_hash": source_hash})

    def space(self, space: SearchSpace) -> SearchSpaceRecord:
        return self._get_or_create(SearchSpaceRecord, {"hash": space.hash},
                                   kernel_name=space.kernel, strategy=space.strategy,
                                   yaml=space.to_yaml())

    # -- runs -----------------------------------------------------------------------------
    def start_run(self, device: Device, backend: str, command: list[str]) -> Run:
        """This process's run row, its command line stored with any database password
        masked; first, runs of this host found dead are marked so."""
        self.interrupt_dead_runs()
        me = Owner.this_process()
        with self.sessions() as s:
            run = Run(device_id=device.id, backend=backend, hostname=me.host, pid=me.pid,
                      command=masked_command(command))
            s.add(run)
            s.commit()
            return run

    def interrupt_dead_runs(self) -> list[int]:
        """Mark `interrupted` the `running` runs whose holder is dead by the liveness rule
        (tuner.db.liveness; runs have no heartbeat: a process of this host that is gone, kill
        -9, a crash, a lost machine rebooted); their ids. They end at their last stored
        trial, or at their start. Runs of other hosts, and runs stored without a pid, are
        left alone: whether they live cannot be told from here."""
        host = Owner.this_process().host
        with self.sessions() as s:
            candidates = s.execute(select(Run.id, Run.pid).where(
                Run.status == RunStatus.RUNNING, Run.hostname == host, Run.pid.is_not(None))).all()
            dead = [run_id for run_id, pid in candidates if Owner(host, pid).gone]
            for run_id in dead:
                last_trial = select(func.max(Trial.created_at)).where(Trial.run_id == run_id)
                s.execute(update(Run).where(Run.id == run_id,
                                            Run.status == RunStatus.RUNNING).values(
                    status=RunStatus.INTERRUPTED,
                    finished_at=func.coalesce(last_trial.scalar_subquery(), Run.started_at)))
            s.commit()
        return dead

    def study_statuses(self, study_ids) -> dict[int, StudyStatus]:
        """The status of each of these studies that exists."""
        with self.sessions() as s:
            return dict(s.execute(select(Study.id, Study.status)
                                  .where(Study.id.in_(list(study_ids)))).all())

    def finish_run(self, run: Run, status: RunStatus) -> None:
        with self.sessions() as s:
            row = s.get(Run, run.id)
            row.status, row.finished_at = status, utcnow()
            s.commit()

    # -- studies and trials ---------------------------------------------------------------
    def _studies(self, device, kernel, space, key):
        return (select(Study).filter_by(device_id=device.id, kernel_id=kernel.id,
                                        space_id=space.id)
                .where(*_key_filter(Study, key)).order_by(Study.id.desc()))

    def finished_study(self, device, kernel, space, key: dict) -> Study | None:
        with self.sessions() as s:
            return s.scalars(self._studies(device, kernel, space, key)
                             .filter_by(status=StudyStatus.DONE)).first()

    def open_study(self, device, kernel, space, key: dict, shape: Shape, seed: int,
                   retune: bool, launch: str) -> Study:
        """The latest unfinished study of this key optimising `launch`, to resume, or a new
        one (a study's sampler has learnt one figure: it cannot go on with the other).

        With retune a new study always starts: the old ones stay as history.
        """
        with self.sessions() as s:
            study = None if retune else s.scalars(
                self._studies(device, kernel, space, key)
                .filter_by(status=StudyStatus.RUNNING, launch=launch)
                .options(selectinload(Study.trials))).first()
            if study is None:
                study = Study(device_id=device.id, kernel_id=kernel.id, space_id=space.id,
                              **key, shape_M=shape.M, shape_N=shape.N, shape_K=shape.K,
                              shape_layout=shape.layout, seed=seed, launch=launch, trials=[])
                s.add(study)
                s.commit()
            return study

    def add_trial(self, study: Study, run: Run, number: int, params: dict, **result) -> Trial:
        with self.sessions() as s:
            trial = Trial(study_id=study.id, run_id=run.id, number=number, params=params,
                          **result)
            s.add(trial)
            s.commit()
            return trial

    def trials_of(self, study: Study) -> list[Trial]:
        with self.sessions() as s:
            return list(s.scalars(select(Trial).filter_by(study_id=study.id)
                                  .order_by(Trial.number)))

    def finish_study(self, study: Study, best: Trial | None, baseline_ms: float | None,
                     reason: str | None = None, final=None, tied_trial_ids=()) -> None:
        """Close the study; its best trial becomes the key's winner (the latest study wins).

        final: the winner's Timing from the closing re-timing, if there was one.
        """
        with self.sessions() as s:
            row = s.get(Study, study.id)
            row.status = StudyStatus.DONE if best else StudyStatus.FAILED
            row.reason, row.baseline_ms, row.finished_at = reason, baseline_ms, utcnow()
            if final is not None:
                row.final_p20_ms, row.final_p50_ms, row.final_p80_ms = (
                    final.p20_ms, final.p50_ms, final.p80_ms)
                row.tied_trial_ids = list(tied_trial_ids)
            if best is not None:
                winner = s.scalars(select(Winner).filter_by(
                    device_id=row.device_id, kernel_id=row.kernel_id)
                    .where(*_key_filter(Winner, row.key))).first()
                if winner is None:
                    winner = Winner(device_id=row.device_id, kernel_id=row.kernel_id, **row.key)
                    s.add(winner)
                winner.study_id, winner.trial_id = row.id, best.id
            s.commit()

    # -- remembered failures ---------------------------------------------------------------
    def known_failures(self, device: Device, kernel: KernelVersion,
                       specialization: str) -> set[str]:
        """params_key of every config known to fail for this specialization."""
        with self.sessions() as s:
            return set(s.scalars(select(Failure.params_key).filter_by(
                device_id=device.id, kernel_id=kernel.id, specialization=specialization)))

    def remember_failure(self, device: Device, kernel: KernelVersion, specialization: str,
                         params: dict, status: TrialStatus, reason: str | None) -> None:
        with self.sessions() as s:
            s.add(Failure(device_id=device.id, kernel_id=kernel.id,
                          specialization=specialization, params_key=params_key(params),
                          params=params, status=status, reason=reason))
            try:
                s.commit()
            except IntegrityError:  # already known, perhaps from a concurrent run
                s.rollback()

    def devices_matching(self, selector: str | None) -> list[Device]:
        """The devices the selector names (tuner.devices.device_matches); all, for None."""
        with self.sessions() as s:
            devices = list(s.scalars(select(Device)))
        return [d for d in devices if device_matches(d.name, d.fingerprint, selector)]

    def failures(self, device_ids: list[int]) -> list[Failure]:
        with self.sessions() as s:
            return list(s.scalars(select(Failure).where(Failure.device_id.in_(device_ids))
                                  .options(selectinload(Failure.kernel))
                                  .order_by(Failure.id)))

    # -- claims (tuner.db.claims) ----------------------------------------------------------
    def claim(self, claim_key: str, owner: str, grace_s: float) -> bool:
        """Take the key unless another owner holds it with a heartbeat within the grace.

        Insert-or-conditional-update: concurrent claimants serialize on the row, so exactly
        one of them wins, and a dead owner's claim is taken over once its grace has run out.
        """
        now = utcnow()
        with self.sessions() as s:
            s.add(Claim(claim_key=claim_key, owner=owner, heartbeat_at=now))
            try:
                s.commit()
                return True
            except IntegrityError:
                s.rollback()
            taken = s.execute(update(Claim).where(
                Claim.claim_key == claim_key,
                or_(Claim.owner == owner, Claim.heartbeat_at < now - timedelta(seconds=grace_s)))
                .values(owner=owner, heartbeat_at=now))
            s.commit()
            return taken.rowcount == 1

    def claim_owner(self, claim_key: str) -> str | None:
        with self.sessions() as s:
            return s.scalar(select(Claim.owner).filter_by(claim_key=claim_key))

    def take_over(self, claim_key: str, dead_owner: str, owner: str) -> bool:
        """Move a claim from an owner known to be dead; False if it changed hands meanwhile."""
        with self.sessions() as s:
            moved = s.execute(update(Claim).filter_by(claim_key=claim_key, owner=dead_owner)
                              .values(owner=owner, heartbeat_at=utcnow()))
            s.commit()
            return moved.rowcount == 1

    def heartbeat(self, claim_keys: list[str], owner: str) -> None:
        with self.sessions() as s:
            s.execute(update(Claim).where(Claim.claim_key.in_(claim_keys), Claim.owner == owner)
                      .values(heartbeat_at=utcnow()))
            s.commit()

    def release(self, claim_key: str, owner: str) -> None:
        with self.sessions() as s:
            s.execute(delete(Claim).where(Claim.claim_key == claim_key, Claim.owner == owner))
            s.commit()

    # -- reading back ---------------------------------------------------------------------
    def winners(self, device_ids: list[int] | None = None,
                with_trials: bool = False) -> list[Winner]:
        """Winners with their device, kernel, study (and its space) and trial loaded; with
        their studies' trials too where asked (an export in the other launch mode picks among
        them; a warm start, which reads winners at every study's start, needs none)."""
        study = selectinload(Winner.study)
        loads = [selectinload(Winner.device), selectinload(Winner.kernel),
                 selectinload(Winner.trial), study.selectinload(Study.space)]
        if with_trials:
            loads.append(study.selectinload(Study.trials))
        query = select(Winner).options(*loads).order_by(Winner.id)
        if device_ids is not None:
            query = query.where(Winner.device_id.in_(device_ids))
        with self.sessions() as s:
            return list(s.scalars(query))

    def finished_studies(self, device_id: int) -> list[Study]:
        """A device's finished studies, oldest first, with their trials, kernel and space."""
        query = (select(Study).filter_by(device_id=device_id, status=StudyStatus.DONE)
                 .options(selectinload(Study.trials), selectinload(Study.kernel),
                          selectinload(Study.space)).order_by(Study.id))
        with self.sessions() as s:
            return list(s.scalars(query))

    def shape_study(self, device: Device, kernel: KernelVersion, shape: Shape) -> Study | None:
        """The latest finished study that timed exactly this shape, with its trials."""
        query = (select(Study).filter_by(device_id=device.id, kernel_id=kernel.id,
                                         status=StudyStatus.DONE, **_shape_columns(shape))
                 .options(selectinload(Study.trials)).order_by(Study.id.desc()))
        with self.sessions() as s:
            return s.scalars(query).first()

    # -- cross-measurement and bucketing (`tune buckets`) -------------------------------------
    def cross_timings(self, device: Device, kernel: KernelVersion,
                      shape: Shape) -> dict[str, CrossTiming]:
        """This shape's cross timings by params_key."""
        query = select(CrossTiming).filter_by(device_id=device.id, kernel_id=kernel.id,
                                              **_shape_columns(shape))
        with self.sessions() as s:
            return {row.params_key: row for row in s.scalars(query)}

    def save_cross_timing(self, device: Device, kernel: KernelVersion, shape: Shape,
                          params: dict, status: TrialStatus, reason: str | None,
                          p50_ms: float | None, timing_method: str | None) -> None:
        """Insert or replace one config's timing on one shape (committed at once)."""
        unique = dict(device_id=device.id, kernel_id=kernel.id, **_shape_columns(shape),
                      params_key=params_key(params))
        with self.sessions() as s:
            row = s.scalars(select(CrossTiming).filter_by(**unique)).first()
            if row is None:
                row = CrossTiming(**unique, params=params)
                s.add(row)
            row.status, row.reason, row.p50_ms, row.timing_method = (
                status, reason, p50_ms, timing_method)
            row.created_at = utcnow()
            s.commit()

    def save_bucketing(self, device: Device, kernel: KernelVersion, strategy: dict,
                       max_regret: float, buckets: list, pareto: list,
                       shapes_source: str) -> Bucketing:
        with self.sessions() as s:
            row = Bucketing(device_id=device.id, kernel_id=kernel.id, strategy=strategy,
                            max_regret=max_regret, buckets=buckets, pareto=pareto,
                            shapes_source=shapes_source)
            s.add(row)
            s.commit()
            return row

    def latest_bucketing(self, device: Device, kernel_name: str,
                         source_hash: str) -> Bucketing | None:
        """The newest `tune buckets` decision for this kernel source on this device."""
        query = (select(Bucketing).join(Bucketing.kernel)
                 .where(Bucketing.device_id == device.id, KernelVersion.name == kernel_name,
                        KernelVersion.source_hash == source_hash)
                 .options(selectinload(Bucketing.kernel), selectinload(Bucketing.device))
                 .order_by(Bucketing.id.desc()))
        with self.sessions() as s:
            return s.scalars(query).first()
