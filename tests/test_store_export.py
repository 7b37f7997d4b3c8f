"""Database round trip, exports, and the runtime lookup reading back what was exported."""
import subprocess
import sys
import warnings

import pytest
import yaml
from click.testing import CliRunner
from sqlalchemy import text as sql

from tests.factories import H100, KERNEL_VARIANTS, VARIANTS
from tuner import runtime
from tuner.bucketing.strategies import bucket_key
from tuner.cli import main
from tuner.db.session import DatabaseError, session_factory
from tuner.db.store import Store
from tuner.devices import DeviceInfo
from tuner.execution.measure import TrialResult
from tuner.export import ExportError
from tuner.export.flaggems_ops import EXPAND_OP_NAMES, NO_EXPAND_OP
from tuner.export.op_lists import union_ops
from tuner.export.picks import (
    Pick,
    current_only,
    export_launch,
    select_device,
    study_trials,
    winner_picks,
)
from tuner.export.writers import table_document
from tuner.formats import flaggems
from tuner.formats.device import device_block
from tuner.formats.files import write_atomic
from tuner.kernels import KERNELS
from tuner.objective import EAGER, GRAPH, ranked
from tuner.shapes import Shape
from tuner.space import builtin_spaces, parse_space

SPACE = parse_space({
    "kernel": "mm",
    "params": {"variant": ["general", "splitk"], "pad": [0], "BLOCK_M": [32, 64, 128],
               "BLOCK_N": [64, 128], "BLOCK_K": [32, 64], "GROUP_M": [8], "num_stages": [2, 3],
               "num_warps": [4, 8], "SPLIT_K": [4, 8]},
    "strategy": {"M": "align32", "N": "align32", "K": "align32", "stride_am": "align32",
                 "stride_bk": "align32", "dtype": "default"}}, "test", VARIANTS)


def config(bm, bn, bk, stages=3, warps=8, variant="general", pad=0, **extra):
    return {"variant": variant, "pad": pad, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk,
            "GROUP_M": 8, "num_stages": stages, "num_warps": warps, **extra}


def expand_document(picks):
    """The unbounded expand YAML of the picks, as `tune suggest` writes it."""
    return flaggems.expand_document(union_ops(picks), for_both_readers=False)


def tune_fake(store, info, shape, results, kernel_hash="abc", launch=GRAPH):
    """Record a study of `shape` with the given (params, TrialResult) list, as the tuner would
    in the `launch` mode."""
    device = store.device(info)
    kernel = store.kernel("mm", kernel_hash)
    space = store.space(SPACE)
    run = store.start_run(device, "gpu", ["tune", "run"])
    key = dict(zip(("M", "N", "K", "stride_am", "stride_bk", "dtype"),
                   bucket_key(shape.key(), SPACE.strategy)))
    study = store.open_study(device, kernel, space, key, shape, seed=0, retune=False,
                             launch=launch)
    rows = [store.add_trial(study, run, i, params, **r.as_columns())
            for i, (params, r) in enumerate(results)]
    best = ranked(rows, launch)[0]  # as a study's final would, its trials left as they are
    store.finish_study(study, best, baseline_ms=0.2)
    store.finish_run(run, "finished")
    return device, kernel, space, key, best


def db_url(tmp_path):
    return f"sqlite:///{tmp_path / 'tune.db'}"


@pytest.fixture
def store(tmp_path):
    return Store(session_factory(db_url(tmp_path)))


def tune_cli(tmp_path, *args):
    return CliRunner().invoke(main, [*args, "--db", db_url(tmp_path)], catch_exceptions=False)


def ok(ms, tflops, loop_ms=None, host_us=None):
    return TrialResult("ok", None, ms * 0.99, ms, ms * 1.01, tflops, 1e-3, 1.5, "events",
                       host_us, loop_ms)


SQUARE = Shape(4096, 4096, 4096, "bf16", "nn")
DECODE = Shape(1, 6144, 4096, "bf16", "nt")
SMALL_M = Shape(16, 4096, 4096, "bf16", "nn")


