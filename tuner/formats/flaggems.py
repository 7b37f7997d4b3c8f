"""FlagGems' two files, their schemas written and read here alone: the expand YAML and
tune_configs.yaml.

The expand YAML holds, per FlagGems op, one dict of value lists with the `param_map` naming
them (`META`: kernel constexpr -> list name; `num_stages`, `num_warps` -> list names) and one
dict with the bucketing `strategy`. Two readers take it:

- FlagGems 5.x's `ConfigLoader.get_expand_config(op)` reads `mm_general_tma` and `gemv` (and
  has no `mm_splitk`), building the Cartesian product of every list its param_map names;
- the reference Hopper `mm.py` (shared/reference/flaggems_hopper_mm.md) reads top-level
  `matmul` (BLOCK_M/N/K through META, stages, warps; key M, N, K, stride_am, stride_bk,
  dtype) and `gemv` (BLOCK_M/K, stages, warps; key M, K, stride_am, stride_bk).

So for both readers `matmul` repeats `mm_general_tma`'s tile and launch lists, and `gemv`'s
strategy names the four fields of its key. tuner.runtime.expand answers keys from such a file
(`read_op`).

tune_configs.yaml is FlagGems' explicit list: per op, one entry per config (`META`,
`num_stages`, `num_warps`), tried as listed. Both files' header comments are built by the
export (tuner.export.writers), their device line by tuner.formats.device.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

from tuner.bucketing.strategies import KEY_FIELDS
from tuner.errors import UserError
from tuner.textfiles import clipped, quoted

MM_OP, GEMV_OP, SPLITK_OP = "mm_general_tma", "gemv", "mm_splitk"
REFERENCE_MATMUL = "matmul"  # the reference Hopper mm.py's name for mm_general_tma's space
REFERENCE_MATMUL_META = ("BLOCK_M", "BLOCK_N", "BLOCK_K")
GEMV_KEY_FIELDS = ("M", "K", "stride_am", "stride_bk")  # what both readers' gemv key holds
# FlagGems' value-list names for the Triton launch options.
LAUNCH_OPTION_NAMES = {"num_stages": "stages", "num_warps": "warps"}
# FlagGems' strategy for a key field an op's strategy leaves out.
DEFAULT_FIELD_STRATEGY = {**dict.fromkeys(KEY_FIELDS, "align32"), "dtype": "default"}
_PARAM_MAP, _META, _STRATEGY = "param_map", "META", "strategy"

# What each FlagGems 5.x op enumerates from its lists (ConfigLoader._build_configs_by_op):
# mm_general_tma's kernel takes GROUP_M=8 from its caller and has no persistent flags, so
# other lists would neither reach the kernel nor belong in the bound.
ENUMERATED = {MM_OP: ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_stages", "num_warps"),
              GEMV_OP: ("BLOCK_M", "BLOCK_K", "num_stages", "num_warps")}


def enumerated(op: str, params: Sequence[str]) -> tuple[str, ...]:
    """The params FlagGems builds configs of for `op` (all of them for an op it lacks)."""
    kept = ENUMERATED.get(op)
    return tuple(params) if kept is None else tuple(p for p in params if p in kept)


def yaml_name(param: str) -> str:
    return LAUNCH_OPTION_NAMES.get(param, param.lower())


# -- the expand YAML: writing -----------------------------------------------------------------
class OpLists(NamedTuple):
    """One op of an expand file: its parameters in order, a value list per parameter, and
    its bucketing strategy."""
    op: str
    params: tuple[str, ...]
    lists: Mapping[str, Sequence]
    strategy: Mapping


def _op_entry(params: Sequence[str], lists: Mapping[str, Sequence], strategy: Mapping) -> list:
    """One op's entry: the value lists with their param_map, then the strategy."""
    meta = [p for p in params if p not in LAUNCH_OPTION_NAMES]
    space = {"config": None, _PARAM_MAP: {
        _META: {p: yaml_name(p) for p in meta},
        **{p: yaml_name(p) for p in params if p in LAUNCH_OPTION_NAMES}}}
    for p in params:
        space[yaml_name(p)] = list(lists[p])
    return [space, {_STRATEGY: dict(strategy)}]


def expand_document(ops: Sequence[OpLists], for_both_readers: bool = True) -> dict:
    """The expand YAML of the ops' lists; `for_both_readers` (the bounded export) adds
    `matmul` beside mm_general_tma and keeps gemv's strategy to its four key fields, for the
    reference mm.py; without it (`tune suggest`), each op as given."""
    doc = {}
    for entry in ops:
        strategy = entry.strategy
        if for_both_readers and entry.op == GEMV_OP:
            strategy = {f: strategy[f] for f in GEMV_KEY_FIELDS if f in strategy}
        doc[entry.op] = _op_entry(entry.params, entry.lists, strategy)
    mm = next((entry for entry in ops if entry.op == MM_OP), None)
    if for_both_readers and mm is not None:
        params = [p for p in mm.params
                  if p in REFERENCE_MATMUL_META or p in LAUNCH_OPTION_NAMES]
        doc[REFERENCE_MATMUL] = _op_entry(params, mm.lists, mm.strategy)
    return doc


