"""Writing FlagGems' files (tuner.flaggems) from our picks: the expand YAML of the values
that won (`expand_document`, unbounded: `tune suggest`), the bounded expand YAML (each op's
product narrowed by tuner.expand, weighing each tuned shape's measured configs,
tuner.expand_cases) and tune_configs.yaml; from a database (`export_device_file`, on
tuner.export's picks) or from a table file (`export_table_file`) where none is at hand.

FlagGems has no op for some variants (cuBLAS): those picks are left out with a comment line,
or stand in as their fastest Triton alternate where a FlagGems deployment still needs a config
for the key.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

from tuner import flaggems
from tuner.db.models import Device, Winner
from tuner.db.store import Store, params_key
from tuner.expand import DEFAULT_MAX_CONFIGS, narrow, regret_line
from tuner.expand_cases import MODEL_NOTE, Tuned, case_for, device_spec_of, projected
from tuner.export import (
    ExportError,
    Pick,
    chosen_picks,
    device_block,
    exported_trial,
    grouped,
    note_on_stderr,
    op_strategy,
    wrote_line,
)
from tuner.objective import GRAPH
from tuner.runtime import table
from tuner.runtime.table import write_text_atomic, yaml_text
from tuner.shapes import Shape
from tuner.space import KERNEL_PARAMS


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


def _expand_op(pick: Pick) -> str:
    """The FlagGems op a pick belongs to, as its variant declares it (Variant.expand_op); a
    plugin kernel's variants keep their own name."""
    variant = _pick_variant(pick)
    if variant is not None and variant.expand_op:
        return variant.expand_op
    return f"{pick.kernel}_{pick.config['variant']}"


def _no_expand_op(pick: Pick) -> str | None:
    """What a pick's variant is, where FlagGems has no op for it (Variant.no_expand_op)."""
    variant = _pick_variant(pick)
    return None if variant is None else variant.no_expand_op


def expand_text(picks: list[Pick]) -> str:
    """The expand YAML of the picks FlagGems has an op for, headed by a comment line per pick
    left out (Variant.no_expand_op): a reader must not take their keys for keys never tuned."""
    left_out = [p for p in picks if _no_expand_op(p)]
    kept = [p for p in picks if not _no_expand_op(p)]
    return "".join(map(_left_out_line, left_out)) + yaml_text(expand_document(kept))


def _left_out_line(pick: Pick) -> str:
    variant = pick.config["variant"]
    key = " ".join(f"{field}={value}" for field, value in pick.key.items())
    return (f"# left out: {pick.kernel} {key}, won by {variant} ({_no_expand_op(pick)}): "
            "FlagGems has no such op\n")


def expand_document(picks: list[Pick]) -> dict:
    """Per FlagGems op, the values its picks use. FlagGems has no variant or pad parameter:
    the op name carries the variant, and padded picks export their tiles."""
    doc = {}
    for op, group in grouped(picks, _expand_op).items():
        params = tuple(dict.fromkeys(p for pick in group for p in pick.config
                                     if p not in KERNEL_PARAMS))
        meta = [p for p in params if p not in flaggems.LAUNCH_OPTION_NAMES]
        space = {"config": None, "param_map": {
            "META": {p: flaggems.yaml_name(p) for p in meta},
            **{p: flaggems.yaml_name(p) for p in params if p in flaggems.LAUNCH_OPTION_NAMES}}}
        for p in params:
            space[flaggems.yaml_name(p)] = sorted({pick.config[p] for pick in group
                                           if p in pick.config})
        doc[op] = [space, {"strategy": op_strategy(op, group)}]
    return doc


# -- FlagGems' files: the bounded expand YAML and tune_configs.yaml ---------------------------
# Names that say a file is for a GPU (FlagGems' mm_hopper_expand.yaml among them).
_GPU_FILE_NAME = re.compile(r"(?<![a-z])(hopper|ampere|blackwell|[abhl]\d{2,3}|gb\d{3}|sm_?\d{2,3})"
                            r"(?!\d)")


def check_output_name(device: Mapping, output: str | Path, allow_cpu: bool) -> None:
    """Refuse to write interpreter (CPU) results under a GPU file name unless allowed."""
    name = Path(output).name.lower()
    if flaggems.is_interpreter(device) and not allow_cpu and _GPU_FILE_NAME.search(name):
        raise ExportError(f"refusing to write CPU interpreter results (device "
                          f"{device.get('name')!r}, no GPU timing) to {Path(output).name}, a GPU "
                          "file name; export a GPU's winners, or pass --allow-cpu")


