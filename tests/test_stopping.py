"""Issue 40: a study ends where nothing untried can win, within its time budget, and a warm
start from near keys finishes the job. Real Optuna studies in a real database, scripted
timings; the replays read the committed H200 recording."""
import math
import time
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.factories import H100
from tests.test_search import SHAPE, SPACE, ScriptedExecutor, loop_ms, speed
from tuner.db.optuna_storage import optuna_storage
from tuner.db.session import session_factory
from tuner.db.store import Store
from tuner.execution.measure import TrialResult
from tuner.execution.timing import Timing
from tuner.kernels import KERNELS
from tuner.objective import (
    CALL_NOISE,
    DEVICE_SLACK,
    EAGER,
    GRAPH,
    CallTime,
    call_time,
    contested,
    finalists,
    ranked,
)
from tuner.search.budget import StudyBudget
from tuner.search.planning import plan_studies
from tuner.search.replay import TUNE_RUN, TUNE_RUN_BEFORE, Recording, replay, with_library
from tuner.search.replay_report import geomean
from tuner.search.screening import HOST_PACED_REACH, REACH, screened
from tuner.search.stopping import (
    MIN_CALIBRATION,
    MODEL_BOUND,
    PATIENCE,
    RUN_BUDGET,
    STUDY_BUDGET,
    WARM_CONFIRMED,
    ModelBound,
    gained,
    search_stop,
    stalled,
)
from tuner.search.warmstart import model_configs
from tuner.shapes import Shape
from tuner.space import config_signature, parse_space
from tuner.statuses import TrialStatus

CUBLAS = {"variant": "cublas", "pad": 0}
WITH_CUBLAS = parse_space({"kernel": "mm", "params": {
    **{name: list(values) for name, values in SPACE.params.items()},
    "variant": ["general", "cublas"]},
                           "strategy": SPACE.strategy}, "test",
                          {"mm": KERNELS["mm"].variant_params})


def tile_ms(config) -> float:
    return 1.0 / speed(config)


def model_ms(config) -> float:
    """A model that is right within ±12%, by a fixed per-config error."""
    error = 1 + 0.12 * math.sin(config["BLOCK_M"] + 3 * config["BLOCK_N"] + config["BLOCK_K"])
    return tile_ms(config) * error


TILES = [c for c in SPACE.configs()]
BOUND = ModelBound(lambda c: math.inf if c["variant"] == "cublas" else model_ms(c),
                   min(map(model_ms, TILES)), frozenset({"cublas"}))
# What `tune run` enqueues: cuBLAS, then the model's fastest configs.
WARM_START = [CUBLAS, *sorted(TILES, key=model_ms)[:6]]


class CublasExecutor(ScriptedExecutor):
    """ScriptedExecutor's tiles, and cuBLAS at `cublas_ms`; measuring takes `measure_s`."""

    def __init__(self, cublas_ms: float, measure_s: float = 0.0):
        super().__init__()
        self.cublas_ms, self.measure_s = cublas_ms, measure_s

    def submit_compile(self, shape, kernel_name, config):
        if config["variant"] != "cublas":
            return super().submit_compile(shape, kernel_name, config)
        self.compiled.append(config)
        done = Future()
        done.set_result(0.0)
        return done

    def measure(self, slot, shape, seed, kernel_name, config, short=False):
        time.sleep(self.measure_s)
        if config["variant"] != "cublas":
            return super().measure(slot, shape, seed, kernel_name, config, short)
        (self.short if short else self.measured).append(config)
        ms = self.cublas_ms
        return TrialResult("ok", None, ms * 0.99, ms, ms * 1.01, 1.0, 1e-3, None, "x",
                           host_us=10.0, loop_ms=ms)

    def retime(self, slot, shape, seed, kernel_name, configs, launch):
        ms = [self.cublas_ms if c["variant"] == "cublas" else tile_ms(c) for c in configs]
        return [Timing(m * 0.99, m, m * 1.01, 30, "x") for m in ms]


# -- the rules ---------------------------------------------------------------------------------
def timed(ms: float, spread: float = 0.0) -> CallTime:
    """A call of `ms` whose samples' p20-p80 span `spread` of it."""
    return CallTime(ms * (1 - spread / 2), ms, ms * (1 + spread / 2))


def test_patience_counts_the_trials_since_the_last_real_gain():
    assert not stalled([timed(1.0), timed(0.5), timed(0.4999), timed(0.4998)], 3)
    assert stalled([timed(1.0), timed(0.5), timed(0.4999), timed(0.4998), timed(1.0)], 3)
    assert stalled([timed(1.0), None, None, None], 3)  # failed trials are no progress
    assert not stalled([timed(1.0)] * 50, None)
    assert search_stop([timed(1.0)] * 3, [], 2, None).rule == PATIENCE


def test_gains_within_the_noise_of_the_two_measures_are_not_progress():
    """A short kernel's best creeps up by one noisy sample after another: each 'gain' is
    within the noise of the two timings (their p20-p80, at least TIE_FLOOR), so patience
    runs out after `patience` trials as if there were none; a late gain beyond the noise
    resets it, however tight or wide the timings' spread."""
    creeping = [timed(0.020 * (1 - 0.007) ** i, spread=0.04) for i in range(12)]
    assert stalled(creeping, 8)
    assert not stalled([timed(1.0), *[timed(1.0 - 0.006 * i) for i in range(1, 8)]], 8)
    tight = [timed(0.020 * (1 - 0.006) ** i) for i in range(12)]  # within TIE_FLOOR
    assert stalled(tight, 8)
    real_late_gain = [*creeping[:8], timed(0.015, spread=0.04), *creeping[8:11]]
    assert not stalled(real_late_gain, 8)
    assert gained(timed(0.020, 0.04), timed(0.0185, 0.04))
    assert not gained(timed(0.020, 0.04), timed(0.0197, 0.04))
    assert gained(timed(0.020), timed(0.0197))  # tight timings: 1.5% is beyond TIE_FLOOR


