"""Shapes CSV and search-space YAML: good files load, bad ones fail with file, line and field."""

import re

import pytest

from tests.factories import INTERPRETER, VARIANTS, error_line, tune
from tuner.bucketing.strategies import KEY_FIELDS
from tuner.shapes import Shape, ShapesError, load_shapes
from tuner.space import SpaceError, load_space, parse_space


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_shapes_with_all_columns(tmp_path):
    path = write(tmp_path, "s.csv", "M,N,K,dtype,layout,weight\n1,6144,4096,bf16,nt,3\n"
                                    "77,768,768,fp16,tn,0.5\n")
    a, b = load_shapes(path)
    assert a == Shape(1, 6144, 4096, "bf16", "nt", 3.0)
    assert (a.stride_am, a.stride_bk) == (4096, 1)
    assert (b.stride_am, b.stride_bk) == (1, 768)


def test_layout_defaults_to_nn_and_duplicates_collapse(tmp_path):
    path = write(tmp_path, "s.csv", "M,N,K,dtype\n8,16,32,fp32\n8,16,32,fp32\n")
    (shape,) = load_shapes(path)
    assert shape.layout == "nn" and shape.weight == 1.0
    assert (shape.stride_am, shape.stride_bk) == (32, 16)


@pytest.mark.parametrize("body, line, words", [
    ("8,16,32,fp64,nn\n", 2, "dtype must be one of fp16, bf16, fp32"),
    ("8,16,32,bf16,nn\n8,0,32,bf16,nn\n", 3, "N must be >= 1"),
    ("8,16,x,bf16,nn\n", 2, "K must be an integer"),
    ("8,16,32,bf16,tx\n", 2, "layout must be one of"),
    ("8,16,32,bf16\n", 2, "expected 5 columns"),
    ("8,16,32,bf16,nn,7\n", 2, "expected 5 columns"),
])
def test_bad_row_names_its_line(tmp_path, body, line, words):
    path = write(tmp_path, "s.csv", "M,N,K,dtype,layout\n" + body)
    with pytest.raises(ShapesError) as e:
        load_shapes(path)
    assert str(e.value).startswith(f"{path}:{line}: ")
    assert words in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("body, line, words", [
    ("\uff16\uff14,16,32,bf16,nn,1\n", 2, "M must be an integer (ASCII digits), got '６４'"),
    ("4_096,16,32,bf16,nn,1\n", 2, "M must be an integer (ASCII digits), got '4_096'"),
    ("8,16,32,bf16,nn,1\n2147483648,16,32,bf16,nn,1\n", 3, "M must be <= 2**31-1"),
    ("1099511627776,16,32,bf16,nn,1\n", 2, "M must be <= 2**31-1 (2147483647), got 1099511627776"),
    ("2000000000,2000000000,32,bf16,nn,1\n", 2, "C would hold M*N = 4000000000000000000"),
    ("8,16,32,bf16,nn,inf\n", 2, "weight must be a finite decimal number > 0, got 'inf'"),
    ("8,16,32,bf16,nn,nan\n", 2, "weight must be a finite decimal number > 0, got 'nan'"),
    ("8,16,32,bf16,nn,1e999\n", 2, "weight must be a finite decimal number > 0, got '1e999'"),
    ("8,16,32,bf16,nn,-2\n", 2, "weight must be a finite decimal number > 0, got '-2'"),
    ("8,16,32,bf16,nn,1_0\n", 2, "weight must be a finite decimal number > 0, got '1_0'"),
])
def test_numbers_are_ascii_bounded_and_finite(tmp_path, body, line, words):
    path = write(tmp_path, "s.csv", "M,N,K,dtype,layout,weight\n" + body)
    with pytest.raises(ShapesError) as e:
        load_shapes(path)
    assert str(e.value).startswith(f"{path}:{line}: {words}") and "\n" not in str(e.value)


