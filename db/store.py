"""The queries the tuner, the exporter and `tune show` need, each in its own short transaction.

Every write commits before returning: a run killed at any moment keeps all it finished.
Returned rows are detached (expire_on_commit=False) and carry what callers read.
"""
from __future__ import annotations

import socket
from dataclasses import asdict

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload, sessionmaker

from tuner.backends import DeviceInfo
from tuner.db.models import (Device, KernelVersion, Run, SearchSpaceRecord, Study, Trial, Winner,
                             utcnow)
from tuner.shapes import Shape
from tuner.space import SearchSpace


def _key_filter(model, key: dict):
    return [getattr(model, f) == v for f, v in key.items()]


class Store:
    def __init__(self, sessions: sessionmaker[Session]):
        self.sessions = sessions

    def _get_or_create(self, model, unique: dict, **extra):
        with self.sessions() as s:
            row = s.scalars(select(model).filter_by(**unique)).first()
            if row is None:
                row = model(**unique, **extra)
                s.add(row)
                s.commit()
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
        with self.sessions() as s:
            run = Run(device_id=device.id, backend=backend, hostname=socket.gethostname(),
                      command=command)
            s.add(run)
            s.commit()
            return run

    def finish_run(self, run: Run, status: str) -> None:
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
                             .filter_by(status="done")).first()

    def open_study(self, device, kernel, space, key: dict, shape: Shape, seed: int,
                   retune: bool) -> Study:
        """The latest unfinished study of this key, to resume, or a new one.

        With retune a new study always starts: the old ones stay as history.
        """
        with self.sessions() as s:
            study = None if retune else s.scalars(
                self._studies(device, kernel, space, key).filter_by(status="running")
                .options(selectinload(Study.trials))).first()
            if study is None:
                study = Study(device_id=device.id, kernel_id=kernel.id, space_id=space.id,
                              **key, shape_M=shape.M, shape_N=shape.N, shape_K=shape.K,
                              shape_layout=shape.layout, seed=seed, trials=[])
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

    def finish_study(self, study: Study, best: Trial | None, baseline_ms: float | None,
                     reason: str | None = None) -> None:
        """Close the study; its best trial becomes the key's winner (the latest study wins)."""
        with self.sessions() as s:
            row = s.get(Study, study.id)
            row.status = "done" if best else "failed"
            row.reason, row.baseline_ms, row.finished_at = reason, baseline_ms, utcnow()
            if best is not None:
                winner = s.scalars(select(Winner).filter_by(
                    device_id=row.device_id, kernel_id=row.kernel_id)
                    .where(*_key_filter(Winner, row.key))).first()
                if winner is None:
                    winner = Winner(device_id=row.device_id, kernel_id=row.kernel_id, **row.key)
                    s.add(winner)
                winner.study_id, winner.trial_id = row.id, best.id
            s.commit()

    # -- reading back ---------------------------------------------------------------------
    def winners(self, device_ids: list[int] | None = None) -> list[Winner]:
        """Winners with their device, kernel, study (and its space) and trial loaded."""
        query = select(Winner).options(
            selectinload(Winner.device), selectinload(Winner.kernel), selectinload(Winner.trial),
            selectinload(Winner.study).selectinload(Study.space)).order_by(Winner.id)
        if device_ids is not None:
            query = query.where(Winner.device_id.in_(device_ids))
        with self.sessions() as s:
            return list(s.scalars(query))