def test_the_bound_needs_calibration_and_ends_where_nothing_untried_can_win():
    """Calibrated on configs the model predicts right, the bound ends the search only where
    the best measured beats the model's fastest config by more than the spread allows."""
    tiles = sorted(TILES, key=model_ms)[:MIN_CALIBRATION]
    measured = [(c, model_ms(c)) for c in tiles]
    assert BOUND.reason(measured[:-1]) is None  # too few samples to calibrate
    assert BOUND.reason(measured) is None  # the best is the model's fastest: keep searching
    assert BOUND.reason([*measured, (CUBLAS, BOUND.fastest_ms * 0.95)]) is None
    why = BOUND.reason([*measured, (CUBLAS, BOUND.fastest_ms * 0.5)])
    assert why.rule == MODEL_BOUND and why.drops_in_flight
    spread = [(c, model_ms(c) * (2.0 if i % 2 else 0.5)) for i, c in enumerate(tiles)]
    assert BOUND.reason([*spread, (CUBLAS, BOUND.fastest_ms * 0.5)]) is None  # no trust left


# -- studies -----------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_study_where_cublas_wins_by_far_stops_after_the_models_top_configs(world):
    executor = CublasExecutor(cublas_ms=tile_ms(TILES[-1]) / 2)
    runner, record = world.runner(executor, trials=24, space=WITH_CUBLAS, patience=8, polish=6,
                                  warm_start=WARM_START, early_stop=True, bound=BOUND, batch=8)
    outcome = runner.run()
    assert outcome.best.params == CUBLAS and outcome.ended_by.startswith(MODEL_BOUND)
    looked_at = executor.measured + executor.short  # cuBLAS in full, then each tile short
    compiling = [c for c in WARM_START if c in looked_at or c not in executor.compiled]
    assert looked_at == compiling[:len(looked_at)]  # in order, none after
    # The tiles, twice cuBLAS's time, are screened: their short measure calibrates the bound.
    assert executor.measured == [CUBLAS] and len(executor.short) == MIN_CALIBRATION
    statuses = [t.status for t in runner.stored.values()]
    assert statuses.count("ok") == 1 and statuses.count("screened") == MIN_CALIBRATION


@pytest.mark.slow
def test_a_study_where_a_tile_wins_is_not_ended_by_the_bound(world):
    """cuBLAS is slower than the best tiles: the bound cannot say the search is over, so
    patience ends it, having found the fastest tile (the polish steps reach it)."""
    executor = CublasExecutor(cublas_ms=1.0)
    runner, record = world.runner(executor, trials=10, space=WITH_CUBLAS, patience=4, polish=6,
                                  warm_start=WARM_START, early_stop=True, bound=BOUND, batch=8)
    outcome = runner.run()
    assert not outcome.ended_by.startswith(MODEL_BOUND)
    assert len(executor.measured + executor.short) > 1 + MIN_CALIBRATION
    best_tile = {**WARM_START[1], "BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64,
                 "num_stages": 2}
    assert outcome.best.params == best_tile


class PowerStateExecutor(CublasExecutor):
    """cuBLAS's trial timed 10% behind the best tile (a hotter power state); side by side,
    within 0.5% of it: `best_ms` per launch mode, cuBLAS's device and call alike."""

    def __init__(self, best_ms: float):
        super().__init__(cublas_ms=best_ms * 1.10)
        self.paired_ms = best_ms * 1.005

    def retime(self, slot, shape, seed, kernel_name, configs, launch):
        self.retimed.append(configs)
        ms = [self.paired_ms if c["variant"] == "cublas"
              else tile_ms(c) if launch == GRAPH else loop_ms(c) for c in configs]
        return [Timing(m * 0.99, m, m * 1.01, 30, "x") for m in ms]


@pytest.mark.slow
@pytest.mark.parametrize("launch", [GRAPH, EAGER])
def test_a_tile_must_beat_cublas_side_by_side_to_replace_it(world, launch):
    """Every config measured; the best tile's trial leads cuBLAS's by 10%, past eager's
    DEVICE_SLACK, within LIBRARY_REACH: the final re-times cuBLAS beside it, they tie, and
    cuBLAS stays."""
    best = min((c for c in TILES if not (c["BLOCK_M"] == 128 and c["num_stages"] == 3)
                and not (c["BLOCK_M"] == 32 and c["BLOCK_N"] == 128)),
               key=tile_ms if launch == GRAPH else loop_ms)
    executor = PowerStateExecutor(tile_ms(best) if launch == GRAPH else loop_ms(best))
    runner, _ = world.runner(executor, trials=WITH_CUBLAS.size, space=WITH_CUBLAS,
                             warm_start=[CUBLAS], launch=launch)
    outcome = runner.run()
    assert CUBLAS in executor.retimed[0] and best in executor.retimed[0]
    assert outcome.best.params == CUBLAS
    assert outcome.final.p50_ms == pytest.approx(executor.paired_ms)


class FewRowsExecutor(CublasExecutor):
    """A bucket's two ends: at SHAPE, cuBLAS `lead` times the best tile's time (by the launch
    mode's figure and on the device alike); at fewer rows, each tile as at SHAPE (it runs
    the same row tiles) and cuBLAS `low_lead` times the best tile's. `retimed_at` lists
    the M of each re-timing."""

    def __init__(self, best_ms: float, lead: float, low_lead: float):
        super().__init__(cublas_ms=best_ms * lead)
        self.low_ms, self.retimed_at = best_ms * low_lead, []

    def retime(self, slot, shape, seed, kernel_name, configs, launch):
        self.retimed_at.append(shape.M)
        self.retimed.append(configs)
        cublas = self.cublas_ms if shape.M == SHAPE.M else self.low_ms
        ms = [cublas if c["variant"] == "cublas"
              else tile_ms(c) if launch == GRAPH else loop_ms(c) for c in configs]
        return [Timing(m * 0.99, m, m * 1.01, 30, "x") for m in ms]


