"""Bucketing strategies: which shapes share one tuned config.

A search space names one strategy per key field (M, N, K, stride_am, stride_bk, dtype). The
tuner, the export and the runtime all map a raw key to its bucket through `bucket_key`, so the
three can never disagree. The built-in strategies follow FlagGems' libtuner semantics
(`default`, `alignN`, `log`); `buckets:[b1,b2,...]` lists breakpoints explicitly; and
`register_strategy` adds a user's own function under a name (modules listed in
$TUNE_STRATEGY_MODULES are imported to register theirs, so CLI runs and deployments that only
name a strategy in a file still find it).

Every strategy must be idempotent (f(f(x)) == f(x)) and monotone non-decreasing: exports store
bucket keys, and the runtime buckets them again on load. This module imports nothing heavy:
the runtime lookup depends on it.
"""
from __future__ import annotations

import bisect
import functools
import importlib
import os
import re
from collections.abc import Callable, Mapping
from types import MappingProxyType

from tuner.errors import UserError
from tuner.textfiles import clipped, quoted

KEY_FIELDS: tuple[str, ...] = ("M", "N", "K", "stride_am", "stride_bk", "dtype")

MODULES_ENV_VAR = "TUNE_STRATEGY_MODULES"

# What a strategy name may be, for every error message that rejects one.
STRATEGY_FORMS = ("default, align8, align16, align32, align64, align128, log, "
                  "buckets:[b1,b2,...] (strictly increasing positive integers), "
                  "or a name given to register_strategy")

Strategy = Callable[[int], int]


class BucketingError(UserError, ValueError):
    """A strategy name that names no strategy, or a registration that would be ambiguous."""


class StrategyModuleError(BucketingError):
    """A module $TUNE_STRATEGY_MODULES lists that cannot be imported: what is wrong is the
    environment, not the strategy name that made us look there."""


def _exact(value):
    """`default`: the exact value (the only strategy for dtype, which is a string)."""
    return value


def _next_power_of_two(value: int) -> int:
    """`log`: the next power of two (1 → 1, 5 → 8); 0 stays 0."""
    return 0 if value <= 0 else 1 << (value - 1).bit_length()


def _aligned_to(n: int) -> Strategy:
    """`align<n>` (n a power of two), FlagGems' align32 for any n: 0 → 0; below n, the next
    power of two; otherwise up to a multiple of n. A power of two keeps it idempotent: the
    small values land on powers of two, which are multiples of n from n on."""
    def align(value: int) -> int:
        if value < n:
            return _next_power_of_two(value)
        return -(-value // n) * n

    align.__name__ = align.__qualname__ = f"align{n}"
    return align


# The built-in strategies, finest to coarsest.
STRATEGIES: Mapping[str, Strategy] = MappingProxyType({
    "default": _exact,
    **{f"align{n}": _aligned_to(n) for n in (8, 16, 32, 64, 128)},
    "log": _next_power_of_two,
})
BUILTIN_STRATEGIES: tuple[str, ...] = tuple(STRATEGIES)

_BUCKETS = re.compile(r"buckets:\[(?P<breakpoints>.*)\]")
_REGISTERED: dict[str, Strategy] = {}


def _bad_strategy(name, problem: str) -> BucketingError:
    return BucketingError(f"bucketing strategy {quoted(name)}: {problem}; expected "
                          f"{STRATEGY_FORMS}")


def _to_breakpoint(breakpoints: tuple[int, ...], value: int) -> int:
    """The smallest breakpoint >= value; a value above the last stays exact (no bucket claims
    territory nobody chose) and 0 stays 0."""
    if value <= 0:
        return value
    i = bisect.bisect_left(breakpoints, value)
    return breakpoints[i] if i < len(breakpoints) else value


@functools.cache
def _breakpoints_strategy(name: str) -> Strategy:
    """The strategy a `buckets:[b1,b2,...]` name spells; parsed once per name."""
    match = _BUCKETS.fullmatch(name)
    if match is None:
        raise _bad_strategy(name, "breakpoints must be written in brackets")
    if not match["breakpoints"].strip():
        raise _bad_strategy(name, "no breakpoints")
    texts = [t.strip() for t in match["breakpoints"].split(",")]
    if not all(t.isascii() and t.isdigit() for t in texts):
        raise _bad_strategy(name, "breakpoints must be integers")
    breakpoints = tuple(int(t) for t in texts)
    if breakpoints[0] < 1 or any(a >= b for a, b in zip(breakpoints, breakpoints[1:])):
        raise _bad_strategy(name, "breakpoints must be positive and strictly increasing")
    return functools.partial(_to_breakpoint, breakpoints)


def register_strategy(name: str, fn: Strategy) -> None:
    """Make `fn` (int -> int, idempotent and monotone non-decreasing) the strategy `name`.

    Registering the same function again is a no-op, so a module may be imported twice; another
    function under a taken name raises, since keys already bucketed by one would be read back
    by the other.
    """
    if not isinstance(name, str) or not name.isidentifier() or name in STRATEGIES:
        raise BucketingError(f"register_strategy: name {name!r} must be an identifier (letters, "
                             f"digits, '_') and not a built-in ({', '.join(STRATEGIES)})")
    if not callable(fn):
        raise BucketingError(f"register_strategy: strategy {name!r} must be callable, got "
                             f"{fn!r}")
    registered = _REGISTERED.setdefault(name, fn)
    if registered is not fn:
        raise BucketingError(f"register_strategy: {name!r} is registered already, to "
                             f"{registered!r}; pick another name")


def _import_strategy_modules() -> None:
    """Import the modules $TUNE_STRATEGY_MODULES lists (comma-separated), which register their
    strategies at import; Python imports each module once however often this runs."""
    listed = (m.strip() for m in os.environ.get(MODULES_ENV_VAR, "").split(","))
    for module in filter(None, listed):
        try:
            importlib.import_module(module)
        except Exception as e:  # a missing module, or one failing as it imports
            raise StrategyModuleError(
                f"${MODULES_ENV_VAR}: cannot import strategy module {quoted(module)} "
                f"({type(e).__name__}: {clipped(str(e), 200)})") from None


def strategy_function(name: str) -> Strategy:
    """The function a strategy name stands for; BucketingError, naming it, for any other name.

    A name neither built in, nor `buckets:[...]`, nor registered yet has the modules of
    $TUNE_STRATEGY_MODULES imported before it is given up on.
    """
    if not isinstance(name, str):
        raise _bad_strategy(name, "not a string")
    found = STRATEGIES.get(name) or _REGISTERED.get(name)
    if found is not None:
        return found
    if name.startswith("buckets:"):
        return _breakpoints_strategy(name)
    _import_strategy_modules()
    if name not in _REGISTERED:
        raise _bad_strategy(name, "unknown")
    return _REGISTERED[name]


def lowest_member(value: int, name: str) -> int:
    """The smallest positive value that strategy `name` puts in `value`'s bucket: the other
    end of the range a config tuned at `value` answers. A binary search, which the contract
    (monotone non-decreasing) makes exact."""
    bucket = strategy_function(name)
    target, low, high = bucket(value), 1, value
    while low < high:
        middle = (low + high) // 2
        if bucket(middle) < target:
            low = middle + 1
        else:
            high = middle
    return low


def bucket_key(key: Mapping[str, object], strategy: Mapping[str, str]) -> tuple:
    """The bucketed key, as a tuple in KEY_FIELDS order, for a raw key and a strategy per field."""
    return tuple(strategy_function(strategy[f])(key[f]) for f in KEY_FIELDS)
