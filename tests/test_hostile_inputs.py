"""Files a careless or hostile user may hand any reader: special files, files past their size
cap, YAML whose aliases would expand without bound, values too long to quote, and files that
parse but do not fit. Each is one line naming the file, fast, before anything is written."""
import copy
import gzip
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from tests.factories import SMALL_SPACE
from tuner.cli import main
from tuner.errors import UserError
from tuner.formats.table import TableError, read_document
from tuner.search.replay import Recording, ReplayError
from tuner.shapes import ShapesError, load_shapes
from tuner.space import SpaceError, load_space
from tuner.textfiles import (
    MAX_ALIAS_NODES,
    BoundedLoader,
    parsed_yaml,
    quoted,
    read_user_file,
)

DATA = Path(__file__).parent / "data"
LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))


def read_shapes(path):
    return load_shapes(path)


def read_space(path):
    from tuner.kernels import kernel_variants
    return load_space(path, kernel_variants())


def read_table(path):
    return read_document(path)


READERS = {"shapes": (read_shapes, ShapesError), "space": (read_space, SpaceError),
           "table": (read_table, TableError), "recording": (Recording.load, ReplayError)}


@pytest.fixture(params=["fifo", "directory", "dev-zero", "socket"])
def special_file(request, tmp_path):
    if request.param == "fifo":
        path = tmp_path / "pipe"
        os.mkfifo(path)
        return path, "a FIFO (named pipe)"
    if request.param == "directory":
        return tmp_path, "a directory"
    if request.param == "socket":
        path = tmp_path / "s.sock"
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
        request.addfinalizer(server.close)
        return path, "a socket"
    return Path("/dev/zero"), "a character device"


@pytest.mark.parametrize("reader", READERS)
def test_every_reader_refuses_a_file_that_is_not_a_regular_one_at_once(reader, special_file):
    read, error = READERS[reader]
    path, kind = special_file
    start = time.perf_counter()
    with pytest.raises(error) as e:
        read(path)
    assert time.perf_counter() - start < 1
    assert str(path) in str(e.value) and f"it is {kind}, not a regular file" in str(e.value)


def test_a_file_past_its_cap_is_refused_naming_the_cap(tmp_path):
    path = tmp_path / "big"
    path.write_bytes(b"x" * 1025)
    with pytest.raises(ShapesError, match=r"big: cannot read shapes file: larger than 1024 "
                                          r"bytes, the most a shapes file may hold"):
        read_user_file(path, "shapes file", 1024, ShapesError)
    assert read_user_file(path, "shapes file", 1025, ShapesError) == b"x" * 1025


@pytest.mark.parametrize("module, name", [("tuner.shapes", "MAX_SHAPES_BYTES"),
                                          ("tuner.space", "MAX_SPACE_BYTES"),
                                          ("tuner.formats.table", "MAX_TABLE_BYTES"),
                                          ("tuner.search.replay", "MAX_RECORDING_BYTES")])
def test_each_kind_of_file_has_a_generous_cap(module, name):
    import importlib
    assert 1 << 20 <= getattr(importlib.import_module(module), name) <= 64 << 20


def test_billion_laughs_is_refused_fast_in_every_yaml_reader(tmp_path):
    path = tmp_path / "laughs.yaml"
    path.write_text(LAUGHS)
    for reader in ("space", "table"):
        read, error = READERS[reader]
        start = time.perf_counter()
        with pytest.raises(error, match="aliases expand the document past"):
            read(path)
        assert time.perf_counter() - start < 0.5


def test_aliases_that_add_little_still_load_and_recursive_ones_do_not():
    assert parsed_yaml("a: &x [16, 32]\nb: *x\n", "f", ValueError) == {"a": [16, 32],
                                                                       "b": [16, 32]}
    with pytest.raises(ValueError, match="an alias refers to a node inside itself"):
        parsed_yaml("a: &x [1, *x]\n", "f", ValueError)
    many = "a: &x [" + ", ".join(["1"] * 1000) + "]\nb: [" + ", ".join(["*x"] * 200) + "]\n"
    with pytest.raises(ValueError, match=f"past {MAX_ALIAS_NODES} more nodes"):
        parsed_yaml(many, "f", ValueError)