def test_trials_and_winner_round_trip(store):
    results = [(config(128, 128, 64), ok(0.20, 690.0)),
               (config(256, 256, 64), TrialResult("infeasible", "shared memory: needs ...")),
               (config(64, 64, 32), ok(0.40, 345.0)),
               (config(32, 64, 32), TrialResult("wrong", "relative error 0.5 > 0.01",
                                                rel_error=0.5, compile_s=1.0))]
    device, kernel, space, key, best = tune_fake(store, H100, SQUARE, results)
    assert store.finished_study(device, kernel, space, key) is not None
    (winner,) = store.winners()
    assert winner.trial.params == config(128, 128, 64)
    assert winner.trial.p50_ms == pytest.approx(0.20)
    assert winner.device.name == H100.name and winner.kernel.source_hash == "abc"
    study = winner.study
    assert [t.status for t in store.open_study(device, kernel, space, key, SQUARE, 0,
                                               retune=True, launch=GRAPH).trials] == []
    with store.sessions() as s:
        from tuner.db.models import Trial
        statuses = sorted(t.status for t in s.query(Trial).filter_by(study_id=study.id))
    assert statuses == ["infeasible", "ok", "ok", "wrong"]


def test_a_later_study_replaces_the_winner(store):
    tune_fake(store, H100, SQUARE, [(config(64, 64, 32), ok(0.4, 345.0))])
    tune_fake(store, H100, SQUARE, [(config(128, 256, 64), ok(0.19, 720.0))])
    (winner,) = store.winners()
    assert winner.trial.params == config(128, 256, 64)


def test_unfinished_study_is_resumed_with_its_trials(store):
    device = store.device(H100)
    kernel, space = store.kernel("mm", "abc"), store.space(SPACE)
    run = store.start_run(device, "gpu", ["tune"])
    key = SQUARE.key()
    study = store.open_study(device, kernel, space, key, SQUARE, 0, retune=False, launch=EAGER)
    store.add_trial(study, run, 0, config(64, 64, 32), **ok(0.4, 345.0).as_columns())
    again = store.open_study(device, kernel, space, key, SQUARE, 0, retune=False, launch=EAGER)
    assert again.id == study.id and [t.params for t in again.trials] == [config(64, 64, 32)]
    assert store.finished_study(device, kernel, space, key) is None
    # the sampler of a study has learnt one figure: the other mode starts its own study
    graph = store.open_study(device, kernel, space, key, SQUARE, 0, retune=False, launch=GRAPH)
    assert graph.id != study.id and graph.trials == [] and graph.launch == GRAPH


def test_bad_database_urls_are_one_line_errors(tmp_path):
    with pytest.raises(DatabaseError, match="bad database URL 'nonsense'"):
        session_factory("nonsense")
    with pytest.raises(DatabaseError, match="driver not available"):
        session_factory("postgresql+nosuchdriver://u@localhost/db")
    with pytest.raises(DatabaseError, match="cannot open database"):
        session_factory(f"sqlite:///{tmp_path}/missing/dir/tune.db")


def test_export_both_formats_and_runtime_reads_the_winner(store, tmp_path, monkeypatch):
    tune_fake(store, H100, SQUARE, [(config(128, 256, 64), ok(0.19, 720.0)),
                                    (config(64, 64, 32), ok(0.4, 345.0))])
    tune_fake(store, H100, DECODE, [(config(32, 64, 128, 4, 4, pad=64), ok(0.02, 25.0))])
    tune_fake(store, H100, SMALL_M, [(config(16, 64, 64, 4, 4, "splitk", SPLIT_K=8),
                                      ok(0.01, 30.0))])
    device, winners = select_device(store.winners(), None)

    expand = expand_document(winner_picks(winners, GRAPH))
    assert set(expand) == {"mm_general_tma", "mm_splitk"}
    space, strategy = expand[EXPAND_OP_NAMES["general"]]
    assert space["config"] is None
    assert space["param_map"] == {"META": {"BLOCK_M": "block_m", "BLOCK_N": "block_n",
                                           "BLOCK_K": "block_k", "GROUP_M": "group_m"},
                                  "num_stages": "stages", "num_warps": "warps"}
    assert space["block_m"] == [32, 128] and space["stages"] == [3, 4] and space["warps"] == [4, 8]
    assert strategy == {"strategy": SPACE.strategy}
    splitk, _ = expand["mm_splitk"]
    assert splitk["param_map"]["META"]["SPLIT_K"] == "split_k" and splitk["split_k"] == [8]
    assert "pad" not in space and "variant" not in space  # FlagGems has neither

    path = tmp_path / "out" / "tuned.yaml"
    header = device_block(device, device.fingerprint)
    write_atomic(path, table_document(header, winner_picks(winners, GRAPH), {"mm": "abc"}, GRAPH))
    doc = yaml.safe_load(path.read_text())
    assert doc["device"]["name"] == H100.name and doc["device"]["triton"] == "3.6"
    (entry,) = [e for e in doc["ops"]["mm"]["entries"] if e["tuned_shape"].startswith("4096")]
    assert entry["cublas_ms"] == 0.2 and entry["tflops"] == 720.0
    assert entry["config"]["variant"] == "general" and entry["config"]["pad"] == 0
    assert list(tmp_path.joinpath("out").iterdir()) == [path]  # no temp file left

    runtime.clear_cache()
    monkeypatch.setenv("TUNE_CONFIG", str(path))
    got = runtime.get_tuned_config("mm", M=4096, N=4096, K=4096, dtype="bf16",
                                   stride_am=4096, stride_bk=4096)
    assert dict(got) == config(128, 256, 64)
    # same bucket under align32: 4090 -> 4096
    assert runtime.get_tuned_config("mm", M=4090, N=4096, K=4096, dtype="bf16",
                                    stride_am=4096, stride_bk=4096) is got
    assert dict(runtime.get_tuned_config("mm", M=1, N=6144, K=4096, dtype="bf16", stride_am=4096,
                                         stride_bk=1)) == config(32, 64, 128, 4, 4, pad=64)


