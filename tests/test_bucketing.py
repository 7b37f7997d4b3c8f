"""Bucketing: the built-in strategies follow FlagGems' libtuner semantics on random integers,
`buckets:[...]` maps to its breakpoints, user strategies register by call or by module, and
every bad name fails with one line that names it."""
import math
import re
import sys

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from tuner.bucketing import strategies as bucketing
from tuner.bucketing.strategies import (
    BUILTIN_STRATEGIES,
    KEY_FIELDS,
    STRATEGIES,
    BucketingError,
    bucket_key,
    lowest_member,
    register_strategy,
    strategy_function,
)
from tuner.kernels import kernel_variants
from tuner.space import SpaceError, builtin_spaces, load_space

ALIGNMENTS = (8, 16, 32, 64, 128)
# Random breakpoint lists, as a `buckets:[...]` name spells them.
BREAKPOINTS = st.lists(st.integers(min_value=1, max_value=1 << 20), min_size=1, max_size=8,
                       unique=True).map(sorted)
SIZES = st.integers(min_value=0, max_value=1 << 40)


def buckets_name(breakpoints) -> str:
    return f"buckets:[{', '.join(map(str, breakpoints))}]"


def flaggems_align(n, key):  # FlagGems' align32, written out as its docs state it, for any n
    if key == 0:
        return 0
    if key < n:
        return 2 ** math.ceil(math.log2(key))
    return math.ceil(key / n) * n


@pytest.fixture
def fresh_registry(monkeypatch):
    """An empty registry of user strategies, and tests.user_strategy not imported yet."""
    monkeypatch.setattr(bucketing, "_REGISTERED", {})
    monkeypatch.delitem(sys.modules, "tests.user_strategy", raising=False)
    monkeypatch.delenv(bucketing.MODULES_ENV_VAR, raising=False)


@pytest.mark.parametrize("n", ALIGNMENTS)
@given(key=SIZES)
def test_align_matches_flaggems(n, key):
    assert strategy_function(f"align{n}")(key) == flaggems_align(n, key)


