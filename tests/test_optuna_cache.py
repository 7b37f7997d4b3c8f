"""The cache a tuning process's Optuna studies read through (tuner.db.optuna_storage.
OwnWritesCache): what it holds is what the database holds, and reading the trials this
process holds costs no query, where Optuna's own cache read them all again on every read."""
import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState
from sqlalchemy import event

from tuner.db.database import Database
from tuner.db.optuna_storage import OWNER_ATTR, optuna_storage

SPACE = {"BLOCK_M": CategoricalDistribution([16, 32, 64]),
         "num_warps": CategoricalDistribution([2, 4, 8])}


def _storage(tmp_path):
    url = f"sqlite:///{tmp_path / 'tune.db'}"
    Database(url, create=True).store  # noqa: B018 - our schema first, as `tune run` does
    return url, optuna_storage(url)


def _trial_reads(storage) -> list[str]:
    """Every read of Optuna's trials table from now on (a read's further statements load the
    trials' params, values and attributes), appended as it runs."""
    seen: list[str] = []

    def record(_conn, _cursor, statement, *_):
        if statement.startswith("SELECT trials."):
            seen.append(statement)
    event.listen(storage.engine, "before_cursor_execute", record)
    return seen


def _snapshot(trials):
    return [(t.number, t.state, t.params, t.values, t.system_attrs) for t in trials]


def test_what_the_cache_holds_is_what_the_database_holds(tmp_path):
    url, storage = _storage(tmp_path)
    study = optuna.create_study(study_name="s", storage=storage.cached, direction="maximize",
                                sampler=optuna.samplers.TPESampler(seed=0, constant_liar=True,
                                                                   n_startup_trials=3))
    study.enqueue_trial({"BLOCK_M": 64, "num_warps": 4})  # a warm start, popped by ask
    in_flight = []
    for value in range(12):
        trial = study.ask(SPACE)
        storage.cached.flush(trial._trial_id)  # as a study leaves a config in flight
        in_flight.append(trial)
        if len(in_flight) > 3:  # a batch in flight, told in order
            study.tell(in_flight.pop(0), float(value))
    study.tell(in_flight.pop(0), state=TrialState.FAIL)

    fresh = optuna.load_study(study_name="s", storage=optuna.storages.RDBStorage(url))
    assert _snapshot(study.get_trials()) == _snapshot(fresh.get_trials())
    assert fresh.trials[0].params == {"BLOCK_M": 64, "num_warps": 4}
    assert {t.state for t in fresh.trials} == {TrialState.COMPLETE, TrialState.FAIL,
                                              TrialState.RUNNING}
    assert all(t.system_attrs[OWNER_ATTR] == storage.owner for t in fresh.trials)


def test_a_held_trials_parameters_are_written_together_once_it_is_left_or_told(tmp_path):
    """Drawn one by one, a config's parameters would be a transaction each: they are kept
    until the asker leaves the trial in flight (flush) or tells it."""
    url, storage = _storage(tmp_path)
    study = optuna.create_study(study_name="s", storage=storage.cached, direction="maximize")
    left, told = study.ask(SPACE), study.ask(SPACE)
    fresh = optuna.storages.RDBStorage(url)
    assert fresh.get_trial(left._trial_id).params == {}
    storage.cached.flush(left._trial_id)
    study.tell(told, 1.0)
    assert fresh.get_trial(left._trial_id).params == left.params
    assert fresh.get_trial(told._trial_id).params == told.params


def test_asking_and_telling_held_trials_reads_no_trial_back(tmp_path, monkeypatch):
    """What TPE's constant liar sets on each config it samples (a system attribute) and a
    tell are applied to the cache as written, not read back: a read cost as much as the
    write."""
    url, storage = _storage(tmp_path)
    study = optuna.create_study(study_name="s", storage=storage.cached, direction="maximize",
                                sampler=optuna.samplers.TPESampler(seed=0, constant_liar=True,
                                                                   n_startup_trials=2))
    read_back, read = [], storage.get_trial
    monkeypatch.setattr(storage, "get_trial",
                        lambda trial_id: read_back.append(trial_id) or read(trial_id))
    for value in range(8):
        study.tell(study.ask(SPACE), float(value))
    monkeypatch.undo()
    assert read_back == []
    liar = [t.system_attrs for t in study.get_trials() if len(t.system_attrs) > 1]
    assert liar  # TPE's attribute was set, and is on the database as in the cache
    fresh = optuna.load_study(study_name="s", storage=optuna.storages.RDBStorage(url))
    assert _snapshot(study.get_trials()) == _snapshot(fresh.get_trials())


def test_reading_held_trials_costs_no_query_and_others_are_read_again(tmp_path):
    url, storage = _storage(tmp_path)
    study = optuna.create_study(study_name="s", storage=storage.cached, direction="maximize")
    # A trial another process holds (it asked, and has not told yet).
    other = optuna.load_study(study_name="s", storage=optuna.storages.RDBStorage(url))
    theirs = other.ask(SPACE)
    ours = [study.ask(SPACE) for _ in range(4)]
    study.tell(ours[0], 1.0)
    study.get_trials(deepcopy=False)  # the first read of the study

    reads = _trial_reads(storage)
    for _ in range(5):  # what TPE does for every parameter it samples
        study.get_trials(deepcopy=False)
    assert len(reads) == 5  # the other process's unfinished trial, read again each time

    other.tell(theirs, 2.0)
    by_number = {t.number: t for t in study.get_trials(deepcopy=False)}
    assert by_number[theirs.number].state == TrialState.COMPLETE  # its write is seen
    assert by_number[theirs.number].values == [2.0]
    reads.clear()
    study.get_trials(deepcopy=False)
    assert reads == []  # three of ours still run, and nothing unfinished is another's now
