"""The table file, read and written here alone, so the reader and the writers cannot drift.

A table (`TABLE_FORMAT`) holds the launch mode its configs were chosen for, the device, and
per op its bucketing strategy, kernel source hash and one entry per bucketed key: the config,
the runner-up configs (`alternates`) the runtime's nearest fallback may choose among, and the
provenance (measured times, or the model's prediction). `tune export` and `tune suggest`
build theirs with `table_document` (written by tuner.formats.files); the runtime reads one
with `read_table`, the export's conversions with `table_rows`, and the runtime's online cache
joins one with `merge_documents`; an entry's measured times are read by `EntryTimes` alone.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import NamedTuple, Protocol

from tuner.errors import UserError
from tuner.space import config_signature
from tuner.textfiles import MiB, clipped, decoded, parsed_yaml, quoted, read_user_file

TABLE_FORMAT = "gemm-tuner-table/2"  # /2: configs name their variant and pad


# -- reading ----------------------------------------------------------------------------------
# The largest table file read: some hundred thousand entries, far more than any tuning stores.
MAX_TABLE_BYTES = 64 * MiB
# The largest size or stride a bucketed key may state: a call's (int32) bucketed upwards.
MAX_KEY_VALUE = 2**31


class TableError(UserError, ValueError):
    """A table file that cannot be used: one line naming the file, the field and what was
    expected."""


class TableMissing(UserError, FileNotFoundError):
    """A table file that cannot be opened (missing, unreadable): a FileNotFoundError to the
    runtime's callers, one line to the CLI's."""


class Table(NamedTuple):
    """A table file's contents the runtime reads: the device it was tuned on (its name, None
    where it names none) and per op its body (strategy and entries)."""
    device_name: str | None
    ops: dict[str, Mapping]


def read_document(path: Path) -> tuple[object, str]:
    """The YAML document at `path` and the file's text (its comments say what the document
    cannot); FileNotFoundError where it cannot be read, TableError where it is not a regular
    file of at most MAX_TABLE_BYTES of UTF-8 YAML. An expand file (tuner.formats.flaggems)
    is read here too: the runtime tells the two apart by content."""
    label = f"gemm-tuner table {path}"
    try:
        data = read_user_file(path, "table", MAX_TABLE_BYTES, TableError, label)
    except OSError as e:
        raise TableMissing(f"{label}: {e.strerror}") from None
    text = decoded(data, label, TableError)
    return parsed_yaml(text, label, TableError), text


def is_table_document(doc: object) -> bool:
    return isinstance(doc, dict) and doc.get("format") == TABLE_FORMAT


def document_device(doc: Mapping) -> dict:
    """The device header a table document states ({} where it states none)."""
    return doc.get("device") or {}


def document_launch(doc: Mapping, default: str) -> str:
    """The launch mode a table document's configs were chosen for (`default` for a table
    written before launch modes)."""
    return doc.get("launch", default)


def read_table(path: Path, doc: object = None,
               variants: Mapping[str, Mapping[str, Sequence[str]]] | None = None) -> Table:
    """The table at `path` (its document `doc`, where already read); FileNotFoundError where
    it cannot be read, TableError (a ValueError) naming the field where it is not a
    TABLE_FORMAT document whose entries the runtime can use: each key's sizes, strides and
    dtype, and each config's values by the space rules (tuner.space.allowed_value). With
    `variants` (per op, per variant, the parameters a config holds: the installed kernels'),
    also each op, each config's variant and the parameters it names."""
    if doc is None:
        doc = read_document(path)[0]
    checked_document(doc, f"gemm-tuner table {path}", variants)
    device = doc.get("device") or {}
    name = device.get("name")
    ops = dict(doc.get("ops") or {})
    if variants is not None:
        ops = {op: _with_later_params(body, variants[op]) for op, body in ops.items()}
    return Table(name if isinstance(name, str) else None, ops)


def _with_later_params(body: Mapping, variants: Mapping[str, Sequence[str]]) -> dict:
    """An op's body whose configs hold each parameter their variant took on after they were
    written (tuner.space.LATER_PARAM_DEFAULTS), at the value that runs them as before."""
    from tuner.space import LATER_PARAM_DEFAULTS

    def completed(config: Mapping) -> dict:
        return {**config, **{p: LATER_PARAM_DEFAULTS[p] for p in variants[config["variant"]]
                             if p in LATER_PARAM_DEFAULTS and p not in config}}

    return {**body, "entries": [
        {**entry, "config": completed(entry["config"]),
         "alternates": [completed(a) for a in entry.get("alternates", [])]}
        for entry in body["entries"]]}


def checked_document(doc: object, label: str,
                     variants: Mapping[str, Mapping[str, Sequence[str]]] | None = None) -> None:
    """TableError, starting with `label`, naming the first field of `doc` that is not as
    read_table says."""
    if not is_table_document(doc):
        raise TableError(f"{label}: not a '{TABLE_FORMAT}' file (write one with `tune export "
                         "table`)")
    device = doc.get("device") or {}
    if not isinstance(device, dict):
        raise _bad(label, "device", f"expected a mapping with name, got {quoted(device)}")
    ops = doc.get("ops") or {}
    if not isinstance(ops, dict):
        raise _bad(label, "ops", "expected a mapping of op to its strategy and entries, got "
                   f"{quoted(ops)}")
    for op, body in ops.items():
        _check_op(label, op, body, variants)


def _bad(label: str, field: str, problem: str) -> TableError:
    return TableError(f"{label}: field '{field}': {problem}")


def _check_op(label: str, op, body, variants) -> None:
    """TableError naming the field where an op's body lacks what the runtime reads."""
    from tuner.bucketing.strategies import KEY_FIELDS  # light; only reading needs it

    field = f"ops.{clipped(str(op))}"
    if variants is not None and op not in variants:
        raise _bad(label, field, f"expected an op of the installed kernels "
                   f"({', '.join(variants)}), got {quoted(op)}")
    if not isinstance(body, dict):
        raise _bad(label, field, f"expected a mapping with strategy and entries, got "
                   f"{quoted(body)}")
    strategy = body.get("strategy")
    if not isinstance(strategy, dict) or any(f not in strategy for f in KEY_FIELDS):
        raise _bad(label, f"{field}.strategy", f"expected a strategy for each of "
                   f"{', '.join(KEY_FIELDS)}, got {quoted(strategy)}")
    entries = body.get("entries")
    if not isinstance(entries, list):
        raise _bad(label, f"{field}.entries", f"expected a list of entries, got "
                   f"{quoted(entries)}")
    op_variants = None if variants is None else variants[op]
    for i, entry in enumerate(entries):
        where = f"{field}.entries[{i}]"
        if not isinstance(entry, dict):
            raise _bad(label, where, f"expected a mapping with key and config, got "
                       f"{quoted(entry)}")
        _check_key(label, f"{where}.key", entry.get("key"))
        alternates = entry.get("alternates", [])
        if not isinstance(alternates, list):
            raise _bad(label, f"{where}.alternates", f"expected a list of configs, got "
                       f"{quoted(alternates)}")
        _check_provenance(label, where, entry)
        _check_config(label, f"{where}.config", entry.get("config"), op_variants)
        for j, alternate in enumerate(alternates):
            _check_config(label, f"{where}.alternates[{j}]", alternate, op_variants)


def _check_provenance(label: str, where: str, entry: Mapping) -> None:
    """TableError naming a provenance field EntryTimes reads that is there but not of its
    kind: times are numbers, the tuned shape a Shape label."""
    from tuner.shapes import Shape  # light: no torch

    for name in ("ms", "cublas_ms"):
        if entry.get(name) is not None and not _number(entry[name]):
            raise _bad(label, f"{where}.{name}", f"expected a number, got {quoted(entry[name])}")
    times = entry.get("alternates_ms", [])
    if not isinstance(times, list) or not all(t is None or _number(t) for t in times):
        raise _bad(label, f"{where}.alternates_ms", f"expected a list of numbers, got "
                   f"{quoted(times)}")
    if "tuned_shape" in entry:
        try:
            Shape.from_label(entry["tuned_shape"])
        except ValueError as e:
            raise _bad(label, f"{where}.tuned_shape", str(e)) from None


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_key(label: str, field: str, key) -> None:
    """TableError naming the key field that is not a size, stride or dtype a call has."""
    from tuner.bucketing.strategies import KEY_FIELDS  # light; only reading needs it
    from tuner.dtypes import DTYPES  # light: no torch

    if not isinstance(key, dict) or any(f not in key for f in KEY_FIELDS):
        raise _bad(label, field, f"expected a value for each of {', '.join(KEY_FIELDS)}, got "
                   f"{quoted(key)}")
    for name in KEY_FIELDS:
        value = key[name]
        if name == "dtype":
            if not isinstance(value, str) or value not in DTYPES:
                raise _bad(label, f"{field}.dtype", f"expected one of {', '.join(DTYPES)}, "
                           f"got {quoted(value)}")
            continue
        low = 0 if name.startswith("stride") else 1
        if not _integer(value) or not low <= value <= MAX_KEY_VALUE:
            raise _bad(label, f"{field}.{name}", f"expected an integer from {low} to 2**31, "
                       f"got {quoted(value)}")


def _check_config(label: str, field: str, config,
                  variants: Mapping[str, Sequence[str]] | None) -> None:
    """TableError naming what is wrong with a config: it must be a mapping with a variant
    (one of `variants`, holding each of that variant's parameters, where given; others are
    not read), each other value an integer the space rules allow."""
    from tuner.space import LATER_PARAM_DEFAULTS, allowed_value, allowed_words

    if not isinstance(config, dict) or not isinstance(config.get("variant"), str):
        raise _bad(label, field, f"expected a mapping with a variant, got {quoted(config)}")
    variant = config["variant"]
    if variants is not None:
        params = variants.get(variant)
        if params is None:
            raise _bad(label, f"{field}.variant", f"expected a variant of the installed "
                       f"kernel ({', '.join(variants)}), got {quoted(variant)}")
        missing = [p for p in params if p not in config and p not in LATER_PARAM_DEFAULTS]
        if missing:
            raise _bad(label, field, f"variant {variant} takes {', '.join(params)}; missing "
                       f"{', '.join(missing)}")
    for name, value in config.items():
        if name == "variant":
            continue
        if not allowed_value(name, value):
            raise _bad(label, f"{field}.{clipped(str(name))}", f"expected "
                       f"{allowed_words(name)}, got {quoted(value)}")


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class EntryTimes(NamedTuple):
    """The times a table entry states it measured at its own shape, in ms: its `tuned_shape`
    (a Shape label), its config's `ms`, and each alternate paired with its `alternates_ms`
    (where the two lists are as long). None where the entry states none (a bucketed export's
    entries) or a time is not a positive number. The one reader of these fields: the runtime
    (Measurement) and the export (tuner.export.cases) both read them so."""
    tuned_shape: str | None
    ms: float | None
    alternates: tuple[tuple[dict, float | None], ...]

    @classmethod
    def read(cls, provenance: Mapping, alternates: Sequence[dict]) -> EntryTimes:
        """The times of an entry with these provenance fields and alternates."""
        shape = provenance.get("tuned_shape")
        times = provenance.get("alternates_ms", ())
        paired = zip(alternates, times) if len(alternates) == len(times) else ()
        return cls(shape if isinstance(shape, str) else None, _time(provenance.get("ms")),
                   tuple((config, _time(ms)) for config, ms in paired))


class Measurement(NamedTuple):
    """What a table entry measured at its own shape (`tuned_shape`, a Shape label): cuBLAS's
    kernel time and, per config signature, its config's and its alternates' (EntryTimes), in
    ms."""
    tuned_shape: str
    cublas_ms: float
    times: dict[tuple, float]

    @classmethod
    def of(cls, entry: Mapping) -> Measurement | None:
        """The entry's measurement, or None where it states none (a bucketed export's)."""
        measured = EntryTimes.read(entry, entry.get("alternates", ()))
        cublas_ms = _time(entry.get("cublas_ms"))
        if measured.tuned_shape is None or measured.ms is None or cublas_ms is None:
            return None
        times = {config_signature(entry["config"]): measured.ms}
        times.update((config_signature(config), ms) for config, ms in measured.alternates
                     if ms is not None)
        return cls(measured.tuned_shape, cublas_ms, times)


def _time(value) -> float | None:
    """A stated time, where it is a positive number."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    return None


# -- writing ----------------------------------------------------------------------------------
class Row(Protocol):
    """One entry to write (tuner.export.picks.Pick is one): a bucketed key, its config, the
    runner-up configs, and the provenance fields written beside them."""
    key: dict
    config: dict
    provenance: dict
    alternates: list[dict]


class OpRows(NamedTuple):
    """One op's part of a table to write."""
    kernel_source_hash: str
    strategy: dict
    rows: Sequence[Row]


def table_document(device: Mapping, ops: Mapping[str, OpRows], launch: str) -> dict:
    """The table: the launch mode its configs were chosen for, the device block, and per op
    its strategy and source hash, and one entry per row, in key order."""
    return {"format": TABLE_FORMAT, "launch": launch,
            "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "device": device, "ops": {op: {
                "kernel_source_hash": part.kernel_source_hash, "strategy": part.strategy,
                "entries": [_entry(row) for row in sorted(
                    part.rows, key=lambda row: tuple(row.key.values()))]}
                for op, part in ops.items()}}


