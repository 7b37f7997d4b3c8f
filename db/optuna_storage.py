"""Optuna's side of the tuning database: its RDB storage in the same database (so studies
resume and are shared by hosts), told who holds each RUNNING trial, and the settling of the
trials that dead processes left (the liveness rule: tuner.db.liveness).

Importing this module imports Optuna: the rest of tuner.db does not, so that commands which
only read the database stay light.
"""
from __future__ import annotations

import json
import warnings

import optuna
from optuna.storages._rdb import models
from optuna.trial import TrialState, create_trial
from sqlalchemy import create_engine, event, inspect, text

from tuner.db.liveness import TRIAL_LEASE, Heartbeat, Owner
from tuner.db.session import SQLITE_BUSY_TIMEOUT_MS, DatabaseError, schema_lock
from tuner.db.urls import masked_message, masked_url
from tuner.statuses import StudyStatus

# The system attribute naming the process ("host:pid") that holds a RUNNING Optuna trial.
OWNER_ATTR = "tuner:owner"
# Optuna study names before they said what they tune; their user attribute since.
LEGACY_STUDY_PREFIX = "tuner-study-"
STUDY_ID_ATTR = "tuner_study_id"
# What a redone trial's system attributes name: the number of the dead trial it redoes.
REDO_OF_ATTR = "tuner:redo_of"


def tuner_study_id(optuna_study) -> int | None:
    """The tuner_studies id an Optuna study (Study or FrozenStudy) searches for, if ours."""
    found = optuna_study.user_attrs.get(STUDY_ID_ATTR)
    if found is None and optuna_study.study_name.startswith(LEGACY_STUDY_PREFIX):
        found = optuna_study.study_name[len(LEGACY_STUDY_PREFIX):]
    return int(found) if str(found).isdigit() else None


class TunerStorage(optuna.storages.RDBStorage):
    """Optuna's RDB storage that says who holds each RUNNING trial: its process, as
    OWNER_ATTR, and a heartbeat (tuner.db.liveness.Heartbeat) while the process lives. The
    tuner asks and tells (never Study.optimize, which would beat on its own), so the storage
    beats for every trial this process set RUNNING, whether created by ask or popped from the
    queue of enqueued configs."""

    def __init__(self, url: str, **kwargs):
        with warnings.catch_warnings():  # heartbeat_interval is "experimental"
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            super().__init__(url, heartbeat_interval=int(TRIAL_LEASE.beat_s),
                             grace_period=int(TRIAL_LEASE.grace_s), **kwargs)
        self._init_holding()

    def _init_holding(self) -> None:
        self.owner = str(Owner.this_process())
        self._heartbeat = Heartbeat(self._beat, TRIAL_LEASE.beat_s, "optuna-heartbeat")
        event.listen(self.scoped_session, "before_flush", self._own_popped)

    def __getstate__(self):
        state = super().__getstate__()
        state.pop("_heartbeat", None)
        return state

    def __setstate__(self, state) -> None:
        super().__setstate__(state)
        self._init_holding()

    def _create_new_trial(self, study_id, template_trial=None):
        # What create_new_trial and Optuna's cached storage (Study.ask) both call. A plain
        # ask becomes a RUNNING template that carries its owner, so that the trial and its
        # owner are one commit: a kill between two commits would leave a RUNNING trial
        # nobody is known to hold.
        if template_trial is None:
            template_trial = create_trial(state=TrialState.RUNNING,
                                          system_attrs={OWNER_ATTR: self.owner})
        trial = super()._create_new_trial(study_id, template_trial)
        if trial.state == TrialState.RUNNING:
            self._hold(trial._trial_id)
        return trial

    def set_trial_state_values(self, trial_id, state, values=None):
        # a WAITING trial popped into RUNNING gets its owner in the same flush (_own_popped)
        changed = super().set_trial_state_values(trial_id, state, values)
        if changed and state == TrialState.RUNNING:
            self._hold(trial_id)
        elif state.is_finished():
            self._heartbeat.drop(trial_id)
        return changed

    def _own_popped(self, session, _flush_context, _instances) -> None:
        """before_flush: a trial this flush moves from WAITING to RUNNING is this process's;
        its OWNER_ATTR row joins the same transaction."""
        owner = json.dumps(self.owner)
        for trial in session.dirty:
            if not (isinstance(trial, models.TrialModel)
                    and trial.state == TrialState.RUNNING
                    and TrialState.WAITING in inspect(trial).attrs.state.history.deleted):
                continue
            with session.no_autoflush:
                held = models.TrialSystemAttributeModel.find_by_trial_and_key(
                    trial, OWNER_ATTR, session)
            if held is None:
                session.add(models.TrialSystemAttributeModel(
                    trial_id=trial.trial_id, key=OWNER_ATTR, value_json=owner))
            else:
                held.value_json = owner

    def _hold(self, trial_id: int) -> None:
        self.record_heartbeat(trial_id)
        self._heartbeat.hold(trial_id)

    def _beat(self, trial_ids: list[int]) -> None:
        for trial_id in trial_ids:
            self.record_heartbeat(trial_id)


