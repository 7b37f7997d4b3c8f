"""The runtime reading a FlagGems expand file: one config of the op's product per bucketed key
(the model's pick by default; with TUNE_ONLINE=1 the winner of timing the candidates, in a
cache file that processes share under a lock and replace atomically)."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.factories import fresh_lookup_command, fresh_lookups
from tuner import runtime
from tuner.filelock import locked_beside
from tuner.formats.device import header_device
from tuner.formats.flaggems import is_expand_document
from tuner.formats.table import TABLE_FORMAT, merge_documents, read_document
from tuner.runtime import online
from tuner.runtime.expand import ExpandTable

ROOT = Path(__file__).resolve().parent.parent
LOG_M = {"M": "log", "N": "default", "K": "default", "stride_am": "default",
         "stride_bk": "default", "dtype": "default"}
PRODUCT = {"block_m": [16, 32], "block_n": [16], "block_k": [16, 32], "stages": [2],
           "warps": [4]}
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="online tuning tests time tiny shapes on the interpreter")


def expand_doc(strategy=LOG_M, gemv_strategy=None, **lists):
    """An expand file as tuner.export.writers writes it: mm_general_tma and gemv."""
    values = PRODUCT | lists
    doc = {"mm_general_tma": [
        {"config": None, "param_map": {
            "META": {"BLOCK_M": "block_m", "BLOCK_N": "block_n", "BLOCK_K": "block_k",
                     **({"GROUP_M": "group_m"} if "group_m" in values else {})},
            "num_stages": "stages", "num_warps": "warps"}, **values},
        {"strategy": strategy}]}
    doc["gemv"] = [{"param_map": {"META": {"BLOCK_M": "block_m", "BLOCK_K": "block_k"},
                                  "num_stages": "stages", "num_warps": "warps"},
                    "block_m": [16, 32], "block_k": [32, 64], "stages": [2], "warps": [4]},
                   {"strategy": gemv_strategy or {}}]
    return doc


def write_expand(path: Path, doc=None, device="NVIDIA H100 80GB HBM3") -> Path:
    header = f"# device: {device}\n# regret: geomean 1.00\n" if device else ""
    path.write_text(header + yaml.safe_dump(doc or expand_doc(), sort_keys=False))
    return path


def key(M, N=32, K=32, dtype="bf16", stride_am=None, stride_bk=None):
    return {"M": M, "N": N, "K": K, "stride_am": K if stride_am is None else stride_am,
            "stride_bk": N if stride_bk is None else stride_bk, "dtype": dtype}


def tiles(config):
    return (config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"], config["num_stages"],
            config["num_warps"])


PRODUCT_TILES = {(m, n, k, s, w) for m in PRODUCT["block_m"] for n in PRODUCT["block_n"]
                 for k in PRODUCT["block_k"] for s in PRODUCT["stages"] for w in PRODUCT["warps"]}


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    for name in (runtime.ENV_VAR, runtime.LOG_ENV_VAR, "TUNE_ONLINE", online.CACHE_ENV_VAR,
                 online.TOP_K_ENV_VAR, online.LAUNCH_ENV_VAR):
        monkeypatch.delenv(name, raising=False)
    runtime.clear_cache()
    online.reset_stats()
    yield
    runtime.clear_cache()


# -- the model's pick ---------------------------------------------------------------------------
def test_the_file_kind_is_told_by_its_content(tmp_path):
    path = write_expand(tmp_path / "mm_hopper_expand.yaml")
    doc, text = read_document(path)
    assert is_expand_document(doc) and header_device(text) == "NVIDIA H100 80GB HBM3"
    assert not is_expand_document({"format": TABLE_FORMAT, "ops": {}})
    assert not is_expand_document({"mm_general_tma": []})


def test_the_model_picks_a_member_of_the_product_for_each_bucket(tmp_path):
    path = write_expand(tmp_path / "e.yaml")
    first = runtime.get_tuned_config("mm", path=path, **key(20))
    assert first.source == "expand-model" and tiles(first) in PRODUCT_TILES
    assert first["variant"] == "tma" and first["GROUP_M"] == 8 and first["pad"] == 0
    assert first.bucket == (32, 32, 32, 32, 32, "bf16")  # M by `log`, the file's strategy
    # a bucket-mate gets the same config; another bucket is answered on its own
    assert dict(runtime.get_tuned_config("mm", path=path, **key(30))) == dict(first)
    other = runtime.get_tuned_config("mm", path=path, **key(33))
    assert other.bucket[0] == 64 and tiles(other) in PRODUCT_TILES
    assert isinstance(runtime.lookup._tables[path], ExpandTable)


def test_strides_tma_cannot_read_get_the_pointer_kernel(tmp_path):
    path = write_expand(tmp_path / "e.yaml")
    unaligned = runtime.get_tuned_config("mm", path=path, **key(20, N=30, K=30))
    assert unaligned["variant"] == "general" and tiles(unaligned) in PRODUCT_TILES


def test_a_strategy_field_the_file_leaves_out_takes_flaggems_default(tmp_path):
    path = write_expand(tmp_path / "e.yaml", expand_doc(strategy={"M": "log"}))
    assert runtime.get_tuned_config("mm", path=path, **key(20, N=40, K=40)).bucket == (
        32, 64, 64, 64, 64, "bf16")  # N, K and strides align32; dtype exact


def test_gemv_lists_and_given_group_m(tmp_path, monkeypatch):
    path = write_expand(tmp_path / "e.yaml", expand_doc(group_m=[4]))
    monkeypatch.setenv(runtime.ENV_VAR, str(path))
    assert runtime.get_tuned_config("mm", **key(20))["GROUP_M"] == 4
    gemv = runtime.get_tuned_config("gemv", **key(1, N=300, K=64))
    assert gemv.source == "expand-model" and gemv["variant"] == "gemv"
    assert (gemv["BLOCK_M"], gemv["BLOCK_K"]) in {(m, k) for m in (16, 32) for k in (32, 64)}


def test_the_model_predicts_for_the_device_the_header_names(tmp_path, monkeypatch):
    asked = []
    import tuner.model.named_devices as named

    real = named.named_spec
    monkeypatch.setattr(named, "named_spec", lambda name: asked.append(name) or real(name))
    runtime.get_tuned_config("mm", path=write_expand(tmp_path / "a.yaml", device="NVIDIA H200"),
                             **key(20))
    runtime.get_tuned_config("mm", path=write_expand(tmp_path / "b.yaml", device=None),
                             **key(20))
    assert asked == ["NVIDIA H200", None]  # None: the visible GPU, else an H100


def test_an_op_the_file_lacks_answers_cublas(tmp_path):
    doc = expand_doc()
    del doc["gemv"]
    path = write_expand(tmp_path / "e.yaml", doc)
    with pytest.warns(RuntimeWarning, match="using cublas"):
        assert runtime.get_tuned_config("gemv", path=path, **key(1, N=64)).source == "cublas"


# -- online: two processes, one cache -----------------------------------------------------------


def run_lookups(expand: Path, keys: list[dict], **env) -> dict:
    environ = {k: v for k, v in os.environ.items()
               if k not in ("TUNE_CONFIG", "TUNE_LOG", "TUNE_ONLINE_CACHE")}
    # a budget the interpreter's timings stay within: these tests count what is timed
    environ.update(TRITON_INTERPRET="1", TUNE_CONFIG=str(expand), TUNE_ONLINE="1",
                   TUNE_ONLINE_BUDGET_S="600", **env)
    return fresh_lookups(keys, environ)


@pytest.mark.slow
@pytest.mark.parametrize("named_cache", [False, True])
def test_the_first_process_times_and_the_second_reads_its_cache(tmp_path, named_cache):
    expand = write_expand(tmp_path / "e.yaml")
    cache = tmp_path / "elsewhere" / "c.yaml" if named_cache else tmp_path / "e.online.yaml"
    env = {"TUNE_ONLINE_CACHE": str(cache)} if named_cache else {}
    keys = [key(20), key(30), key(64)]  # buckets M=32 (twice) and 64
    first = run_lookups(expand, keys, **env)
    # per bucket: the product's 4 configs and cuBLAS
    assert first["stats"] == {"configs_timed": 10, "buckets_tuned": 2, "cache_answers": 0}
    assert [source for source, _ in first["answers"]] == ["expand-online"] * 3
    assert all(config["variant"] == "cublas" or tiles(config) in PRODUCT_TILES
               for _, config in first["answers"])
    assert first["loaded"] == []
    doc = yaml.safe_load(cache.read_text())
    assert doc["format"] == TABLE_FORMAT and doc["device"]["name"] == "cpu-interpreter"
    assert [e["key"]["M"] for e in doc["ops"]["mm"]["entries"]] == [32, 64]
    assert doc["ops"]["mm"]["strategy"] == LOG_M

    second = run_lookups(expand, keys, **env)  # a restart: nothing is timed again
    assert second["stats"] == {"configs_timed": 0, "buckets_tuned": 0, "cache_answers": 2}
    assert second["answers"] == first["answers"]
    # the cache is a table: our runtime reads it as one
    assert runtime.get_tuned_config("mm", path=cache, **key(20)).source == "table"


@pytest.mark.slow
def test_top_k_caps_the_configs_timed(tmp_path):
    expand = write_expand(tmp_path / "e.yaml")
    got = run_lookups(expand, [key(20)], TUNE_ONLINE_TOP_K="2")
    assert got["stats"]["configs_timed"] == 3  # the model's top 2, and cuBLAS


@pytest.mark.slow
def test_a_process_waits_for_the_lock_and_then_reads_what_the_holder_wrote(tmp_path):
    expand = write_expand(tmp_path / "e.yaml")
    cache = tmp_path / "e.online.yaml"
    winner = {"variant": "general", "pad": 0, "BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_K": 16,
              "GROUP_M": 8, "num_stages": 2, "num_warps": 4}
    environ = {k: v for k, v in os.environ.items() if k not in ("TUNE_ONLINE_CACHE",)}
    environ.update(TRITON_INTERPRET="1", TUNE_CONFIG=str(expand), TUNE_ONLINE="1")
    from tuner.kernels import source_hashes

    with locked_beside(cache):
        waiting = subprocess.Popen(fresh_lookup_command([key(20)]),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   env=environ, cwd=ROOT)
        time.sleep(4)
        assert waiting.poll() is None  # blocked on the lock, timing nothing
        online._write_merged(cache, {"name": "cpu-interpreter"}, "eager", "mm", LOG_M,
                             source_hashes()["mm"], {"key": key(32), "config": winner})
    out, err = waiting.communicate(timeout=120)
    assert waiting.returncode == 0, err
    got = json.loads(out)
    assert got["stats"] == {"configs_timed": 0, "buckets_tuned": 0, "cache_answers": 1}
    assert got["answers"] == [["expand-online", winner]]


@pytest.mark.slow
def test_an_entry_of_other_kernel_source_is_not_used(tmp_path):
    expand = write_expand(tmp_path / "e.yaml")
    cache = tmp_path / "e.online.yaml"
    online.remember(cache, {"name": "cpu-interpreter"}, "eager", "mm", LOG_M, "stale",
                    {"key": key(32), "config": {"variant": "general", "pad": 0}})
    got = run_lookups(expand, [key(20)])
    assert got["stats"]["configs_timed"] == 5 and got["stats"]["buckets_tuned"] == 1
    assert len(yaml.safe_load(cache.read_text())["ops"]["mm"]["entries"]) == 1  # replaced


# -- the cache file: lock and atomic replacement ------------------------------------------------
REMEMBER = """
import sys
from tuner.runtime import online
path, first, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
strategy = dict.fromkeys(("M", "N", "K", "stride_am", "stride_bk", "dtype"), "default")
for M in range(first, first + count):
    online.remember(path, {"name": "gpu"}, "eager", "mm", strategy, "h",
                    {"key": {"M": M, "N": 8, "K": 8, "stride_am": 8, "stride_bk": 8,
                             "dtype": "bf16"}, "config": {"variant": "general", "pad": 0}})
