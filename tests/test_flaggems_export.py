"""FlagGems' files: the bounded expand YAML (tuner.export.narrowing bounding its lists), read
back the way both FlagGems loaders read it, its header and the CPU refusal, tune_configs.yaml,
and the same files from a table file instead of a database."""
import itertools
import math
import random

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.factories import H100, examples
from tests.test_store_export import (
    DECODE,
    SMALL_M,
    SQUARE,
    config,
    db_url,
    ok,
    tune_fake,
)
from tuner.cli import main
from tuner.db.session import session_factory
from tuner.db.store import Store
from tuner.devices import DeviceInfo
from tuner.export.cases import Tuned, case_for
from tuner.export.narrowing import Case, narrow
from tuner.export.writers import FlagGemsOptions, expand_from_table
from tuner.kernels import KERNELS
from tuner.model.named_devices import named_spec
from tuner.model.predict import predict_ms
from tuner.reporting import Silent
from tuner.shapes import Shape

CPU = DeviceInfo("cpu-interpreter", "none", 8, 0, "none", "none", "2.11", "3.6")
MM_HASH = KERNELS["mm"].source_hash


# -- the product bound, on random winner sets ------------------------------------------------
@st.composite
def winner_sets(draw):
    n_params = draw(st.integers(1, 5))
    values = [draw(st.lists(st.sampled_from([16, 32, 64, 128, 256]), min_size=1, max_size=4,
                            unique=True)) for _ in range(n_params)]
    winners = draw(st.lists(st.tuples(*[st.sampled_from(v) for v in values]), min_size=1,
                            max_size=8))
    seed = draw(st.integers(0, 2**16))
    return [f"p{i}" for i in range(n_params)], winners, seed


def random_cases(winners, seed):
    cases = []
    for i, winner in enumerate(winners):
        rng_seed = (seed, i)

        def time(values, winner=winner, rng_seed=rng_seed):
            if values == winner:
                return 1.0
            return 1.0 + random.Random(str((rng_seed, values))).random()
        cases.append(Case(f"shape{i}", winner, 1.0, time, weight=1.0 + i % 3))
    return cases


@settings(max_examples=examples(60), deadline=None)
@given(winner_sets(), st.integers(0, 40))
def test_the_product_never_exceeds_the_bound(drawn, max_configs):
    params, winners, seed = drawn
    result = narrow(params, random_cases(winners, seed), max_configs)
    union = {p: sorted({w[i] for w in winners}) for i, p in enumerate(params)}
    assert result.union == union
    if max_configs == 0:
        assert result.lists == union
    else:
        assert result.product <= max_configs
    assert all(result.lists[p] and set(result.lists[p]) <= set(union[p]) for p in params)
    assert all(o.regret >= 0 for o in result.outcomes.values())
    if max_configs == 0 or math.prod(map(len, union.values())) <= max_configs:
        assert result.lists == union and result.max_regret == 0
    # each shape's answer is inside the product, at the regret stated
    for case in random_cases(winners, seed):
        outcome = result.outcomes[case.label]
        assert all(v in result.lists[p] for p, v in zip(params, outcome.replacement))
        assert outcome.regret == pytest.approx(case.time(outcome.replacement) - 1.0)


def test_the_narrowing_keeps_what_costs_most_to_lose():
    """Two shapes want BLOCK_M 64 and 128 and lose 50% without theirs; the others barely
    care: a bound of 2 keeps both tiles and one of everything else."""
    params = ("BLOCK_M", "num_warps")
    costs = {(64, 4): {(64, 4): 1.0, (64, 8): 1.01, (128, 4): 1.5, (128, 8): 1.5},
             (128, 8): {(128, 8): 1.0, (128, 4): 1.01, (64, 4): 1.5, (64, 8): 1.5}}
    cases = [Case(str(w), w, 1.0, costs[w].__getitem__) for w in costs]
    result = narrow(params, cases, 2)
    assert result.lists["BLOCK_M"] == [64, 128] and len(result.lists["num_warps"]) == 1
    assert result.max_regret == pytest.approx(0.01)
    assert result.geomean_regret == pytest.approx(math.sqrt(1.01) - 1)


def test_an_unmeasured_config_is_the_models_prediction_scaled_to_the_winner():
    spec = named_spec("NVIDIA H100")
    shape = Shape(4096, 4096, 4096, "bf16", "nn")
    winner, other, slow = config(128, 128, 64), config(128, 256, 64), config(32, 32, 32)
    params = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_stages", "num_warps")
    case = case_for(params, Tuned(shape, "mm", winner, 0.5, ((other, 0.45),)), spec)
    values = lambda c: tuple(c[p] for p in params)  # noqa: E731
    assert case.time(values(winner)) == 0.5 and case.time(values(other)) == 0.45
    assert case.measured(values(other)) and not case.measured(values(slow))
    scaled = predict_ms(shape, slow, spec) / predict_ms(shape, winner, spec) * 0.5
    assert case.time(values(slow)) == pytest.approx(max(scaled, 0.5))
    assert case.time(values(config(256, 256, 128, stages=6))) == math.inf  # shared memory


