"""The search loop: a real Optuna study and a real database, with a scripted executor."""
from types import SimpleNamespace

import pytest

from tuner.db.session import session_factory
from tuner.db.store import Store
from tuner.execution import TrialResult
from tuner.search import StudyBudget, run_study
from tuner.shapes import Shape
from tuner.space import parse_space
from tests.factories import H100, PARAMS

SPACE = parse_space({
    "kernel": "mm",
    "params": {"BLOCK_M": [32, 64, 128], "BLOCK_N": [64, 128], "BLOCK_K": [32, 64],
               "GROUP_M": [8], "num_stages": [2, 3], "num_warps": [4]},
    "strategy": {"M": "default", "N": "default", "K": "default", "stride_am": "default",
                 "stride_bk": "default", "dtype": "default"}}, "test", PARAMS)
SHAPE = Shape(256, 256, 256, "fp16", "nn")


class ScriptedBench:
    """Stands in for ShapeBench: bigger tiles are faster, BLOCK_M=128 with 3 stages 'fails'."""
    backend = SimpleNamespace(method="scripted")

    def __init__(self):
        self.ran = []

    def run(self, kernel, config):
        self.ran.append(dict(config))
        if config["BLOCK_M"] == 128 and config["num_stages"] == 3:
            return TrialResult("compile_error", "OutOfResources: shared memory")
        tflops = config["BLOCK_M"] * config["BLOCK_N"] * config["BLOCK_K"] / 1e3
        return TrialResult("ok", None, 0.9, 1.0, 1.1, tflops, 1e-3, 0.5)


@pytest.fixture
def setup(tmp_path):
    store = Store(session_factory(f"sqlite:///{tmp_path / 'tune.db'}"))
    device = store.device(H100)
    kernel, space = store.kernel("mm", "abc"), store.space(SPACE)
    run = store.start_run(device, "gpu", ["tune"])
    study = store.open_study(device, kernel, space, SHAPE.key(), SHAPE, seed=3, retune=False)
    return store, run, study, (device, kernel, space)


def test_budget_stores_each_distinct_config_once_and_returns_the_best(setup):
    store, run, study, _ = setup
    bench = ScriptedBench()
    best = run_study(store, run, study, bench, None, SPACE, StudyBudget(30, None, 3),
                     lambda done, result: None)
    signatures = [tuple(sorted(c.items())) for c in bench.ran]
    assert len(signatures) == len(set(signatures)) <= SPACE.size  # repeats are not re-run
    ok = [c for c in bench.ran if not (c["BLOCK_M"] == 128 and c["num_stages"] == 3)]
    assert best.tflops == max(c["BLOCK_M"] * c["BLOCK_N"] * c["BLOCK_K"] / 1e3 for c in ok)
    reopened = store.open_study(*setup[3], SHAPE.key(), SHAPE, seed=3, retune=False)
    assert [t.number for t in reopened.trials] == list(range(len(bench.ran)))
    assert {t.status for t in reopened.trials} <= {"ok", "compile_error"}


def test_resumed_study_counts_stored_trials_and_reruns_none_of_them(setup):
    store, run, study, ids = setup
    first = ScriptedBench()
    run_study(store, run, study, first, None, SPACE, StudyBudget(4, None, 3), lambda *a: None)
    resumed = store.open_study(*ids, SHAPE.key(), SHAPE, seed=3, retune=False)
    assert len(resumed.trials) == len(first.ran) == 4
    second = ScriptedBench()
    run_study(store, run, resumed, second, None, SPACE, StudyBudget(7, None, 3), lambda *a: None)
    assert len(second.ran) <= 3
    assert not {tuple(sorted(c.items())) for c in second.ran} & {
        tuple(sorted(c.items())) for c in first.ran}


def test_timeout_stops_the_study(setup):
    store, run, study, _ = setup
    bench = ScriptedBench()
    assert run_study(store, run, study, bench, None, SPACE, StudyBudget(30, 1e-9, 3),
                     lambda *a: None) is None
    assert bench.ran == []
