"""Random and near-valid shapes CSVs and search-space YAMLs fed to the CLI in-process.

Whatever the bytes, `tune run --backend interpret` and `tune suggest` end in a clean error (exit
1 or 2, one 'Error: ...' line, no traceback) or succeed; and a refused run leaves no database
behind, a refused suggestion no output file. Tuning itself is stubbed out (a valid input would
otherwise start trials): what is fuzzed is everything before it.
"""
import os
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.factories import SMALL_SPACE, examples
from tuner.cli import main

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="interpreter CLI tests run on CPU-only machines")
FUZZ = settings(max_examples=examples(40), deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
GOOD_CSV = "M,N,K,dtype,layout,weight\n40,48,64,bf16,nn,1\n"

# -- near-valid shapes CSVs ------------------------------------------------------------------
COLUMNS = ["M", "N", "K", "dtype", "layout", "weight"]
ODD_COLUMNS = ["dtype", "batch", "", " M ", "m", "\ufeffM", "weight "]
TOKENS = ["1", "7", "64", "4096", "0", "-1", "+8", "\uff16\uff14", "4_096", "2147483648",
          "1099511627776", "1e3", "0.5", "inf", "nan", "-inf", "", " 7 ", "bf16", "fp16",
          "fp32", "fp8e4m3", "fp64", "BF16", "nn", "nt", "tn", "tt", "xx", '"', '"4,4"',
          "\x00", "\u00e9", "\r", "\t"]
token = st.one_of(st.sampled_from(TOKENS), st.text(max_size=4),
                  st.integers(-2**70, 2**70).map(str))
header = st.one_of(st.permutations(COLUMNS).flatmap(lambda cols: st.integers(4, 6).map(
                       lambda n: cols[:n])),
                   st.lists(st.sampled_from(COLUMNS + ODD_COLUMNS), min_size=1, max_size=7))


@st.composite
def near_valid_csv(draw) -> bytes:
    columns = draw(header)
    rows = draw(st.lists(st.lists(token, min_size=len(columns) - 1,
                                  max_size=len(columns) + 1), max_size=4))
    newline = draw(st.sampled_from(["\n", "\r\n", "\r"]))
    text = newline.join([",".join(columns), *(",".join(row) for row in rows)]) + newline
    encoding = draw(st.sampled_from(["utf-8", "utf-8-sig", "latin-1", "utf-16"]))
    return text.encode(encoding, errors="replace")


csv_bytes = st.one_of(near_valid_csv(), st.binary(max_size=200),
                      st.binary(max_size=40).map(lambda b: GOOD_CSV.encode() + b))

# -- near-valid search-space YAMLs -----------------------------------------------------------
ODD_VALUES = [0, 3, 7, -1, 48, 2**40, "16", 16.0, True, None, [], [0], [3], [7], [16, 16],
              "x", {"a": 1}, [[16]], [2**63]]


@st.composite
def near_valid_yaml(draw) -> bytes:
    doc = yaml.safe_load(SMALL_SPACE)
    for _ in range(draw(st.integers(1, 3))):
        part = draw(st.sampled_from(["params", "strategy", "top"]))
        target = doc if part == "top" else doc.get(part)
        if not isinstance(target, dict) or not target:
            continue
        name = draw(st.sampled_from(sorted(target) + ["SPLIT_K", "bogus"]))
        action = draw(st.sampled_from(["set", "set", "drop"]))
        if action == "drop":
            target.pop(name, None)
        else:
            target[name] = draw(st.one_of(st.sampled_from(ODD_VALUES),
                                          st.sampled_from(["log", "align7", "default", "mm",
                                                           "gemv", "conv"])))
    text = yaml.safe_dump(doc, sort_keys=False)
    cut = draw(st.one_of(st.none(), st.integers(0, len(text))))
    if cut is not None:  # a text edit: cut short, or a junk character spliced in
        text = text[:cut] + draw(st.sampled_from(["", "[", ":", "\x07", "  BLOCK_M: [16]\n",
                                                  "\u00e9", "\t", "&a", "*a"])) + (
            text[cut:] if draw(st.booleans()) else "")
    return text.encode(draw(st.sampled_from(["utf-8", "latin-1"])), errors="replace")


yaml_bytes = st.one_of(near_valid_yaml(), st.binary(max_size=120))


# -- running the CLI -------------------------------------------------------------------------
def invoke(args: list[str], workdir: Path):
    """The command's result, tuning stubbed out: a run whose input passes every check opens
    the database, plans its studies and returns an empty summary."""
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(workdir)
        mp.delenv("TUNE_DB", raising=False)
        mp.setattr("tuner.tuning.tune_plans", lambda *a, **k: SimpleNamespace(
            tuned=[], skipped=[], busy=[], failed=[], unstarted=[]))
        mp.setattr("tuner.tuning.Workers.executor",
                   lambda self, devices: SimpleNamespace(close=lambda: None))
        return CliRunner().invoke(main, args)


def assert_clean(result) -> bool:
    """Success, or one clean error line; True for an error."""
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"uncaught {result.exception!r}\n{result.output}")
    assert "Traceback" not in result.output, result.output
    assert result.exit_code in (0, 1, 2), result.output
    if result.exit_code == 0:
        return False
    errors = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, result.output
    if result.exit_code == 1:  # failed work: that line and nothing else
        assert result.output.strip() == errors[0], result.output
    return True