@pytest.mark.slow
@pytest.mark.parametrize("launch", [GRAPH, EAGER])
@pytest.mark.parametrize(("low_lead", "tile_keeps"), [(0.85, False), (0.97, True), (1.2, True)])
def test_a_tile_keeps_a_bucket_only_if_its_fewest_rows_lose_less_than_its_top_gains(
        world, launch, low_lead, tile_keeps):
    """The best tile leads cuBLAS by 5% at SHAPE's 256 rows; at the bucket's 225 rows the
    tile runs the same row tiles while cuBLAS gets faster: 15% ahead of the tile, cuBLAS
    keeps the key; 3% ahead, or behind, the tile keeps it. Both are re-timed in pairs at
    both ends, by each figure the launch mode chooses by."""
    figure = tile_ms if launch == GRAPH else loop_ms
    best = min((c for c in TILES if not (c["BLOCK_M"] == 128 and c["num_stages"] == 3)
                and not (c["BLOCK_M"] == 32 and c["BLOCK_N"] == 128)), key=figure)
    executor = FewRowsExecutor(figure(best), 1.05, low_lead)
    runner, record = world.runner(executor, trials=WITH_CUBLAS.size, space=WITH_CUBLAS,
                                  warm_start=[CUBLAS], launch=launch,
                                  low_end=replace(SHAPE, M=225))
    outcome = runner.run()
    assert executor.retimed_at.count(225) == (1 if launch == GRAPH else 2)
    assert executor.retimed[-1][1] == CUBLAS
    assert (outcome.best.params != CUBLAS) == tile_keeps
    assert ("the library kept" in outcome.ended_by) != tile_keeps
    if not tile_keeps:
        assert outcome.final.p50_ms == pytest.approx(executor.cublas_ms)
        assert "1.18x its time at M=225" in outcome.ended_by


@pytest.mark.slow
def test_without_a_low_end_or_a_library_trial_nothing_is_timed_at_other_rows(world):
    executor = FewRowsExecutor(tile_ms(TILES[0]), 1.05, 0.5)
    runner, _ = world.runner(executor, trials=WITH_CUBLAS.size, space=WITH_CUBLAS,
                             warm_start=[CUBLAS])
    assert runner.run().best.params != CUBLAS and set(executor.retimed_at) == {SHAPE.M}
    lone = FewRowsExecutor(tile_ms(TILES[0]), 1.05, 0.5)
    runner, _ = world.runner(lone, trials=SPACE.size, low_end=replace(SHAPE, M=225))
    runner.run()
    assert set(lone.retimed_at) == {SHAPE.M}


WIDE = parse_space({"kernel": "mm", "params": {
    "variant": ["general", "cublas"], "pad": [0], "BLOCK_M": [16, 32, 64, 128],
    "BLOCK_N": [32, 64, 128, 256], "BLOCK_K": [32, 64, 128, 256], "GROUP_M": [1, 8],
    "num_stages": [2, 3, 4], "num_warps": [2, 4, 8]}, "strategy": SPACE.strategy}, "test",
                   {"mm": KERNELS["mm"].variant_params})


def decode_ms(config) -> float:
    """A memory-bound decode GEMM: two warps, BLOCK_K 32 and tall tiles cost 10-25% each;
    the rest of the space is one plateau, its configs apart by less than the noise."""
    if config["variant"] == "cublas":
        return 1.6
    jitter = 0.001 * (sum(v for v in config.values() if isinstance(v, int)) % 5)
    return ((1 + 0.25 * (config["num_warps"] == 2)) * (1 + 0.10 * (config["BLOCK_K"] == 32))
            * (1 + 0.15 * (config["BLOCK_M"] >= 64)) * (1 + jitter))


class FormulaExecutor(CublasExecutor):
    """`ms_of(config)` as device time and per eager call, each with a 1% p20-p80 spread."""

    def __init__(self, ms_of):
        super().__init__(cublas_ms=ms_of(CUBLAS))
        self.ms_of = ms_of

    def measure(self, slot, shape, seed, kernel_name, config, short=False):
        (self.short if short else self.measured).append(config)
        ms = self.ms_of(config)
        loop = {} if short else dict(host_us=10.0, loop_ms=ms, loop_p20_ms=ms * 0.995,
                                     loop_p80_ms=ms * 1.005)
        return TrialResult("ok", None, ms * 0.995, ms, ms * 1.005, 1.0, 1e-3, None, "x", **loop)

    def retime(self, slot, shape, seed, kernel_name, configs, launch):
        return [Timing(self.ms_of(c) * 0.995, self.ms_of(c), self.ms_of(c) * 1.005, 30, "x")
                for c in configs]


@pytest.mark.slow
def test_a_decode_study_whose_gains_come_early_ends_soon_after_them(world):
    """The pattern of decode shapes: the warm start and the sampler's first configs bring
    gains, then every config is on the plateau. Patience ends the search, the descent
    measures only its own steps (the sampler is asked nothing more), and the study ends
    far short of its 40 + 6 trials, on the plateau."""
    tiles = [{"variant": "general", "pad": 0, "BLOCK_M": m, "BLOCK_N": 64, "BLOCK_K": k,
              "GROUP_M": 1, "num_stages": 3, "num_warps": 2} for m, k in ((64, 32), (64, 64),
                                                                          (32, 64))]
    executor, in_descent = FormulaExecutor(decode_ms), []
    runner, _ = world.runner(executor, trials=40, space=WIDE, patience=8, polish=6, batch=16,
                             launch=EAGER, warm_start=[CUBLAS, *tiles], early_stop=True,
                             on_trial=lambda done, result: in_descent.append(
                                 runner.polished > 0))
    outcome = runner.run()
    assert outcome.ended_by.startswith(PATIENCE) and runner.polished
    assert in_descent.count(True) <= runner.polished  # the descent's steps, nothing more
    assert runner.attempted <= 24
    assert decode_ms(outcome.best.params) <= 1.005  # on the plateau


@pytest.mark.slow
def test_without_early_stop_the_bound_is_not_asked(world):
    executor = CublasExecutor(cublas_ms=tile_ms(TILES[-1]) / 2)
    runner, _ = world.runner(executor, trials=12, space=WITH_CUBLAS, patience=24,
                             warm_start=WARM_START, bound=BOUND, batch=8)
    outcome = runner.run()
    assert runner.attempted == 12 and outcome.ended_by == "trials spent: 12 trials"