def _op_of(kernel: str, config: Mapping) -> str | None:
    """The FlagGems op a config of a kernel exports to; None for a variant FlagGems has no op
    for (cuBLAS)."""
    pick = Pick(kernel, {}, dict(config), {}, {})
    return None if _no_expand_op(pick) else _expand_op(pick)


def _same_op(kernel: str, op: str, timed: Iterable[tuple[Mapping, float | None]]) -> tuple:
    return tuple((dict(c), ms) for c, ms in timed if ms and _op_of(kernel, c) == op)


def tuned_from_db(store: Store, device: Device, winners: list[Winner], launch: str,
                  picks: Sequence[Pick] = ()) -> list[Tuned]:
    """Each tuned shape of the winners (their studies' trials loaded) as the narrowing
    weighs it: the config exported for it under `launch`, its kernel time, and every other
    config of its op it was timed with: its study's trials, and `tune buckets`' cross
    timings (scaled to the study's timing of the winner where both timed it). Weights: the
    shapes CSV's, where a bucketed pick's members name them, else 1."""
    weights = {m["shape"]: m.get("weight", 1.0)
               for p in picks for m in p.provenance.get("members", ())}
    tuned = []
    for w in winners:
        trial = exported_trial(w, launch)
        if trial is None or not trial.p50_ms:
            continue
        if _op_of(w.kernel.name, trial.params) is None:  # cuBLAS won: its fastest Triton trial
            trial = min((t for t in w.study.trials if t.status == "ok" and t.p50_ms
                         and _op_of(w.kernel.name, t.params)),
                        key=lambda t: t.p50_ms, default=trial)
        op = _op_of(w.kernel.name, trial.params)
        if op is None:
            continue
        shape = w.study.shape
        timed = [(t.params, t.p50_ms) for t in w.study.trials if t.status == "ok"]
        rows = store.cross_timings(device, w.kernel, shape)
        cross = {k: row for k, row in rows.items() if row.status == "ok" and row.p50_ms}
        mine = cross.get(params_key(trial.params))
        scale = trial.p50_ms / mine.p50_ms if mine is not None else 1.0
        timed += [(row.params, row.p50_ms * scale) for row in cross.values()]
        # a config found unable to run the shape (refused, wrong, failed to compile) is
        # measured as never answering it
        timed += [(row.params, math.inf) for row in rows.values() if row.status in CANNOT_RUN]
        tuned.append(Tuned(shape, w.kernel.name, dict(trial.params), trial.p50_ms,
                           _same_op(w.kernel.name, op, timed), weights.get(str(shape), 1.0)))
    return tuned


def picks_from_table(doc: Mapping) -> list[Pick]:
    """A table document's entries (tuner.runtime.table) as picks, one op per kernel."""
    picks = []
    for kernel, body in (doc.get("ops") or {}).items():
        for entry in body.get("entries", ()):
            provenance = {k: v for k, v in entry.items()
                          if k not in ("key", "config", "alternates")}
            picks.append(Pick(kernel, dict(entry["key"]), dict(entry["config"]),
                              dict(body["strategy"]), provenance,
                              list(entry.get("alternates", ()))))
    return picks


def tuned_from_table(doc: Mapping) -> list[Tuned]:
    """Each measured entry of a table document as the narrowing weighs it: its tuned shape,
    config and `ms`, and its alternates with `alternates_ms`. Entries of a bucketed export
    state no time of their own: their configs join the lists, but weigh no shape."""
    tuned = []
    for kernel, body in (doc.get("ops") or {}).items():
        for entry in body.get("entries", ()):
            ms, label, config = entry.get("ms"), entry.get("tuned_shape"), entry["config"]
            timed = list(zip(entry.get("alternates", ()), entry.get("alternates_ms", ())))
            if _op_of(kernel, config) is None:  # cuBLAS won: its fastest Triton runner-up
                config, ms = min(((c, t) for c, t in timed if t and _op_of(kernel, c)),
                                 key=lambda pair: pair[1], default=(config, ms))
            op = _op_of(kernel, config)
            if not (isinstance(ms, (int, float)) and ms > 0 and isinstance(label, str)) or (
                    op is None):
                continue
            others = [(c, t) for c, t in timed if c != config]
            tuned.append(Tuned(Shape.from_label(label), kernel, dict(config), float(ms),
                               _same_op(kernel, op, others)))
    return tuned


