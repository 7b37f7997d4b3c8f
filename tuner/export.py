"""Writing the chosen configs out for deployments, in FlagGems' expand schema or our table.

The expand YAML narrows FlagGems' search to the values that won, with the bucketing strategy
FlagGems should apply. The table YAML is exact, one row per bucketed key, with provenance
and the runner-up configs the runtime's nearest fallback may choose among, for
`tuner.runtime.get_tuned_config`. Both are written from `Pick`s: the tuned winners of a
device (`winner_picks`) or the analytical model's choices (`tune suggest`), so the two
exports never differ in form. Files are replaced atomically: a reader never sees half.

Winners follow a launch mode (tuner.objective): each trial stores both figures, so a table
for the other mode than the run's is picked from the stored trials, without re-tuning, and
the table says which mode it holds.
"""
from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import yaml

from tuner.bucketing.strategies import KEY_FIELDS
from tuner.db.models import Bucketing, Device, KernelVersion, Trial, Winner
from tuner.db.store import Store
from tuner.errors import UserError
from tuner.objective import DEFAULT_LAUNCH, FIGURES, GRAPH, call_ms, eligible
from tuner.runtime import TABLE_FORMAT
from tuner.shapes import Shape
from tuner.space import KERNEL_PARAMS, config_signature

# FlagGems' op names for our variants: its mm_general_tma op covers the pointer and the TMA
# paths (it takes TMA whenever strides allow), so our persistent kernel joins them there.
EXPAND_OP_NAMES = {"general": "mm_general_tma", "tma": "mm_general_tma",
                   "persistent": "mm_general_tma", "splitk": "mm_splitk", "gemv": "gemv"}
# FlagGems' value-list names for the Triton launch options.
_LAUNCH_OPTION_NAMES = {"num_stages": "stages", "num_warps": "warps"}
# Variants FlagGems has no op for, and what they are: the expand export leaves their picks
# out and says so in a comment.
NO_EXPAND_OP = {"cublas": "a cuBLAS call through torch"}


class ExportError(UserError, RuntimeError):
    """Nothing, or nothing unambiguous, to export."""


def select_device(winners: list[Winner], selector: str | None) -> tuple[Device, list[Winner]]:
    """The one device whose winners to export: the only one, or the one --device names."""
    devices = {w.device.id: w.device for w in winners}
    if selector is not None:
        s = selector.lower()
        devices = {i: d for i, d in devices.items()
                   if s in d.name.lower() or d.fingerprint.startswith(s)}
    if not devices:
        raise ExportError("no winners in the database" + (
            f" for device {selector!r}" if selector else "; run `tune run` first"))
    if len(devices) > 1:
        listed = "; ".join(f"{d.name} [{d.fingerprint}]" for d in devices.values())
        raise ExportError(f"winners from {len(devices)} devices ({listed}); choose one with "
                          "--device NAME-or-FINGERPRINT")
    (device,) = devices.values()
    return device, [w for w in winners if w.device.id == device.id]


def current_only(winners: list[Winner], source_hashes: dict[str, str]) -> tuple[list[Winner], int]:
    """Winners measured with today's kernel source, and how many were left out as stale."""
    current = [w for w in winners if source_hashes.get(w.kernel.name) == w.kernel.source_hash]
    return current, len(winners) - len(current)


# How many runner-up configs a table entry carries per shape it answers, for the runtime's
# nearest fallback only (tuner.runtime). A shape never tuned is answered from the entries of
# nearby sizes, whose winners alone often lack the tile that suits it, while each study has
# measured other tiles too. One per shape: with it, each shape of shapes-dev answered from the
# others loses 7.9% (geomean) against 11.1% without (benchmarks/nearest_fallback.py, H200).
ALTERNATES_PER_SHAPE = 1


@dataclass(frozen=True)
class Pick:
    """One exported row: the config for a bucketed key of a kernel, and where it came from."""
    kernel: str
    key: dict
    config: dict
    strategy: dict  # the bucketing strategy of the space it was chosen in
    provenance: dict  # measured times and errors, or the model's prediction
    alternates: list[dict] = field(default_factory=list)  # runner_ups of its shapes' studies