def test_bom_is_read_and_other_encodings_name_their_line(tmp_path):
    path = tmp_path / "bom.csv"
    path.write_bytes("\ufeffM,N,K,dtype\n8,16,32,fp16\n".encode())
    assert load_shapes(path) == [Shape(8, 16, 32, "fp16")]
    latin = tmp_path / "latin1.csv"
    latin.write_bytes(b"M,N,K,dtype\n8,16,32,fp16\n9,16,32,bf16\xa0\n")
    with pytest.raises(ShapesError, match=r"latin1.csv:3: expected UTF-8 text, got byte 0xa0$"):
        load_shapes(latin)
    nul = write(tmp_path, "nul.csv", "M,N,K,dtype\n8,16,\x0032,fp16\n")
    with pytest.raises(ShapesError, match=r"nul.csv:2: expected CSV text, got a NUL byte"):
        load_shapes(nul)


def test_a_column_named_twice_is_refused(tmp_path):
    with pytest.raises(ShapesError, match=r"s.csv:1: header names column 'dtype' twice"):
        load_shapes(write(tmp_path, "s.csv", "M,N,K,dtype,dtype\n1,2,3,fp16,bf16\n"))


def test_bad_header_and_missing_file(tmp_path):
    with pytest.raises(ShapesError, match=r":1: header must be .*missing dtype"):
        load_shapes(write(tmp_path, "s.csv", "M,N,K\n1,2,3\n"))
    with pytest.raises(ShapesError, match="unknown column 'batch'"):
        load_shapes(write(tmp_path, "s.csv", "M,N,K,dtype,batch\n1,2,3,fp16,4\n"))
    with pytest.raises(ShapesError, match="cannot read shapes file"):
        load_shapes(tmp_path / "absent.csv")
    with pytest.raises(ShapesError, match="no shapes listed"):
        load_shapes(write(tmp_path, "s.csv", "M,N,K,dtype\n"))


GOOD_SPACE = """
kernel: mm
params:
  variant: [general]
  pad: [0, 64]
  BLOCK_M: [32, 64]
  BLOCK_N: [32]
  BLOCK_K: [32]
  GROUP_M: [8]
  num_stages: [2, 3]
  num_warps: [4]
strategy: {M: align32, N: log, K: default, stride_am: align32, stride_bk: align32, dtype: default}
"""


def test_space_loads_and_hash_ignores_formatting(tmp_path):
    a = load_space(write(tmp_path, "a.yaml", GOOD_SPACE), VARIANTS)
    b = load_space(write(tmp_path, "b.yaml", "# comment\n" + GOOD_SPACE), VARIANTS)
    assert a.params["BLOCK_M"] == (32, 64) and a.size == 8
    assert a.hash == b.hash
    c = load_space(write(tmp_path, "c.yaml", GOOD_SPACE.replace("[32, 64]", "[32, 128]")),
                   VARIANTS)
    assert c.hash != a.hash


