"""`tuner.record`: the rows and weights a model's GEMMs give, each call counted once; merging
into a file and writing it atomically; the calls the kernels cannot run, listed apart; and
TUNE_RECORD for a script run unchanged."""
import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import tuner
from tuner.formats.files import OutputError
from tuner.recording import main, skipped_path
from tuner.shapes import Shape, load_shapes

ROOT = Path(__file__).resolve().parent.parent


def rows(path) -> list[tuple]:
    return [(s.M, s.N, s.K, s.dtype, s.layout, s.weight) for s in load_shapes(path)]


def skipped_rows(path) -> list[list[str]]:
    """The skipped file's rows after its header (op,batch,M,N,K,dtype,reason,count)."""
    with open(skipped_path(path), newline="") as f:
        return list(csv.reader(f))[1:]


def small_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4, bias=False))


def test_a_models_gemms_become_rows_weighted_by_their_calls(tmp_path):
    """nn.Linear is x @ W^T (nt), with or without a bias; a 3-D input folds into M; a plain
    matmul is nn; nothing is counted twice (F.linear and torch.matmul decompose into the one
    aten GEMM recorded)."""
    model, path = small_model(), tmp_path / "shapes.csv"
    with torch.no_grad(), tuner.record(path) as recording:
        model(torch.randn(5, 16))
        for _ in range(2):
            model(torch.randn(2, 3, 16))
        torch.matmul(torch.randn(4, 6), torch.randn(6, 7))
        torch.bmm(torch.randn(1, 4, 6), torch.randn(1, 6, 7))  # batch 1: one GEMM
        weight = torch.randn(8, 16)
        torch.bmm(torch.randn(2, 3, 16), weight.t().expand(2, 16, 8))  # folds into M = 6
    assert rows(path) == [(5, 8, 16, "fp32", "nt", 1), (5, 4, 8, "fp32", "nt", 1),
                          (6, 8, 16, "fp32", "nt", 3), (6, 4, 8, "fp32", "nt", 2),
                          (4, 7, 6, "fp32", "nn", 2)]
    assert not skipped_path(path).exists()
    assert not recording.shapes  # written, so counting starts afresh


def test_the_dtypes_name_the_csvs(tmp_path):
    path = tmp_path / "shapes.csv"
    with tuner.record(path):
        for dtype in (torch.float16, torch.bfloat16):
            torch.randn(3, 5, dtype=dtype).t() @ torch.randn(3, 2, dtype=dtype)
    assert rows(path) == [(5, 2, 3, "fp16", "tn", 1), (5, 2, 3, "bf16", "tn", 1)]


def test_calls_the_kernels_cannot_run_are_listed_apart_with_the_reason(tmp_path):
    path = tmp_path / "shapes.csv"
    with tuner.record(path):
        torch.randn(3, 4, dtype=torch.float64) @ torch.randn(4, 5, dtype=torch.float64)
        torch.ones(3, 4, dtype=torch.int64) @ torch.ones(4, 5, dtype=torch.int64)
        torch.randn(2, 2, 3, 4) @ torch.randn(2, 2, 4, 5)  # attention-like: 4 GEMMs
        torch.randn(0, 4) @ torch.randn(4, 5)
        torch.addmm(torch.randn(3, 5), torch.randn(3, 4), torch.randn(4, 5))
        torch.randn(3, 4) @ torch.randn(1, 1).expand(4, 5)  # b: strides 0, 0
        torch.randn(3, 4) @ torch.randn(4, 5)
    assert rows(path) == [(3, 5, 4, "fp32", "nn", 1)]
    assert skipped_rows(path) == [
        ["mm", "1", "3", "5", "4", "float64", "the kernels take fp16, bf16, fp32", "1"],
        ["mm", "1", "3", "5", "4", "int64", "the kernels take fp16, bf16, fp32", "1"],
        ["bmm", "4", "3", "5", "4", "float32",
         "separate GEMMs, one per batch: the kernels run one GEMM a call", "1"],
        ["mm", "1", "0", "5", "4", "float32", "a zero-size dimension: nothing to compute", "1"],
        ["addmm", "1", "3", "5", "4", "float32",
         "adds a matrix or scales: the kernels add only a bias row (N,)", "1"],
        ["mm", "1", "3", "5", "4", "float32",
         "operand strides (4, 1), (0, 0): neither rows nor columns contiguous", "1"],
    ]


def test_recording_merges_into_the_file_counts_adding(tmp_path):
    path = tmp_path / "shapes.csv"
    path.write_text("M,N,K,dtype\n4,7,6,fp32\n1,2,3,bf16\n")  # no layout: nn; no weight: 1
    for _ in range(2):
        with tuner.record(path):
            torch.randn(4, 6) @ torch.randn(6, 7)
            torch.randn(3, 3, dtype=torch.float64) @ torch.randn(3, 3, dtype=torch.float64)
    assert rows(path) == [(4, 7, 6, "fp32", "nn", 3), (1, 2, 3, "bf16", "nn", 1)]
    assert skipped_rows(path) == [
        ["mm", "1", "3", "3", "3", "float64", "the kernels take fp16, bf16, fp32", "2"]]


def test_a_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "shapes.csv"
    path.write_text("M,N,K,dtype,layout,weight\n4,7,6,fp32,nn,5\n")
    before = path.read_text()

    def full_disk(src, dst):
        raise OSError(28, "No space left on device")

    with pytest.raises(OutputError, match="No space left on device"):
        with tuner.record(path):
            monkeypatch.setattr(os, "replace", full_disk)
            torch.randn(4, 6) @ torch.randn(6, 7)
    assert path.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shapes.csv", "shapes.csv.lock"]


def test_a_file_that_is_no_shapes_csv_is_left_alone(tmp_path):
    path = tmp_path / "shapes.csv"
    path.write_text("not,a,shapes,file\n")
    with pytest.raises(ValueError, match="header must be"):
        with tuner.record(path):
            torch.randn(4, 6) @ torch.randn(6, 7)
    assert path.read_text() == "not,a,shapes,file\n"


@pytest.mark.slow
def test_tune_record_runs_a_script_unchanged_inside_a_recording(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("import sys, torch\n"
                      "n = int(sys.argv[1])\n"
                      "torch.nn.Linear(16, n)(torch.randn(3, 16))\n"
                      "sys.exit(3)\n")
    env = dict(os.environ, TUNE_RECORD=str(tmp_path / "shapes.csv"))
    done = subprocess.run([sys.executable, "-m", "tuner.recording", str(script), "8"], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr  # the script's own exit, the file written anyway
    assert rows(tmp_path / "shapes.csv") == [(3, 8, 16, "fp32", "nt", 1)]


def test_the_runner_says_how_to_call_it(monkeypatch, capsys):
    monkeypatch.delenv("TUNE_RECORD", raising=False)
    assert main(["script.py"]) == 2
    assert "TUNE_RECORD=shapes.csv python -m tuner.recording" in capsys.readouterr().err


def test_a_recorded_shape_is_one_the_tuner_reads(tmp_path):
    path = tmp_path / "shapes.csv"
    with tuner.record(path):
        torch.randn(2, 3, 16, dtype=torch.bfloat16) @ torch.randn(8, 16, dtype=torch.bfloat16).t()
    (shape,) = load_shapes(path)
    assert shape == Shape(6, 8, 16, "bf16", "nt")
