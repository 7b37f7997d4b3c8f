"""The search loop: a real Optuna study in a real database, with a scripted executor."""
import dataclasses
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from tests.factories import H100, VARIANTS, told_and_objective
from tuner.db.optuna_storage import optuna_storage
from tuner.db.session import session_factory
from tuner.db.store import Store
from tuner.execution.measure import TrialResult
from tuner.execution.timing import Timing
from tuner.kernels import KERNELS
from tuner.kernels.calls import meta_gemm
from tuner.objective import EAGER, GRAPH, call_ms, eligible
from tuner.search.budget import StudyBudget
from tuner.search.study import DeviceSlot, StudyRecords, StudyRunner
from tuner.shapes import Shape
from tuner.space import parse_space

SPACE = parse_space({
    "kernel": "mm",
    "params": {"variant": ["general"], "pad": [0], "BLOCK_M": [32, 64, 128],
               "BLOCK_N": [64, 128], "BLOCK_K": [32, 64], "GROUP_M": [8], "num_stages": [2, 3],
               "num_warps": [4]},
    "strategy": {"M": "default", "N": "default", "K": "default", "stride_am": "default",
                 "stride_bk": "default", "dtype": "default"}}, "test", VARIANTS)
SHAPE = Shape(256, 256, 256, "fp16", "nn")


def speed(config):
    """Bigger tiles run faster; BLOCK_K 64 beats 32 by 3%, within DEVICE_SLACK."""
    return config["BLOCK_M"] * config["BLOCK_N"] * (1000 + config["BLOCK_K"]) / 1e6


def loop_ms(config):
    """Per back-to-back call: the device time, plus a slow host path for BLOCK_K=64."""
    return 1.0 / speed(config) + (0.01 if config["BLOCK_K"] == 64 else 0.0)


class ScriptedExecutor:
    """Stands in for Executor: bigger tiles are faster on the device, but BLOCK_K=64 has a
    slow host path; BLOCK_M=128 with 3 stages won't compile; BLOCK_M=32, BLOCK_N=128 crashes
    its worker. Compiles finish at once."""
    options = SimpleNamespace(backend="gpu", compile_timeout_s=120.0)

    def __init__(self):
        self.compiled, self.measured, self.retimed, self.retimed_by = [], [], [], []
        self.short = []

    def submit_compile(self, shape, kernel_name, config):
        self.compiled.append(config)
        done = Future()
        done.set_result(TrialResult("compile_error", "OutOfResources: shared memory")
                        if config["BLOCK_M"] == 128 and config["num_stages"] == 3 else 1.0)
        return done

    def measure(self, slot, shape, seed, kernel_name, config, short=False):
        """`measured` lists the full measures, `short` the short ones (no call loop)."""
        (self.short if short else self.measured).append(config)
        if config["BLOCK_M"] == 32 and config["BLOCK_N"] == 128:
            return TrialResult("crashed", "worker killed by SIGSEGV")
        ms = 1.0 / speed(config)
        return TrialResult("ok", None, ms * 0.99, ms, ms * 1.01, speed(config), 1e-3, None, "x",
                           **({} if short else {"host_us": 10.0, "loop_ms": loop_ms(config)}))

    def retime(self, slot, shape, seed, kernel_name, configs, launch):
        self.retimed.append(configs)
        self.retimed_by.append(launch)
        ms = [1.0 / speed(c) if launch == GRAPH else loop_ms(c) for c in configs]
        return [Timing(m * 0.99, m, m * 1.01, 30, "x") for m in ms]


@pytest.fixture
def world(tmp_path):
    url = f"sqlite:///{tmp_path / 'tune.db'}"
    store = Store(session_factory(url))
    device = store.device(H100)
    kernel_row = store.kernel("mm", "abc")
    run = store.start_run(device, "gpu", ["tune"])

    def runner(executor, trials, timeout=None, retune=False, space=SPACE, patience=None,
               warm_start=(), exhaustive=False, launch=GRAPH, polish=0, early_stop=False,
               batch=4, **study):
        """A StudyRunner of SHAPE; `study`: StudyRunner's other keywords (bound, ...)."""
        record = store.open_study(device, kernel_row, store.space(space), SHAPE.key(), SHAPE,
                                  seed=3, retune=retune, launch=launch)
        budget = StudyBudget(trials, timeout, 3, batch=batch, patience=patience,
                             exhaustive=exhaustive, launch=launch, polish=polish,
                             early_stop=early_stop)
        records = StudyRecords(store, optuna_storage(url), run, device, kernel_row, record)
        return StudyRunner(records, DeviceSlot(executor, 0, 232448), KERNELS["mm"], space,
                           SHAPE, budget, warm_start=warm_start, **study), record
    return SimpleNamespace(store=store, runner=runner, device=device, kernel_row=kernel_row,
                           url=url)