@pytest.mark.slow
@pytest.mark.parametrize("budget", ["study", "run"])
def test_a_budget_ends_the_study_on_time_keeping_the_best_found(world, budget):
    """Each measure takes 0.2 s and the space holds 24 configs; a 2 s budget ends the search
    within a few seconds of it, as the issue asks (a loaded CI core has taken over a second
    to open and close a study), configs in flight left unmeasured, and the best measured
    wins. Without the deadline the 24 measures alone would take 4.8 s."""
    executor = CublasExecutor(cublas_ms=1.0, measure_s=0.2)
    deadline = dict(timeout=2.0) if budget == "study" else dict(
        run_deadline=time.monotonic() + 3.0)
    runner, _ = world.runner(executor, trials=24, space=WITH_CUBLAS, batch=8, **deadline)
    start = time.monotonic()
    outcome = runner.run()
    end = start + 2.0 if budget == "study" else deadline["run_deadline"]
    assert time.monotonic() < end + 2.0
    assert 1 <= len(executor.measured) < 24
    assert outcome.ended_by.startswith(STUDY_BUDGET if budget == "study" else RUN_BUDGET)
    fastest = min(executor.measured, key=lambda c: 1.0 if c == CUBLAS else tile_ms(c))
    assert outcome.best.params == fastest


class ClockedExecutor(ScriptedExecutor):
    """Every tile takes the same time, so each is within reach of the best and its short
    measure is followed by a full one; each measure takes `measure_s` and is logged with
    when it started and ended. The first short measure lasts until just past the runner's
    deadline, however long the study took to reach it (a loaded CI machine's start-up)."""

    def __init__(self, measure_s: float):
        super().__init__()
        self.measure_s, self.log = measure_s, []
        self.runner = None  # set once the runner exists: its deadline is known while it runs

    def measure(self, slot, shape, seed, kernel_name, config, short=False):
        start = time.monotonic()
        first_short = short and not any(logged_short for _, logged_short, _, _ in self.log)
        seconds = self.runner.deadline - start + 0.05 if first_short else self.measure_s
        time.sleep(max(seconds, self.measure_s))
        self.log.append((config_signature(config), short, start, time.monotonic()))
        return TrialResult("ok", None, 0.99, 1.0, 1.01, 1.0, 1e-3, None, "x",
                           **({} if short else {"host_us": 10.0, "loop_ms": 1.0}))


def test_past_the_deadline_a_short_measure_is_not_followed_by_the_full_one(world):
    """A config whose short measure ends past the deadline is left unmeasured, like one still
    in flight: its full measure would overrun the budget by a whole measure more."""
    executor = ClockedExecutor(measure_s=0.15)
    runner, record = world.runner(executor, trials=24, timeout=3.0, early_stop=True, batch=4)
    executor.runner = runner
    runner.run()
    late = {sig for sig, short, _, end in executor.log if short and end >= runner.deadline}
    assert late  # the budget ran out in the middle of the screening
    full = [(sig, start) for sig, short, start, _ in executor.log if not short]
    assert not late & {sig for sig, _ in full}
    assert not late & {config_signature(t.params) for t in world.store.trials_of(record)}


# -- warm starts along an M sweep ------------------------------------------------------------
class SweepExecutor(CublasExecutor):
    """What TuneJob asks of an executor beyond a study's: the device, one slot, a baseline."""
    options = SimpleNamespace(backend="gpu", compile_timeout_s=120.0)
    slots = 1

    def device_info(self):
        return H100

    def __init__(self, cublas_ms):
        super().__init__(cublas_ms)
        self.baselines, self.ahead = [], []

    def submit_compile(self, shape, kernel_name, config, ahead=False):
        """Compiles ahead of their study (tuner.search.ahead) are kept apart, in `ahead`."""
        if not ahead:
            return super().submit_compile(shape, kernel_name, config)
        self.ahead.append((shape, config))
        done = Future()
        done.set_result(1.0)
        return done

    def baseline(self, slot, shape, seed):
        """A separate cuBLAS timing, not what the studies measured of the cuBLAS config."""
        self.baselines.append(shape)
        return Timing(1.98, 2.0, 2.02, 30, "x")


class Quiet:
    def __init__(self):
        self.done = {}

    def key_started(self, plan, trials):
        pass

    def trial_done(self, plan, done, result):
        pass

    def key_done(self, plan, outcome):
        self.done[plan.shape.M] = outcome


def sweep(folder, budget: StudyBudget, run_budget_s=None, ms=(64, 128, 256, 512),
          executor=None):
    """`tune run`'s job on these M of one (N, K), into folder's database (kept between
    calls): its summary, the studies, their trial counts, the winners' configs, what the
    reporter heard per M, and how many rankings the job asked for."""
    from tuner.db.models import Study
    from tuner.search.pipeline import TuneJob

    url = f"sqlite:///{folder / 'tune.db'}"
    store, reporter = Store(session_factory(url)), Quiet()
    executor = executor or SweepExecutor(1.0)
    shapes = [Shape(m, 256, 256, "fp16", "nn") for m in ms]
    plans = plan_studies(shapes, {"mm": WITH_CUBLAS}, lambda m, n: KERNELS["mm"])
    job = TuneJob(store, optuna_storage(url), executor, {"mm": WITH_CUBLAS}, budget, False,
                  reporter, run_budget_s)
    summary = job.run(plans, ["tune"])
    with store.sessions() as s:
        studies = list(s.query(Study).order_by(Study.id))
    winners = [w.trial.params for w in store.winners()]
    return SimpleNamespace(summary=summary, studies=studies, winners=winners, reporter=reporter,
                           trials=[len(store.trials_of(s)) for s in studies],
                           baselines=executor.baselines, rankings=len(job.ranking))


@pytest.mark.slow
def test_along_an_m_sweep_each_next_m_starts_from_the_last_winner_and_ends_once_confirmed(
        tmp_path):
    warm = sweep(tmp_path, StudyBudget(8, None, 0, batch=8, patience=4, polish=2,
                                       early_stop=True))
    assert len(warm.summary.tuned) == 4
    assert warm.trials[0] > 2 and warm.trials[1:] == [2, 2, 2]  # cuBLAS, the last M's winner
    assert [s.reason.split(":")[0] for s in warm.studies[1:]] == [WARM_CONFIRMED] * 3
    assert len(warm.winners) == 4 and all(w == warm.winners[0] for w in warm.winners)
    assert "(ended by warm start confirmed" in warm.reporter.done[512]
    # Each study measured cuBLAS as a config: its baseline is that measure, not timed again.
    assert not warm.baselines and all(s.baseline_ms == 1.0 for s in warm.studies)
    (tmp_path / "before").mkdir()
    before = sweep(tmp_path / "before", StudyBudget(8, None, 0, batch=8, patience=4,
                                                    polish=2))
    assert min(before.trials) > 2  # without early_stop every study searches