def _op_params(configs: Iterable[Mapping]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(p for c in configs for p in c if p not in KERNEL_PARAMS))


def triton_stand_in(pick: Pick) -> Pick:
    """The pick as FlagGems can run it: a pick of a variant FlagGems has no op for (cuBLAS)
    becomes its first alternate that has one (the runner-ups are fastest first), since a
    deployment on FlagGems still runs a Triton config for that key; otherwise the pick."""
    if not _no_expand_op(pick):
        return pick
    for config in pick.alternates:
        if _op_of(pick.kernel, config) is not None:
            return Pick(pick.kernel, pick.key, dict(config), pick.strategy,
                        {**pick.provenance, "stands_in_for": pick.config["variant"]})
    return pick


def _runnable_on_flaggems(picks: Sequence[Pick]) -> tuple[list[Pick], list[str]]:
    """The picks as FlagGems can run them (triton_stand_in), and a comment line for each
    that still has no FlagGems op."""
    picks = [triton_stand_in(p) for p in picks]
    return ([p for p in picks if not _no_expand_op(p)],
            [_left_out_line(p) for p in picks if _no_expand_op(p)])


def flaggems_spaces(picks: Sequence[Pick], tuned: Sequence[Tuned], device: Mapping,
                    max_configs: int, with_splitk: bool, spec=None
                    ) -> tuple[list[flaggems.OpSpace], list[str]]:
    """Per FlagGems op of the picks (mm_splitk only `with_splitk`), its value lists narrowed
    to at most max_configs configs (tuner.expand; 0: the union) over the tuned shapes of its
    op; and comment lines for what was left out. spec: the device's model DeviceSpec, if
    already built."""
    spec = device_spec_of(device) if spec is None else spec
    kept, left_out = _runnable_on_flaggems(picks)
    spaces = []
    for op, group in grouped(kept, _expand_op).items():
        if op == flaggems.SPLITK_OP and not with_splitk:
            left_out.append(f"# left out: {op} ({len(group)} configs won by split-K): FlagGems "
                            "5.x's ConfigLoader has no such op; --with-splitk writes it\n")
            continue
        mine = [t for t in tuned if _op_of(t.kernel, t.winner) == op]
        params = flaggems.enumerated(op, _op_params([p.config for p in group]
                                                    + [t.winner for t in mine]))
        narrowing = narrow(params, [case_for(params, t, spec) for t in mine], max_configs,
                           [projected(params, p.config) for p in group])
        spaces.append(flaggems.OpSpace(op, op_strategy(op, group), narrowing))
    return spaces, left_out


# -- --time-missing: timing on the GPU the answers the model filled in ------------------------
# How often the narrowing is redone after timing its model-filled answers, at most.
TIMING_ROUNDS = 3
# Cross-timing statuses that say a config cannot run a shape (it never answers it); a lost
# worker or a timeout says nothing of the config.
CANNOT_RUN = ("unsupported", "infeasible", "compile_error", "runtime_error", "wrong")

# (tuned shape, full configs) -> each config's kernel time over the shape's winner's, both
# timed side by side now (inf: the config cannot run the shape; None: no answer); e.g.
# tuner.expand_timing.SideBySideTimer.
Timer = Callable[[Tuned, list[dict]], list]


@dataclass(frozen=True)
class TimedMissing:
    """What --time-missing did: configs timed, narrowing rounds that timed some, and the
    model-filled answers left (none, unless the rounds ran out or a timing was lost)."""
    configs: int
    rounds: int
    left: int

    def line(self) -> str:
        return (f"--time-missing timed {self.configs} model-filled answers on this device "
                f"side by side with their shape's winner ({self.rounds} rounds); "
                f"{self.left} answers still model-predicted")


def model_filled(spaces: Sequence[flaggems.OpSpace], tuned: Sequence[Tuned]
                 ) -> list[tuple[Tuned, dict]]:
    """Each tuned shape whose best config inside its op's product has a model-filled time,
    with that config in full: the shape's winner with the product's values put in (as
    tuner.expand_cases.case_for prices it)."""
    missing = []
    for space in spaces:
        n = space.narrowing
        mine = {str(t.shape): t for t in tuned if _op_of(t.kernel, t.winner) == space.op}
        for label, outcome in n.outcomes.items():
            t = mine.get(label)
            if t is None or outcome.replacement is None or outcome.measured:
                continue
            missing.append((t, {**t.winner, **{p: v for p, v in zip(n.params,
                                                                    outcome.replacement)
                                               if p in t.winner and v is not None}}))
    return missing