@pytest.mark.parametrize("old, new, field, expected", [
    ("kernel: mm", "kernel: conv", "kernel", "one of mm"),
    ("BLOCK_M: [32, 64]", "BLOCK_M: []", "params.BLOCK_M", "non-empty list of powers of two"),
    ("BLOCK_M: [32, 64]", "BLOCK_M: [32, -1]", "params.BLOCK_M", "got -1 in [32, -1]"),
    ("BLOCK_M: [32, 64]", "BLOCK_M: [0]", "params.BLOCK_M", "powers of two from 1 to 4096"),
    ("BLOCK_M: [32, 64]", "BLOCK_M: [32, 48]", "params.BLOCK_M", "got 48 in [32, 48]"),
    ("BLOCK_N: [32]", "BLOCK_N: [true]", "params.BLOCK_N", "got True"),
    ("BLOCK_K: [32]", "BLOCK_K: [32.0]", "params.BLOCK_K", "got 32.0"),
    ("num_warps: [4]", "num_warps: [3]", "params.num_warps", "among 1, 2, 4, 8, 16, 32, got 3"),
    ("num_stages: [2, 3]", "num_stages: [0]", "params.num_stages", "from 1 to 16, got 0"),
    ("pad: [0, 64]", "pad: [7]", "params.pad", "0 (no padding) or powers of two from 8"),
    ("GROUP_M: [8]", "GROUP_M: [0]", "params.GROUP_M", "from 1 to 4096, got 0"),
    ("  num_warps: [4]\n", "", "params.num_warps", "non-empty list"),
    ("GROUP_M: [8]", "GROUP_M: [8]\n  SPLIT_K: [2]", "params.SPLIT_K",
     "a parameter of variants general"),
    ("variant: [general]", "variant: [general, splitk]", "params.SPLIT_K", "non-empty list"),
    ("variant: [general]", "variant: [gemv]", "params.variant", "list of general, splitk"),
    ("variant: [general]", "variant: []", "params.variant", "non-empty list"),
    ("  pad: [0, 64]\n", "", "params.pad", "non-empty list"),
    ("N: log", "N: align7", "strategy.N", "one of default, align8, align16, align32"),
    ("dtype: default", "dtype: log", "strategy.dtype", "one of default"),
    ("stride_bk: align32, ", "", "strategy.stride_bk", "one of"),
])
def test_bad_space_names_file_field_and_expectation(tmp_path, old, new, field, expected):
    assert old in GOOD_SPACE
    path = write(tmp_path, "bad.yaml", GOOD_SPACE.replace(old, new))
    with pytest.raises(SpaceError) as e:
        load_space(path, VARIANTS)
    message = str(e.value)
    assert message.startswith(f"{path}: field '{field}': expected ") and expected in message
    assert "\n" not in message


def test_space_that_is_not_yaml_or_not_a_mapping(tmp_path):
    with pytest.raises(SpaceError, match=r"bad.yaml:\d+: not valid YAML"):
        load_space(write(tmp_path, "bad.yaml", "kernel: mm\nparams: [1,\n"), VARIANTS)
    with pytest.raises(SpaceError, match=r"bad.yaml:7: not valid YAML \(key 'BLOCK_M' given "):
        load_space(write(tmp_path, "bad.yaml", GOOD_SPACE.replace(
            "  BLOCK_N: [32]", "  BLOCK_M: [16]")), VARIANTS)
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"kernel: mm\n# caf\xe9\n")
    with pytest.raises(SpaceError, match=r"latin1.yaml:2: expected UTF-8 text, got byte 0xe9"):
        load_space(path, VARIANTS)
    with pytest.raises(SpaceError, match=r"ctl.yaml:2: not valid YAML \((control|special) "
                       r"characters"):
        load_space(write(tmp_path, "ctl.yaml", "kernel: mm\nparams: \x07\n"), VARIANTS)
    with pytest.raises(SpaceError, match="field '<top level>'"):
        parse_space(["a"], "x.yaml", VARIANTS)


class FixedTrial:
    """Stands in for an Optuna trial: answers each suggestion with the first choice, or the
    value named in `picks`, and records what was asked."""

    def __init__(self, **picks):
        self.picks, self.asked = picks, []

    def suggest_categorical(self, name, choices):
        self.asked.append(name)
        return self.picks.get(name, choices[0])


def test_conditional_space_draws_only_the_chosen_variants_parameters(tmp_path):
    text = GOOD_SPACE.replace("variant: [general]", "variant: [general, splitk]").replace(
        "GROUP_M: [8]", "GROUP_M: [8]\n  SPLIT_K: [2, 4, 8]")
    space = load_space(write(tmp_path, "s.yaml", text), VARIANTS)
    assert space.size == 8 + 8 * 3  # general: 2*2*2; splitk: the same times 3 SPLIT_K values
    general = FixedTrial()
    assert "SPLIT_K" not in space.suggest(general) and "SPLIT_K" not in general.asked
    configs = list(space.configs())
    assert len(configs) == space.size == len({tuple(c.items()) for c in configs})
    assert all(("SPLIT_K" in c) == (c["variant"] == "splitk") for c in configs)
    config = space.suggest(FixedTrial(variant="splitk", SPLIT_K=8))
    assert config["variant"] == "splitk" and config["SPLIT_K"] == 8
    assert list(config)[:2] == ["variant", "pad"]