def test_a_warm_start_holds_where_a_near_winner_leads_as_close_to_the_roofline_as_there():
    from tuner.search.stopping import WARM_MARGIN, WarmConfirmation

    tile = TILES[0]
    confirmation = WarmConfirmation({config_signature(tile): 0.8}, roofline_ms=1.0)
    assert confirmation.holds(tile, 1.0 / 0.8)
    assert confirmation.holds(tile, 1.0 / (0.8 * (1 - WARM_MARGIN)) * 0.999)
    assert not confirmation.holds(tile, 1.0 / (0.8 * (1 - WARM_MARGIN)) * 1.01)
    assert not confirmation.holds(CUBLAS, 0.1)  # no near key's winner: nothing carried over


def test_the_roofline_is_the_longer_of_the_multiply_adds_and_the_traffic():
    from tuner.model.predict import H100_SXM, roofline_ms

    square = Shape(8192, 8192, 8192, "bf16", "nn")  # compute-bound: 2·8192³ at 989.4 TF/s
    assert roofline_ms(square, H100_SXM) == pytest.approx(2 * 8192**3 / 989.4e9)
    row = Shape(1, 8192, 8192, "bf16", "nt")  # the weight's 128 MiB at 3.35 TB/s
    assert roofline_ms(row, H100_SXM) == pytest.approx(8192 * (8192 + 2) * 2 / 3.35e9)


class CublasAheadAt(SweepExecutor):
    """cuBLAS far ahead of every tile at M = `m`, behind them elsewhere."""

    def __init__(self, m: int):
        super().__init__(1.0)
        self.m = m

    def measure(self, slot, shape, seed, kernel_name, config, short=False):
        self.cublas_ms = 0.01 if shape.M == self.m else 1.0
        return super().measure(slot, shape, seed, kernel_name, config, short)


class TilesSlowerAt(SweepExecutor):
    """Every tile `factor` times slower at M = `m` than at the other M, whose roofline
    time is at most twice theirs."""

    def __init__(self, m: int, factor: float):
        super().__init__(1.0)
        self.m, self.factor = m, factor

    def measure(self, slot, shape, seed, kernel_name, config, short=False):
        result = super().measure(slot, shape, seed, kernel_name, config, short)
        if shape.M != self.m or config["variant"] == "cublas" or result.p50_ms is None:
            return result
        return replace(result, **{field: getattr(result, field) * self.factor for field in
                                  ("p20_ms", "p50_ms", "p80_ms", "loop_ms")
                                  if getattr(result, field) is not None})


@pytest.mark.slow
@pytest.mark.parametrize("executor", [CublasAheadAt(128), TilesSlowerAt(128, 3.0)],
                         ids=["cublas-ahead-here", "the-winner-slower-than-its-key-foretells"])
def test_a_near_winner_that_does_not_carry_over_leaves_the_study_to_search_on(tmp_path,
                                                                              executor):
    """The M = 64 winner, measured at M = 128, loses to cuBLAS there or falls further from
    the roofline than at M = 64: no warm start confirmed; the study ranks and measures the
    model's picks and searches on, and its winner is the fastest measured."""
    budget = StudyBudget(8, None, 0, batch=8, patience=4, polish=2, early_stop=True)
    run = sweep(tmp_path, budget, ms=(64, 128), executor=executor)
    assert not run.studies[1].reason.startswith(WARM_CONFIRMED)
    assert run.trials[1] > 2 and run.rankings == 2  # the model's picks, ranked only now
    if isinstance(executor, CublasAheadAt):
        assert run.winners[1] == CUBLAS
    else:
        assert run.winners[1] == run.winners[0] != CUBLAS  # all tiles alike slower


@pytest.mark.slow
def test_a_key_next_to_a_tuned_one_is_ranked_only_in_the_worker(tmp_path, monkeypatch):
    """The model's ranking takes the interpreter's lock for seconds: a study that will start
    from a near key's winner (here one a former run tuned) is never ranked in this process;
    its ranking runs ahead in the ranking's worker, for the search that goes on if its near
    winners do not carry over. The far key, first, is ranked once, here, as it starts."""
    from tuner.search import warmstart

    budget = StudyBudget(8, None, 0, batch=8, patience=4, polish=2, early_stop=True)
    assert sweep(tmp_path, budget, ms=(64,)).rankings == 1
    ranked_here, real = [], warmstart.model_configs
    monkeypatch.setattr(warmstart, "model_configs",
                        lambda *args: ranked_here.append(args[2].M) or real(*args))
    later = sweep(tmp_path, budget, ms=(4096, 128))
    assert later.studies[-1].reason.startswith(WARM_CONFIRMED)
    assert later.rankings == 2 and ranked_here == [4096]
    assert [s.shape_M for s in later.studies] == [64, 4096, 128]


@pytest.mark.slow
def test_a_run_says_where_each_studys_wall_went(tmp_path):
    """Per key tuned, the seconds of each phase (tuner.search.phases): a warm study's
    measures, its records, its database set-up; together no more than the run's wall."""
    from tuner.search.phases import ASK, CLAIM, FINISH, MEASURE, OPEN, RECORD, WARM_START

    budget = StudyBudget(8, None, 0, batch=8, patience=4, polish=2, early_stop=True)
    sweep(tmp_path, budget, ms=(64,))
    start = time.perf_counter()
    warm = sweep(tmp_path, budget, ms=(128,))
    wall = time.perf_counter() - start
    phases = warm.summary.phases["mm 128x256x256 fp16 nn"]
    assert phases.steps[MEASURE] == 2 == phases.steps[RECORD]  # cuBLAS, the winner of M=64
    assert {CLAIM, OPEN, WARM_START, ASK, FINISH} <= set(phases.seconds)
    assert 0 < phases.total < wall
    costliest = max(phases.seconds, key=phases.seconds.get)
    shown = str(phases).split(", ")
    assert len(shown) == len(phases.seconds) and shown[0].startswith(f"{costliest} ")


def test_a_run_budget_leaves_the_studies_it_cannot_start(tmp_path):
    spent = sweep(tmp_path, StudyBudget(8, None, 0, batch=8, patience=4, polish=2),
                  run_budget_s=1e-9)
    assert len(spent.summary.unstarted) == 4 and not spent.studies
    assert spent.reporter.done[64] == "not started: the run's budget is spent"