"""

READ_ALL = """
import sys, time, yaml
path, until = sys.argv[1], time.time() + float(sys.argv[2])
reads = 0
while time.time() < until:
    try:
        text = open(path).read()
    except FileNotFoundError:
        continue
    doc = yaml.safe_load(text)
    assert doc["format"] == "gemm-tuner-table/2" and doc["ops"]["mm"]["entries"], text
    reads += 1
print(reads)
"""


@pytest.mark.slow
def test_writers_in_several_processes_lose_no_entry_and_readers_never_see_half_a_file(
        tmp_path):
    cache = tmp_path / "c.yaml"
    writers = [subprocess.Popen([sys.executable, "-c", REMEMBER, str(cache), str(first), "40"],
                                cwd=ROOT, stderr=subprocess.PIPE, text=True)
               for first in (1, 1001, 2001)]
    reader = subprocess.run([sys.executable, "-c", READ_ALL, str(cache), "6"], cwd=ROOT,
                            capture_output=True, text=True)
    for writer in writers:
        assert writer.wait(timeout=120) == 0, writer.stderr.read()
    assert reader.returncode == 0, reader.stderr
    assert int(reader.stdout) > 0
    entries = yaml.safe_load(cache.read_text())["ops"]["mm"]["entries"]
    assert sorted(e["key"]["M"] for e in entries) == [*range(1, 41), *range(1001, 1041),
                                                      *range(2001, 2041)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml", "c.yaml.lock"]  # no temp


def test_a_failed_write_leaves_the_old_file_whole(tmp_path, monkeypatch):
    cache = tmp_path / "c.yaml"
    entry = {"key": key(32), "config": {"variant": "general", "pad": 0}}
    online.remember(cache, {"name": "gpu"}, "eager", "mm", LOG_M, "h", entry)
    before = cache.read_text()

    def fail(*args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        online.remember(cache, {"name": "gpu"}, "eager", "mm", LOG_M, "h",
                        {**entry, "key": key(64)})
    assert cache.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml", "c.yaml.lock"]


# -- merging a cache into an exported table -----------------------------------------------------
def test_merging_keeps_the_tables_entries_and_adds_the_buckets_it_lacks():
    def table(device, entries, source_hash="h"):
        return {"format": TABLE_FORMAT, "device": {"name": device}, "ops": {"mm": {
            "kernel_source_hash": source_hash, "strategy": LOG_M,
            "entries": [{"key": key(M), "config": {"variant": v, "pad": 0}}
                        for M, v in entries]}}}

    merged, notes = merge_documents(table("H100", [(32, "general")]),
                                    table("H100", [(20, "tma"), (64, "splitk")]))
    assert [(e["key"]["M"], e["config"]["variant"]) for e in merged["ops"]["mm"]["entries"]] \
        == [(32, "general"), (64, "splitk")]  # 20 falls in the table's bucket 32: it wins
    assert notes == ["merge: added 1 mm entries, 1 already held"]
    other, notes = merge_documents(table("H100", [(32, "general")]), table("H200", [(64, "t")]))
    assert len(other["ops"]["mm"]["entries"]) == 1 and "H200" in notes[0]
    stale, notes = merge_documents(table("H100", []), table("H100", [(64, "t")], "old"))
    assert stale["ops"]["mm"]["entries"] == [] and "other kernel source" in notes[0]