def optuna_storage(url: str) -> TunerStorage:
    """Optuna's RDB storage in the same database as a TunerStorage, its tables created under
    the schema lock (tuner.db.session.schema_lock). Tables Optuna cannot use (written by
    another Optuna version) are a one-line DatabaseError."""
    # ask() warns on a storage with a heartbeat outside Study.optimize: ours beats itself.
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
    connect_args = {"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000} if url.startswith("sqlite") else {}
    lock_engine = create_engine(url)
    try:
        with lock_engine.connect() as conn, schema_lock(conn):  # Optuna creates tables too
            return TunerStorage(url, engine_kwargs={"connect_args": connect_args})
    except DatabaseError:
        raise
    except RuntimeError as e:  # what RDBStorage raises on a schema of another Optuna version
        first = masked_message(str(e).splitlines()[0], url)
        raise DatabaseError(f"database {masked_url(url)}: Optuna's tables: {first}") from None
    finally:
        lock_engine.dispose()


def settle_dead_trials(storage, store) -> int:
    """Fail the Optuna trials that dead processes left behind; how many were failed.

    A RUNNING trial is dead when its owner (OWNER_ATTR) is dead by the liveness rule
    (tuner.db.liveness): a process of this host that is gone, or, held by another host (or
    by nobody known), a heartbeat older than the grace (Optuna's fail_stale_trials). Where
    its study (of `store`, a tuner.db.store.Store) is still open, its config is enqueued
    again, so that the resumed study redoes it first. In a closed study (done or failed:
    nothing resumes it) every RUNNING or WAITING trial is residue and is failed. WAITING
    trials of an open study are its queue (warm starts, redos), asked first when it resumes,
    and stay. Trials of studies that are not the tuner's are left alone.
    """
    with storage.engine.connect() as conn:  # one query where nothing is left over
        left = conn.execute(text("SELECT trial_id, study_id, state FROM trials "
                                 "WHERE state IN ('RUNNING', 'WAITING')")).all()
    if not left:
        return 0
    studies = {s._study_id: s for s in storage.get_all_studies()}
    ours = {sid: tuner_study_id(studies[sid]) for sid in {sid for _, sid, _ in left}
            if sid in studies}
    statuses = store.study_statuses(i for i in ours.values() if i is not None)
    failed = 0

    def fail(trial_id: int) -> bool:
        try:
            return storage.set_trial_state_values(trial_id, TrialState.FAIL)
        except (optuna.exceptions.UpdateFinishedTrialError, RuntimeError):
            return False  # finished meanwhile, perhaps by a concurrent run's settling

    def redo(study_id: int, trial) -> None:
        if trial.params:
            storage.create_new_trial(study_id, template_trial=create_trial(
                state=TrialState.WAITING,
                system_attrs={"fixed_params": trial.params, REDO_OF_ATTR: trial.number}))

    heartbeat_checks: dict[int, list] = {}
    for trial_id, study_id, state in left:
        if statuses.get(ours.get(study_id)) is None:
            continue  # not a study of ours
        is_open = statuses[ours[study_id]] == StudyStatus.RUNNING
        if state == "WAITING":
            if not is_open and fail(trial_id):
                failed += 1
            continue
        trial = storage.get_trial(trial_id)
        if trial.state != TrialState.RUNNING:
            continue
        owner = Owner.parse(trial.system_attrs.get(OWNER_ATTR))
        if (owner.gone if owner else not is_open):
            if fail(trial_id):
                failed += 1
                if is_open:
                    redo(study_id, trial)
        elif not (owner and owner.local):  # a live process of this host is alive
            heartbeat_checks.setdefault(study_id, []).append(trial)
    for study_id, running in heartbeat_checks.items():
        study = optuna.load_study(study_name=studies[study_id].study_name, storage=storage,
                                  sampler=optuna.samplers.RandomSampler())
        with warnings.catch_warnings():  # "experimental" since Optuna 2.9
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)
        is_open = statuses[ours[study_id]] == StudyStatus.RUNNING
        for trial in running:
            if storage.get_trial(trial._trial_id).state == TrialState.FAIL:
                failed += 1
                if is_open:
                    redo(study_id, trial)
    return failed