@pytest.mark.slow
def test_a_deeply_nested_yaml_is_one_line():
    with pytest.raises(ValueError, match="nested too deeply|not valid YAML"):
        parsed_yaml("[" * 100_000 + "]" * 100_000, "f", ValueError)


@pytest.mark.skipif(not yaml.__with_libyaml__, reason="PyYAML built without libyaml")
def test_yaml_events_come_from_libyaml_and_nodes_from_the_bounded_composer():
    """libyaml's parser makes a table's first load a few times faster than PyYAML's own; the
    composer stays PyYAML's, whose recursion stops at an error (the test above), where
    libyaml's would crash."""
    assert issubclass(BoundedLoader, yaml.CSafeLoader)
    assert BoundedLoader.compose_node is yaml.composer.Composer.compose_node


@pytest.mark.slow
def test_the_shapes_csv_parses_in_linear_time(tmp_path):
    path = tmp_path / "big.csv"
    path.write_text("M,N,K,dtype\n" + "".join(f"{i + 1},{i % 977 + 1},{i % 13 + 1},bf16\n"
                                              for i in range(50_000)))
    start = time.process_time()  # CPU time: the machine may be shared
    shapes = load_shapes(path)
    assert len(shapes) == 50_000 and time.process_time() - start < 5


def test_a_header_of_many_columns_is_refused_fast(tmp_path):
    path = tmp_path / "wide.csv"
    path.write_text(",".join(f"c{i}" for i in range(200_000)) + "\n")
    start = time.process_time()
    with pytest.raises(ShapesError, match="header must be"):
        load_shapes(path)
    assert time.process_time() - start < 2


@pytest.mark.parametrize("row, words", [
    ("1,1,1," + "b" * 100_000 + ",nn,1", "dtype must be one of"),
    ("9" * 100_000 + ",1,1,bf16,nn,1", "M must be <= 2**31-1"),
    ("1,1,1,bf16,nn," + "7" * 100_000 + "x", "weight must be"),
], ids=["dtype", "M", "weight"])
def test_a_long_value_is_quoted_short(tmp_path, row, words):
    path = tmp_path / "s.csv"
    path.write_text("M,N,K,dtype,layout,weight\n" + row + "\n")
    with pytest.raises(ShapesError) as e:
        load_shapes(path)
    assert words in str(e.value) and len(str(e.value)) < len(str(path)) + 200


def test_quoted_cuts_a_value_to_a_few_dozen_characters():
    assert quoted("abc") == "'abc'" and quoted(7) == "7"
    assert len(quoted("x" * 10_000)) == 60 and quoted("x" * 10_000).endswith("...")


def test_a_space_files_unknown_top_level_key_is_an_error(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text(SMALL_SPACE + "stratgey: log\n")
    with pytest.raises(SpaceError, match="field 'stratgey': expected only the fields kernel, "
                                         "params, strategy"):
        read_space(path)


# -- through the CLI ----------------------------------------------------------------------------
def invoke(args, workdir):
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(workdir)
        mp.delenv("TUNE_DB", raising=False)
        return CliRunner().invoke(main, args)


def assert_one_line(result, code, words):
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        result.exception)
    assert result.exit_code == code, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and words in errors[0], result.output
    return errors[0]


@pytest.fixture
def workdir(tmp_path):
    (tmp_path / "s.csv").write_text("M,N,K,dtype\n64,64,64,bf16\n")
    (tmp_path / "space.yaml").write_text(SMALL_SPACE)
    return tmp_path


def test_a_fifo_as_the_shapes_file_is_one_line_not_a_hang(workdir):
    os.mkfifo(workdir / "pipe.csv")
    result = invoke(["suggest", "--shapes", "pipe.csv", "-o", "out.yaml"], workdir)
    assert_one_line(result, 1, "pipe.csv: cannot read shapes file: it is a FIFO")
    assert not (workdir / "out.yaml").exists()


