"""The files `tune export` writes, and `tune suggest` through it: our exact table, FlagGems'
bounded expand YAML and its tune_configs.yaml; from a database (`export_table`,
`export_device_file`, on tuner.export.picks' picks) or from a table file
(`export_table_file`) where none is at hand. Their schemas are tuner.formats'; here they are
filled and headed by comments naming the device, the versions, the date and the source.

FlagGems has no op for some variants (cuBLAS): those picks are left out with a comment line,
or stand in as their fastest Triton alternate where a FlagGems deployment still needs a config
for the key (tuner.export.flaggems_ops).
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from tuner.db.models import Device
from tuner.db.store import Store
from tuner.export import ExportError
from tuner.export.cases import MODEL_NOTE, Tuned, tuned_from_db, tuned_from_table
from tuner.export.flaggems_ops import expand_op, left_out_line, no_expand_op, runnable_on_flaggems
from tuner.export.narrowing import DEFAULT_MAX_CONFIGS, regret_line
from tuner.export.op_lists import NarrowedOp, bounded_ops, union_ops
from tuner.export.picks import Pick, Selection, chosen_picks, grouped, op_strategy, picks_from_table
from tuner.export.time_missing import TimeMissing, Timer, narrowed_timing_missing
from tuner.formats import flaggems, table
from tuner.formats.device import comment_lines, device_block, is_interpreter
from tuner.formats.files import write_atomic, write_text_atomic, yaml_text
from tuner.objective import GRAPH
from tuner.reporting import STDERR, Reporter

# The formats' names, as `tune export` and `tune suggest` say them.
TABLE, EXPAND, TUNE_CONFIGS = "table", "expand", "flaggems-tune-configs"
FLAGGEMS_FORMATS = (EXPAND, TUNE_CONFIGS)


@dataclass(frozen=True)
class FlagGemsOptions:
    """How a FlagGems file is written: the most configs each expand op's lists may multiply
    to (0: the winners' union), whether mm_splitk (which FlagGems 5.x's ConfigLoader lacks)
    is written, whether CPU interpreter results may go under a GPU file name, and (expand
    only) where the narrowing's model-filled answers are timed (None: nowhere)."""
    max_configs: int = DEFAULT_MAX_CONFIGS
    with_splitk: bool = False
    allow_cpu: bool = False
    time_missing: TimeMissing | None = None


def wrote_line(picks: list[Pick], device: Device, launch: str, output: str | Path,
               fmt: str) -> str:
    return (f"wrote {len(picks)} configs of {device.name} chosen for {launch} launch to "
            f"{output} ({fmt})")


# -- our table --------------------------------------------------------------------------------
def table_document(device: dict, picks: list[Pick], source_hashes: dict[str, str],
                   launch: str) -> dict:
    """The exact table of the picks (tuner.formats.table), one op per kernel, with the one
    strategy its picks share."""
    return table.table_document(device, {
        kernel: table.OpRows(source_hashes[kernel], op_strategy(kernel, group), group)
        for kernel, group in grouped(picks, lambda p: p.kernel).items()}, launch)


def export_table(store: Store, output: str | Path, selection: Selection,
                 merge: Sequence[str | Path] = (), reporter: Reporter = STDERR) -> None:
    """`tune export table`: write the selected picks of one device (chosen_picks) to `output`
    as the exact table, taking in the entries of each `merge` file (a runtime online cache,
    tuner.runtime.online) whose buckets the database's picks lack
    (tuner.formats.table.merge_documents: the database wins its buckets)."""
    device, winners, launch, picks = chosen_picks(store, selection, reporter)
    doc = table_document(device_block(device, device.fingerprint), picks, {
        w.kernel.name: w.kernel.source_hash for w in winners}, launch)
    for extra in merge:
        doc, merge_notes = table.merge_documents(doc, _table_document(extra))
        for line in merge_notes:
            reporter.note(f"{extra}: {line}")
    write_atomic(output, doc)
    reporter.note(wrote_line(picks, device, launch, output, TABLE))


# -- FlagGems' files --------------------------------------------------------------------------
def expand_text(picks: list[Pick]) -> str:
    """The unbounded expand YAML of the picks FlagGems has an op for (union_ops), headed by a
    comment line per pick left out (Variant.no_expand_op): a reader must not take their keys
    for keys never tuned."""
    left_out = [p for p in picks if no_expand_op(p)]
    kept = [p for p in picks if not no_expand_op(p)]
    return "".join(map(left_out_line, left_out)) + yaml_text(
        flaggems.expand_document(union_ops(kept), for_both_readers=False))


# Names that say a file is for a GPU (FlagGems' mm_hopper_expand.yaml among them).
_GPU_FILE_NAME = re.compile(r"(?<![a-z])(hopper|ampere|blackwell|[abhl]\d{2,3}|gb\d{3}|sm_?\d{2,3})"
                            r"(?!\d)")