# -- files as both FlagGems loaders read them ----------------------------------------------------
def flaggems_5_expand_configs(doc, op):
    """FlagGems 5.0.2's ConfigLoader.get_expand_config, from its behaviour: the op's first
    list element holds the value lists and a param_map (META: kernel name -> list name;
    num_stages, num_warps -> list names); every combination of the named lists is a
    config."""
    space = doc[op][0]
    param_map = space["param_map"]
    meta = param_map["META"]
    names = [*meta.items(), *((k, v) for k, v in param_map.items() if k != "META")]
    configs = []
    for combo in itertools.product(*(space[list_name] for _, list_name in names)):
        chosen = dict(zip([k for k, _ in names], combo))
        configs.append({"META": {k: chosen[k] for k in meta},
                        **{k: chosen[k] for k in ("num_stages", "num_warps") if k in chosen}})
    strategy = next(e["strategy"] for e in doc[op] if "strategy" in e)
    return configs, strategy


def reference_expand_config(doc, op):
    """The reference Hopper mm.py's get_expand_config (shared/reference/flaggems_hopper_mm.md):
    -1 on any failure, else its ranges and strategy; its configs are the product of the
    ranges."""
    defaults = {"matmul": ["align32"] * 5 + ["default"], "gemv": ["align32"] * 3 + ["default"]}
    key_orders = {"matmul": ["M", "N", "K", "stride_am", "stride_bk", "dtype"],
                  "gemv": ["M", "K", "stride_am", "stride_bk"]}
    meta_maps = {"matmul": {"BM": "BLOCK_M", "BN": "BLOCK_N", "BK": "BLOCK_K"},
                 "gemv": {"BM": "BLOCK_M", "BK": "BLOCK_K"}}
    try:
        gen = strategy_config = None
        for single in doc.get(op):
            if isinstance(single, dict) and "param_map" in single:
                gen = single
            if isinstance(single, dict) and "strategy" in single:
                strategy_config = single["strategy"]
        param_map = gen["param_map"]
        strategy = [strategy_config.get(k, defaults[op][i])
                    for i, k in enumerate(key_orders[op])]
        ranges = {r: gen[param_map["META"][m]] for r, m in meta_maps[op].items()}
        ranges["s"], ranges["w"] = gen[param_map["num_stages"]], gen[param_map["num_warps"]]
    except Exception:
        return -1
    return {"ranges": ranges, "strategy": strategy,
            "configs": list(itertools.product(*ranges.values()))}


def tune(tmp_path, *args):
    return CliRunner().invoke(main, [*args, "--db", db_url(tmp_path)], catch_exceptions=False)


@pytest.fixture
def store(tmp_path):
    return Store(session_factory(db_url(tmp_path)))


def tune_several(store, info=H100):
    """Six mm shapes with trials: four won by general tiles, one by split-K, one by cuBLAS."""
    rng = random.Random(0)
    for shape in (SQUARE, Shape(2048, 4096, 1024, "bf16", "nt"),
                  Shape(512, 14336, 4096, "bf16", "nt"), Shape(8192, 1024, 8192, "bf16", "nn")):
        trials = [(config(bm, bn, bk, s, w), ok(rng.uniform(0.2, 0.6), 500.0))
                  for bm, bn, bk, s, w in [(rng.choice([64, 128, 256]), rng.choice([64, 128, 256]),
                                            rng.choice([32, 64]), rng.choice([3, 4]),
                                            rng.choice([4, 8])) for _ in range(8)]]
        tune_fake(store, info, shape, trials, MM_HASH)
    tune_fake(store, info, SMALL_M, [(config(16, 64, 64, 4, 4, "splitk", SPLIT_K=8),
                                      ok(0.01, 30.0))], MM_HASH)
    tune_fake(store, info, DECODE, [({"variant": "cublas", "pad": 0}, ok(0.02, 25.0))], MM_HASH)