def test_a_space_without_variants_drops_them_and_the_parameters_only_they_read(tmp_path):
    text = GOOD_SPACE.replace("variant: [general]", "variant: [general, splitk]").replace(
        "GROUP_M: [8]", "GROUP_M: [8]\n  SPLIT_K: [2, 4, 8]")
    space = load_space(write(tmp_path, "s.yaml", text), VARIANTS)
    general_only = space.without(frozenset({"splitk", "cublas"}))
    assert general_only.params["variant"] == ("general",) and "SPLIT_K" not in general_only.params
    assert list(general_only.params) == [p for p in space.params if p != "SPLIT_K"]
    assert general_only.size == 8 and general_only.hash != space.hash
    assert general_only.source.endswith("s.yaml less splitk")
    assert space.without(frozenset({"cublas"})) is space
    with pytest.raises(SpaceError, match="s.yaml: excluding general, splitk leaves kernel mm no "
                                         "variant to search"):
        space.without(frozenset({"general", "splitk"}))


# -- the command line: every bad flag or file is one line, and nothing is written -----------


@pytest.mark.parametrize("args, words", [
    (["--seed", "-3"], "Invalid value for '--seed': -3 is not in the range 0<=x<=4294967295"),
    (["--timeout", "nan"], "Invalid value for '--timeout': expected a finite number, got 'nan'"),
    (["--compile-timeout", "inf"], "'--compile-timeout': expected a finite number, got 'inf'"),
    (["--db", ""], "Invalid value for '--db': expected a database URL such as sqlite:///tune.db, "
                   "got ''"),
    (["--db", "sqlite://"], "'--db': 'sqlite://' is an in-memory database, gone when the "
                            "command ends; expected a file"),
    (["--db", "sqlite:///:memory:"], "'sqlite:///:memory:' is an in-memory database"),
])
def test_bad_run_flags_are_usage_errors(shapes_dir, args, words):
    result = tune("run", "--shapes", "s.csv", "--backend", "interpret", *args)
    assert result.exit_code == 2 and words in error_line(result)
    assert sorted(p.name for p in shapes_dir.iterdir()) == ["s.csv"]


def test_an_unknown_variant_to_exclude_is_one_line_before_anything_runs(shapes_dir,
                                                                           monkeypatch):
    monkeypatch.setenv("TUNE_EXCLUDE", "cublas,cubals")
    result = tune("run", "--shapes", "s.csv", "--backend", "interpret")
    assert result.exit_code == 2
    assert "TUNE_EXCLUDE names unknown variant(s) cubals; known: cublas" in error_line(result)
    assert sorted(p.name for p in shapes_dir.iterdir()) == ["s.csv"]


@pytest.mark.parametrize("args", [["show"], ["show", "--failures"],
                                  ["export", "table", "-o", "x.yaml"], ["replay"]])
def test_read_only_commands_never_create_a_database(shapes_dir, args):
    result = tune(*args)
    assert result.exit_code == 1
    assert error_line(result) == ("Error: no database at tune.db (--db sqlite:///tune.db); "
                                  "`tune run` creates one")
    assert sorted(p.name for p in shapes_dir.iterdir()) == ["s.csv"]
    result = tune(*args, "--db", f"sqlite:///{shapes_dir / 'typo.db'}")
    assert f"no database at {shapes_dir / 'typo.db'}" in error_line(result)
    assert sorted(p.name for p in shapes_dir.iterdir()) == ["s.csv"]


def test_show_failures_with_none_is_no_error(shapes_dir):
    from tuner.db.session import session_factory
    from tuner.db.store import Store

    Store(session_factory(f"sqlite:///{shapes_dir / 'tune.db'}"))  # an empty database
    result = tune("show", "--failures")
    assert result.exit_code == 0 and result.output.strip() == "no remembered failures"


