"""Each FlagGems op's value lists, as an expand file holds them (tuner.formats.flaggems):
bounded, each op's product narrowed to at most N configs over its tuned shapes
(`bounded_ops`, `tune export expand`), or the union of the values the picks use
(`union_ops`, `tune suggest`).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

from tuner.export.cases import Tuned, case_for, device_spec_of, projected
from tuner.export.flaggems_ops import expand_op, op_of, runnable_on_flaggems
from tuner.export.narrowing import Narrowing, narrow
from tuner.export.picks import Pick, grouped, op_strategy
from tuner.formats.flaggems import SPLITK_OP, OpLists, enumerated
from tuner.space import KERNEL_PARAMS


class NarrowedOp(NamedTuple):
    """One op's part of a bounded expand file: its strategy and its narrowed lists."""
    op: str
    strategy: dict
    narrowing: Narrowing

    def lists(self) -> OpLists:
        return OpLists(self.op, self.narrowing.params, self.narrowing.lists, self.strategy)


def _op_params(configs: Iterable[Mapping]) -> tuple[str, ...]:
    """The parameters the configs use, in first use order; FlagGems has no variant or pad."""
    return tuple(dict.fromkeys(p for c in configs for p in c if p not in KERNEL_PARAMS))


def bounded_ops(picks: Sequence[Pick], tuned: Sequence[Tuned], device: Mapping,
                max_configs: int, with_splitk: bool, spec=None
                ) -> tuple[list[NarrowedOp], list[str]]:
    """Per FlagGems op of the picks (mm_splitk only `with_splitk`), its value lists narrowed
    to at most max_configs configs (tuner.export.narrowing; 0: the union) over the tuned
    shapes of its op; and comment lines for what was left out. spec: the device's model
    DeviceSpec, if already built."""
    spec = device_spec_of(device) if spec is None else spec
    kept, left_out = runnable_on_flaggems(picks)
    ops = []
    for op, group in grouped(kept, expand_op).items():
        if op == SPLITK_OP and not with_splitk:
            left_out.append(f"# left out: {op} ({len(group)} configs won by split-K): FlagGems "
                            "5.x's ConfigLoader has no such op; --with-splitk writes it\n")
            continue
        mine = [t for t in tuned if op_of(t.kernel, t.winner) == op]
        params = enumerated(op, _op_params([p.config for p in group]
                                           + [t.winner for t in mine]))
        narrowing = narrow(params, [case_for(params, t, spec) for t in mine], max_configs,
                           [projected(params, p.config) for p in group])
        ops.append(NarrowedOp(op, op_strategy(op, group), narrowing))
    return ops, left_out


def union_ops(picks: Sequence[Pick]) -> list[OpLists]:
    """Per FlagGems op of the picks, the sorted values its picks use: no bound, and padded
    picks export their tiles (FlagGems has no variant or pad parameter: the op name carries
    the variant)."""
    ops = []
    for op, group in grouped(picks, expand_op).items():
        params = _op_params(pick.config for pick in group)
        lists = {p: sorted({pick.config[p] for pick in group if p in pick.config})
                 for p in params}
        ops.append(OpLists(op, params, lists, op_strategy(op, group)))
    return ops
