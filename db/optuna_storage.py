"""Optuna's side of the tuning database: its RDB storage in the same database (so studies
resume and are shared by hosts), told who holds each RUNNING trial, and the settling of the
trials that dead processes left (the liveness rule: tuner.db.liveness).

Importing this module imports Optuna: the rest of tuner.db does not, so that commands which
only read the database stay light.
"""
from __future__ import annotations

import copy
import functools
import json
import warnings
from datetime import datetime

import optuna
from optuna.storages._cached_storage import _CachedStorage, _StudyInfo
from optuna.storages._rdb import models
from optuna.storages._rdb.storage import _create_scoped_session
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
        state.pop("cached", None)
        return state

    def set_trial_params_and_attrs(self, trial_id: int, params: list[tuple],
                                   system_attrs: dict) -> None:
        """For one trial, in one transaction: set_trial_param's (name, internal value,
        distribution, the study's previous distribution of it, checked against the new by
        the caller; where the caller knew no previous one, Optuna looks for it here), and
        set_trial_system_attr's (key: value)."""
        with _create_scoped_session(self.scoped_session, True) as session:
            trial = models.TrialModel.find_or_raise_by_id(trial_id, session)
            self.check_trial_is_updatable(trial_id, trial.state)
            for name, value, distribution, previous in params:
                if previous is None:
                    self._set_trial_param_without_commit(session, trial_id, name, value,
                                                         distribution)
                else:
                    session.add(models.TrialParamModel(
                        trial_id=trial_id, param_name=name, param_value=value,
                        distribution_json=optuna.distributions.distribution_to_json(
                            distribution)))
            for key, value in system_attrs.items():
                self._set_trial_attr_without_commit(
                    session, models.TrialSystemAttributeModel, trial_id, key, value)

    @functools.cached_property
    def cached(self) -> OwnWritesCache:
        """What this process's Optuna studies are given (Optuna would wrap an RDB storage in
        its own cache, which re-reads what this process wrote: OwnWritesCache)."""
        return OwnWritesCache(self)

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