def check_output_name(device: Mapping, output: str | Path, allow_cpu: bool) -> None:
    """Refuse to write interpreter (CPU) results under a GPU file name unless allowed."""
    name = Path(output).name.lower()
    if is_interpreter(device) and not allow_cpu and _GPU_FILE_NAME.search(name):
        raise ExportError(f"refusing to write CPU interpreter results (device "
                          f"{device.get('name')!r}, no GPU timing) to {Path(output).name}, a GPU "
                          "file name; export a GPU's winners, or pass --allow-cpu")


def _values(params: Sequence[str], values: tuple) -> str:
    return " ".join(f"{flaggems.yaml_name(p)}={v}" for p, v in zip(params, values)
                    if v is not None)


def expand_header(device: Mapping, source: str, launch: str, max_configs: int,
                  ops: Sequence[NarrowedOp], model_note: str) -> str:
    """The comment heading an expand file: what it is for, the device and versions, when and
    from what, the bound, and per op its product and regret (and each shape's answer)."""
    lines = [f"# gemm-tuner expand file (FlagGems' expand schema): {flaggems.MM_OP} and "
             f"{flaggems.GEMV_OP} for FlagGems 5.x's ConfigLoader; {flaggems.REFERENCE_MATMUL} "
             f"and {flaggems.GEMV_OP} for the reference Hopper mm.py",
             *comment_lines(device, source, launch),
             "# bound: " + (f"each op's lists multiply to at most {max_configs} configs "
                            "(--max-configs; 0 keeps the winners' union)" if max_configs > 0
                            else "none (--max-configs 0): the winners' union of values")]
    for narrowed in ops:
        n = narrowed.narrowing
        lines.append(f"# {narrowed.op}: {n.product} configs (the winners' union: "
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


def tune_configs_header(device: Mapping, source: str, launch: str,
                        doc: Mapping[str, list]) -> str:
    counts = ", ".join(f"{op}: {len(entries)}" for op, entries in doc.items())
    lines = ["# gemm-tuner tune_configs (FlagGems' tune_configs.yaml op list): the exact "
             "tuned winners, each tried as listed, no runtime search",
             *comment_lines(device, source, launch), f"# configs per op: {counts}"]
    return "".join(line + "\n" for line in lines)


def _bounded_expand_text(picks: Sequence[Pick], tuned: Sequence[Tuned], device: Mapping,
                         source: str, launch: str, options: FlagGemsOptions,
                         reporter: Reporter, timer: Timer | None) -> str:
    model_note = MODEL_NOTE
    if timer is None:
        ops, left_out = bounded_ops(picks, tuned, device, options.max_configs,
                                    options.with_splitk)
    else:
        ops, left_out, done = narrowed_timing_missing(picks, tuned, device, options.max_configs,
                                                      options.with_splitk, timer, reporter)
        reporter.note(done.line())
        model_note = f"{MODEL_NOTE}\n# {done.line()}"
    for narrowed in ops:
        n = narrowed.narrowing
        reporter.note(f"{narrowed.op}: {n.product} configs (union {n.union_product}); "
                      f"{regret_line(n)}")
    return (expand_header(device, source, launch, options.max_configs, ops, model_note)
            + "".join(left_out)
            + yaml_text(flaggems.expand_document([narrowed.lists() for narrowed in ops])))


def _tune_configs_text(picks: Sequence[Pick], device: Mapping, source: str, launch: str,
                       options: FlagGemsOptions) -> str:
    kept, left_out = runnable_on_flaggems(picks)
    groups = {}
    for op, group in grouped(kept, expand_op).items():
        if op == flaggems.SPLITK_OP and not options.with_splitk:
            left_out.append(f"# left out: {op} ({len(group)} configs won by split-K); "
                            "--with-splitk writes them\n")
            continue
        groups[op] = [p.config for p in sorted(group, key=lambda p: tuple(p.key.values()))]
    doc = flaggems.tune_configs_document(groups)
    return tune_configs_header(device, source, launch, doc) + "".join(left_out) + yaml_text(doc)


def flaggems_text(fmt: str, picks: Sequence[Pick], tuned: Sequence[Tuned], device: Mapping,
                  source: str, launch: str, options: FlagGemsOptions = FlagGemsOptions(),
                  reporter: Reporter = STDERR, timer: Timer | None = None) -> str:
    """The text of a FlagGems file of the picks: the bounded expand YAML (EXPAND; its regret
    per op noted; with a `timer`, the model-filled answers timed first:
    narrowed_timing_missing) or tune_configs.yaml (TUNE_CONFIGS), headed by comments naming
    the device, versions, date, `source` and what was left out."""
    if fmt == EXPAND:
        return _bounded_expand_text(picks, tuned, device, source, launch, options, reporter,
                                    timer)
    return _tune_configs_text(picks, device, source, launch, options)


def _table_document(table_path: str | Path) -> dict:
    """The document of a table file; a missing, non-UTF-8, malformed or non-table file, or
    one with an entry this install's kernels cannot run, is one line naming it and the entry
    (tuner.formats.table.read_document, checked_document)."""
    from tuner.kernels import kernel_variants

    try:
        doc = table.read_document(Path(table_path))[0]
    except FileNotFoundError as e:
        raise ExportError(str(e)) from None
    table.checked_document(doc, f"gemm-tuner table {table_path}", kernel_variants())
    return doc


def _flaggems_of_table(doc: Mapping, table_path: str | Path, fmt: str,
                       options: FlagGemsOptions, reporter: Reporter,
                       timer: Timer | None) -> str:
    return flaggems_text(fmt, picks_from_table(doc), tuned_from_table(doc),
                         table.document_device(doc), f"table {table_path}",
                         table.document_launch(doc, GRAPH), options, reporter, timer)


def expand_from_table(table_path: str | Path, options: FlagGemsOptions = FlagGemsOptions(),
                      fmt: str = EXPAND, reporter: Reporter = STDERR,
                      timer: Timer | None = None) -> str:
    """The FlagGems file (fmt: EXPAND, bounded to options.max_configs per op, or
    TUNE_CONFIGS) of a table file (`tune export table`), with no database: its entries'
    configs, weighed on their `ms` and `alternates_ms` (the model filling the rest, or
    `timer` timing what the narrowing's answers lack: flaggems_text)."""
    return _flaggems_of_table(_table_document(table_path), table_path, fmt, options, reporter,
                              timer)


def check_time_missing(fmt: str, options: FlagGemsOptions) -> None:
    if options.time_missing is not None and fmt != EXPAND:
        raise ExportError(f"--time-missing times what a bounded expand file's narrowing "
                          f"lacks: use it with `tune export expand`, not {fmt}")


def export_table_file(table_path: str | Path, fmt: str, output: str | Path,
                      options: FlagGemsOptions = FlagGemsOptions(),
                      reporter: Reporter = STDERR) -> None:
    """`tune export expand|tune-configs --table FILE`: a FlagGems file from a table file
    instead of a database. options.time_missing (expand only) times the narrowing's
    model-filled answers on this machine's device (the table's: checked); nothing stored."""
    if fmt not in FLAGGEMS_FORMATS:
        raise ExportError(f"--table converts a table to {' or '.join(FLAGGEMS_FORMATS)}, not "
                          f"{fmt}")
    check_time_missing(fmt, options)
    doc = _table_document(table_path)
    device = table.document_device(doc)
    check_output_name(device, output, options.allow_cpu)
    timing = nullcontext() if options.time_missing is None else options.time_missing.timer(
        device.get("fingerprint"), device.get("name"), reporter=reporter)
    with timing as timer:
        text = _flaggems_of_table(doc, table_path, fmt, options, reporter, timer)
    write_text_atomic(output, text)
    reporter.note(f"wrote {output} ({fmt}) from {table_path}")


def export_device_file(store: Store, fmt: str, output: str | Path, selection: Selection,
                       options: FlagGemsOptions = FlagGemsOptions(),
                       source: str = "the tuning database", reporter: Reporter = STDERR
                       ) -> None:
    """`tune export expand|tune-configs`: write the selected picks of one device
    (tuner.export.picks.chosen_picks) as the expand YAML (each op's lists bounded to
    options.max_configs configs, weighing the winners' studies: tuned_from_db; its regret
    noted) or FlagGems' tune_configs.yaml.

    options.time_missing (expand only) times the narrowing's model-filled answers on this
    machine's device (the winners': checked) and stores them as cross timings, which later
    exports weigh as measured."""
    check_time_missing(fmt, options)
    device, winners, launch, picks = chosen_picks(store, selection, reporter)
    block = device_block(device, device.fingerprint, smem_per_block=device.smem_per_block)
    check_output_name(block, output, options.allow_cpu)
    tuned = tuned_from_db(store, device, winners, launch, picks) if fmt == EXPAND else []
    args = (fmt, picks, tuned, block, source, launch, options, reporter)
    if options.time_missing is None:
        text = flaggems_text(*args)
    else:
        kernels = {w.kernel.name: w.kernel for w in winners}
        with options.time_missing.db_timer(store, device, kernels, reporter) as timer:
            text = flaggems_text(*args, timer=timer)
    write_text_atomic(output, text)
    reporter.note(wrote_line(picks, device, launch, output, fmt))