def _tile(config: Mapping) -> tuple:
    return (config["variant"], config.get("BLOCK_M"), config.get("BLOCK_N"),
            config.get("BLOCK_K"))


def runner_up_trials(trials: Iterable[Trial], config: Mapping) -> list[Trial]:
    """The fastest measured trial of each tile (variant and BLOCK_M/N/K) other than
    `config`'s, fastest first, ALTERNATES_PER_SHAPE of them: what a study learnt besides its
    winner. Another tile, not another GROUP_M or stage count, since a neighbouring size wants
    a different tile far more often than a different pipeline depth of the same one."""
    taken, ups = {_tile(config)}, []
    for trial in sorted((t for t in trials if t.status == "ok" and t.p50_ms),
                        key=lambda t: t.p50_ms):
        if len(ups) == ALTERNATES_PER_SHAPE:
            break
        if _tile(trial.params) not in taken:
            taken.add(_tile(trial.params))
            ups.append(trial)
    return ups


def runner_ups(trials: Iterable[Trial], config: Mapping) -> list[dict]:
    """The configs of runner_up_trials."""
    return [dict(t.params) for t in runner_up_trials(trials, config)]


def study_trials(store: Store, device: Device,
                 kernel: KernelVersion) -> Callable[[Shape], Sequence[Trial]]:
    """A shape's measured trials: those of its latest finished study of the device and
    kernel (none if it has none), where the picks' alternates come from."""
    def trials(shape: Shape) -> Sequence[Trial]:
        study = store.shape_study(device, kernel, shape)
        return () if study is None else study.trials
    return trials


def _no_trials(shape: Shape) -> Sequence[Trial]:
    return ()


def export_launch(requested: str | None, winners: list[Winner]) -> str:
    """The launch mode to export: the one asked for, else the one the winners' studies were
    run with (a study from before the choice optimised device time: graph), else
    DEFAULT_LAUNCH."""
    if requested is not None:
        return requested
    modes = {w.study.launch or GRAPH for w in winners}
    if len(modes) > 1:
        raise ExportError(f"the winners were tuned under launch modes {', '.join(sorted(modes))}"
                          "; choose one with --launch")
    return modes.pop() if modes else DEFAULT_LAUNCH


def exported_trial(winner: Winner, launch: str) -> Trial | None:
    """The trial to ship for a winner's key under `launch`: the stored winner where its study
    optimised that mode (its final side-by-side re-timing chose it, which no single trial's
    figure beats for accuracy) and the mode may choose it (objective.eligible: a study stored
    before that rule may hold one it may not), else the study's correct trial fastest by the
    mode's figure among those it may choose; None where no trial has that figure (stored
    before it was measured)."""
    same_mode = (winner.study.launch or GRAPH) == launch
    if same_mode and launch == GRAPH:  # graph may choose any trial
        return winner.trial
    measured = eligible([t for t in winner.study.trials
                         if t.status == "ok" and call_ms(t, launch) is not None], launch)
    if same_mode and winner.trial.id in {t.id for t in measured}:
        return winner.trial
    return min(measured, key=lambda t: call_ms(t, launch), default=None)


