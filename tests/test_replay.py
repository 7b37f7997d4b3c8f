"""Replaying search strategies on recorded timings: real Optuna studies over a lookup table."""
import gzip
import json
from pathlib import Path

import pytest

from tests.factories import H100
from tests.test_search import ScriptedExecutor, speed
from tuner.kernels import KERNELS
from tuner.kernels.calls import meta_gemm
from tuner.model import predict as model
from tuner.model.named_devices import named_spec
from tuner.search.budget import DEFAULT_SAMPLER
from tuner.search.replay import (
    STRATEGIES,
    Recording,
    ReplayError,
    ShapeRecording,
    compare,
    median_curve,
    recording_from_store,
    replay,
)
from tuner.search.replay_report import (
    curves_table,
    geomean,
    meets_goal,
    model_pick_among,
    model_pick_ratios,
    model_quality_table,
)
from tuner.shapes import Shape
from tuner.space import config_signature, parse_space

SPACE = parse_space({
    "kernel": "mm",
    "params": {"variant": ["general", "splitk"], "pad": [0], "BLOCK_M": [16, 32, 64, 128],
               "BLOCK_N": [32, 64, 128], "BLOCK_K": [32, 64], "GROUP_M": [8],
               "num_stages": [2, 3], "num_warps": [4, 8], "SPLIT_K": [2, 4]},
    "strategy": {f: "default" for f in ("M", "N", "K", "stride_am", "stride_bk", "dtype")}},
    "test", {"mm": KERNELS["mm"].variant_params})


def synthetic(shape: Shape, space=SPACE) -> ShapeRecording:
    """A 'recording' whose timings are the model's predictions (made up, but not trivially
    ordered): enough to exercise every strategy without a GPU."""
    kernel, spec, gemm = KERNELS["mm"], model.device_spec(H100), meta_gemm(shape)
    space = space.for_call(gemm)
    tflops = {config_signature(c): shape.flops / model.predict_ms(shape, c, spec) / 1e9
              for c in kernel.feasible_configs(space, gemm, H100.smem_per_block)}
    return ShapeRecording(shape, "mm", space, tflops)


RECORDING = Recording(H100, (synthetic(Shape(2048, 2048, 2048, "bf16", "nn")),
                             synthetic(Shape(32, 4096, 4096, "bf16", "nt"))))


def test_a_replay_measures_distinct_configs_and_is_seeded():
    recording = RECORDING.shapes[0]
    curve = replay(recording, STRATEGIES["tpe"], seed=1, trials=30, in_flight=4)
    assert len(curve) == 30 and 0 < curve[0] <= curve[-1] <= 1
    assert curve == sorted(curve)
    assert replay(recording, STRATEGIES["tpe"], 1, 30, 4) == curve
    assert replay(recording, STRATEGIES["tpe"], 2, 30, 4) != curve


def test_a_replay_stops_when_the_space_is_spent_having_found_the_best():
    eight = SPACE.narrowed(variant=("general",), BLOCK_M=(64,), num_warps=(4,), BLOCK_N=(64, 128))
    recording = synthetic(Shape(2048, 2048, 2048, "bf16", "nn"), eight)
    assert len(recording.tflops) == 8
    curve = replay(recording, STRATEGIES["random"], seed=0, trials=20, in_flight=3)
    assert len(curve) == 8 and curve[-1] == 1.0


def test_model_strategies_start_from_the_models_ranking():
    recording = RECORDING.shapes[1]
    curves = compare(Recording(H100, (recording,)), [STRATEGIES["model"],
                                                      STRATEGIES["model+tpe"]],
                     seeds=2, trials=8, in_flight=4, jobs=1)
    assert len(curves["model"]) == 1 and len(curves["model+tpe"]) == 2
    (first,) = [c for _, c in model.rank_configs(recording.shape, recording.space,
                                                 KERNELS["mm"], model.device_spec(H100),
                                                 H100.smem_per_block, k=1)]
    expected = recording.tflops[config_signature(first)] / recording.best
    assert curves["model"][0][0] == expected == curves["model+tpe"][0][0]


@pytest.mark.slow
def test_comparison_tables_and_the_goal():
    curves = compare(RECORDING, [STRATEGIES["random"], STRATEGIES["model+tpe"]], seeds=3,
                     trials=40, in_flight=8, jobs=2)
    assert {name: len(runs) for name, runs in curves.items()} == {"random": 6, "model+tpe": 6}
    median = median_curve(curves["model+tpe"], 40)
    assert median == sorted(median) and median[-1] <= 1.0
    table = curves_table(curves, 40)
    assert table.count("\n") == 3 and "| model+tpe | 6 |" in table
    assert meets_goal([1.0] * 32) and not meets_goal([0.96] * 32)
    assert "geomean model pick / best" in model_quality_table(RECORDING)