@given(st.integers(min_value=1, max_value=1 << 40))
def test_log_is_the_next_power_of_two(n):
    b = STRATEGIES["log"](n)
    assert b >= n and b & (b - 1) == 0 and (b == 1 or b // 2 < n)


@given(BREAKPOINTS, SIZES)
def test_buckets_map_to_the_smallest_breakpoint_at_or_above_and_are_exact_beyond(breakpoints,
                                                                                  value):
    bucket = strategy_function(buckets_name(breakpoints))(value)
    above = [b for b in breakpoints if b >= value]
    assert bucket == (0 if value == 0 else above[0] if above else value)


@given(st.sampled_from(BUILTIN_STRATEGIES) | BREAKPOINTS.map(buckets_name), SIZES, SIZES)
def test_strategies_are_idempotent_and_monotone(name, a, b):
    f = strategy_function(name)
    assert f(f(a)) == f(a)
    low, high = sorted((a, b))
    assert f(low) <= f(high)


@given(st.sampled_from(BUILTIN_STRATEGIES) | BREAKPOINTS.map(buckets_name),
       st.integers(min_value=1, max_value=1 << 40))
def test_the_lowest_member_is_the_first_value_of_the_bucket(name, value):
    f, low = strategy_function(name), lowest_member(value, name)
    assert 1 <= low <= value and f(low) == f(value)
    assert low == 1 or f(low - 1) < f(value)


def test_lowest_member_examples():
    assert lowest_member(128, "align32") == 97 and lowest_member(100, "align32") == 97
    assert lowest_member(32, "align32") == 17 and lowest_member(2, "align32") == 2
    assert lowest_member(2048, "log") == 1025 and lowest_member(300, "default") == 300
    assert lowest_member(4, "buckets:[4,64]") == 1 and lowest_member(5000, "buckets:[4]") == 5000


def test_builtin_strategies_run_finest_to_coarsest():
    assert BUILTIN_STRATEGIES == ("default", "align8", "align16", "align32", "align64",
                                  "align128", "log")
    assert tuple(STRATEGIES) == BUILTIN_STRATEGIES
    sizes = range(1, 5000)
    buckets = [len({STRATEGIES[name](v) for v in sizes}) for name in BUILTIN_STRATEGIES]
    assert buckets == sorted(buckets, reverse=True)


def test_bucket_key_order_and_examples():
    key = {"M": 4097, "N": 4095, "K": 4100, "stride_am": 4100, "stride_bk": 4095, "dtype": "bf16"}
    strategy = dict.fromkeys(KEY_FIELDS, "align32") | {"dtype": "default", "N": "log",
                                                      "stride_bk": "buckets:[ 64 ,4096,8192 ]"}
    assert bucket_key(key, strategy) == (4128, 4096, 4128, 4128, 4096, "bf16")
    assert STRATEGIES["align32"](17) == 32 and STRATEGIES["align32"](3) == 4
    assert STRATEGIES["align128"](129) == 256 and STRATEGIES["align8"](9) == 16
    assert STRATEGIES["log"](0) == 0


def test_a_buckets_name_is_parsed_once():
    assert strategy_function("buckets:[1,16]") is strategy_function("buckets:[1,16]")


@pytest.mark.parametrize("name, problem", [
    ("align7", "unknown"),
    ("align256", "unknown"),
    ("Log", "unknown"),
    ("buckets:[]", "no breakpoints"),
    ("buckets:[ ]", "no breakpoints"),
    ("buckets:[4,2]", "strictly increasing"),
    ("buckets:[4,4]", "strictly increasing"),
    ("buckets:[0,4]", "positive"),
    ("buckets:[1.5,4]", "integers"),
    ("buckets:[1,,4]", "integers"),
    ("buckets:[-1,4]", "integers"),
    ("buckets:1,4", "in brackets"),
    (32, "not a string"),
    (None, "not a string"),
])
def test_bad_names_fail_with_one_line_naming_them_and_the_valid_forms(name, problem):
    with pytest.raises(BucketingError) as e:
        strategy_function(name)
    message = str(e.value)
    assert message.startswith(f"bucketing strategy {name!r}: ") and problem in message
    assert "expected default, align8, " in message
    assert "buckets:[b1,b2,...]" in message and "\n" not in message
    with pytest.raises(BucketingError):
        bucket_key(dict.fromkeys(KEY_FIELDS, 1), dict.fromkeys(KEY_FIELDS, "default") | {"K": name})


def test_a_registered_strategy_buckets_keys(fresh_registry):
    def to_even(value):
        return value + value % 2

    register_strategy("even", to_even)
    register_strategy("even", to_even)  # the same function again: a module imported twice
    key = {"M": 3, "N": 4, "K": 5, "stride_am": 5, "stride_bk": 4, "dtype": "fp16"}
    strategy = dict.fromkeys(KEY_FIELDS, "even") | {"dtype": "default"}
    assert bucket_key(key, strategy) == (4, 4, 6, 6, 4, "fp16")
    with pytest.raises(BucketingError, match="'even' is registered already"):
        register_strategy("even", lambda value: value)


@pytest.mark.parametrize("name", ["", "align32", "log", "my:strategy", "buckets:[1]", "2x",
                                  None])
def test_registering_under_a_bad_name_fails(fresh_registry, name):
    with pytest.raises(BucketingError, match=re.escape(f"register_strategy: name {name!r} ")):
        register_strategy(name, lambda value: value)


def test_registering_something_not_callable_fails(fresh_registry):
    with pytest.raises(BucketingError, match="'fixed' must be callable"):
        register_strategy("fixed", 32)


def test_strategy_modules_are_imported_for_an_unknown_name(fresh_registry, monkeypatch):
    with pytest.raises(BucketingError, match="'thousands': unknown"):
        strategy_function("thousands")
    monkeypatch.setenv(bucketing.MODULES_ENV_VAR, " tests.user_strategy ,")
    assert strategy_function("thousands")(1001) == 2000
    assert "tests.user_strategy" in sys.modules


def test_a_strategy_module_that_cannot_be_imported_is_named(fresh_registry, monkeypatch):
    monkeypatch.setenv(bucketing.MODULES_ENV_VAR, "tests.no_such_module")
    with pytest.raises(BucketingError, match=r"\$TUNE_STRATEGY_MODULES: cannot import strategy "
                                             r"module 'tests.no_such_module'"):
        strategy_function("thousands")


def write_mm_space(tmp_path, **strategy) -> str:
    """The built-in mm space with some fields' strategies replaced, as a file."""
    doc = yaml.safe_load(builtin_spaces(kernel_variants())["mm"].to_yaml())
    doc["strategy"].update(strategy)
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


@pytest.mark.parametrize("field, value, expected", [
    ("M", "align7", "expected one of default, align8, align16, align32, align64, align128, "
                    "log, buckets:[b1,b2,...]"),
    ("K", "buckets:[8,4]", "or a name given to register_strategy"),
    ("stride_bk", 32, "expected one of default, align8"),
    ("dtype", "log", "expected one of default, got 'log'"),
])
def test_a_space_with_a_bad_strategy_names_file_and_field(tmp_path, field, value, expected):
    path = write_mm_space(tmp_path, **{field: value})
    with pytest.raises(SpaceError) as e:
        load_space(path, kernel_variants())
    message = str(e.value)
    assert message.startswith(f"{path}: field 'strategy.{field}': ") and expected in message
    assert "\n" not in message


def test_a_space_takes_breakpoints_and_registered_strategies(tmp_path, fresh_registry,
                                                             monkeypatch):
    monkeypatch.setenv(bucketing.MODULES_ENV_VAR, "tests.user_strategy")
    path = write_mm_space(tmp_path, M="buckets:[1, 16, 64, 256, 1024]", N="thousands",
                          K="align128")
    space = load_space(path, kernel_variants())
    assert space.strategy["M"] == "buckets:[1, 16, 64, 256, 1024]"
    assert space.strategy["N"] == "thousands" and space.strategy["K"] == "align128"
