"""FlagGems' files, as documents and header comments: the expand YAML and tune_configs.yaml.

The expand YAML holds, per FlagGems op, one dict of value lists with the `param_map` naming
them (`META`: kernel constexpr -> list name; `num_stages`, `num_warps` -> list names) and one
dict with the bucketing `strategy`. Two readers take it:

- FlagGems 5.x's `ConfigLoader.get_expand_config(op)` reads `mm_general_tma` and `gemv` (and
  has no `mm_splitk`), building the Cartesian product of every list its param_map names;
- the reference Hopper `mm.py` (shared/reference/flaggems_hopper_mm.md) reads top-level
  `matmul` (BLOCK_M/N/K through META, stages, warps; key M, N, K, stride_am, stride_bk,
  dtype) and `gemv` (BLOCK_M/K, stages, warps; key M, K, stride_am, stride_bk).

So `matmul` repeats `mm_general_tma`'s tile and launch lists, and `gemv`'s strategy names the
four fields of its key. The lists come from a narrowing (tuner.expand) whose product is
bounded; the header says where they came from and what the bound costs.

tune_configs.yaml is FlagGems' explicit list: per op, one entry per config (`META`,
`num_stages`, `num_warps`), tried as listed: the exact winners, for deployments that want no
runtime tuning at all. This module builds documents and text only; tuner.export_flaggems
gathers them.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

from tuner.expand import Narrowing, regret_line
from tuner.space import KERNEL_PARAMS

MM_OP, GEMV_OP, SPLITK_OP = "mm_general_tma", "gemv", "mm_splitk"
REFERENCE_MATMUL = "matmul"  # the reference Hopper mm.py's name for mm_general_tma's space
REFERENCE_MATMUL_META = ("BLOCK_M", "BLOCK_N", "BLOCK_K")
GEMV_KEY_FIELDS = ("M", "K", "stride_am", "stride_bk")  # what both readers' gemv key holds
# FlagGems' value-list names for the Triton launch options.
LAUNCH_OPTION_NAMES = {"num_stages": "stages", "num_warps": "warps"}
# The files `tune export --format` writes for FlagGems (tuner.export_flaggems).
FORMATS = ("expand", "flaggems-tune-configs")


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


@dataclass(frozen=True)
class OpSpace:
    """One op's part of the expand file: its strategy and its narrowed lists."""
    op: str
    strategy: dict
    narrowing: Narrowing


def op_entry(params: Sequence[str], lists: Mapping[str, Sequence], strategy: Mapping) -> list:
    """One op's entry: the value lists with their param_map, then the strategy."""
    meta = [p for p in params if p not in LAUNCH_OPTION_NAMES]
    space = {"config": None, "param_map": {
        "META": {p: yaml_name(p) for p in meta},
        **{p: yaml_name(p) for p in params if p in LAUNCH_OPTION_NAMES}}}
    for p in params:
        space[yaml_name(p)] = list(lists[p])
    return [space, {"strategy": dict(strategy)}]


def expand_document(spaces: Sequence[OpSpace]) -> dict:
    """The expand YAML of the ops' narrowed spaces, with `matmul` beside mm_general_tma and
    gemv's strategy on its four key fields."""
    doc = {}
    for space in spaces:
        strategy = space.strategy
        if space.op == GEMV_OP:
            strategy = {f: strategy[f] for f in GEMV_KEY_FIELDS if f in strategy}
        doc[space.op] = op_entry(space.narrowing.params, space.narrowing.lists, strategy)
    mm = next((s for s in spaces if s.op == MM_OP), None)
    if mm is not None:
        params = [p for p in mm.narrowing.params
                  if p in REFERENCE_MATMUL_META or p in LAUNCH_OPTION_NAMES]
        doc[REFERENCE_MATMUL] = op_entry(params, mm.narrowing.lists, mm.strategy)
    return doc


def _device_lines(device: Mapping, source: str, launch: str) -> list[str]:
    lines = [f"# device: {device.get('name')} (compute capability "
             f"{device.get('compute_capability')}, {device.get('sm_count')} SMs, fingerprint "
             f"{device.get('fingerprint')}); torch {device.get('torch')}, triton "
             f"{device.get('triton')}, CUDA {device.get('cuda')}, driver {device.get('driver')}",
             f"# written {datetime.now(timezone.utc).isoformat(timespec='seconds')} from "
             f"{source}; winners chosen for {launch} launch"]
    if is_interpreter(device):
        lines.append("# WARNING: CPU interpreter results: no GPU timing, not for deployment")
    return lines


def is_interpreter(device: Mapping) -> bool:
    """Whether a device block is the CPU interpreter's (tuner.execution.backends)."""
    return str(device.get("compute_capability")) == "none"


def _values(params: Sequence[str], values: tuple) -> str:
    return " ".join(f"{yaml_name(p)}={v}" for p, v in zip(params, values) if v is not None)


def expand_header(device: Mapping, source: str, launch: str, max_configs: int,
                  spaces: Sequence[OpSpace], model_note: str) -> str:
    """The comment heading an expand file: what it is for, the device and versions, when and
    from what, the bound, and per op its product and regret (and each shape's answer)."""
    lines = ["# gemm-tuner expand file (FlagGems' expand schema): mm_general_tma and gemv for "
             "FlagGems 5.x's ConfigLoader; matmul and gemv for the reference Hopper mm.py",
             *_device_lines(device, source, launch),
             "# bound: " + (f"each op's lists multiply to at most {max_configs} configs "
                            "(--max-configs; 0 keeps the winners' union)" if max_configs > 0
                            else "none (--max-configs 0): the winners' union of values")]
    for space in spaces:
        n = space.narrowing
        lines.append(f"# {space.op}: {n.product} configs (the winners' union: "
                     f"{n.union_product}); {regret_line(n)}")
        for label, outcome in n.outcomes.items():
            if outcome.replacement is None:
                lines.append(f"#   {label}: no config inside runs it")
            elif outcome.regret == 0 and outcome.own:
                lines.append(f"#   {label}: 0.00%")
            else:
                lines.append(f"#   {label}: {outcome.regret * 100:.2f}% (best inside: "
                             f"{_values(n.params, outcome.replacement)}, "
                             f"{'measured' if outcome.measured else 'model-predicted'})")
    lines.append(f"# regret: kernel time (p50) of the best config inside the product over the "
                 f"shape's own winner's; {model_note}")
    return "".join(line + "\n" for line in lines)


def tune_configs_entry(config: Mapping) -> dict:
    """A config as a tune_configs.yaml entry: META (the kernel's constexprs), num_stages,
    num_warps."""
    return {"META": {p: v for p, v in config.items()
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


def tune_configs_header(device: Mapping, source: str, launch: str,
                        doc: Mapping[str, list]) -> str:
    counts = ", ".join(f"{op}: {len(entries)}" for op, entries in doc.items())
    lines = ["# gemm-tuner tune_configs (FlagGems' tune_configs.yaml op list): the exact "
             "tuned winners, each tried as listed, no runtime search",
             *_device_lines(device, source, launch), f"# configs per op: {counts}"]
    return "".join(line + "\n" for line in lines)