def test_a_table_entry_carries_the_fastest_other_tile_its_study_measured(store, tmp_path):
    """Alternates are for the nearest fallback: another tile (a pipeline variant of the
    winner's tile is no alternative), measured and correct (failed trials are not), with its
    kernel time (what calibrates the fallback's model)."""
    failed = TrialResult("wrong", "max error 3.1", 0.1, 0.1, 0.1, 1400.0, 3.1, 1.5, "events")
    tune_fake(store, H100, SQUARE, [(config(128, 256, 64), ok(0.19, 720.0)),
                                    (config(128, 256, 64, stages=4), ok(0.195, 700.0)),
                                    (config(64, 128, 64), failed),
                                    (config(128, 128, 64), ok(0.3, 450.0)),
                                    (config(128, 128, 32), ok(0.25, 550.0))])
    tune_fake(store, H100, DECODE, [(config(32, 64, 128, 4, 4), ok(0.02, 25.0))])
    device, winners = select_device(store.winners(), None)
    kernel = winners[0].kernel
    picks = winner_picks(winners, GRAPH, study_trials(store, device, kernel))
    assert {p.provenance["tuned_shape"]: p.alternates for p in picks} == {
        str(SQUARE): [config(128, 128, 32)], str(DECODE): []}
    path = tmp_path / "tuned.yaml"
    header = device_block(device, device.fingerprint)
    write_atomic(path, table_document(header, picks, {"mm": "abc"}, GRAPH))
    entries = yaml.safe_load(path.read_text())["ops"]["mm"]["entries"]
    assert [e.get("alternates") for e in entries] == [None, [config(128, 128, 32)]]  # by key
    assert [e.get("alternates_ms") for e in entries] == [None, [0.25]]
    assert winner_picks(winners, GRAPH)[0].alternates == []  # no trials given: none


def test_a_key_cublas_won_by_far_carries_its_fastest_screened_tile(store):
    """Screening left every tile with its short device measure alone: the fastest of them is
    still the alternate, what a deployment without cuBLAS runs for the key."""
    cublas = {"variant": "cublas", "pad": 0}
    screened = [TrialResult("screened", None, ms * 0.99, ms, ms * 1.01, 0.0, 1e-3, 1.5, "events")
                for ms in (0.9, 0.6)]
    tune_fake(store, H100, SQUARE, [(cublas, ok(0.19, 720.0)),
                                    (config(64, 64, 32), screened[0]),
                                    (config(128, 128, 64), screened[1])])
    device, winners = select_device(store.winners(), None)
    (pick,) = winner_picks(winners, GRAPH, study_trials(store, device, winners[0].kernel))
    assert pick.config == cublas and pick.alternates == [config(128, 128, 64)]
    assert pick.provenance["alternates_ms"] == [0.6]


def test_expand_refuses_one_op_under_two_strategies_and_names_them():
    exact_n = SPACE.strategy | {"N": "default"}
    picks = [Pick("mm", {}, config(64, 64, 32, variant="splitk", SPLIT_K=4), SPACE.strategy, {}),
             Pick("gemv", {}, config(16, 64, 32, variant="splitk", SPLIT_K=8), exact_n, {})]
    with pytest.raises(ExportError, match=r"mm_splitk .*kernels gemv, mm.*differ in N"):
        expand_document(picks)