def test_the_expand_file_is_bounded_for_both_loaders_and_says_where_it_came_from(store, tmp_path):
    tune_several(store)
    winners = {str(w.study.shape): w.trial.params for w in store.winners()}
    path = tmp_path / "mm_hopper_expand.yaml"
    result = tune(tmp_path, "export", "expand", "--max-configs", "4", "-o", str(path))
    assert result.exit_code == 0, result.output
    assert "mm_general_tma: 4 configs" in result.output and "geomean" in result.output
    text = path.read_text()
    doc = yaml.safe_load(text)
    assert set(doc) == {"mm_general_tma", "matmul"}  # no mm_splitk unless asked
    configs, strategy = flaggems_5_expand_configs(doc, "mm_general_tma")
    assert 1 <= len(configs) <= 4 and strategy["M"] == "align32"
    reference = reference_expand_config(doc, "matmul")
    assert reference != -1 and 1 <= len(reference["configs"]) <= 4
    assert reference["strategy"] == ["align32"] * 5 + ["default"]
    assert reference_expand_config(doc, "gemv") == -1  # none tuned: the reader's defaults
    inside = {(c["META"]["BLOCK_M"], c["META"]["BLOCK_N"], c["META"]["BLOCK_K"],
               c["num_stages"], c["num_warps"]) for c in configs}
    assert set(reference["configs"]) == inside
    # every tuned shape's winner, or the replacement the header names, is inside
    for label, params in winners.items():
        if params["variant"] != "general":
            continue
        (line,) = [line for line in text.splitlines() if line.startswith(f"#   {label}:")]
        if "best inside:" in line:
            named = dict(part.split("=") for part in line.split("best inside: ")[1]
                         .split(",")[0].split())
            values = tuple(int(named[k]) for k in ("block_m", "block_n", "block_k", "stages",
                                                   "warps"))
        else:
            values = tuple(params[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_stages",
                                               "num_warps"))
        assert values in inside, line
    header = [line for line in text.splitlines() if line.startswith("#")]
    assert H100.name in header[1] and "torch 2.11, triton 3.6" in header[1]
    assert "tune.db" in header[2] and "at most 4 configs" in header[3]
    assert any("regret" in line and "geomean" in line for line in header)
    assert any(line.startswith("# left out: mm_splitk") for line in header)
    assert any("won by cublas" in line for line in header)

    union = tmp_path / "union.yaml"
    assert tune(tmp_path, "export", "expand", "--max-configs", "0",
                "--with-splitk", "-o", str(union)).exit_code == 0
    doc = yaml.safe_load(union.read_text())
    assert doc["mm_splitk"][0]["split_k"] == [8]
    tiles = [w for w in winners.values() if w["variant"] == "general"]
    assert doc["mm_general_tma"][0]["block_m"] == sorted({w["BLOCK_M"] for w in tiles})
    assert "regret" in union.read_text() and "max 0.00%" in union.read_text()


def test_gemv_strategy_holds_its_four_key_fields(store, tmp_path):
    gemv = {"variant": "gemv", "pad": 0, "BLOCK_M": 64, "BLOCK_K": 256, "num_stages": 2,
            "num_warps": 4}
    tune_fake(store, H100, Shape(1, 4096, 4096, "bf16", "nt"), [(gemv, ok(0.02, 25.0))],
              MM_HASH)
    path = tmp_path / "expand.yaml"
    assert tune(tmp_path, "export", "expand", "-o", str(path)).exit_code == 0
    doc = yaml.safe_load(path.read_text())
    reference = reference_expand_config(doc, "gemv")
    assert reference["ranges"] == {"BM": [64], "BK": [256], "s": [2], "w": [4]}
    assert reference["strategy"] == ["align32"] * 4  # from the file, not the reader's default
    assert set(doc["gemv"][1]["strategy"]) == {"M", "K", "stride_am", "stride_bk"}
    configs, _ = flaggems_5_expand_configs(doc, "gemv")
    assert configs == [{"META": {"BLOCK_M": 64, "BLOCK_K": 256}, "num_stages": 2,
                        "num_warps": 4}]


def test_interpreter_results_are_refused_under_a_gpu_file_name(store, tmp_path):
    tune_fake(store, CPU, SQUARE, [(config(64, 64, 32), ok(0.4, 345.0))], MM_HASH)
    for name in ("mm_hopper_expand.yaml", "h200_expand.yaml", "tune_configs_H100.yaml"):
        refused = tune(tmp_path, "export", "expand", "-o", str(tmp_path / name))
        assert refused.exit_code == 1 and not (tmp_path / name).exists()
        (line,) = refused.output.strip().splitlines()
        assert line.startswith("Error: refusing to write CPU interpreter results") and (
            "--allow-cpu" in line)
    allowed = tmp_path / "mm_hopper_expand.yaml"
    assert tune(tmp_path, "export", "expand", "--allow-cpu", "-o",
                str(allowed)).exit_code == 0
    assert "CPU interpreter results" in allowed.read_text().splitlines()[3]
    assert tune(tmp_path, "export", "expand", "-o",
                str(tmp_path / "expand.yaml")).exit_code == 0