def test_suggest_refuses_a_device_the_model_does_not_know(shapes_dir):
    result = tune("suggest", "--shapes", "s.csv", "--device", "Bogus GPU", "-o", "o.yaml")
    assert result.exit_code == 2
    assert error_line(result) == (
        "Error: Invalid value for '--device': no model of a GPU named 'Bogus GPU'; expected a "
        "name containing one of H200 NVL, H200, H100 NVL, H100 PCIe, H100, A100 (e.g. "
        "'NVIDIA H200')")
    assert not (shapes_dir / "o.yaml").exists()


@pytest.mark.slow
def test_an_output_that_cannot_be_written_is_one_line(shapes_dir):
    (shapes_dir / "file").write_text("")
    result = tune("suggest", "--shapes", "s.csv", "-o", "file/o.yaml")
    assert result.exit_code == 1
    assert error_line(result) == "Error: cannot write file/o.yaml: file is not a folder"
    assert tune("suggest", "--shapes", "s.csv", "-o", "t.yaml").exit_code == 0
    result = tune("export", "expand", "--table", "t.yaml", "-o", "file/x.yaml")
    assert result.exit_code == 1
    assert error_line(result) == "Error: cannot write file/x.yaml: file is not a folder"
    assert not (shapes_dir / "tune.db").exists()


def test_export_from_a_malformed_table_file_is_one_line(shapes_dir):
    (shapes_dir / "bad.yaml").write_text("format: [\n")
    result = tune("export", "expand", "--table", "bad.yaml", "-o", "out.yaml")
    assert result.exit_code == 1
    assert re.fullmatch(r"Error: gemm-tuner table bad.yaml:2: not valid YAML \((did not find "
                        r"expected node content|expected the node content, but found "
                        r"'<stream end>')\)", error_line(result))
    assert sorted(p.name for p in shapes_dir.iterdir()) == ["bad.yaml", "s.csv"]


@INTERPRETER
def test_validate_with_a_file_that_is_no_table(shapes_dir):
    result = tune("validate", "--config", "s.csv", "--shapes", "s.csv", "--backend",
                  "interpret")
    assert result.exit_code == 1
    assert error_line(result) == ("Error: gemm-tuner table s.csv: not a 'gemm-tuner-table/2' "
                                  "file (write one with `tune export table`)")
    assert sorted(p.name for p in shapes_dir.iterdir()) == ["s.csv"]


@INTERPRETER
def test_a_read_only_database_is_one_line(shapes_dir):
    from tuner.db.session import session_factory
    from tuner.db.store import Store

    Store(session_factory(f"sqlite:///{shapes_dir / 'ro.db'}"))
    url = f"sqlite:///file:{shapes_dir / 'ro.db'}?mode=ro&uri=true"
    result = tune("run", "--shapes", "s.csv", "--backend", "interpret", "--jobs", "1",
                  "--trials", "1", "--db", url)
    assert result.exit_code == 1
    assert error_line(result).endswith("attempt to write a readonly database")


# -- the runtime: a bad key or table is a ValueError of one line -----------------------------
@pytest.fixture
def table(tmp_path):
    from tuner import runtime
    from tuner.formats.files import write_atomic

    runtime.clear_cache()
    key = {"M": 64, "N": 64, "K": 64, "stride_am": 64, "stride_bk": 64, "dtype": "bf16"}
    config = {"variant": "general", "pad": 0, "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32,
              "GROUP_M": 8, "num_stages": 3, "num_warps": 4}
    doc = {"format": runtime.TABLE_FORMAT, "device": {"name": "NVIDIA H100 80GB HBM3"},
           "ops": {"mm": {"strategy": dict.fromkeys(KEY_FIELDS, "default"),
                          "entries": [{"key": key, "config": config}]}}}
    write_atomic(tmp_path / "t.yaml", doc)
    yield tmp_path / "t.yaml", doc
    runtime.clear_cache()