# -- the expand YAML: reading -----------------------------------------------------------------
def _lists_part(body: object) -> dict | None:
    """The element of an op's entry that holds its value lists (the one with a param_map)."""
    if not isinstance(body, list):
        return None
    return next((part for part in body if isinstance(part, dict) and _PARAM_MAP in part), None)


def is_expand_document(doc: object) -> bool:
    """Whether a YAML document is an expand file: op names mapping to lists that hold a dict
    with a `param_map` (and no table `format`)."""
    if not isinstance(doc, dict) or "format" in doc or not doc:
        return False
    return any(_lists_part(body) is not None for body in doc.values())


def op_bodies(doc: Mapping) -> dict[str, list]:
    """The document's op entries (those holding value lists), by FlagGems op name."""
    return {name: body for name, body in doc.items() if _lists_part(body) is not None}


class ExpandError(UserError, ValueError):
    """An expand file the runtime cannot use: one line naming the file, the field and what
    was expected."""


def read_op(name: str, body: list, label: str) -> OpLists:
    """One op's entry (one `op_bodies` gives) as OpLists under our parameter names, its
    strategy with FlagGems' default for each field it leaves out.

    ExpandError, starting with `label`, naming the field where the entry is not one FlagGems
    reads and our kernels can run: its param_map maps parameters to names of lists the entry
    holds (each list FlagGems enumerates for the op among them), each list a non-empty list of
    values the parameter may take (tuner.space.allowed_value, the rule a table's configs are
    checked by), its strategy a mapping of key fields."""
    from tuner.space import allowed_value, allowed_words

    def bad(field: str, problem: str, param: str | None = None) -> ExpandError:
        of = "" if param is None else f" ({param})"
        return ExpandError(f"{label}: field '{name}.{clipped(field)}'{of}: {problem}")

    part = _lists_part(body)
    param_map = part[_PARAM_MAP]
    meta = param_map.get(_META) if isinstance(param_map, dict) else None
    if not isinstance(meta, dict):
        raise bad(_PARAM_MAP, f"expected a mapping with {_META} (parameter to list name), "
                  f"num_stages and num_warps, got {quoted(param_map)}")
    names = {**{p: (f"{_META}.{p}", n) for p, n in meta.items()},
             **{p: (p, param_map[p]) for p in LAUNCH_OPTION_NAMES if p in param_map}}
    for param in ENUMERATED.get(MM_OP if name == REFERENCE_MATMUL else name, ()):
        if param not in names:
            raise bad(f"{_PARAM_MAP}.{param if param in LAUNCH_OPTION_NAMES else _META}",
                      f"names no list for {param}, which FlagGems reads")
    lists = {}
    for ours, (field, list_name) in names.items():
        if not isinstance(list_name, str) or list_name not in part:
            raise bad(f"{_PARAM_MAP}.{field}", f"expected the name of a list this entry "
                      f"holds, got {quoted(list_name)}")
        values = part[list_name]
        expected = f"expected a non-empty list of {allowed_words(ours)}"
        if not isinstance(values, list) or not values:
            raise bad(list_name, f"{expected}, got {quoted(values)}", ours)
        for value in values:
            if not allowed_value(ours, value):
                raise bad(list_name, f"{expected}, got {quoted(value)} in {quoted(values)}",
                          ours)
        lists[ours] = list(values)
    strategy = next((p[_STRATEGY] for p in body if isinstance(p, dict) and _STRATEGY in p),
                    {})
    if not isinstance(strategy, dict) or any(f not in KEY_FIELDS for f in strategy):
        raise bad(_STRATEGY, f"expected a mapping of some of {', '.join(KEY_FIELDS)} to a "
                  f"bucketing strategy, got {quoted(strategy)}")
    return OpLists(name, tuple(lists), lists,
                   {f: str(strategy.get(f, DEFAULT_FIELD_STRATEGY[f])) for f in KEY_FIELDS})


# -- tune_configs.yaml --------------------------------------------------------------------------
def tune_configs_entry(config: Mapping) -> dict:
    """A config as a tune_configs.yaml entry: META (the kernel's constexprs), num_stages,
    num_warps."""
    from tuner.space import KERNEL_PARAMS  # variant and pad, which FlagGems has not

    return {_META: {p: v for p, v in config.items()
                    if p not in KERNEL_PARAMS and p not in LAUNCH_OPTION_NAMES},
            **{p: config[p] for p in LAUNCH_OPTION_NAMES if p in config}}


def tune_configs_document(groups: Mapping[str, Sequence[Mapping]]) -> dict:
    """Per op, its configs as tune_configs.yaml entries, each once, in the order given."""
    doc = {}
    for op, configs in groups.items():
        entries = []
        for config in configs:
            entry = tune_configs_entry(config)
            if entry not in entries:
                entries.append(entry)
        doc[op] = entries
    return doc