def test_a_recording_round_trips_and_a_bad_file_is_one_clear_error(tmp_path):
    path = tmp_path / "recording.json.gz"
    RECORDING.save(path)
    loaded = Recording.load(path)
    assert loaded.device == RECORDING.device
    for back, original in zip(loaded.shapes, RECORDING.shapes, strict=True):
        assert (back.shape, back.kernel, back.tflops) == (original.shape, original.kernel,
                                                           original.tflops)
        assert back.space.hash == original.space.hash
    (tmp_path / "bad.json.gz").write_text("not gzip")
    with pytest.raises(ReplayError, match="bad.json.gz: not a gemm-tuner recording"):
        Recording.load(tmp_path / "bad.json.gz")


@pytest.mark.slow
def test_an_exhaustive_study_measures_every_feasible_config_and_becomes_a_recording(world):
    executor = ScriptedExecutor()
    runner, record = world.runner(executor, trials=3, exhaustive=True)
    outcome = runner.run()
    world.store.finish_study(record, outcome.best, None, final=outcome.final)
    partial, again = world.runner(ScriptedExecutor(), trials=3, retune=True)
    world.store.finish_study(again, partial.run().best, None)
    recording, skipped = recording_from_store(world.store, world.device)
    assert len(recording.shapes) == 1 and len(skipped) == 1 and "3 of 24" in skipped[0]
    measured = recording.shapes[0].tflops
    assert len(measured) == len(executor.compiled) == runner.budget.trials == 24
    assert recording.shapes[0].best == max(speed(dict(c)) for c, tf in measured.items() if tf)


def test_tune_replay_prints_the_curves_and_names_bad_input(tmp_path):
    from click.testing import CliRunner

    from tuner.cli import main
    path = tmp_path / "recording.json.gz"
    RECORDING.save(path)
    cli = CliRunner()
    result = cli.invoke(main, ["replay", "--recording", str(path), "--strategies",
                               "random,model+tpe", "--seeds", "2", "--trials", "12",
                               "--jobs", "1"])
    assert result.exit_code == 0, result.output
    assert "| model+tpe | 4 |" in result.output and "geomean model pick" in result.output
    result = cli.invoke(main, ["replay", "--recording", str(path), "--strategies", "cmaes"])
    assert result.exit_code == 2 and "unknown strategy 'cmaes'" in result.output


def test_the_cli_offers_exactly_the_samplers_there_are():
    from tuner.cli import run
    from tuner.search.samplers import SAMPLERS
    (option,) = [p for p in run.params if p.name == "sampler"]
    assert list(option.type.choices) == list(SAMPLERS)


# The exhaustive H200 recording committed for CI (tests/data/README.md says how it was taken),
# and the seeds replayed here: the committed curves use 20; 8 keep the median stable and the
# test under a minute on CI's two cores.
RECORDED_H200 = Path(__file__).resolve().parent / "data/recording-h200.json.gz"
CI_SEEDS = 8


@pytest.mark.slow
def test_the_default_strategy_meets_the_goal_on_the_recorded_h200_timings():
    """`tune run`'s default (the model's warm start, then the default sampler) reaches the
    issue's goal on real timings: median >= 95% of the exhaustive best within 12 measured
    configs and >= 98% within 32, over 12+ shapes."""
    recording = Recording.load(RECORDED_H200)
    assert len(recording.shapes) >= 12
    default = STRATEGIES[f"model+{DEFAULT_SAMPLER}"]
    curves = compare(recording, [default], seeds=CI_SEEDS, trials=32, in_flight=16, jobs=2)
    assert len(curves[default.name]) == CI_SEEDS * len(recording.shapes)
    assert meets_goal(median_curve(curves[default.name], 32))


def test_the_model_alone_reaches_90_percent_of_the_recorded_best():
    rows = model_pick_ratios(Recording.load(RECORDED_H200))
    assert geomean([picked / best for _, best, picked in rows]) >= 0.90


# Every measured trial of 52 studies of the shapes-dev and hold-out tunes, committed for CI
# (tests/data/README.md): issue 6's first H200 tune, and the H100 tunes of 2026-11-26.
STUDIES = {"studies-h200.json.gz": "H200 SXM", "studies-h100.json.gz": "H100 SXM"}


@pytest.mark.parametrize("name", STUDIES)
def test_the_model_picks_well_among_the_configs_studies_measured(name):
    """Among each study's measured configs the model's pick reaches 0.970 of the best
    (geomean) on the H200's and 0.960 on the H100's; taking the larger of the tensor cores'
    time and the load wait rather than their rounded maximum (STEP_OVERLAP_NORM), 0.939 and
    0.885."""
    with gzip.open(RECORDED_H200.parent / name, "rt") as f:
        doc = json.load(f)
    spec = named_spec(doc["device"])
    assert spec.name == STUDIES[name] and len(doc["studies"]) == 52
    ratios = [model_pick_among(Shape.from_label(s["shape"]), s["trials"], spec)
              for s in doc["studies"]]
    assert geomean(ratios) >= 0.95
