"""Shapes CSV and search-space YAML: good files load, bad ones fail with file, line and field."""
import pytest

from tests.factories import VARIANTS
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
    ("BLOCK_M: [32, 64]", "BLOCK_M: []", "params.BLOCK_M", "non-empty list of non-negative"),
    ("BLOCK_M: [32, 64]", "BLOCK_M: [32, -1]", "params.BLOCK_M", "non-negative integers"),
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
