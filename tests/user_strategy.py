"""A user's bucketing strategy, registered at import: the module TUNE_STRATEGY_MODULES names in
tests/test_bucketing.py."""
from tuner.bucketing.strategies import register_strategy


def up_to_thousands(value: int) -> int:
    """Up to a multiple of 1000 (idempotent and monotone, as a strategy must be)."""
    return -(-value // 1000) * 1000


register_strategy("thousands", up_to_thousands)