def _entry(row: Row) -> dict:
    return table_entry(row.key, row.config, row.provenance, row.alternates)


def table_entry(key: dict, config: dict, provenance: Mapping,
                alternates: Sequence[dict] = ()) -> dict:
    """One entry: the bucketed key, its config, the alternates where there are any, then the
    provenance fields."""
    return {"key": key, "config": config,
            **({"alternates": list(alternates)} if alternates else {}), **provenance}


class TableRow(NamedTuple):
    """One entry of a table document as written (a Row), with its op and the op's strategy."""
    op: str
    strategy: dict
    key: dict
    config: dict
    alternates: list[dict]
    provenance: dict

    def times(self) -> EntryTimes:
        """What the entry measured at its own shape."""
        return EntryTimes.read(self.provenance, self.alternates)


def table_rows(doc: Mapping) -> list[TableRow]:
    """Every entry of a table document, in file order, as the rows it was written from."""
    rows = []
    for op, body in (doc.get("ops") or {}).items():
        for entry in body.get("entries", ()):
            provenance = {k: v for k, v in entry.items()
                          if k not in ("key", "config", "alternates")}
            rows.append(TableRow(op, dict(body["strategy"]), dict(entry["key"]),
                                 dict(entry["config"]), list(entry.get("alternates", ())),
                                 provenance))
    return rows