def test_flaggems_tune_configs_lists_the_exact_winners(store, tmp_path):
    tune_several(store)
    path = tmp_path / "tune_configs.yaml"
    result = tune(tmp_path, "export", "tune-configs", "-o", str(path))
    assert result.exit_code == 0, result.output
    text = path.read_text()
    doc = yaml.safe_load(text)
    assert list(doc) == ["mm_general_tma"]
    general = [w.trial.params for w in store.winners() if w.trial.params["variant"] == "general"]
    expected = {(p["BLOCK_M"], p["BLOCK_N"], p["BLOCK_K"], p["GROUP_M"], p["num_stages"],
                 p["num_warps"]) for p in general}
    assert len(doc["mm_general_tma"]) == len(expected)
    for entry in doc["mm_general_tma"]:
        assert set(entry) == {"META", "num_stages", "num_warps"}
        assert set(entry["META"]) == {"BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M"}
    assert {(e["META"]["BLOCK_M"], e["META"]["BLOCK_N"], e["META"]["BLOCK_K"],
             e["META"]["GROUP_M"], e["num_stages"], e["num_warps"])
            for e in doc["mm_general_tma"]} == expected
    assert any("won by cublas" in line and line.startswith("#") for line in text.splitlines())
    with_splitk = tmp_path / "with_splitk.yaml"
    assert tune(tmp_path, "export", "tune-configs", "--with-splitk", "-o",
                str(with_splitk)).exit_code == 0
    assert yaml.safe_load(with_splitk.read_text())["mm_splitk"] == [
        {"META": {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8, "SPLIT_K": 8},
         "num_stages": 4, "num_warps": 4}]


def test_the_same_files_from_a_table_file(store, tmp_path):
    tune_several(store)
    table = tmp_path / "tuned.yaml"
    assert tune(tmp_path, "export", "table", "-o", str(table)).exit_code == 0
    text = expand_from_table(table, FlagGemsOptions(max_configs=2), reporter=Silent())
    doc = yaml.safe_load(text)
    assert len(flaggems_5_expand_configs(doc, "mm_general_tma")[0]) <= 2
    assert f"from table {table}" in text and "regret" in text
    out = tmp_path / "from_table.yaml"
    result = CliRunner().invoke(main, ["export", "expand", "--table", str(table),
                                       "--max-configs", "3", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert len(reference_expand_config(yaml.safe_load(out.read_text()), "matmul")["configs"]) <= 3
    refused = CliRunner().invoke(main, ["export", "table", "--table", str(table), "-o", str(out)])
    assert refused.exit_code == 2 and "No such option '--table'" in refused.output


def test_each_format_is_a_subcommand_and_the_format_option_an_alias_for_it(store, tmp_path):
    """`tune export table|expand|tune-configs`; the old `tune export [--format X]` writes the
    same file (the date aside) after one deprecation line on standard error."""
    tune_several(store)
    forms = {"table": ("table", "table"), "expand": ("expand", "expand"),
             "tune-configs": ("flaggems-tune-configs", "tune-configs")}
    for name, (old, new) in forms.items():
        new_path, old_path = tmp_path / f"{name}.new.yaml", tmp_path / f"{name}.old.yaml"
        assert tune(tmp_path, "export", new, "-o", str(new_path)).exit_code == 0
        aliased = tune(tmp_path, "export", "--format", old, "-o", str(old_path))
        assert aliased.exit_code == 0, aliased.output
        warning, *_ = aliased.output.splitlines()
        assert warning == (f"warning: `tune export --format` is deprecated and goes in the next "
                           f"release; use `tune export {new}`")
        assert undated(old_path.read_text()) == undated(new_path.read_text())
    bare = tune(tmp_path, "export", "-o", str(tmp_path / "bare.yaml"), "--exact")
    assert bare.exit_code == 0 and bare.output.splitlines()[0] == (
        "warning: `tune export` without a format is deprecated and goes in the next release; "
        "use `tune export table`")
    wrong = tune(tmp_path, "export", "--format=csv", "-o", str(tmp_path / "x.yaml"))
    assert wrong.exit_code == 2 and "Invalid value for '--format': 'csv' is not one of" in (
        wrong.output)
    listed = CliRunner().invoke(main, ["export", "--help"])
    assert all(name in listed.output for name in forms)


def undated(text: str) -> list[str]:
    """A file's lines but those that say when it was written."""
    return [line for line in text.splitlines()
            if not line.startswith(("generated_at:", "# written "))]