def signatures(configs):
    return [tuple(sorted(c.items())) for c in configs]


def test_every_distinct_config_once_failures_recorded_best_retimed(world):
    executor = ScriptedExecutor()
    runner, record = world.runner(executor, trials=12)
    outcome = runner.run()
    assert len(set(signatures(executor.compiled))) == len(executor.compiled) == 12
    trials = world.store.trials_of(record)
    assert [t.number for t in trials] == list(range(12))
    assert {t.status for t in trials} == {"ok", "compile_error", "crashed"}
    ok = [c for c in executor.measured if not (c["BLOCK_M"] == 32 and c["BLOCK_N"] == 128)]
    assert outcome.best.tflops == max(map(speed, ok))
    assert len(executor.retimed) == 1 and len(executor.retimed[0]) == 3
    assert outcome.final.p50_ms == pytest.approx(1.0 / outcome.best.tflops)


@pytest.mark.slow
@pytest.mark.parametrize("polish", [0, 12])
def test_polish_descends_from_the_best_config_one_parameter_at_a_time(world, polish):
    """One sampled trial (the warm start, 64x64x32), then the descent: each round measures the
    best config's unmeasured neighbours (a step along one parameter's list), until the
    fastest config of the space (128x128x64, two stages: three won't compile) is reached,
    within the polish budget."""
    executor = ScriptedExecutor()
    start = {"variant": "general", "pad": 0, "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32,
             "GROUP_M": 8, "num_stages": 2, "num_warps": 4}
    runner, record = world.runner(executor, trials=1, warm_start=[start], polish=polish)
    outcome = runner.run()
    trials = world.store.trials_of(record)
    assert trials[0].params == start
    if not polish:
        assert len(trials) == 1 and outcome.best.params == start
        return
    assert 1 < len(trials) <= 1 + polish
    assert len(set(signatures(executor.compiled))) == len(executor.compiled)
    for trial in trials[1:]:  # every step is one parameter away from a config before it
        assert any(sum(trial.params[k] != t.params[k] for k in start) == 1
                   for t in trials[:trial.number])
    best = {**start, "BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64}
    assert outcome.best.params == best
    told, objective = told_and_objective(world.url, record, trials, GRAPH)
    assert told == objective


@pytest.mark.slow
@pytest.mark.parametrize("launch, winner_block_k", [(GRAPH, 64), (EAGER, 32)])
def test_the_launch_mode_decides_what_the_study_optimises(world, launch, winner_block_k):
    """Every config of the space measured: device time alone crowns the fastest kernel
    (BLOCK_K 64); eager calls pay its slow host path, so the best BLOCK_K 32 tile wins, its
    kernel within DEVICE_SLACK of the fastest. The sampler is told by the mode's figure, and
    the top 3 re-timed by it where their trials leave the winner open: by device time the
    two BLOCK_K tiles are 3% apart; per eager call the slow host path puts BLOCK_K 64 17%
    behind, beyond CALL_NOISE, and the trials settle it."""
    executor = ScriptedExecutor()
    runner, record = world.runner(executor, trials=SPACE.size, launch=launch)
    outcome = runner.run()
    assert outcome.best.params["BLOCK_M"] == outcome.best.params["BLOCK_N"] == 128
    assert outcome.best.params["BLOCK_K"] == winner_block_k
    assert executor.retimed_by == ([GRAPH] if launch == GRAPH else [])
    trials = world.store.trials_of(record)
    assert all(t.loop_ms is not None and t.host_us == 10.0 for t in trials if t.status == "ok")
    told, objective = told_and_objective(world.url, record, trials, launch)
    assert told == objective


class HostBoundExecutor(ScriptedExecutor):
    """Every call costs the host's 50 µs, give or take 3%, whatever its kernel (bigger tiles
    still run faster on the device)."""

    def measure(self, slot, shape, seed, kernel_name, config, short=False):
        result = super().measure(slot, shape, seed, kernel_name, config, short)
        if result.status != "ok":
            return result
        jitter = 1 + 0.03 * ((config["BLOCK_M"] + config["num_stages"]) % 3 - 1)
        return dataclasses.replace(result, loop_ms=0.05 * jitter)

    def retime(self, slot, shape, seed, kernel_name, configs, launch):
        """Device times as measured; every call the host's 50 µs."""
        if launch == GRAPH:
            return super().retime(slot, shape, seed, kernel_name, configs, launch)
        self.retimed.append(configs)
        return [Timing(0.048, 0.05, 0.052, 30, "x") for _ in configs]


@pytest.mark.slow
def test_eager_calls_the_host_paces_go_to_the_fastest_kernel(world):
    """Host-bound calls all take the same time within noise: the eager winner is the config
    whose kernel is fastest on the device, not whichever the host noise favoured."""
    executor = HostBoundExecutor()
    runner, _ = world.runner(executor, trials=SPACE.size, launch=EAGER)
    outcome = runner.run()
    measured = [t for t in runner.stored.values() if t.status == "ok"]
    assert outcome.best.p50_ms == min(t.p50_ms for t in measured)
    assert min(t.loop_ms for t in measured) < outcome.best.loop_ms  # not the loop's pick
    # calls within CALL_NOISE: re-timed side by side, kernels and calls
    assert len(executor.retimed) == 2 and executor.retimed_by == [GRAPH]


@pytest.mark.slow
def test_failures_are_remembered_and_skipped_by_the_next_study(world):
    first = ScriptedExecutor()
    world.runner(first, trials=16)[0].run()
    failing = {c for c in signatures(first.compiled)
               if dict(c)["BLOCK_M"] == 128 and dict(c)["num_stages"] == 3}
    crashed = {c for c in signatures(first.measured)
               if dict(c)["BLOCK_M"] == 32 and dict(c)["BLOCK_N"] == 128}
    assert failing and crashed
    second = ScriptedExecutor()
    world.runner(second, trials=8, retune=True)[0].run()
    assert not (failing | crashed) & set(signatures(second.compiled))


@pytest.mark.slow
def test_interrupted_study_resumes_without_redoing_stored_trials(world):
    first = ScriptedExecutor()
    runner, record = world.runner(first, trials=6)
    runner.run()
    assert len(world.store.trials_of(record)) == 6
    second = ScriptedExecutor()
    resumed, again = world.runner(second, trials=12)
    assert again.id == record.id
    resumed.run()
    assert len(world.store.trials_of(record)) == 12
    assert not set(signatures(second.compiled)) & set(signatures(first.compiled))


def test_timeout_stops_the_study(world):
    executor = ScriptedExecutor()
    assert world.runner(executor, trials=30, timeout=1e-9)[0].run().best is None
    assert executor.compiled == []


@pytest.mark.slow
def test_conditional_space_and_infeasible_configs_cost_no_budget(world):
    """Two variants; pad 64 changes nothing on 256³, so the study never proposes it, and
    SPLIT_K 32 leaves splits empty, so those configs are stored as infeasible before
    compiling; 10 trials still means 10 measured."""
    space = parse_space({
        "kernel": "mm",
        "params": {"variant": ["general", "splitk"], "pad": [0, 64], "BLOCK_M": [32, 64],
                   "BLOCK_N": [64, 128], "BLOCK_K": [32, 64], "GROUP_M": [8],
                   "num_stages": [2], "num_warps": [4], "SPLIT_K": [2, 32]},
        "strategy": SPACE.strategy}, "test", {"mm": KERNELS["mm"].variant_params})
    executor = ScriptedExecutor()
    runner, record = world.runner(executor, trials=10, space=space)
    runner.run()
    trials = world.store.trials_of(record)
    infeasible = [t for t in trials if t.status == "infeasible"]
    assert len(trials) - len(infeasible) == 10 == len(executor.compiled)
    assert infeasible and all("no work" in t.reason for t in infeasible)
    assert all(t.params["pad"] == 0 for t in trials)
    variants = {c["variant"] for c in executor.compiled}
    assert variants == {"general", "splitk"}
    for c in executor.compiled:
        assert ("SPLIT_K" in c) == (c["variant"] == "splitk")


@pytest.mark.slow
def test_warm_start_configs_are_tried_first(world):
    best = {"variant": "general", "pad": 0, "BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64,
            "GROUP_M": 8, "num_stages": 2, "num_warps": 4}
    executor = ScriptedExecutor()
    world.runner(executor, trials=4, warm_start=[best])[0].run()
    assert executor.compiled[0] == best


def test_patience_stops_a_study_that_no_longer_improves(world):
    """The warm start hands the study the space's fastest config first: nothing can beat it,
    so with patience 3 the study stops after that config and three more."""
    best = {"variant": "general", "pad": 0, "BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64,
            "GROUP_M": 8, "num_stages": 2, "num_warps": 4}
    executor = ScriptedExecutor()
    runner, record = world.runner(executor, trials=20, patience=3, warm_start=[best])
    runner.run()
    assert executor.compiled[0] == best
    assert len(executor.compiled) == 4 < 20


def test_a_study_offers_only_the_pads_that_change_its_shape():
    space = SPACE.narrowed(pad=(0,))  # a copy: SPACE itself stays as it is
    wide = dataclasses.replace(SPACE, params={**SPACE.params, "pad": (0, 8, 64)})

    def pads(shape):
        return wide.for_call(meta_gemm(shape)).params["pad"]

    assert pads(Shape(256, 256, 256, "fp16", "nn")) == (0,)
    assert pads(Shape(4097, 4095, 4100, "bf16", "nn")) == (0, 8, 64)
    assert pads(Shape(256, 256, 200, "fp16", "nn")) == (0, 64)
    assert wide.narrowed(pad=(64, 0)).params["pad"] == (0, 64)
    assert space.params["pad"] == (0,) and SPACE.params["pad"] == (0,)
    config = {"variant": "general", "pad": 8, "BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32,
              "GROUP_M": 8, "num_stages": 2, "num_warps": 4}
    assert wide.holds(config) and not wide.narrowed(pad=(0,)).holds(config)
    with pytest.raises(ValueError, match="leaves no value"):
        wide.narrowed(pad=(16,))



class StragglingExecutor(ScriptedExecutor):
    """Compiles in real threads; the first config asked compiles until every other config
    has been measured, then times out."""

    def __init__(self, trials):
        super().__init__()
        self.pool = ThreadPoolExecutor(4)
        self.others_measured = threading.Event()
        self.trials = trials

    def submit_compile(self, shape, kernel_name, config):
        self.compiled.append(config)
        straggler = len(self.compiled) == 1

        def compile_it():
            if straggler:
                self.others_measured.wait(10)
                return TrialResult("timeout", "timeout after 120 s")
            return 1.0
        return self.pool.submit(compile_it)

    def measure(self, slot, shape, seed, kernel_name, config, short=False):
        if len(self.measured) == self.trials - 2:  # this is the last of the others
            self.others_measured.set()
        return super().measure(slot, shape, seed, kernel_name, config, short)


@pytest.mark.slow
def test_configs_stream_past_a_slow_compile(world):
    executor = StragglingExecutor(trials=12)
    runner, record = world.runner(executor, trials=12)
    runner.run()
    assert len(executor.measured) == 11 and executor.compiled[0] not in executor.measured
    statuses = {signature: t.status for t in world.store.trials_of(record)
                for signature in signatures([t.params])}
    assert len(statuses) == 12 and statuses[signatures(executor.compiled[:1])[0]] == "timeout"


def test_an_eager_winner_keeps_its_kernel_within_the_slack_of_the_fastest():
    """The cheapest call whose kernel runs more than DEVICE_SLACK behind the key's fastest
    kernel cannot win eager (it would lose under graphs); graph mode may choose any."""
    def trial(p50_ms, loop_ms):
        return SimpleNamespace(status="ok", p20_ms=p50_ms, p50_ms=p50_ms, p80_ms=p50_ms,
                               loop_ms=loop_ms)
    fastest, close, slow, unmeasured = trial(1.0, 3.0), trial(1.04, 2.0), trial(1.2, 1.0), \
        trial(None, 0.5)
    trials = [fastest, close, slow, unmeasured]
    assert eligible(trials, EAGER) == [fastest, close]
    assert min(eligible(trials, EAGER), key=lambda t: call_ms(t, EAGER)) is close
    assert eligible(trials, GRAPH) == trials
    assert eligible([unmeasured], EAGER) == [unmeasured]
