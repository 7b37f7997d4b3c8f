"""`tune buckets`, the bucketed export, the runtime and `tune validate` end to end, on the CPU
through Triton's interpreter (its timings are noise, so the budget here is generous: what is
checked is the plumbing and the agreement, not the regrets)."""
import os

import pytest
import yaml
from click.testing import CliRunner

from tuner import runtime
from tuner.bucketing.search import DEFAULT_CANDIDATES, sweep_candidates
from tuner.bucketing.strategies import bucket_key
from tuner.cli import main

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="interpreter CLI tests run on CPU-only machines")
EXACT_SPACE = """kernel: mm
params: {variant: [general], pad: [0], BLOCK_M: [16, 32], BLOCK_N: [16], BLOCK_K: [32],
         GROUP_M: [1], num_stages: [2], num_warps: [2, 4]}
strategy: {M: default, N: default, K: default, stride_am: default, stride_bk: default,
           dtype: default}
"""
# 40, 33 and 35 rows share a `log` bucket (64); 16 rows stay alone in a widened bucket (15..16),
# so `log` makes 2 rows and 1 widened singleton, smaller than the 4 exact rows.
SHAPES = ("M,N,K,dtype,layout\n40,48,64,bf16,nn\n33,48,64,bf16,nn\n35,48,64,bf16,nn\n"
          "16,48,64,bf16,nn\n")
HOLDOUT = "M,N,K,dtype,layout\n36,48,64,bf16,nn\n20,48,64,bf16,nn\n"


def tune(tmp_path, *args):
    result = CliRunner().invoke(main, [*args, "--db", f"sqlite:///{tmp_path / 'tune.db'}"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


@pytest.mark.slow
def test_buckets_export_runtime_and_validate_agree(tmp_path, monkeypatch):
    for name, text in (("shapes.csv", SHAPES), ("holdout.csv", HOLDOUT),
                       ("space.yaml", EXACT_SPACE)):
        (tmp_path / name).write_text(text)
    tune(tmp_path, "run", "--shapes", str(tmp_path / "shapes.csv"), "--space",
         str(tmp_path / "space.yaml"), "--backend", "interpret", "--trials", "2")

    chosen = tune(tmp_path, "buckets", "--shapes", str(tmp_path / "shapes.csv"),
                  "--strategy", "default", "--strategy", "log", "--max-regret", "100",
                  "--backend", "interpret")
    assert "bucketings on the Pareto front" in chosen.output and "**chosen**" in chosen.output
    # A second search reuses the stored timings: nothing left to time.
    again = tune(tmp_path, "buckets", "--shapes", str(tmp_path / "shapes.csv"),
                 "--strategy", "default", "--strategy", "log", "--max-regret", "100",
                 "--backend", "interpret")
    assert "0 shapes to time" in again.output

    table = tmp_path / "tuned.yaml"
    tune(tmp_path, "export", "table", "-o", str(table))
    mm = yaml.safe_load(table.read_text())["ops"]["mm"]
    assert len(mm["entries"]) == 2 and mm["strategy"]["M"] == "log"
    # The warm start measured both tiles (BLOCK_M 16 and 32): each bucket carries the other
    # as its alternate, for the nearest fallback.
    for entry in mm["entries"]:
        assert entry["alternates"]
        assert all(a["BLOCK_M"] != entry["config"]["BLOCK_M"] for a in entry["alternates"])
    exact = tmp_path / "exact.yaml"
    tune(tmp_path, "export", "table", "--exact", "-o", str(exact))
    assert len(yaml.safe_load(exact.read_text())["ops"]["mm"]["entries"]) == 4

    runtime.clear_cache()
    by_bucket = {bucket_key(e["key"], mm["strategy"]): e["config"] for e in mm["entries"]}
    for m in (40, 33, 35, 16):
        key = {"M": m, "N": 48, "K": 64, "stride_am": 64, "stride_bk": 48, "dtype": "bf16"}
        answer = runtime.get_tuned_config("mm", **key, path=table)
        assert answer.source == "table"
        assert dict(answer) == by_bucket[bucket_key(key, mm["strategy"])]

    report = tmp_path / "holdout.md"
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TUNE_VALIDATE_DB", raising=False)
    validated = CliRunner().invoke(main, ["validate", "--config", str(table), "--shapes",
                                          str(tmp_path / "holdout.csv"), "--trials", "2",
                                          "--backend", "interpret", "-o", str(report)],
                                   catch_exceptions=False)
    assert validated.exit_code == 0, validated.output
    text = report.read_text()
    assert "| 36x48x64 bf16 nn | table |" in text  # in the 40/33/35 bucket
    # Log bucket 32, never tuned: at this size the model predicts every tuned tile slower
    # than cuBLAS, which answers instead.
    assert "| 20x48x64 bf16 nn | cublas |" in text
    assert "2 shapes: geomean regret" in validated.output
    # The fresh tunes went to validate.db: the tuning database still exports its 4 keys only.
    assert (tmp_path / "validate.db").exists()
    tune(tmp_path, "export", "table", "--exact", "-o", str(exact))
    assert len(yaml.safe_load(exact.read_text())["ops"]["mm"]["entries"]) == 4


@pytest.mark.slow
def test_interpret_backend_needs_no_environment_variable(tmp_path):
    """`--backend interpret` sets TRITON_INTERPRET itself, so nothing the command imports
    before that (its error handling included) may pull in triton: in a fresh process without
    the variable, the command gets as far as its own input check."""
    import subprocess
    import sys

    (tmp_path / "shapes.csv").write_text(SHAPES)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", "from tuner.cli import main; main()", "buckets",
         "--shapes", str(tmp_path / "shapes.csv"), "--db", f"sqlite:///{tmp_path / 'empty.db'}",
         "--backend", "interpret"],
        capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 1
    assert "no database at" in done.stderr and "TRITON_INTERPRET" not in done.stderr


@pytest.mark.slow
def test_a_swept_m_gets_a_bucket_entry_at_every_m(tmp_path):
    """`tune run --m`, `tune buckets --m`, `tune export table`: every M up to the largest
    swept one is answered by a bucket's entry, a config measured on a swept shape, and none by
    the fallback."""
    (tmp_path / "shapes.csv").write_text("M,N,K,dtype,layout\n8,48,64,bf16,nn\n")
    (tmp_path / "space.yaml").write_text(EXACT_SPACE)
    sweep = ("--shapes", str(tmp_path / "shapes.csv"), "--m", "2-16", "--backend", "interpret")
    tune(tmp_path, "run", *sweep, "--space", str(tmp_path / "space.yaml"), "--trials", "2",
         "--polish", "0")
    chosen = tune(tmp_path, "buckets", *sweep, "--max-regret", "0.05")
    assert "**chosen**" in chosen.output
    table = tmp_path / "tuned.yaml"
    tune(tmp_path, "export", "table", "-o", str(table))
    mm = yaml.safe_load(table.read_text())["ops"]["mm"]
    assert mm["strategy"]["M"] in sweep_candidates((2, 4, 8, 16), DEFAULT_CANDIDATES)

    runtime.clear_cache()
    for m in range(2, 17):
        key = {"M": m, "N": 48, "K": 64, "stride_am": 64, "stride_bk": 48, "dtype": "bf16"}
        assert runtime.get_tuned_config("mm", **key, path=table).source == "table", m