# -- replayed recordings ---------------------------------------------------------------------
RECORDED_H200 = Path(__file__).resolve().parent / "data/recording-h200.json.gz"


def replayed(shape_recording, device, strategy, seed=0, noise=0.0):
    from tuner.model.predict import device_spec
    picks = model_configs(KERNELS["mm"], shape_recording.space, shape_recording.shape,
                          device_spec(device), device.smem_per_block)
    return replay(shape_recording, strategy, seed, 40, 16, picks, device, noise)


def test_a_replay_with_noisy_measures_stops_where_exact_ones_do():
    """A decode-like shape (16x4096x4096) whose measures are off by 5% each, as the timings
    of ~20 us kernels are: the noise does not keep the study going (its p20-p80 says how
    large it is), and the configs measured are as good; the noise is seeded."""
    recording = Recording.load(RECORDED_H200)
    shape = recording.shapes[2]
    exact = replayed(shape, recording.device, TUNE_RUN)
    noisy = [replayed(shape, recording.device, TUNE_RUN, seed, noise=0.05) for seed in (0, 1)]
    assert noisy[0] == replayed(shape, recording.device, TUNE_RUN, 0, noise=0.05)
    assert all(len(curve) <= len(exact) + 2 and curve[-1] >= exact[-1] - 0.01
               for curve in noisy)


def test_a_replayed_recording_where_cublas_wins_stops_in_few_trials():
    recording = Recording.load(RECORDED_H200)
    shape = with_library(recording.shapes[1], 1.3)  # 4096³ bf16, cuBLAS 30% ahead
    curve = replayed(shape, recording.device, TUNE_RUN)
    assert curve[0] == curve[-1] == 1.0 and len(curve) == 1 + MIN_CALIBRATION


def test_the_descent_starts_from_the_best_tile_where_a_library_call_leads_within_reach():
    from tuner.search.stopping import descent_start

    tile, slower = TILES[0], TILES[1]
    library = frozenset({"cublas"})
    assert descent_start([(tile, 1.0), (CUBLAS, 1.01)], library) == tile
    assert descent_start([(CUBLAS, 1.0), (tile, 1.0 + REACH / 2), (slower, 1.01)],
                         library) == tile
    assert descent_start([(CUBLAS, 1.0), (tile, 1.0 + 2 * REACH)], library) == CUBLAS
    assert descent_start([(CUBLAS, 1.0)], library) == CUBLAS


def test_under_a_host_paced_library_call_patience_waits_while_tile_kernels_gain():
    """cuBLAS leads every call; no tile is eligible yet, but each tile's kernel gains on the
    last: patience waits, and runs out once they stop gaining too."""
    library_call = [timed(4.0)] + [None] * 3  # the tiles: screened, so no call time
    closing = [None, timed(1.3), timed(1.2), timed(1.1)]
    assert search_stop(library_call, [], 3, None).rule == PATIENCE
    assert search_stop(library_call, [], 3, None, closing) is None
    stalled_tiles = [None, timed(1.1), timed(1.2), timed(1.15)]
    assert search_stop(library_call, [], 2, None, stalled_tiles).rule == PATIENCE


class HostPacedExecutor(CublasExecutor):
    """cuBLAS: a 1 ms kernel in a `cublas_call_ms` call. Every tile's kernel runs 1.12 ms
    (beyond HOST_PACED_REACH) but FAST_TILE's: 1.04 (within DEVICE_SLACK), though its short
    measure reads 1.08 (beyond REACH, within HOST_PACED_REACH): few samples of a few-us kernel.
    A tile's call costs its kernel and 0.5 ms."""
    FAST_TILE = {"variant": "general", "pad": 0, "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32,
                 "GROUP_M": 8, "num_stages": 2, "num_warps": 4}

    def __init__(self, cublas_call_ms: float):
        super().__init__(cublas_ms=1.0)
        self.cublas_call_ms = cublas_call_ms

    def kernel_ms(self, config, short=False) -> float:
        if config["variant"] == "cublas":
            return 1.0
        return (1.08 if short else 1.04) if config == self.FAST_TILE else 1.12

    def call_ms(self, config) -> float:
        return self.cublas_call_ms if config["variant"] == "cublas" else (
            self.kernel_ms(config) + 0.5)

    def measure(self, slot, shape, seed, kernel_name, config, short=False):
        (self.short if short else self.measured).append(config)
        ms = self.kernel_ms(config, short)
        loop = {} if short else dict(host_us=10.0, loop_ms=self.call_ms(config))
        return TrialResult("ok", None, ms * 0.995, ms, ms * 1.005, 1.0, 1e-3, None, "x", **loop)

    def retime(self, slot, shape, seed, kernel_name, configs, launch):
        ms = [self.call_ms(c) if launch == EAGER else self.kernel_ms(c) for c in configs]
        return [Timing(m * 0.995, m, m * 1.005, 30, "x") for m in ms]


@pytest.mark.parametrize("cublas_call_ms", [4.0, 1.2])
def test_under_a_host_paced_cublas_a_tile_within_the_wider_reach_is_measured_and_wins(
        world, cublas_call_ms):
    """Paced by the host (a 4 ms call for a 1 ms kernel), cuBLAS leaves room for a tile whose
    kernel comes within DEVICE_SLACK: the tile whose short measure reads 8% behind is measured
    in full, comes within the slack and wins by its call (before, screened, it was lost and
    cuBLAS won). With cuBLAS's call 1.2 ms the host does not pace it: the tile is screened,
    and its 1.54 ms call could not have won."""
    executor = HostPacedExecutor(cublas_call_ms)
    fast = HostPacedExecutor.FAST_TILE
    runner, _ = world.runner(executor, trials=2, space=WITH_CUBLAS, launch=EAGER, polish=6,
                             early_stop=True, warm_start=[CUBLAS, fast])
    outcome = runner.run()
    assert fast in executor.short
    if cublas_call_ms == 4.0:
        assert fast in executor.measured and outcome.best.params == fast
    else:
        assert fast not in executor.measured and outcome.best.params == CUBLAS


