"""`tune lookup` and TUNE_EXCLUDE: what the runtime answers a key, and why, without a GPU."""
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

from tuner import runtime
from tuner.cli import main
from tuner.runtime import dispatch
from tuner.shapes import Shape

TABLE = str(Path(__file__).resolve().parent / "data" / "tuned-h100-2026-11-25.yaml")


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.delenv("TUNE_CONFIG", raising=False)
    monkeypatch.delenv("TUNE_EXCLUDE", raising=False)
    dispatch.clear_cache()
    yield
    dispatch.clear_cache()


def lookup(*args):
    return CliRunner().invoke(main, ["lookup", *args], catch_exceptions=False)


def runtime_answer(shape: Shape, excluded=()):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return runtime.get_tuned_config_without(excluded, "gemv" if 1 in (shape.M, shape.N)
                                                else "mm", **shape.key(), path=TABLE)


@pytest.mark.parametrize("shape", [Shape(4096, 4096, 4096, "bf16", "nn"),
                                   Shape(1, 4096, 4096, "bf16", "nt"),
                                   Shape(333, 1537, 999, "fp16", "nt")])
def test_lookup_prints_the_runtimes_answer_its_step_and_bucket(shape):
    result = lookup(str(shape.M), str(shape.N), str(shape.K), "--dtype", shape.dtype,
                    "--layout", shape.layout, "--table", TABLE)
    assert result.exit_code == 0, result.output
    answer = runtime_answer(shape)
    lines = result.output.splitlines()
    assert lines[0].startswith(f"{'gemv' if shape.M == 1 else 'mm'} {shape} (stride_am="
                               f"{shape.stride_am}, stride_bk={shape.stride_bk}) from {TABLE}")
    assert lines[1] == f"config: {dict(answer)}"
    assert lines[2].startswith(f"source: {answer.source}: ")
    assert lines[3] == "bucket: " + ", ".join(
        f"{f}={v}" for f, v in zip(("M", "N", "K", "stride_am", "stride_bk", "dtype"),
                                   answer.bucket))


def test_lookup_reads_TUNE_CONFIG_and_says_when_there_is_no_table(monkeypatch):
    result = lookup("40", "48", "64", "--dtype", "bf16")
    assert result.exit_code == 0
    assert "from no table (set TUNE_CONFIG or --table)" in result.output
    assert "source: cublas: " in result.output and "warning: gemm-tuner: no tuned mm" in \
        result.output
    monkeypatch.setenv("TUNE_CONFIG", TABLE)
    runtime.clear_cache()
    result = lookup("4096", "4096", "4096", "--dtype", "bf16")
    assert f"from {TABLE}" in result.output and "source: table: " in result.output


@pytest.mark.parametrize("args, message", [
    (["0", "8", "8", "--dtype", "bf16"], "Invalid value for 'M'"),
    (["8", "8", "8", "--dtype", "fp64"], "Invalid value for '--dtype'"),
    (["8", "8", "8", "--dtype", "bf16", "--layout", "xy"], "Invalid value for '--layout'"),
    (["8", "8", "8", "--dtype", "bf16", "--table", "missing.yaml"], "does not exist"),
    (["8", "8", "2147483648", "--dtype", "bf16"], "K must be from 1 to 2**31-1"),
])
def test_lookup_refuses_bad_input_in_one_line(args, message):
    result = lookup(*args)
    assert result.exit_code == 2 if "Invalid" in message or "exist" in message else 1
    assert message in result.output and "Traceback" not in result.output


def test_lookup_of_a_file_that_is_no_table_is_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("format: nonsense\n")
    result = lookup("8", "8", "8", "--dtype", "bf16", "--table", str(bad))
    assert result.exit_code == 1 and result.output.startswith("Error: ")
    assert len(result.output.strip().splitlines()) == 1


def test_TUNE_EXCLUDE_leaves_variants_out_of_lookup_and_dispatch(monkeypatch):
    shape = Shape(4096, 4096, 4096, "bf16", "nn")  # tuned to cuBLAS in the table
    assert runtime_answer(shape)["variant"] == "cublas"
    monkeypatch.setenv("TUNE_EXCLUDE", "cublas")
    result = lookup("4096", "4096", "4096", "--dtype", "bf16", "--table", TABLE)
    without = runtime_answer(shape, ("cublas",))
    assert without["variant"] != "cublas"
    assert f"config: {dict(without)}" in result.output
    assert "excluded: cublas (TUNE_EXCLUDE)" in result.output

    from tuner.kernels.calls import meta_gemm
    monkeypatch.setenv("TUNE_CONFIG", TABLE)
    assert dict(dispatch.plan(meta_gemm(shape))[1]) == dict(without)
    monkeypatch.setenv("TUNE_EXCLUDE", "")  # read once: the plan stays until clear_cache
    assert dict(dispatch.plan(meta_gemm(shape))[1]) == dict(without)
    dispatch.clear_cache()
    assert dispatch.plan(meta_gemm(shape))[1]["variant"] == "cublas"


def test_an_unknown_TUNE_EXCLUDE_name_is_one_line_naming_the_known_variants(monkeypatch):
    monkeypatch.setenv("TUNE_EXCLUDE", "cublas, tmaa")
    result = lookup("8", "8", "8", "--dtype", "bf16")
    assert result.exit_code == 1
    assert result.output.startswith("Error: gemm-tuner: TUNE_EXCLUDE names unknown variant(s) "
                                    "tmaa; known: ")
    assert "cublas" in result.output and "general" in result.output
    from tuner.kernels.calls import meta_gemm
    with pytest.raises(ValueError, match="unknown variant"):
        dispatch.plan(meta_gemm(Shape(8, 8, 8, "bf16")))