def test_the_same_kernels_space_given_twice_is_a_usage_error(workdir):
    result = invoke(["suggest", "--shapes", "s.csv", "--space", "space.yaml", "--space",
                     "space.yaml", "-o", "out.yaml"], workdir)
    assert_one_line(result, 2, "--space space.yaml and --space space.yaml are both for "
                               "kernel mm; give one space per kernel")
    assert not (workdir / "out.yaml").exists()


@pytest.mark.parametrize("text, words", [
    ("format: gemm-tuner-table/2\nops: [mm]\n", "field 'ops': expected a mapping of op"),
    ("[1, 2]\n", "not a 'gemm-tuner-table/2' file"),
    (LAUGHS, "aliases expand the document past"),
], ids=["list-ops", "not-a-table", "laughs"])
@pytest.mark.parametrize("fmt", ["expand", "tune-configs"])
def test_export_of_a_table_that_is_not_one_is_one_line(workdir, text, words, fmt):
    (workdir / "t.yaml").write_text(text)
    result = invoke(["export", fmt, "--table", "t.yaml", "-o", "out.yaml"], workdir)
    assert_one_line(result, 1, words)
    assert not (workdir / "out.yaml").exists()


def test_lookup_with_tune_config_naming_no_file_is_one_line(workdir, monkeypatch):
    from tuner import runtime

    monkeypatch.setenv("TUNE_CONFIG", "nope.yaml")
    runtime.clear_cache()
    result = invoke(["lookup", "64", "64", "64", "--dtype", "bf16"], workdir)
    runtime.clear_cache()
    assert_one_line(result, 1, "gemm-tuner table nope.yaml: No such file or directory")


def recording(tmp_path, edit) -> Path:
    doc = json.loads(gzip.decompress((DATA / "recording-h200.json.gz").read_bytes()))
    edit(doc)
    path = tmp_path / "r.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return path


@pytest.mark.parametrize("edit, words", [
    (lambda d: d["shapes"][0].update(shape=[0, 0, 0, "bf16", "nn"]),
     "M must be an integer from 1 to 2**31-1, got 0"),
    (lambda d: d["shapes"][0].update(shape="8192x8192"), "shape must be [M, N, K, dtype, "
                                                          "layout], got '8192x8192'"),
    (lambda d: d["shapes"][0]["configs"][0].__setitem__(1, "fast"),
     "a config's TF/s must be a number >= 0, got 'fast'"),
    (lambda d: d["shapes"][0]["configs"][0].__setitem__(0, [1, 2]), "not a gemm-tuner"),
    (lambda d: d["device"].update(sm_count="many"), "device sm_count must be int"),
    (lambda d: d["shapes"][0].update(kernel=[1]), "kernel [1] is not one of"),
    (lambda d: d["shapes"][0].update(space=5), "space must be YAML text, got 5"),
    (lambda d: d["shapes"][0].update(space=LAUGHS), "aliases expand the document past"),
    (lambda d: d.update(shapes="x"), "not a gemm-tuner recording"),
])
def test_replay_of_a_recording_with_wrong_values_is_one_line(tmp_path, edit, words):
    path = recording(tmp_path, edit)
    result = invoke(["replay", "--recording", str(path), "--strategies", "random", "--seeds",
                     "1", "--trials", "2", "--jobs", "1"], tmp_path)
    assert_one_line(result, 1, words)


def test_a_recording_that_unpacks_past_its_cap_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr("tuner.search.replay.MAX_RECORDING_BYTES", 1 << 20)
    path = tmp_path / "bomb.json.gz"
    path.write_bytes(gzip.compress(b" " * (8 << 20)))
    with pytest.raises(ReplayError, match="unpacks to more than 1 MiB"):
        Recording.load(path)


# -- environment --------------------------------------------------------------------------------
def tune(args, tmp_path, **env):
    return subprocess.run([sys.executable, "-c", "from tuner.cli import main; main()", *args],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(tmp_path), **env})