def run_args(space: bool) -> list[str]:
    return ["run", "--shapes", "s.csv", *(["--space", "space.yaml"] if space else []),
            "--backend", "interpret", "--trials", "1", "--jobs", "1", "--db",
            "sqlite:///fuzz.db"]


SUGGEST = ["suggest", "--shapes", "s.csv", "--space", "space.yaml", "-o", "out.yaml"]


def check_run(shapes: bytes, space: bytes | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        (workdir / "s.csv").write_bytes(shapes)
        if space is not None:
            (workdir / "space.yaml").write_bytes(space)
        failed = assert_clean(invoke(run_args(space is not None), workdir))
        if failed:
            assert not (workdir / "fuzz.db").exists(), "a refused run created its database"


def check_suggest(shapes: bytes, space: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        (workdir / "s.csv").write_bytes(shapes)
        (workdir / "space.yaml").write_bytes(space)
        failed = assert_clean(invoke(SUGGEST, workdir))
        assert not (workdir / "tune.db").exists()
        if failed:
            assert not (workdir / "out.yaml").exists(), "a refused suggestion wrote its file"


@FUZZ
@given(csv_bytes)
def test_run_with_any_shapes_file_fails_cleanly_or_runs(shapes):
    check_run(shapes, None)


@FUZZ
@given(yaml_bytes)
def test_run_with_any_space_file_fails_cleanly_or_runs(space):
    check_run(GOOD_CSV.encode(), space)


@settings(FUZZ, max_examples=examples(25))
@given(st.one_of(st.just(GOOD_CSV.encode()), csv_bytes), yaml_bytes)
def test_suggest_with_any_inputs_fails_cleanly_or_writes(shapes, space):
    check_suggest(shapes, space)


def test_the_stubbed_run_and_suggest_succeed_on_good_inputs():
    """The fuzz tests' baseline: the unmutated inputs pass, so the errors they see are the
    mutations' (and a successful run does create its database)."""
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        (workdir / "s.csv").write_text(GOOD_CSV)
        (workdir / "space.yaml").write_text(SMALL_SPACE)
        result = invoke(run_args(True), workdir)
        assert result.exit_code == 0, result.output
        assert (workdir / "fuzz.db").exists()
        result = invoke(SUGGEST, workdir)
        assert result.exit_code == 0 and (workdir / "out.yaml").exists(), result.output