def narrowed_timing_missing(picks: Sequence[Pick], tuned: Sequence[Tuned], device: Mapping,
                            max_configs: int, with_splitk: bool, timer: Timer,
                            note: Callable[[str], None] = note_on_stderr
                            ) -> tuple[list[flaggems.OpSpace], list[str], TimedMissing]:
    """flaggems_spaces, with each tuned shape whose answer inside the product is
    model-filled timed by `timer` (that config beside the shape's winner, the ratio scaled to
    the winner's stored time) and the lists narrowed again, until no answer is model-filled
    or TIMING_ROUNDS rounds have timed."""
    spec = device_spec_of(device)
    tuned = list(tuned)
    spaces, left_out = flaggems_spaces(picks, tuned, device, max_configs, with_splitk, spec)
    tried: set[tuple[str, str]] = set()
    timed = rounds = 0
    for _ in range(TIMING_ROUNDS):
        missing = [(t, c) for t, c in model_filled(spaces, tuned)
                   if (str(t.shape), params_key(c)) not in tried]
        if not missing:
            break
        rounds += 1
        note(f"--time-missing round {rounds}: timing {len(missing)} model-filled answers "
             "beside their shapes' winners")
        index = {id(t): i for i, t in enumerate(tuned)}
        for t, config in missing:
            tried.add((str(t.shape), params_key(config)))
            (ratio,) = timer(t, [config])
            if ratio is None:
                note(f"  {t.shape}: no timing of {params_key(config)}; it stays model-filled")
                continue
            timed += 1
            i = index[id(t)]
            tuned[i] = replace(tuned[i], measured=(*tuned[i].measured,
                                                   (config, ratio * t.winner_ms)))
        spaces, left_out = flaggems_spaces(picks, tuned, device, max_configs, with_splitk,
                                           spec)
    return spaces, left_out, TimedMissing(timed, rounds, len(model_filled(spaces, tuned)))


def flaggems_text(fmt: str, picks: Sequence[Pick], tuned: Sequence[Tuned], device: Mapping,
                  source: str, launch: str, max_configs: int = DEFAULT_MAX_CONFIGS,
                  with_splitk: bool = False,
                  note: Callable[[str], None] = note_on_stderr, timer: Timer | None = None) -> str:
    """The text of a FlagGems file of the picks: the bounded expand YAML (fmt "expand"; its
    regret per op noted; with a `timer`, the model-filled answers timed first:
    narrowed_timing_missing) or tune_configs.yaml ("flaggems-tune-configs"), headed by
    comments naming the device, versions, date, `source` and what was left out."""
    if fmt == "expand":
        model_note = MODEL_NOTE
        if timer is None:
            spaces, left_out = flaggems_spaces(picks, tuned, device, max_configs, with_splitk)
        else:
            spaces, left_out, done = narrowed_timing_missing(picks, tuned, device, max_configs,
                                                             with_splitk, timer, note)
            note(done.line())
            model_note = f"{MODEL_NOTE}\n# {done.line()}"
        for space in spaces:
            n = space.narrowing
            note(f"{space.op}: {n.product} configs (union {n.union_product}); "
                 f"{regret_line(n)}")
        return (flaggems.expand_header(device, source, launch, max_configs, spaces,
                                       model_note)
                + "".join(left_out) + yaml_text(flaggems.expand_document(spaces)))
    kept, left_out = _runnable_on_flaggems(picks)
    groups = {}
    for op, group in grouped(kept, _expand_op).items():
        if op == flaggems.SPLITK_OP and not with_splitk:
            left_out.append(f"# left out: {op} ({len(group)} configs won by split-K); "
                            "--with-splitk writes them\n")
            continue
        groups[op] = [p.config for p in sorted(group, key=lambda p: tuple(p.key.values()))]
    doc = flaggems.tune_configs_document(groups)
    return (flaggems.tune_configs_header(device, source, launch, doc) + "".join(left_out)
            + yaml_text(doc))