@pytest.mark.slow
@pytest.mark.parametrize("module, source, words", [
    ("nosuchmod", None, "kernel module 'nosuchmod' cannot be imported (ModuleNotFoundError: "
                        "No module named 'nosuchmod')"),
    ("emptymod", "", "kernel module 'emptymod' must define KERNEL, a "
                     "tuner.kernels.base.Kernel; got None"),
    ("badmod", "raise RuntimeError('boom')", "cannot be imported (RuntimeError: boom)"),
], ids=["missing", "empty", "failing"])
def test_a_kernel_module_that_is_missing_or_empty_is_one_line(workdir, module, source, words):
    if source is not None:
        (workdir / f"{module}.py").write_text(source)
    done = tune(["suggest", "--shapes", "s.csv", "-o", "out.yaml"], workdir,
                TUNE_KERNEL_MODULES=module)
    assert done.returncode == 1 and done.stderr.startswith("Error: $TUNE_KERNEL_MODULES: ")
    assert words in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
    assert not (workdir / "out.yaml").exists()


def test_a_missing_strategy_module_is_reported_as_such(workdir, monkeypatch):
    (workdir / "mine.yaml").write_text(SMALL_SPACE.replace("M: align32", "M: mine"))
    monkeypatch.setenv("TUNE_STRATEGY_MODULES", "nosuchstrategies")
    result = invoke(["suggest", "--shapes", "s.csv", "--space", "mine.yaml", "-o", "out.yaml"],
                    workdir)
    line = assert_one_line(result, 1, "mine.yaml: field 'strategy.M': $TUNE_STRATEGY_MODULES: "
                                      "cannot import strategy module 'nosuchstrategies'")
    assert "unknown" not in line


@pytest.mark.parametrize("setup, name, words", [
    (lambda d: (d / "f.csv").mkdir(), "f.csv", "cannot write {d}/f.csv: it is a folder"),
    (lambda d: (d / "f.csv").write_text("not,shapes\n"), "f.csv", "header must be"),
    (lambda d: os.mkfifo(d / "f.skipped.csv"), "f.csv", "f.skipped.csv: not a regular file"),
    (lambda d: (d / "f.skipped.csv").write_bytes(b"\xff"), "f.csv", "expected UTF-8 text"),
], ids=["folder", "not-shapes", "fifo-skipped", "binary-skipped"])
def test_a_recording_refuses_its_files_before_the_block_runs(tmp_path, setup, name, words):
    import tuner

    setup(tmp_path)
    ran = []
    with pytest.raises(UserError, match=words.format(d=tmp_path).replace(".", r"\.")):
        with tuner.record(tmp_path / name):
            ran.append(True)
    assert not ran


def test_user_errors_of_every_reader_are_user_errors():
    for _, error in READERS.values():
        assert issubclass(error, UserError)


def test_an_export_shares_no_yaml_anchor(tmp_path):
    from tuner.formats.files import yaml_text
    shared = {"variant": "general"}
    text = yaml_text({"a": shared, "b": shared, "c": copy.copy(shared)})
    assert "&" not in text and "*" not in text


# -- expand files: checked whole at load, as tables are ------------------------------------------
def _mm(doc):
    return doc["mm_general_tma"][0]


SPLITK_ENTRY = [{"param_map": {"META": {"BLOCK_M": "block_m", "BLOCK_N": "block_n",
                                        "BLOCK_K": "block_k"},
                               "num_stages": "stages", "num_warps": "warps"},
                 "block_m": [32], "block_n": [32], "block_k": [32], "stages": [2],
                 "warps": [4]}, {"strategy": {}}]


