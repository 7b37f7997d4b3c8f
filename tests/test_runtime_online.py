"""Our table with TUNE_ONLINE=1: a key the table has no entry of is timed once, within
TUNE_ONLINE_BUDGET_S, and its winner remembered in the online cache beside the table, so a
second lookup, another process or a restart times nothing (the `online` step of
tuner.runtime.policy; the cache is tuner.runtime.online's, shared with expand files)."""
import os
import warnings
from pathlib import Path

import pytest
import yaml

from tests.factories import fresh_lookups
from tuner import runtime
from tuner.bucketing.strategies import KEY_FIELDS
from tuner.formats.files import write_atomic
from tuner.formats.table import TABLE_FORMAT
from tuner.runtime import online, policy
from tuner.runtime.policy import Question
from tuner.space import config_signature

LOG_M = dict.fromkeys(KEY_FIELDS, "default") | {"M": "log"}
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="online tuning tests time tiny shapes on the interpreter")


def key(M, N=32, K=32, dtype="bf16"):
    return {"M": M, "N": N, "K": K, "stride_am": K, "stride_bk": N, "dtype": dtype}


def tile(block_m, block_k=32):
    return {"variant": "general", "pad": 0, "BLOCK_M": block_m, "BLOCK_N": 32,
            "BLOCK_K": block_k, "GROUP_M": 1, "num_stages": 2, "num_warps": 4}


@pytest.fixture
def table(tmp_path) -> Path:
    """Buckets M=16 and M=128 (M by `log`), the second with an alternate."""
    path = tmp_path / "t.yaml"
    write_atomic(path, {"format": TABLE_FORMAT, "device": {"name": "NVIDIA H100 80GB HBM3"},
                        "ops": {"mm": {"strategy": LOG_M, "entries": [
                            {"key": key(16), "config": tile(16)},
                            {"key": key(128), "config": tile(32), "alternates": [tile(64)]}]}}})
    return path


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    for name in (runtime.ENV_VAR, runtime.LOG_ENV_VAR, online.CACHE_ENV_VAR,
                 online.TOP_K_ENV_VAR, online.LAUNCH_ENV_VAR, online.BUDGET_ENV_VAR):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TUNE_ONLINE", "1")
    runtime.clear_cache()
    online.reset_stats()
    yield
    runtime.clear_cache()


def ask(table, M, excluded=()):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return runtime.get_tuned_config_without(excluded, "mm", path=table, **key(M))


def cache_entries(table: Path) -> list[dict]:
    return yaml.safe_load(table.with_name("t.online.yaml").read_text())["ops"]["mm"]["entries"]


def test_an_unseen_key_is_timed_once_and_then_answered_from_the_cache(table, monkeypatch):
    monkeypatch.setenv(online.BUDGET_ENV_VAR, "1e-6")  # the first candidate alone: cuBLAS
    first = ask(table, 40)
    assert (first.source, dict(first), first.bucket) == (
        "online", {"variant": "cublas", "pad": 0}, (64, 32, 32, 32, 32, "bf16"))
    assert online.stats() == {"configs_timed": 1, "buckets_tuned": 1, "cache_answers": 0}
    [entry] = cache_entries(table)
    assert entry["key"]["M"] == 64 and entry["config"] == dict(first)
    assert entry["source"] == "online" and entry["configs_timed"] == 1

    # a bucket-mate, and the same key after the tables are forgotten (as a restart would)
    assert ask(table, 50) == first
    runtime.clear_cache()
    again = ask(table, 40)
    assert (again.source, dict(again)) == ("online", dict(first))
    assert online.stats() == {"configs_timed": 1, "buckets_tuned": 1, "cache_answers": 2}


def test_a_key_with_an_entry_times_nothing(table):
    assert ask(table, 100).source == "table"
    assert online.stats()["configs_timed"] == 0
    assert not table.with_name("t.online.yaml").exists()