def expand_from_table(table_path: str | Path, max_configs: int = DEFAULT_MAX_CONFIGS,
                      with_splitk: bool = False, fmt: str = "expand",
                      note: Callable[[str], None] = note_on_stderr,
                      timer: Timer | None = None) -> str:
    """The FlagGems file (fmt: "expand", bounded to max_configs per op, or
    "flaggems-tune-configs") of a table file (`tune export --format table`), with no
    database: its entries' configs, weighed on their `ms` and `alternates_ms` (the model
    filling the rest, or `timer` timing what the narrowing's answers lack: flaggems_text)."""
    return _flaggems_of_table(_table_document(table_path), table_path, fmt, max_configs,
                              with_splitk, note, timer)


def _flaggems_of_table(doc: Mapping, table_path: str | Path, fmt: str, max_configs: int,
                       with_splitk: bool, note: Callable[[str], None],
                       timer: Timer | None) -> str:
    return flaggems_text(fmt, picks_from_table(doc), tuned_from_table(doc),
                         doc.get("device") or {}, f"table {table_path}",
                         doc.get("launch", GRAPH), max_configs, with_splitk, note, timer)


def _table_document(table_path: str | Path) -> dict:
    """The document of a table file; a missing, non-UTF-8, malformed or non-table file is one
    line naming it (tuner.runtime.table.read_document)."""
    try:
        doc = table.read_document(Path(table_path))[0]
    except FileNotFoundError as e:
        raise ExportError(str(e)) from None
    if not table.is_table_document(doc):
        raise ExportError(f"{table_path}: not a '{table.TABLE_FORMAT}' table file")
    return doc


def check_time_missing(fmt: str, time_missing) -> None:
    if time_missing is not None and fmt != "expand":
        raise ExportError(f"--time-missing times what a bounded expand file's narrowing "
                          f"lacks: use it with --format expand, not {fmt}")


def export_table_file(table_path: str | Path, fmt: str, output: str | Path,
                      max_configs: int = DEFAULT_MAX_CONFIGS, with_splitk: bool = False,
                      allow_cpu: bool = False, note: Callable[[str], None] = note_on_stderr,
                      time_missing=None) -> None:
    """`tune export --table FILE`: a FlagGems file from a table file instead of a database.
    time_missing (expand only): a tuner.expand_timing.TimeMissing that times the narrowing's
    model-filled answers on this machine's device (the table's: checked); nothing stored."""
    if fmt not in flaggems.FORMATS:
        raise ExportError(f"--table converts a table to {' or '.join(flaggems.FORMATS)}, not "
                          f"{fmt}")
    check_time_missing(fmt, time_missing)
    doc = _table_document(table_path)
    device = doc.get("device") or {}
    check_output_name(device, output, allow_cpu)
    timing = nullcontext() if time_missing is None else time_missing.timer(
        device.get("fingerprint"), device.get("name"), note=note)
    with timing as timer:
        text = _flaggems_of_table(doc, table_path, fmt, max_configs, with_splitk, note, timer)
    write_text_atomic(output, text)
    note(f"wrote {output} ({fmt}) from {table_path}")


def export_device_file(store: Store, fmt: str, output: str | Path, selector: str | None,
                       exact: bool, launch: str | None,
                       note: Callable[[str], None] = note_on_stderr, *,
                       max_configs: int = DEFAULT_MAX_CONFIGS, with_splitk: bool = False,
                       allow_cpu: bool = False, source: str = "the tuning database",
                       time_missing=None) -> None:
    """`tune export --format expand|flaggems-tune-configs`: write the picks of one device
    (tuner.export.chosen_picks) as the expand YAML (each op's lists bounded to max_configs
    configs, weighing the winners' studies: tuned_from_db; its regret noted) or FlagGems'
    tune_configs.yaml.

    time_missing (expand only): a tuner.expand_timing.TimeMissing that times the narrowing's
    model-filled answers on this machine's device (the winners': checked) and stores them as
    cross timings, which later exports weigh as measured."""
    check_time_missing(fmt, time_missing)
    device, winners, launch, picks = chosen_picks(store, selector, launch, exact, note)
    block = device_block(device) | {"smem_per_block": device.smem_per_block}
    check_output_name(block, output, allow_cpu)
    tuned = tuned_from_db(store, device, winners, launch, picks) if fmt == "expand" else []
    args = (fmt, picks, tuned, block, source, launch, max_configs, with_splitk, note)
    if time_missing is None:
        text = flaggems_text(*args)
    else:
        with time_missing.db_timer(store, device, {w.kernel.name: w.kernel
                                                   for w in winners}, note) as timer:
            text = flaggems_text(*args, timer=timer)
    write_text_atomic(output, text)
    note(wrote_line(picks, device, launch, output, fmt))