@pytest.mark.parametrize("edit, words", [
    (lambda d: _mm(d).update(block_m=[48]), "field 'mm_general_tma.block_m' (BLOCK_M): "
     "expected a non-empty list of powers of two from 1 to 4096 (tl.arange and tl.dot tile "
     "sides), got 48 in [48]"),
    (lambda d: _mm(d).update(block_m=[-16]), "got -16 in [-16]"),
    (lambda d: _mm(d).update(block_n=[2**40]), "(BLOCK_N): expected a non-empty list of powers"),
    (lambda d: _mm(d).update(block_k=["64"]), "(BLOCK_K): expected a non-empty list of powers "
     "of two from 1 to 4096 (tl.arange and tl.dot tile sides), got '64' in ['64']"),
    (lambda d: _mm(d).update(block_m=[True]), "got True in [True]"),
    (lambda d: _mm(d).update(block_m=[64.0]), "got 64.0 in [64.0]"),
    (lambda d: _mm(d).update(block_m=64), "(BLOCK_M): expected a non-empty list of powers of "
     "two from 1 to 4096 (tl.arange and tl.dot tile sides), got 64"),
    (lambda d: _mm(d).update(block_m=[]), "got []"),
    (lambda d: _mm(d).update(warps=[3]), "field 'mm_general_tma.warps' (num_warps): expected a "
     "non-empty list of values among 1, 2, 4, 8, 16, 32, got 3 in [3]"),
    (lambda d: _mm(d).update(stages=[0]), "(num_stages): expected a non-empty list of integers "
     "from 1 to 16, got 0 in [0]"),
    (lambda d: _mm(d).pop("block_k"), "field 'mm_general_tma.param_map.META.BLOCK_K': expected "
     "the name of a list this entry holds, got 'block_k'"),
    (lambda d: _mm(d)["param_map"]["META"].pop("BLOCK_K"),
     "field 'mm_general_tma.param_map.META': names no list for BLOCK_K, which FlagGems reads"),
    (lambda d: _mm(d)["param_map"].pop("num_warps"), "field 'mm_general_tma.param_map."
     "num_warps': names no list for num_warps, which FlagGems reads"),
    (lambda d: _mm(d)["param_map"]["META"].update(BLOCK_M=5),
     "field 'mm_general_tma.param_map.META.BLOCK_M': expected the name of a list this entry "
     "holds, got 5"),
    (lambda d: _mm(d).update(param_map=[1]), "field 'mm_general_tma.param_map': expected a "
     "mapping with META (parameter to list name), num_stages and num_warps, got [1]"),
    (lambda d: d["mm_general_tma"][1].update(strategy=[1]), "field 'mm_general_tma.strategy': "
     "expected a mapping of some of M, N, K, stride_am, stride_bk, dtype to a bucketing "
     "strategy, got [1]"),
    (lambda d: d["mm_general_tma"][1].update(strategy={"Q": "log"}), "got {'Q': 'log'}"),
    (lambda d: d["mm_general_tma"][1].update(strategy={"M": "nope"}),
     "field 'mm_general_tma.strategy': bucketing strategy 'nope': unknown"),
    (lambda d: d["gemv"][0].update(block_k=[0]), "field 'gemv.block_k' (BLOCK_K): expected"),
    (lambda d: d.update(mm_splitk=SPLITK_ENTRY), "field 'mm_splitk': splitk configs need a "
     "list for each of SPLIT_K"),
], ids=["BLOCK_M-48", "negative", "huge", "string", "bool", "float", "scalar", "empty",
        "warps-3", "stages-0", "list-missing", "META-missing", "warps-unmapped", "list-name-int",
        "param_map-list", "strategy-list", "strategy-field", "strategy-name", "gemv-0",
        "splitk-missing"])
def test_an_expand_file_with_a_bad_value_is_one_error_at_load(tmp_path, edit, words):
    from tests.test_runtime_expand import expand_doc, write_expand
    from tuner.runtime.lookup import open_table

    doc = expand_doc()
    edit(doc)
    path = write_expand(tmp_path / "e.yaml", doc)
    with pytest.raises(UserError) as e:
        open_table(path)
    assert str(e.value).startswith(f"gemm-tuner expand file {path}: ")
    assert words in str(e.value) and "\n" not in str(e.value)


def test_an_expand_files_op_of_other_kernels_is_left_unread(tmp_path):
    from tests.test_runtime_expand import expand_doc, write_expand
    from tuner.runtime.lookup import open_table

    doc = expand_doc() | {"mm_other": [{"param_map": {"META": {"X": "x"}}, "x": [-1]}]}
    assert set(open_table(write_expand(tmp_path / "e.yaml", doc)).expand_ops) == {
        "mm_general_tma", "gemv"}
