"""Which FlagGems op each pick belongs to, as the registered variants declare it
(Variant.expand_op; a plugin kernel's variants keep their own name), and what a FlagGems
deployment runs where FlagGems has no op for a pick (cuBLAS): its fastest Triton alternate,
or a comment line saying it was left out.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from tuner.export.picks import Pick


def __getattr__(name: str):
    # EXPAND_OP_NAMES (variant -> its FlagGems op) and NO_EXPAND_OP (variant FlagGems has no
    # op for -> what it is), as the registered variants declare them (Variant.expand_op,
    # Variant.no_expand_op); built on first use, since the kernels import Triton.
    if name in ("EXPAND_OP_NAMES", "NO_EXPAND_OP"):
        from tuner.kernels import KERNELS
        variants = [v for kernel in KERNELS.values() for v in kernel.variants]
        attribute = "expand_op" if name == "EXPAND_OP_NAMES" else "no_expand_op"
        return {v.name: getattr(v, attribute) for v in variants if getattr(v, attribute)}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _pick_variant(pick: Pick):
    """The registered Variant a pick's config runs: its kernel's, else any kernel's variant of
    that name (a built-in kernel replaced by a plugin); None for one no kernel has."""
    from tuner.kernels import KERNELS  # the kernels import Triton: not at module level

    name = pick.config["variant"]
    kernel = KERNELS.get(pick.kernel)
    if kernel is not None and name in kernel.variant:
        return kernel.variant[name]
    return next((v for k in KERNELS.values() for v in k.variants if v.name == name), None)


def expand_op(pick: Pick) -> str:
    """The FlagGems op a pick belongs to, as its variant declares it (Variant.expand_op); a
    plugin kernel's variants keep their own name."""
    variant = _pick_variant(pick)
    if variant is not None and variant.expand_op:
        return variant.expand_op
    return f"{pick.kernel}_{pick.config['variant']}"


def no_expand_op(pick: Pick) -> str | None:
    """What a pick's variant is, where FlagGems has no op for it (Variant.no_expand_op)."""
    variant = _pick_variant(pick)
    return None if variant is None else variant.no_expand_op


def op_of(kernel: str, config: Mapping) -> str | None:
    """The FlagGems op a config of a kernel exports to; None for a variant FlagGems has no op
    for (cuBLAS)."""
    pick = Pick(kernel, {}, dict(config), {}, {})
    return None if no_expand_op(pick) else expand_op(pick)


def left_out_line(pick: Pick) -> str:
    """The comment line naming a pick FlagGems has no op for: a reader must not take its key
    for one never tuned."""
    variant = pick.config["variant"]
    key = " ".join(f"{field}={value}" for field, value in pick.key.items())
    return (f"# left out: {pick.kernel} {key}, won by {variant} ({no_expand_op(pick)}): "
            "FlagGems has no such op\n")


def triton_stand_in(pick: Pick) -> Pick:
    """The pick as FlagGems can run it: a pick of a variant FlagGems has no op for (cuBLAS)
    becomes its first alternate that has one (the runner-ups are fastest first), since a
    deployment on FlagGems still runs a Triton config for that key; otherwise the pick."""
    if not no_expand_op(pick):
        return pick
    for config in pick.alternates:
        if op_of(pick.kernel, config) is not None:
            return Pick(pick.kernel, pick.key, dict(config), pick.strategy,
                        {**pick.provenance, "stands_in_for": pick.config["variant"]})
    return pick


def runnable_on_flaggems(picks: Sequence[Pick]) -> tuple[list[Pick], list[str]]:
    """The picks as FlagGems can run them (triton_stand_in), and a comment line for each
    that still has no FlagGems op."""
    picks = [triton_stand_in(p) for p in picks]
    return ([p for p in picks if not no_expand_op(p)],
            [left_out_line(p) for p in picks if no_expand_op(p)])