def winner_picks(winners: list[Winner], launch: str,
                 shape_trials: Callable[[Shape], Sequence[Trial]] = _no_trials) -> list[Pick]:
    """The tuned winners under `launch` as picks, with their measurements as provenance, and
    the runner-ups of their shapes' studies (shape_trials, e.g. study_trials) as alternates."""
    picks, unmeasured = [], []
    for w in winners:
        t, study = exported_trial(w, launch), w.study
        if t is None:
            unmeasured.append(study.shape_label)
            continue
        ups = runner_up_trials(shape_trials(study.shape), t.params)
        picks.append(Pick(w.kernel.name, w.key, dict(t.params), dict(study.space.strategy), {
            "tuned_shape": study.shape_label,
            "ms": t.p50_ms, "p20_ms": t.p20_ms, "p80_ms": t.p80_ms,
            "tflops": t.tflops,
            "loop_ms": t.loop_ms, "host_us": t.host_us,
            "cublas_ms": study.baseline_ms,
            # the alternates' kernel times here: how the runtime's fallback calibrates the
            # model where they answer other keys (runtime.Measurement)
            **({"alternates_ms": [u.p50_ms for u in ups]} if ups else {}),
            "rel_error": t.rel_error,
            "timing": t.timing_method,
            "space_hash": study.space.hash,
            "tuned_at": t.created_at.isoformat(timespec="seconds"),
        }, [dict(u.params) for u in ups]))
    if unmeasured:  # only eager's figure can be missing: every correct trial has p50_ms
        raise ExportError(f"{len(unmeasured)} tuned shapes have no {FIGURES[launch]} figure "
                          f"(tuned before it was stored: {', '.join(unmeasured)}); export them "
                          f"with --launch {GRAPH}, or tune them again with `tune run --retune`")
    return picks


def bucket_picks(bucketing: Bucketing,
                 shape_trials: Callable[[Shape], Sequence[Trial]] = _no_trials) -> list[Pick]:
    """The buckets `tune buckets` chose, one pick each, with their members' regrets, and as
    alternates the runner-ups of each member's study (shape_trials) to the bucket's config."""
    picks = []
    for b in bucketing.buckets:
        alternates = {}
        for member in b["members"]:
            for config in runner_ups(shape_trials(Shape.from_label(member["shape"])),
                                     b["config"]):
                alternates.setdefault(config_signature(config), config)
        picks.append(Pick(bucketing.kernel.name, dict(zip(KEY_FIELDS, b["key"])), b["config"],
                          dict(bucketing.strategy), {
                              "members": b["members"],
                              "max_regret": max(m["regret"] for m in b["members"]),
                              "regret_budget": bucketing.max_regret,
                              "chosen_at": bucketing.created_at.isoformat(timespec="seconds"),
                          }, list(alternates.values())))
    return picks


def device_picks(store: Store, device: Device, winners: list[Winner], launch: str,
                 exact: bool) -> tuple[list[Pick], list[str]]:
    """What an export of one device ships, per kernel: the buckets of its latest `tune
    buckets` decision (unless `exact`), else its winners under `launch`; and a line for the
    user per kernel exported as buckets."""
    picks, notes = [], []
    for kernel in {w.kernel.name: w.kernel for w in winners}.values():
        bucketing = None if exact else store.latest_bucketing(device, kernel.name,
                                                               kernel.source_hash)
        trials = study_trials(store, device, kernel)
        if bucketing is None:
            picks += winner_picks([w for w in winners if w.kernel.name == kernel.name], launch,
                                  trials)
            continue
        picks += bucket_picks(bucketing, trials)
        # tune buckets weighs device time (tuner.execution.cross_timing), whatever the launch mode.
        by_device_time = "" if launch == GRAPH else (
            f", by device time (--exact: one row per key by the {launch} figure)")
        notes.append(f"{kernel.name}: {len(bucketing.buckets)} buckets chosen by `tune buckets` "
                     f"at {bucketing.created_at:%Y-%m-%d %H:%M}{by_device_time}")
    return picks, notes


def _grouped(picks: list[Pick], op_of) -> dict[str, list[Pick]]:
    groups: dict[str, list[Pick]] = {}
    for pick in picks:
        groups.setdefault(op_of(pick), []).append(pick)
    return groups