# -- merging ----------------------------------------------------------------------------------
def merge_entry(doc: dict, op: str, strategy: Mapping[str, str], kernel_source_hash: str,
                entry: dict) -> dict:
    """`doc` (a table document) with `entry` as its op's entry of the entry's bucket (any
    entry of that bucket replaced); an op of other kernel source starts afresh. The runtime's
    online cache (tuner.runtime.online) adds what it tunes so."""
    from tuner.bucketing.strategies import bucket_key  # light, but only merging needs it

    ops = doc.setdefault("ops", {})
    body = ops.get(op)
    if body is None or body.get("kernel_source_hash") != kernel_source_hash:
        body = ops[op] = {"kernel_source_hash": kernel_source_hash,
                          "strategy": dict(strategy), "entries": []}
    strategy = body["strategy"]
    bucket = bucket_key(entry["key"], strategy)
    body["entries"] = [e for e in body["entries"] if bucket_key(e["key"], strategy) != bucket]
    body["entries"].append(entry)
    body["entries"].sort(key=lambda e: tuple(e["key"].values()))
    return doc


def merge_documents(base: dict, extra: Mapping) -> tuple[dict, list[str]]:
    """`base` (a table document) with the entries of `extra` (another, e.g. the runtime's
    online cache, tuner.runtime.online) whose bucket `base` lacks, and notes on what was
    added or left out. `base` wins every bucket both hold (under base's strategy for the op);
    an op only `extra` has is added whole. Nothing of another device is taken: tiles tuned on
    one GPU say little about another."""
    from tuner.bucketing.strategies import bucket_key  # light, but only merging needs it

    notes: list[str] = []
    if not is_table_document(extra):
        raise ValueError(f"not a '{TABLE_FORMAT}' document")
    base_device = (base.get("device") or {}).get("name")
    extra_device = (extra.get("device") or {}).get("name")
    if base_device and extra_device and base_device != extra_device:
        return base, [f"merge: left out every entry, tuned on {extra_device}, not "
                      f"{base_device}"]
    ops = base.setdefault("ops", {})
    for op, body in (extra.get("ops") or {}).items():
        entries = list(body.get("entries") or ())
        if op not in ops:
            ops[op] = {**body, "entries": entries}
            notes.append(f"merge: added {op} with its {len(entries)} entries")
            continue
        mine = ops[op]
        if body.get("kernel_source_hash") not in (None, mine.get("kernel_source_hash")):
            notes.append(f"merge: left out {len(entries)} {op} entries measured with other "
                         "kernel source")
            continue
        strategy = mine["strategy"]
        held = {bucket_key(entry["key"], strategy) for entry in mine["entries"]}
        added = 0
        for entry in entries:
            bucket = bucket_key(entry["key"], strategy)
            if bucket not in held:
                held.add(bucket)
                mine["entries"].append(entry)
                added += 1
        mine["entries"].sort(key=lambda entry: tuple(entry["key"].values()))
        notes.append(f"merge: added {added} {op} entries, {len(entries) - added} already "
                     "held")
    return base, notes