class OwnWritesCache(_CachedStorage):
    """Optuna's cache of the RDB storage, trusting this process's own writes.

    Optuna's cache reads every unfinished trial of a study again on each read, since another
    process may have changed it; TPE reads a study's trials for every parameter it samples,
    so with a batch of configs in flight one ask cost tenths of a second on SQLite, more than
    measuring a config. A study's trials are written only by the process holding its claim
    (tuner.db.claims), so the trials this process created or popped from the queue are kept
    up to date here as it writes them; after a study's first read, a read fetches only the
    unfinished trials another process left (settled as the study starts), if any.
    """

    def __init__(self, backend: TunerStorage):
        super().__init__(backend)
        self._held: set[int] = set()  # unfinished trials this process created or popped
        # Per held trial, what `flush` writes: set_trial_param's and set_trial_system_attr's.
        self._unwritten_params: dict[int, list[tuple]] = {}
        self._unwritten_attrs: dict[int, dict] = {}
        self._newest: dict[int, int] = {}  # per study, the highest trial id read or created

    def create_new_trial(self, study_id, template_trial=None):
        trial_id = super().create_new_trial(study_id, template_trial)
        with self._lock:
            self._newest[study_id] = max(self._newest.get(study_id, -1), trial_id)
            if not self._cached(trial_id).state.is_finished():
                self._held.add(trial_id)
        return trial_id

    def set_trial_param(self, trial_id, param_name, param_value_internal, distribution):
        """A held trial's parameter is kept here until `flush` or the trial's next write: a
        config's parameters are drawn one by one, and a transaction each cost a study's asks
        more than its sampler did."""
        with self._lock:
            held = trial_id in self._held
            if held:
                study = self._studies[self._trial_id_to_study_id_and_number[trial_id][0]]
                previous = study.param_distribution.get(param_name)
                if previous is None:
                    study.param_distribution[param_name] = distribution
                else:  # what Optuna checks as it writes: raised here, as it would be
                    optuna.distributions.check_distribution_compatibility(previous,
                                                                          distribution)
                self._unwritten_params.setdefault(trial_id, []).append(
                    (param_name, param_value_internal, distribution, previous))
                trial = self._cached(trial_id)
                trial.params[param_name] = distribution.to_external_repr(param_value_internal)
                trial.distributions[param_name] = distribution
        if not held:
            super().set_trial_param(trial_id, param_name, param_value_internal, distribution)

    def flush(self, trial_id: int) -> None:
        """Write what is kept of the trial since its last write, in one transaction: a
        config left in flight has its parameters on the database, for a resume to redo it."""
        with self._lock:
            params = self._unwritten_params.pop(trial_id, [])
            attrs = self._unwritten_attrs.pop(trial_id, {})
        if params or attrs:
            self._backend.set_trial_params_and_attrs(trial_id, params, attrs)

    def set_trial_state_values(self, trial_id, state, values=None):
        self.flush(trial_id)
        changed = super().set_trial_state_values(trial_id, state, values)
        if changed and trial_id in self._held and state.is_finished():  # told
            self._finished(trial_id, state, values)
        elif changed and (trial_id in self._held or state == TrialState.RUNNING):
            self._reread(trial_id)  # popped from the queue: now held
        return changed

    def _finished(self, trial_id: int, state: TrialState, values) -> None:
        """A held trial's tell, applied here as the database applied it (its completion
        time excepted, taken here a moment later): no read back."""
        with self._lock:
            trial = self._cached(trial_id)
            trial.state = state
            trial.values = values
            trial.datetime_complete = datetime.now()
            self._held.discard(trial_id)
            self._studies[self._trial_id_to_study_id_and_number[trial_id][0]
                          ].unfinished_trial_ids.discard(trial_id)

    def set_trial_user_attr(self, trial_id, key, value):
        self.flush(trial_id)
        super().set_trial_user_attr(trial_id, key, value)
        self._reread(trial_id)

    def set_trial_system_attr(self, trial_id, key, value):
        """A held trial's attribute is kept here with its parameters until `flush` or the
        trial's next write: TPE's constant liar sets one on every config it samples."""
        with self._lock:
            held = trial_id in self._held
            if held:
                self._cached(trial_id).system_attrs[key] = value
                self._unwritten_attrs.setdefault(trial_id, {})[key] = value
        if not held:
            self.flush(trial_id)
            super().set_trial_system_attr(trial_id, key, value)
            self._reread(trial_id)

    def get_trial(self, trial_id):
        with self._lock:
            if trial_id in self._held:
                return copy.deepcopy(self._cached(trial_id))
        return super().get_trial(trial_id)

    def _cached(self, trial_id: int):
        study_id, number = self._trial_id_to_study_id_and_number[trial_id]
        return self._studies[study_id].trials[number]

    def _reread(self, trial_id: int) -> None:
        """One trial read back after a write this cache does not apply itself."""
        if trial_id not in self._trial_id_to_study_id_and_number:
            return
        trial = self._backend.get_trial(trial_id)
        with self._lock:
            study_id = self._trial_id_to_study_id_and_number[trial_id][0]
            self._add_trials_to_cache(study_id, [trial])
            study = self._studies[study_id]
            if trial.state.is_finished():
                self._held.discard(trial_id)
                study.unfinished_trial_ids.discard(trial_id)
            elif trial.state == TrialState.RUNNING and trial.system_attrs.get(
                    OWNER_ATTR) == self._backend.owner:
                self._held.add(trial_id)
                study.unfinished_trial_ids.discard(trial_id)

    def _read_trials_from_remote_storage(self, study_id: int) -> None:
        with self._lock:
            study = self._studies.setdefault(study_id, _StudyInfo())
            others = study.unfinished_trial_ids - self._held
            if study_id in self._newest and not others:
                return  # read before, and every trial since is this process's
            trials = self._backend._get_trials(
                study_id, states=None, included_trial_ids=others,
                trial_id_greater_than=self._newest.get(study_id, -1))
            if not trials:
                return
            self._add_trials_to_cache(study_id, trials)
            for trial in trials:
                self._newest[study_id] = max(self._newest.get(study_id, -1), trial._trial_id)
                if trial.state.is_finished():
                    study.unfinished_trial_ids.discard(trial._trial_id)
                elif trial._trial_id not in self._held:
                    study.unfinished_trial_ids.add(trial._trial_id)


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
