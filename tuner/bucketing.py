"""Bucketing strategies: which shapes share one tuned config.

A search space names one strategy per key field (M, N, K, stride_am, stride_bk, dtype). The
tuner, the export and the runtime all map a raw key to its bucket through `bucket_key`, so the
three can never disagree. Semantics follow FlagGems' libtuner strategies of the same names.
This module imports nothing heavy: the runtime lookup depends on it.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

KEY_FIELDS: tuple[str, ...] = ("M", "N", "K", "stride_am", "stride_bk", "dtype")


def _default(value):
    """The exact value."""
    return value


def _next_power_of_two(value: int) -> int:
    """`log`: the next power of two (1 → 1, 5 → 8); 0 stays 0."""
    return 0 if value <= 0 else 1 << (value - 1).bit_length()


def _align32(value: int) -> int:
    """`align32`: 0 → 0; below 32, the next power of two; otherwise up to a multiple of 32."""
    if value < 32:
        return _next_power_of_two(value)
    return -(-value // 32) * 32


STRATEGIES: dict[str, Callable] = {
    "default": _default,
    "align32": _align32,
    "log": _next_power_of_two,
}


def bucket_key(key: Mapping[str, object], strategy: Mapping[str, str]) -> tuple:
    """The bucketed key, as a tuple in KEY_FIELDS order, for a raw key and a strategy per field."""
    return tuple(STRATEGIES[strategy[f]](key[f]) for f in KEY_FIELDS)
