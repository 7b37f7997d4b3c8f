"""Bucketing follows FlagGems' libtuner semantics, checked on random integers."""
import math

from hypothesis import given
from hypothesis import strategies as st

from tuner.bucketing import KEY_FIELDS, STRATEGIES, bucket_key


def flaggems_align32(key):  # FlagGems' definition, written out as its docs state it
    if key == 0:
        return 0
    if key < 32:
        return 2 ** math.ceil(math.log2(key))
    return math.ceil(key / 32) * 32


@given(st.integers(min_value=0, max_value=1 << 40))
def test_align32_matches_flaggems(n):
    assert STRATEGIES["align32"](n) == flaggems_align32(n)


@given(st.integers(min_value=1, max_value=1 << 40))
def test_log_is_the_next_power_of_two(n):
    b = STRATEGIES["log"](n)
    assert b >= n and b & (b - 1) == 0 and (b == 1 or b // 2 < n)


@given(st.integers(min_value=1, max_value=1 << 20), st.integers(min_value=1, max_value=1 << 20))
def test_buckets_are_monotone_and_idempotent(a, b):
    for name, f in STRATEGIES.items():
        assert f(f(a)) == f(a), name
        if a <= b:
            assert f(a) <= f(b), name


def test_bucket_key_order_and_examples():
    key = {"M": 4097, "N": 4095, "K": 4100, "stride_am": 4100, "stride_bk": 4095, "dtype": "bf16"}
    strategy = dict.fromkeys(KEY_FIELDS, "align32") | {"dtype": "default", "N": "log"}
    assert bucket_key(key, strategy) == (4128, 4096, 4128, 4128, 4096, "bf16")
    assert STRATEGIES["align32"](17) == 32 and STRATEGIES["align32"](3) == 4
    assert STRATEGIES["log"](0) == 0