def _strategy(op: str, picks: list[Pick]) -> dict:
    strategies = {tuple(p.strategy[f] for f in KEY_FIELDS) for p in picks}
    if len(strategies) > 1:
        differ = [f for i, f in enumerate(KEY_FIELDS) if len({s[i] for s in strategies}) > 1]
        kernels = ", ".join(sorted({p.kernel for p in picks}))
        raise ExportError(f"{op} configs (kernels {kernels}) were chosen with "
                          f"{len(strategies)} different bucketing strategies (they differ in "
                          f"{', '.join(differ)}); one export holds one strategy per op: give "
                          "their search spaces the same strategy")
    return dict(zip(KEY_FIELDS, strategies.pop()))


def _yaml_name(param: str) -> str:
    return _LAUNCH_OPTION_NAMES.get(param, param.lower())


def _expand_op(pick: Pick) -> str:
    """The FlagGems op a pick belongs to (a plugin kernel's variants keep their own name)."""
    variant = pick.config["variant"]
    return EXPAND_OP_NAMES.get(variant, f"{pick.kernel}_{variant}")


def expand_text(picks: list[Pick]) -> str:
    """The expand YAML of the picks FlagGems has an op for, headed by a comment line per pick
    left out (NO_EXPAND_OP): a reader must not take their keys for keys never tuned."""
    left_out = [p for p in picks if p.config["variant"] in NO_EXPAND_OP]
    kept = [p for p in picks if p.config["variant"] not in NO_EXPAND_OP]
    return "".join(map(_left_out_line, left_out)) + yaml_text(expand_document(kept))


def _left_out_line(pick: Pick) -> str:
    variant = pick.config["variant"]
    key = " ".join(f"{field}={value}" for field, value in pick.key.items())
    return (f"# left out: {pick.kernel} {key}, won by {variant} ({NO_EXPAND_OP[variant]}): "
            "FlagGems has no such op\n")


def expand_document(picks: list[Pick]) -> dict:
    """Per FlagGems op, the values its picks use. FlagGems has no variant or pad parameter:
    the op name carries the variant, and padded picks export their tiles."""
    doc = {}
    for op, group in _grouped(picks, _expand_op).items():
        params = tuple(dict.fromkeys(p for pick in group for p in pick.config
                                     if p not in KERNEL_PARAMS))
        meta = [p for p in params if p not in _LAUNCH_OPTION_NAMES]
        space = {"config": None, "param_map": {
            "META": {p: _yaml_name(p) for p in meta},
            **{p: _yaml_name(p) for p in params if p in _LAUNCH_OPTION_NAMES}}}
        for p in params:
            space[_yaml_name(p)] = sorted({pick.config[p] for pick in group
                                           if p in pick.config})
        doc[op] = [space, {"strategy": _strategy(op, group)}]
    return doc


def device_block(device: Device) -> dict:
    return {"name": device.name, "fingerprint": device.fingerprint,
            "compute_capability": device.compute_capability, "sm_count": device.sm_count,
            "driver": device.driver, "cuda": device.cuda, "torch": device.torch_version,
            "triton": device.triton_version}


def table_document(device: dict, picks: list[Pick], source_hashes: dict[str, str],
                   launch: str) -> dict:
    """The exact table: the launch mode its configs were chosen for, and per kernel its
    strategy and source hash, and one entry per key."""
    ops = {}
    for kernel, group in _grouped(picks, lambda p: p.kernel).items():
        entries = [{"key": p.key, "config": p.config,
                    **({"alternates": p.alternates} if p.alternates else {}), **p.provenance}
                   for p in sorted(group, key=lambda p: tuple(p.key.values()))]
        ops[kernel] = {"kernel_source_hash": source_hashes[kernel],
                       "strategy": _strategy(kernel, group), "entries": entries}
    return {"format": TABLE_FORMAT, "launch": launch,
            "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "device": device, "ops": ops}


def yaml_text(doc: dict) -> str:
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=100)


def write_atomic(path: str | Path, doc: dict) -> None:
    """Write YAML to a temporary file beside `path`, then rename it over `path`."""
    write_text_atomic(path, yaml_text(doc))


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write text to a temporary file beside `path`, then rename it over `path`: a reader
    sees the old file or the new one, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it private; an export is meant to be shipped
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
