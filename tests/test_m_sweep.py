"""`tune run --m`: serving's varying M, each (N, K, dtype, layout) of the shapes file swept."""
import dataclasses
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from tuner.cli import main
from tuner.kernels import kernel_for, kernel_variants
from tuner.search.planning import plan_studies
from tuner.shapes import Shape, parse_m_values, swept_m
from tuner.space import builtin_spaces


@pytest.mark.parametrize("text, values", [
    ("1,2,4,8", (1, 2, 4, 8)),
    ("1-16", (1, 2, 4, 8, 16)),
    ("3-20", (3, 6, 12)),
    ("1-4, 3 ,4,96,64-128", (1, 2, 3, 4, 64, 96, 128)),
    ("7-7", (7,)),
])
def test_m_values_are_integers_and_doubling_ranges(text, values):
    assert parse_m_values(text) == values


@pytest.mark.parametrize("text, message", [
    ("", "got ''"), ("1,,2", "got ''"), ("1-", "got '1-'"), ("a", "got 'a'"),
    ("1.5", "got '1.5'"), ("0", "M must be from 1"), ("8-4", "must go up"),
    ("0-4", "must go up"), ("2147483648", "M must be from 1 to 2**31-1"),
])
def test_bad_m_values_are_one_line(text, message):
    with pytest.raises(ValueError, match="^[^\n]*" + message.replace("*", r"\*")):
        parse_m_values(text)


def test_the_sweep_replaces_each_groups_m_and_sums_its_weight():
    shapes = [Shape(5, 4096, 4096, "bf16", "nt", 3), Shape(9, 4096, 4096, "bf16", "nt", 1),
              Shape(5, 1024, 4096, "fp16", "nn", 2)]
    assert swept_m(shapes, (1, 64)) == [
        Shape(1, 4096, 4096, "bf16", "nt", 4), Shape(64, 4096, 4096, "bf16", "nt", 4),
        Shape(1, 1024, 4096, "fp16", "nn", 2), Shape(64, 1024, 4096, "fp16", "nn", 2)]


def test_a_swept_shape_too_large_is_named():
    with pytest.raises(ValueError, match=r"swept shape 2147483647x65536x2 bf16 nn: C would"):
        swept_m([Shape(1, 65536, 2, "bf16")], (2**31 - 1,))


@pytest.fixture
def shapes_file(tmp_path):
    path = tmp_path / "shapes.csv"
    path.write_text("M,N,K,dtype,layout,weight\n7,48,64,bf16,nt,2\n9,48,64,bf16,nt,1\n")
    return path


def test_tune_run_tunes_the_swept_shapes(shapes_file, monkeypatch, tmp_path):
    import tuner.tuning

    planned = []

    def fake_run(db, shapes, *args):  # the planning's input, nothing tuned
        planned.extend(shapes)
        return SimpleNamespace(tuned=[], skipped=[], busy=[], failed=[], unstarted=[])
    monkeypatch.setattr(tuner.tuning, "tune_run", fake_run)
    result = CliRunner().invoke(main, ["run", "--shapes", str(shapes_file), "--m", "1-4,16",
                                       "--backend", "interpret", "--db",
                                       f"sqlite:///{tmp_path / 'tune.db'}"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert planned == [Shape(m, 48, 64, "bf16", "nt", 3) for m in (1, 2, 4, 16)]


def test_tune_run_refuses_bad_m_in_one_line(shapes_file):
    result = CliRunner().invoke(main, ["run", "--shapes", str(shapes_file), "--m", "1-x"])
    assert result.exit_code == 2
    assert "Invalid value for '--m': expected integers and ranges like 1,2,4 or 1-4096" in \
        result.output


def test_each_study_knows_its_buckets_fewest_rows_that_its_kernel_computes():
    """The built-in mm space buckets M by align32: M = 128 answers 97-128, M = 32 answers
    17-32, M = 2 only itself; a `buckets:[4]` space's 1-4 answers mm calls from M = 2 (one
    row is gemv's)."""
    spaces = builtin_spaces(kernel_variants())
    assert spaces["mm"].strategy["M"] == "align32"
    shapes = [Shape(m, 4096, 4096, "bf16", "nt") for m in (2, 32, 128)]
    lows = {p.shape.M: p.low_end for p in plan_studies(shapes, spaces, kernel_for)}
    assert lows == {2: None, 32: Shape(17, 4096, 4096, "bf16", "nt"),
                    128: Shape(97, 4096, 4096, "bf16", "nt")}
    coarse = {**spaces, "mm": dataclasses.replace(
        spaces["mm"], strategy={**spaces["mm"].strategy, "M": "buckets:[4]"})}
    (plan,) = plan_studies([Shape(4, 4096, 4096, "bf16", "nt")], coarse, kernel_for)
    assert plan.low_end == Shape(2, 4096, 4096, "bf16", "nt")


def test_validate_tunes_each_hold_out_shape_for_its_own_rows(tmp_path, monkeypatch):
    """`tune validate`'s fresh tunes are the references of its regrets: none of their
    studies weighs a bucket's fewest rows, which could hand a key to cuBLAS."""
    from tuner import runtime, tuning
    from tuner.formats.files import write_atomic
    from tuner.validate import validate_table

    table, shapes = tmp_path / "t.yaml", tmp_path / "s.csv"
    write_atomic(table, {"format": runtime.TABLE_FORMAT, "ops": {"mm": {
        "strategy": dict.fromkeys(("M", "N", "K", "stride_am", "stride_bk", "dtype"), "default"),
        "entries": [{"key": {"M": 128, "N": 4096, "K": 4096, "stride_am": 4096, "stride_bk": 1,
                             "dtype": "bf16"}, "config": {"variant": "cublas", "pad": 0}}]}}})
    shapes.write_text("M,N,K,dtype,layout\n128,4096,4096,bf16,nt\n100,4096,4096,bf16,nt\n")
    planned = []

    class Tuned(Exception):
        pass

    def tune_plans(db, executor, spaces, plans, *rest):
        planned.extend(plans)
        raise Tuned

    monkeypatch.setattr(tuning, "tune_plans", tune_plans)
    workers = SimpleNamespace(executor=lambda devices: SimpleNamespace(close=lambda: None),
                              default_batch=4)
    with pytest.raises(Tuned):
        validate_table(SimpleNamespace(store=None), table, shapes, 2, 0, workers, (0,), ["tune"])
    assert [p.shape.M for p in planned] == [128] and planned[0].low_end is None