@pytest.mark.parametrize("change, words", [
    ({"M": 0}, "gemm-tuner: mm M must be from 1 to 2**31-1, got 0"),
    ({"M": -5}, "gemm-tuner: mm M must be from 1 to 2**31-1, got -5"),
    ({"K": 2**40}, "gemm-tuner: mm K must be from 1 to 2**31-1, got 1099511627776"),
    ({"N": 3.5}, "gemm-tuner: mm N must be an int, got 3.5 (float)"),
    ({"stride_am": -1}, "gemm-tuner: mm stride_am must be from 0 to 2**31-1, got -1"),
    ({"dtype": "int3"}, "gemm-tuner: mm dtype must be one of fp16, bf16, fp32, fp8e4m3, got "
                        "'int3'"),
    ({"op": "conv"}, "gemm-tuner: op must be one of mm, gemv, got 'conv'"),
])
def test_a_bad_runtime_key_is_one_value_error(table, change, words):
    from tuner import runtime

    raw = {"op": "mm", "M": 64, "N": 64, "K": 64, "dtype": "bf16", "stride_am": 64,
           "stride_bk": 64} | change
    for lookup in (runtime.get_tuned_config,
                   lambda *a, **k: runtime.get_tuned_config_without(("cublas",), *a, **k)):
        with pytest.raises(ValueError) as e:
            lookup(raw.pop("op") if "op" in raw else "mm", path=table[0], **raw)
        assert str(e.value) == words
        raw["op"] = change.get("op", "mm")


@pytest.mark.parametrize("edit, words", [
    (lambda d: d["ops"]["mm"].pop("strategy"),
     "field 'ops.mm.strategy': expected a strategy for each of M, N, K, stride_am, stride_bk, "
     "dtype, got None"),
    (lambda d: d["ops"]["mm"]["entries"][0].pop("config"),
     "field 'ops.mm.entries[0].config': expected a mapping with a variant, got None"),
    (lambda d: d["ops"]["mm"]["entries"][0]["key"].pop("K"),
     "field 'ops.mm.entries[0].key': expected a value for each of M, N, K"),
    (lambda d: d["ops"]["mm"]["entries"][0]["key"].update(M="big"),
     "field 'ops.mm.entries[0].key.M': expected an integer from 1 to 2**31, got 'big'"),
    (lambda d: d["ops"]["mm"]["entries"][0]["key"].update(M=-64),
     "field 'ops.mm.entries[0].key.M': expected an integer from 1 to 2**31, got -64"),
    (lambda d: d["ops"]["mm"]["entries"][0]["key"].update(dtype="fp64"),
     "field 'ops.mm.entries[0].key.dtype': expected one of fp16, bf16, fp32, fp8e4m3, got "
     "'fp64'"),
    (lambda d: d["ops"]["mm"]["entries"][0]["config"].update(variant="nosuch"),
     "field 'ops.mm.entries[0].config.variant': expected a variant of the installed kernel "
     "(general, tma, persistent, streamk, splitk, kreduce, multigemv, mmagemv, gluongemv, "
     "gluon, cublas), "
     "got 'nosuch'"),
    (lambda d: d["ops"]["mm"]["entries"][0]["config"].pop("BLOCK_K"),
     "field 'ops.mm.entries[0].config': variant general takes variant, pad, BLOCK_M, BLOCK_N, "
     "BLOCK_K, GROUP_M, num_stages, num_warps; missing BLOCK_K"),
    (lambda d: d["ops"]["mm"]["entries"][0]["config"].update(BLOCK_M=48),
     "field 'ops.mm.entries[0].config.BLOCK_M': expected powers of two from 1 to 4096 "
     "(tl.arange and tl.dot tile sides), got 48"),
    (lambda d: d["ops"]["mm"]["entries"][0].update(alternates=[{"variant": "general"}]),
     "field 'ops.mm.entries[0].alternates[0]': variant general takes"),
    (lambda d: d["ops"].update(conv=d["ops"]["mm"]),
     "field 'ops.conv': expected an op of the installed kernels (mm, gemv), got 'conv'"),
    (lambda d: d["ops"]["mm"]["entries"][0]["config"].update(num_warps="x" * 10_000),
     "field 'ops.mm.entries[0].config.num_warps': expected values among 1, 2, 4, 8, 16, 32, "
     "got 'xxxxxxxxx"),
    (lambda d: d["ops"]["mm"]["entries"][0].update(alternates=0),
     "field 'ops.mm.entries[0].alternates': expected a list of configs, got 0"),
    (lambda d: d["ops"]["mm"]["entries"][0].update(tuned_shape="64x64 bf16"),
     "field 'ops.mm.entries[0].tuned_shape': expected a shape label like '4096x4096x4096 bf16 "
     "nn', got '64x64 bf16'"),
    (lambda d: d["ops"]["mm"]["entries"][0].update(alternates_ms="fast"),
     "field 'ops.mm.entries[0].alternates_ms': expected a list of numbers, got 'fast'"),
    (lambda d: d.update(ops=["mm"]), "field 'ops': expected a mapping of op"),
    (lambda d: d.update(device="H100"), "field 'device': expected a mapping with name"),
])
def test_a_wrong_schema_table_names_file_and_field(table, edit, words):
    from tuner import runtime
    from tuner.formats.files import write_atomic
    from tuner.formats.table import TableError

    path, doc = table
    edit(doc)
    write_atomic(path, doc)
    with pytest.raises(TableError) as e:
        runtime.get_tuned_config("mm", M=64, N=64, K=64, dtype="bf16", stride_am=64,
                                 stride_bk=64, path=path)
    assert str(e.value).startswith(f"gemm-tuner table {path}: ") and words in str(e.value)
    assert "\n" not in str(e.value) and len(str(e.value)) < len(str(path)) + 300