def test_a_replay_where_cublas_narrowly_leads_polishes_the_best_tile():
    """cuBLAS 2% ahead of the best tile of 4096³: the study measures the model's top configs,
    then steps from the best of them (a BLOCK_K or a stage may take it past cuBLAS); 30%
    ahead, it stops after them."""
    recording = Recording.load(RECORDED_H200)
    near = replayed(with_library(recording.shapes[1], 1.02), recording.device, TUNE_RUN)
    far = replayed(with_library(recording.shapes[1], 1.3), recording.device, TUNE_RUN)
    assert len(near) > len(far) == 1 + MIN_CALIBRATION and near[-1] == far[-1] == 1.0


@pytest.mark.slow
def test_replayed_recordings_where_a_tile_wins_do_not_stop_early_and_keep_their_quality():
    """Every recorded shape (a tile wins: the recording holds no cuBLAS): today's defaults
    measure fewer configs than the search before them and find as good configs, within
    noise (one seed each: TPE's luck moves single shapes by a few percent either way); with
    cuBLAS 30% ahead each study stops after the model's top configs."""
    recording = Recording.load(RECORDED_H200)
    new, old = [], []
    for shape_recording in recording.shapes:
        new.append(replayed(shape_recording, recording.device, TUNE_RUN))
        old.append(replayed(shape_recording, recording.device, TUNE_RUN_BEFORE))
        ahead = replayed(with_library(shape_recording, 1.3), recording.device, TUNE_RUN)
        assert len(ahead) <= 1 + MIN_CALIBRATION + 2 and ahead[-1] == 1.0
    assert all(len(curve) > 1 + MIN_CALIBRATION for curve in new)
    assert sum(map(len, new)) < 0.7 * sum(map(len, old))
    assert geomean([c[-1] for c in new]) >= geomean([c[-1] for c in old]) - 0.01
    assert min(c[-1] for c in new) >= 0.94


def test_the_recording_replays_the_library_call_first():
    recording = Recording.load(RECORDED_H200)
    shape = with_library(recording.shapes[0], 0.5)
    assert config_signature(CUBLAS) in shape.tflops and shape.best == recording.shapes[0].best
    assert "cublas" in shape.space.variant_params


# -- the command line ------------------------------------------------------------------------
def test_timeout_is_the_deprecated_name_of_budget_s(shapes_dir, monkeypatch):
    import tuner.tuning
    from tests.factories import error_line, tune

    budgets = []

    def fake_run(db, shapes, space_paths, budget, workers, command, retune, reporter,
                 run_budget_s):
        budgets.append((budget, run_budget_s))
        return SimpleNamespace(tuned=[], skipped=[], busy=[], failed=[], unstarted=[])
    monkeypatch.setattr(tuner.tuning, "tune_run", fake_run)
    args = ("run", "--shapes", "s.csv", "--backend", "interpret")
    result = tune(*args, "--budget-s", "5", "--run-budget-s", "60")
    assert result.exit_code == 0, result.output
    assert budgets[-1][0].budget_s == 5 and budgets[-1][1] == 60
    assert budgets[-1][0].early_stop and budgets[-1][0].patience == 8
    result = tune(*args, "--timeout", "7", "--no-early-stop")
    assert result.exit_code == 0 and "--timeout is deprecated" in result.output
    assert budgets[-1][0].budget_s == 7 and not budgets[-1][0].early_stop
    result = tune(*args, "--timeout", "7", "--budget-s", "5")
    assert error_line(result) == "Error: --timeout is the old name of --budget-s: give one"


# -- overlap -----------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_next_studys_ranking_is_computed_ahead_in_another_process(monkeypatch):
    """A prefetched ranking is computed once, in the ranking workers (here two, each ranking
    half the space): seconds of pure Python that would hold this process's interpreter lock
    against the running study's steps. The study that asks for it later gets it, the same
    picks as ranked whole, without ranking again; where a worker was lost, it is ranked
    where it is asked."""
    from tuner.model.predict import device_spec
    from tuner.search import warmstart

    ranked_here = []
    real = warmstart.model_configs

    def spying(*args):
        ranked_here.append(args[2])
        return real(*args)
    monkeypatch.setattr(warmstart, "model_configs", spying)
    ranking = warmstart.ModelRanking(device_spec(H100), H100.smem_per_block, parts=2)
    shape, lost = Shape(512, 512, 512, "fp16", "nn"), Shape(64, 512, 512, "fp16", "nn")
    try:
        ranking.prefetch(KERNELS["mm"], SPACE, shape)
        picks = ranking.configs(KERNELS["mm"], SPACE, shape)
        assert not ranked_here
        for worker in ranking._workers:
            worker.close()
        monkeypatch.setattr(warmstart, "RANKING_TIMEOUT_S", 1e-3)  # lost at once
        ranking.prefetch(KERNELS["mm"], SPACE, lost)
        assert ranking.configs(KERNELS["mm"], SPACE, lost) and ranked_here == [lost]
    finally:
        ranking.close()
    assert picks == real(KERNELS["mm"], SPACE, shape, device_spec(H100), H100.smem_per_block)


def test_a_ranking_ahead_still_queued_when_its_study_asks_is_ranked_there(monkeypatch):
    """The workers rank one shape at a time: a study whose ranking ahead waits behind
    another's (one ranked for a study that did without it) ranks its own at once."""
    import threading

    from tuner.model.predict import device_spec
    from tuner.search import warmstart

    release, ranked_here = threading.Event(), []
    real = warmstart.model_configs
    monkeypatch.setattr(warmstart.ModelRanking, "_rank_in_workers",
                        lambda self, kernel, space, shape: release.wait(30) and [])
    monkeypatch.setattr(warmstart, "model_configs",
                        lambda *args: ranked_here.append(args[2]) or real(*args))
    ranking = warmstart.ModelRanking(device_spec(H100), H100.smem_per_block)
    busy, queued = Shape(512, 512, 512, "fp16", "nn"), Shape(64, 512, 512, "fp16", "nn")
    try:
        ranking.prefetch(KERNELS["mm"], SPACE, busy)
        behind = ranking.prefetch(KERNELS["mm"], SPACE, queued)
        assert ranking.configs(KERNELS["mm"], SPACE, queued) and ranked_here == [queued]
        assert behind.cancelled() and not release.is_set()
    finally:
        release.set()
        ranking.close()