def test_the_candidates_start_with_cublas_and_the_zero_shot_answer(table, monkeypatch):
    """Best first, so that a short budget still gets a good answer: cuBLAS, what the table
    answers without timing, then the model's ranking (each config once, TOP_K of them)."""
    monkeypatch.setenv(online.TOP_K_ENV_VAR, "3")
    source = runtime.lookup.open_table(table)
    question = Question(source, "mm", key(40), frozenset())
    candidates = policy._online_candidates(question)
    zero_shot = policy.ZERO_SHOT.answer(question)
    assert dict(candidates[0]) == {"variant": "cublas", "pad": 0}
    if zero_shot["variant"] != "cublas":
        assert dict(candidates[1]) == dict(zero_shot)
    assert 3 <= len(candidates) <= 5
    assert len({config_signature(c) for c in candidates}) == len(candidates)
    tiles = {config_signature(c) for c in candidates[1:]}
    assert tiles & {config_signature(tile(m)) for m in (16, 32, 64)}  # the neighbours' own
    excluded = Question(source, "mm", key(40), frozenset({"cublas"}))
    assert all(c["variant"] != "cublas" for c in policy._online_candidates(excluded))


def test_a_cached_winner_the_caller_excludes_passes_to_the_next_step(table, monkeypatch):
    monkeypatch.setenv(online.BUDGET_ENV_VAR, "1e-6")
    assert ask(table, 40)["variant"] == "cublas"
    without = ask(table, 40, excluded=("cublas",))
    assert without.source == "nearest" and without["variant"] != "cublas"
    assert online.stats()["buckets_tuned"] == 1  # not re-tuned: the cache keeps its winner
    assert [e["config"] for e in cache_entries(table)] == [{"variant": "cublas", "pad": 0}]


def test_an_op_the_table_lacks_is_not_tuned(table):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        answer = runtime.get_tuned_config("gemv", path=table, **key(1, N=64, K=64))
    assert answer.source == "cublas" and online.stats()["configs_timed"] == 0


@pytest.mark.parametrize("value", ["abc", "0", "-2", "nan", "inf", " "])
def test_a_bad_budget_names_the_variable(table, monkeypatch, value):
    monkeypatch.setenv(online.BUDGET_ENV_VAR, value)
    with pytest.raises(ValueError) as raised:
        ask(table, 40)
    message = str(raised.value)
    assert message.startswith(f"TUNE_ONLINE_BUDGET_S='{value}': expected a positive number of "
                              "seconds") and "\n" not in message
    assert sorted(p.name for p in table.parent.iterdir()) == ["t.yaml"]


@pytest.mark.slow
def test_the_budget_stops_the_timing_early(table, monkeypatch):
    """A budget of one candidate's time times fewer than a generous one; both write their
    winner (the best so far)."""
    monkeypatch.setenv(online.BUDGET_ENV_VAR, "600")
    ask(table, 40)
    everything = online.stats()["configs_timed"]
    assert everything >= 4
    monkeypatch.setenv(online.BUDGET_ENV_VAR, "0.05")
    monkeypatch.setenv(online.CACHE_ENV_VAR, str(table.with_name("other.yaml")))
    runtime.clear_cache()
    online.reset_stats()
    ask(table, 40)
    assert 1 <= online.stats()["configs_timed"] < everything
    assert online.stats()["buckets_tuned"] == 1




@pytest.mark.slow
def test_a_restarted_process_times_nothing(table):
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TUNE_")}
    environ.update(TRITON_INTERPRET="1", TUNE_CONFIG=str(table), TUNE_ONLINE="1",
                   TUNE_ONLINE_BUDGET_S="1e-6")

    def start() -> dict:
        return fresh_lookups([key(40), key(12)], environ)

    first = start()
    assert first["stats"] == {"configs_timed": 1, "buckets_tuned": 1, "cache_answers": 0}
    assert [source for source, _ in first["answers"]] == ["online", "table"]
    assert first["loaded"] == []
    second = start()
    assert second["stats"] == {"configs_timed": 0, "buckets_tuned": 0, "cache_answers": 1}
    assert second["answers"] == first["answers"]