def test_a_table_written_before_a_parameter_reads_its_earlier_value(table):
    """A gluon config written before the variant took BLOCK_N_TAIL and SWAP_AB on (a
    deployment's table of 2026-11-27) runs as it ran then, without a tail and not transposed,
    rather than failing the table."""
    from tuner import runtime
    from tuner.formats.files import write_atomic
    from tuner.formats.table import read_table
    from tuner.kernels import kernel_variants

    path, doc = table
    written = {"variant": "gluon", "pad": 0, "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64,
               "GROUP_M": 8, "num_stages": 3, "num_warps": 4, "WARP_SPECIALIZE": 0}
    doc["ops"]["mm"]["entries"][0]["alternates"] = [written]
    write_atomic(path, doc)
    entry = read_table(path, variants=kernel_variants()).ops["mm"]["entries"][0]
    assert entry["alternates"] == [{**written, "BLOCK_N_TAIL": 0, "SWAP_AB": 0}]
    assert entry["config"] == doc["ops"]["mm"]["entries"][0]["config"]  # general takes none
    assert runtime.get_tuned_config("mm", M=64, N=64, K=64, dtype="bf16", stride_am=64,
                                    stride_bk=64, path=path).source == "table"


def test_malformed_table_yaml_names_the_file_and_line(tmp_path):
    from tuner import runtime
    from tuner.formats.table import TableError

    path = tmp_path / "t.yaml"
    path.write_text("format: gemm-tuner-table/2\nops: [\n")
    runtime.clear_cache()
    with pytest.raises(TableError, match=rf"^gemm-tuner table {path}:3: not valid YAML "
                                         r"\(.*expected.* node content"):
        runtime.get_tuned_config("mm", M=64, N=64, K=64, dtype="bf16", stride_am=64,
                                 stride_bk=64, path=path)
    path.write_bytes(b"format: gemm-tuner-table/2\n# \xff\n")
    runtime.clear_cache()
    with pytest.raises(TableError, match=r"t.yaml:2: expected UTF-8 text, got byte 0xff$"):
        runtime.get_tuned_config("mm", M=64, N=64, K=64, dtype="bf16", stride_am=64,
                                 stride_bk=64, path=path)
    runtime.clear_cache()