@pytest.mark.slow
def test_closing_the_ranking_while_its_worker_ranks_ends_the_worker_once():
    """The job closes its ranking while the worker may be ranking for a study that never
    came: the ranking is killed, the worker closed on the ranking's own thread (closed from
    here as well, it was closed twice: 'Bad file descriptor' on an H100), and the job goes
    on."""
    from tuner.model.predict import device_spec
    from tuner.search import warmstart

    ranking = warmstart.ModelRanking(device_spec(H100), H100.smem_per_block, parts=2)
    running = ranking.prefetch(KERNELS["mm"], SPACE, Shape(512, 512, 512, "fp16", "nn"))
    queued = ranking.prefetch(KERNELS["mm"], SPACE, Shape(64, 512, 512, "fp16", "nn"))
    deadline = time.monotonic() + 60
    while not running.running() and time.monotonic() < deadline:
        time.sleep(0.01)
    ranking.close()
    ranking._ahead.shutdown(wait=True)
    assert queued.cancelled() and all(w.process is None for w in ranking._workers)


def test_a_trials_call_time_is_its_launch_modes_figure_with_that_figures_spread():
    trial = TrialResult("ok", None, 0.9, 1.0, 1.2, 1.0, 1e-3, None, "x", host_us=5.0,
                        loop_ms=2.0, loop_p20_ms=1.9, loop_p80_ms=2.3)
    assert call_time(trial, GRAPH) == CallTime(0.9, 1.0, 1.2)
    assert call_time(trial, EAGER) == CallTime(1.9, 2.0, 2.3)
    older = TrialResult("ok", None, 0.9, 1.0, 1.2, 1.0, 1e-3, None, "x", loop_ms=2.0)
    assert call_time(older, EAGER) == CallTime(2.0, 2.0, 2.0)  # stored before the spread
    assert call_time(TrialResult("wrong", "relative error 1"), GRAPH) is None


def test_a_short_measure_out_of_reach_of_the_best_is_stored_screened_never_ranked():
    """Within REACH of the best kernel, up to the noise of the two, a config earns the full
    measures; beyond, its short measure is stored as screened, which no ranking or finalist
    takes."""
    best = TrialResult("ok", None, 0.99, 1.0, 1.01, 1.0, 1e-3, None, "x", loop_ms=1.2)

    def short(ms):
        return TrialResult("ok", None, ms * 0.99, ms, ms * 1.01, 1.0, 1e-3, None, "short")
    assert screened(short(1.0 + REACH * 0.9), best) is None
    assert screened(short(0.5), best) is None
    assert screened(short(1.0 + REACH * 1.1), best) is None  # past REACH by less than noise
    far = screened(short(1.0 + REACH * 1.5), best)
    assert far.status == TrialStatus.SCREENED and "short measure" in far.reason
    assert screened(short(1.0 + REACH * 1.5), best, HOST_PACED_REACH) is None
    assert screened(short(1.0 + HOST_PACED_REACH * 1.3), best, HOST_PACED_REACH) is not None
    assert screened(TrialResult("wrong", "relative error 1"), best) is None
    assert ranked([far, best], GRAPH) == [best] and finalists([far], EAGER) == []


def test_finalists_are_re_timed_only_where_their_trials_leave_the_winner_open():
    """Another finalist within the noise between two trials of the fastest (CALL_NOISE per
    eager call, DEVICE_SLACK of device time) calls for a re-timing side by side; beyond it,
    or alone, the trials settle the winner."""
    def trial(device_ms, loop_ms):
        return TrialResult("ok", None, device_ms, device_ms, device_ms, 1.0, 1e-3, None, "x",
                           loop_ms=loop_ms)
    leader = trial(1.0, 1.0)
    tiles_only = lambda record: False  # noqa: E731
    assert not contested([], EAGER, tiles_only) and not contested([leader], GRAPH, tiles_only)
    near_call = trial(1.01, 1.0 + CALL_NOISE * 0.9)
    far_call = trial(1.01, 1.0 + CALL_NOISE * 1.1)
    assert contested(finalists([leader, near_call], EAGER), EAGER, tiles_only)
    assert not contested(finalists([leader, far_call], EAGER), EAGER, tiles_only)
    assert contested(finalists([leader, trial(1 + DEVICE_SLACK * 0.9, 9.0)], GRAPH), GRAPH,
                     tiles_only)
    far_kernel = trial(1 + DEVICE_SLACK * 1.1, 1.0)
    assert not contested(finalists([leader, far_kernel], GRAPH), GRAPH, tiles_only)
    # the same far kernel as the library call a tile leads: only pairs settle the lead
    assert contested([leader, far_kernel], GRAPH, lambda record: record is far_kernel)
    assert not contested([far_kernel, leader], GRAPH, lambda record: record is far_kernel)


def test_the_descent_measures_the_steps_the_model_predicts_fastest_first():
    from tuner.search.stopping import descent_order

    steps = [{"BLOCK_M": 64}, {"num_stages": 6}, {"num_stages": 4}, {"GROUP_M": 8}]
    predicted = {64: 3.0, 6: 1.0, 4: 2.0}
    predict = lambda c: predicted.get(c.get("BLOCK_M") or c.get("num_stages"), 2.0)  # noqa: E731
    assert descent_order(steps, predict) == [steps[1], steps[2], steps[3], steps[0]]
    assert descent_order(steps, None) == steps  # no model: the space's order


def deeper_ms(config) -> float:
    """One step pays: a deeper pipeline; every other step from the start tile costs."""
    if config["variant"] == "cublas":
        return 10.0
    return 0.7 if config["num_stages"] == 4 else 1.0 + 0.1 * (config["BLOCK_M"] != 64)


def test_a_single_polish_step_goes_where_the_model_predicts_the_gain(world):
    """The step that pays (num_stages) comes after BLOCK_M, N and K and GROUP_M in the
    space's order; the model predicts it fastest, so one polish step finds it."""
    start = {"variant": "general", "pad": 0, "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64,
             "GROUP_M": 1, "num_stages": 3, "num_warps": 4}
    bound = ModelBound(deeper_ms, deeper_ms({**start, "num_stages": 4}), frozenset({"cublas"}))
    runner, _ = world.runner(FormulaExecutor(deeper_ms), trials=2, space=WIDE, polish=1, batch=2,
                             warm_start=[CUBLAS, start], early_stop=True, bound=bound)
    outcome = runner.run()
    assert runner.polished == 1
    assert outcome.best.params == {**start, "num_stages": 4}