def test_builtin_spaces_share_a_strategy_wherever_they_share_an_expand_op():
    """The shipped mm and gemv spaces both hold general and splitk configs, which export to
    the same FlagGems ops; a strategy that differed would make every such export fail."""
    spaces = builtin_spaces(KERNEL_VARIANTS)
    by_op = {}
    for space in spaces.values():
        for variant in space.params["variant"]:
            assert (variant in EXPAND_OP_NAMES) != (variant in NO_EXPAND_OP)
            if variant in EXPAND_OP_NAMES:
                by_op.setdefault(EXPAND_OP_NAMES[variant], []).append(space.strategy)
    assert all(s == strategies[0] for strategies in by_op.values() for s in strategies)


def test_runtime_miss_warns_once_per_key(tmp_path):
    runtime.clear_cache()
    path = tmp_path / "t.yaml"
    write_atomic(path, {"format": runtime.TABLE_FORMAT, "ops": {}})
    kwargs = dict(M=100, N=200, K=300, dtype="fp16", stride_am=300, stride_bk=200, path=path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = runtime.get_tuned_config("mm", **kwargs)
        runtime.get_tuned_config("mm", **kwargs)
        runtime.get_tuned_config("mm", **(kwargs | {"M": 101}))
    assert first == runtime.CUBLAS_CONFIG and first.source == "cublas"  # nothing tuned: cuBLAS
    assert len(caught) == 2 and "no tuned mm config" in str(caught[0].message)


def test_runtime_rejects_a_file_that_is_not_a_table(tmp_path):
    runtime.clear_cache()
    path = tmp_path / "expand.yaml"
    path.write_text("mm_general_tma: []\n")
    with pytest.raises(ValueError, match=f"not a '{runtime.TABLE_FORMAT}' file"):
        runtime.get_tuned_config("mm", M=1, N=2, K=3, dtype="fp16", stride_am=3, stride_bk=2,
                                 path=path)


def test_device_selection_and_stale_winners(store):
    tune_fake(store, H100, SQUARE, [(config(64, 64, 32), ok(0.4, 345.0))])
    h200 = DeviceInfo("NVIDIA H200", "9.0", 132, 232448, "580.1", "13.0", "2.11", "3.6")
    tune_fake(store, h200, SQUARE, [(config(64, 64, 32), ok(0.3, 400.0))], kernel_hash="old")
    winners = store.winners()
    with pytest.raises(ExportError, match="winners from 2 devices"):
        select_device(winners, None)
    device, chosen = select_device(winners, "h200")
    assert device.name == "NVIDIA H200" and len(chosen) == 1
    current, stale = current_only(winners, {"mm": "abc"})
    assert stale == 1 and current[0].device.name == H100.name
    with pytest.raises(ExportError, match="no winners in the database for device 'a100'"):
        select_device(winners, "a100")
    # `tune export --device` and `tune show --device` mean the same devices, in either case
    for selector in ("h200", "NVIDIA H200", h200.fingerprint[:6].upper()):
        assert select_device(winners, selector)[0].fingerprint == h200.fingerprint
        assert [d.fingerprint for d in store.devices_matching(selector)] == [h200.fingerprint]


def test_runtime_imports_neither_optuna_nor_sqlalchemy():
    code = ("import sys, tuner.runtime; "
            "print(sorted(m for m in ('optuna', 'sqlalchemy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_warm_start_takes_the_nearest_winners_the_space_holds(store):
    from tuner.search.warmstart import in_space, nearest_winner_configs
    device, kernel, *_ = tune_fake(store, H100, SQUARE, [(config(128, 128, 64), ok(0.2, 690.0))])
    tune_fake(store, H100, SMALL_M, [(config(32, 64, 64, 3, 4), ok(0.02, 25.0))])
    tune_fake(store, H100, DECODE, [(config(64, 64, 32, pad=64), ok(0.02, 25.0))])  # pad 64:
    # not in SPACE (pad [0]), so never proposed to a study of that space
    near_square = Shape(4096, 6144, 4096, "bf16", "nn")
    configs = nearest_winner_configs(store, device, kernel, SPACE, near_square)
    assert configs == [config(128, 128, 64), config(32, 64, 64, 3, 4)]
    assert all(in_space(c, SPACE) for c in configs)
    assert nearest_winner_configs(store, device, kernel, SPACE,
                                  Shape(16, 4096, 4096, "fp16", "nn")) == []  # other dtype
    assert nearest_winner_configs(store, device, kernel, SPACE, near_square, count=1) == \
        [config(128, 128, 64)]


# The same stored study seen in both launch modes: the fastest kernel has a slow host path
# (0.19 ms on the device, 0.5 ms per eager call); another config calls cheaply.
# The cheapest call has a kernel too slow to win eager (objective.DEVICE_SLACK): tune_fake
# stores it as the eager winner all the same, as a study from before that rule did.
FAST_KERNEL, CHEAP_CALL, SLOW_KERNEL = config(128, 256, 64), config(64, 128, 64), \
    config(32, 64, 64)
BOTH_MODES = [(FAST_KERNEL, ok(0.19, 720.0, loop_ms=0.5, host_us=480.0)),
              (CHEAP_CALL, ok(0.195, 700.0, loop_ms=0.26, host_us=20.0)),
              (SLOW_KERNEL, ok(0.25, 550.0, loop_ms=0.2, host_us=15.0))]


def exported(tmp_path, *flags):
    """The mm entry of a `tune export` table written with these flags, and the table."""
    path = tmp_path / "tuned.yaml"
    result = tune_cli(tmp_path, "export", "table", "-o", str(path), *flags)
    assert result.exit_code == 0, result.output
    doc = yaml.safe_load(path.read_text())
    (entry,) = doc["ops"]["mm"]["entries"]
    return entry, doc


def test_export_launch_picks_each_modes_winner_from_the_stored_trials(store, tmp_path,
                                                                      monkeypatch):
    tune_fake(store, H100, SQUARE, BOTH_MODES, KERNELS["mm"].source_hash, launch=EAGER)
    entry, doc = exported(tmp_path)  # the run's mode
    assert doc["launch"] == EAGER and entry["config"] == CHEAP_CALL
    assert (entry["loop_ms"], entry["host_us"]) == (0.26, 20.0)
    entry, doc = exported(tmp_path, "--launch", "graph")
    assert doc["launch"] == GRAPH and entry["config"] == FAST_KERNEL
    assert (entry["ms"], entry["loop_ms"]) == (0.19, 0.5)
    runtime.clear_cache()  # the runtime reads a table with its launch mode as before
    monkeypatch.setenv("TUNE_CONFIG", str(tmp_path / "tuned.yaml"))
    assert dict(runtime.get_tuned_config("mm", M=4096, N=4096, K=4096, dtype="bf16",
                                         stride_am=4096, stride_bk=4096)) == FAST_KERNEL
    bad = tune_cli(tmp_path, "export", "table", "-o", str(tmp_path / "x.yaml"), "--launch", "cuda")
    assert bad.exit_code == 2 and "'cuda' is not one of 'eager', 'graph'" in bad.output


def test_export_defaults_to_the_runs_mode_and_refuses_a_mix(store):
    tune_fake(store, H100, SQUARE, BOTH_MODES, launch=GRAPH)
    assert export_launch(None, store.winners()) == GRAPH
    assert export_launch(EAGER, store.winners()) == EAGER
    tune_fake(store, H100, SMALL_M, BOTH_MODES, launch=EAGER)
    with pytest.raises(ExportError, match="launch modes eager, graph; choose one with --launch"):
        export_launch(None, store.winners())


def test_a_database_from_before_the_call_figures_opens_and_exports_device_time(store,
                                                                               tmp_path):
    """Its tables lack host_us, loop_ms and launch: opening adds them, NULL. Its studies
    optimised device time, so export defaults to graph; eager, which those trials never
    measured, is refused with a line saying what to do."""
    tune_fake(store, H100, SQUARE, BOTH_MODES, KERNELS["mm"].source_hash)
    with store.sessions() as s:
        for table, column in [("tuner_trials", "host_us"), ("tuner_trials", "loop_ms"),
                              ("tuner_studies", "launch")]:
            s.execute(sql(f"ALTER TABLE {table} DROP COLUMN {column}"))
        s.execute(sql("DROP TABLE tuner_alembic_version"))  # unversioned, as databases were
        s.commit()
    (winner,) = Store(session_factory(db_url(tmp_path))).winners()
    assert winner.study.launch is None and winner.trial.loop_ms is None
    refused = tune_cli(tmp_path, "export", "table", "--launch", "eager", "-o",
                       str(tmp_path / "x.yaml"))
    assert refused.exit_code == 1 and "no loop_ms figure" in refused.output
    assert "--launch graph" in refused.output
    entry, doc = exported(tmp_path)
    assert doc["launch"] == GRAPH and entry["config"] == FAST_KERNEL


def test_expand_leaves_cublas_out_and_show_marks_it(store, tmp_path, monkeypatch):
    cublas = {"variant": "cublas", "pad": 0}
    tune_fake(store, H100, SQUARE, [(cublas, ok(0.18, 760.0, loop_ms=0.19, host_us=6.5))],
              KERNELS["mm"].source_hash)
    tune_fake(store, H100, SMALL_M, BOTH_MODES, KERNELS["mm"].source_hash)
    path = tmp_path / "expand.yaml"
    assert tune_cli(tmp_path, "export", "expand", "-o", str(path)).exit_code == 0
    written = path.read_text()
    assert (
        "# left out: mm M=4096 N=4096 K=4096 stride_am=4096 stride_bk=4096 dtype=bf16, won by "
        f"cublas ({NO_EXPAND_OP['cublas']}): FlagGems has no such op") in written.splitlines()
    assert list(yaml.safe_load(written)) == ["mm_general_tma", "matmul"]
    monkeypatch.setenv("COLUMNS", "200")  # rich's table: no wrapped cells
    shown = tune_cli(tmp_path, "show")
    assert shown.exit_code == 0 and "host µs" in shown.output
    (cublas_row,) = [line for line in shown.output.splitlines() if "4096x4096x4096" in line]
    assert {"cublas", "6.5"} <= set(cublas_row.split())


def test_export_merges_a_runtime_online_cache_the_database_wins_its_buckets(store, tmp_path):
    """`tune export table --merge CACHE`: what deployments tuned online
    (tuner.runtime.online) flows back into the table for buckets the database lacks."""
    from tuner.runtime import online

    tune_fake(store, H100, SQUARE, BOTH_MODES, KERNELS["mm"].source_hash, launch=EAGER)
    cache = tmp_path / "mm_hopper_expand.online.yaml"
    strategy = SPACE.strategy
    for M, tile in ((4096, config(16, 16, 16)), (512, config(32, 32, 32))):
        online.remember(cache, {"name": H100.name}, EAGER, "mm", strategy,
                        KERNELS["mm"].source_hash,
                        {"key": SQUARE.key() | {"M": M}, "config": tile, "source": "online"})
    path = tmp_path / "tuned.yaml"
    result = tune_cli(tmp_path, "export", "table", "-o", str(path), "--merge", str(cache))
    assert result.exit_code == 0, result.output
    assert "merge: added 1 mm entries, 1 already held" in result.output
    entries = yaml.safe_load(path.read_text())["ops"]["mm"]["entries"]
    assert [(e["key"]["M"], e["config"]) for e in entries] == [
        (512, config(32, 32, 32)), (4096, CHEAP_CALL)]
    refused = tune_cli(tmp_path, "export", "expand", "-o", str(tmp_path / "e.yaml"),
                       "--merge", str(cache))
    assert refused.exit_code != 0 and "--merge" in refused.output


@pytest.mark.parametrize("text, words", [
    ("format: gemm-tuner-table/2\nops: [mm]\n", "field 'ops': expected a mapping of op to its "
                                                "strategy and entries, got ['mm']"),
    ("[1, 2]\n", "not a 'gemm-tuner-table/2' file (write one with `tune export table`)"),
], ids=["list-ops", "not-a-table"])
def test_export_refuses_a_merge_file_that_is_not_a_table_in_one_line(store, tmp_path, text,
                                                                      words):
    tune_fake(store, H100, SQUARE, BOTH_MODES, KERNELS["mm"].source_hash, launch=EAGER)
    (tmp_path / "merge.yaml").write_text(text)
    result = tune_cli(tmp_path, "export", "table", "-o", str(tmp_path / "out.yaml"),
                      "--merge", str(tmp_path / "merge.yaml"))
    assert result.exit_code == 1 and result.output.strip().splitlines()[-1] == (
        f"Error: gemm-tuner table {tmp_path / 'merge.yaml'}: {words}")
    assert not (tmp_path / "out.yaml").exists()
