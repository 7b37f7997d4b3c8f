"""TUNE_EXCLUDE: variants the dispatcher never launches, e.g. `TUNE_EXCLUDE=cublas` for
Triton answers only (get_tuned_config_without's answers, tuner.runtime.lookup). Tuning leaves
them out of its search spaces too (tuner.tuning.load_spaces).

Read once, on the dispatcher's first decision (tuner.runtime.dispatch.clear_cache forgets it),
so a call pays nothing for it. A name no registered kernel has is refused in one line naming
the known variants: a typo would otherwise exclude nothing, silently.
"""
from __future__ import annotations

import os

from tuner.textfiles import quoted

EXCLUDE_ENV_VAR = "TUNE_EXCLUDE"


def excluded_variants() -> frozenset[str]:
    """The variants $TUNE_EXCLUDE names (comma-separated; empty: none). ValueError, one line,
    for a name no registered kernel has."""
    names = frozenset(name.strip() for name in os.environ.get(EXCLUDE_ENV_VAR, "").split(",")
                      if name.strip())
    return checked_variant_names(names, EXCLUDE_ENV_VAR)


def checked_variant_names(names: frozenset, where: str) -> frozenset[str]:
    """`names` where each is a variant of a registered kernel; else ValueError, one line
    starting with `where`, naming the unknown ones and the known."""
    if not names:
        return names
    from tuner.kernels import KERNELS

    known = {variant.name for kernel in KERNELS.values() for variant in kernel.variants}
    unknown = sorted(quoted(name) if not isinstance(name, str) else name
                     for name in names - known)
    if unknown:
        raise ValueError(f"gemm-tuner: {where} names unknown variant(s) "
                         f"{', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return names
