"""TUNE_EXCLUDE: variants the dispatcher never launches, e.g. `TUNE_EXCLUDE=cublas` for
Triton answers only (get_tuned_config_without's answers, tuner.runtime.lookup).

Read once, on the dispatcher's first decision (tuner.runtime.dispatch.clear_cache forgets it),
so a call pays nothing for it. A name no registered kernel has is refused in one line naming
the known variants: a typo would otherwise exclude nothing, silently.
"""
from __future__ import annotations

import os

EXCLUDE_ENV_VAR = "TUNE_EXCLUDE"


def excluded_variants() -> frozenset[str]:
    """The variants $TUNE_EXCLUDE names (comma-separated; empty: none). ValueError, one line,
    for a name no registered kernel has."""
    names = frozenset(name.strip() for name in os.environ.get(EXCLUDE_ENV_VAR, "").split(",")
                      if name.strip())
    if not names:
        return names
    from tuner.kernels import KERNELS

    known = {variant.name for kernel in KERNELS.values() for variant in kernel.variants}
    unknown = sorted(names - known)
    if unknown:
        raise ValueError(f"gemm-tuner: {EXCLUDE_ENV_VAR} names unknown variant(s) "
                         f"{', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return names
