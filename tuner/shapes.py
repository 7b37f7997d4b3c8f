"""The shapes CSV a user lists their model's GEMMs in: `M,N,K,dtype,layout[,weight]`.

Reading is all-or-nothing: the first malformed row raises `ShapesError` naming the file and
line, before anything is tuned or written. `write_shapes` writes what `load_shapes` reads
(tuner.recording writes its recordings through it).
"""
from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tuner.dtypes import DTYPES
from tuner.errors import UserError
from tuner.textfiles import MiB, decoded, quoted, read_user_file

LAYOUTS = ("nn", "nt", "tn", "tt")
REQUIRED_COLUMNS = ("M", "N", "K", "dtype")
OPTIONAL_COLUMNS = ("layout", "weight")
# Bounds a shape must keep: each size fits Triton's int32 arguments, and each operand (A, B,
# C) holds at most 2**36 elements (128 GiB of bf16: more than any one GPU's memory).
MAX_DIM = 2**31 - 1
MAX_OPERAND_ELEMENTS = 2**36
# The largest shapes file read: a few million rows, far more than any model's GEMMs.
MAX_SHAPES_BYTES = 64 * MiB
# Numbers as a CSV states them: ASCII digits only (int() and float() also take '４０９６',
# '4_096', 'inf' and 'nan', none of which a shapes file means).
_INTEGER = re.compile(r"[+-]?[0-9]+")
# Each written so that a string matches in one way only: a long run of digits must not
# backtrack quadratically.
_DECIMAL = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")


class ShapesError(UserError, ValueError):
    """A shapes CSV that cannot be used; the message is one line naming file and line."""


@dataclass(frozen=True)
class Shape:
    """One GEMM C[M,N] = A[M,K] @ B[K,N] as the model runs it.

    layout is two letters, for A then B: `n` stored as written (A row-major M×K, B row-major
    K×N), `t` stored transposed (A as K×M, B as N×K: the nn.Linear case x @ W.T).
    """

    M: int
    N: int
    K: int
    dtype: str
    layout: str = "nn"
    weight: float = 1.0

    @property
    def stride_am(self) -> int:
        return self.K if self.layout[0] == "n" else 1

    @property
    def stride_bk(self) -> int:
        return self.N if self.layout[1] == "n" else 1

    @property
    def flops(self) -> int:
        return 2 * self.M * self.N * self.K

    def key(self) -> dict:
        """The raw (un-bucketed) key fields the tuner and the runtime bucket."""
        return {"M": self.M, "N": self.N, "K": self.K, "stride_am": self.stride_am,
                "stride_bk": self.stride_bk, "dtype": self.dtype}

    def __str__(self) -> str:
        return f"{self.M}x{self.N}x{self.K} {self.dtype} {self.layout}"

    @classmethod
    def from_label(cls, label: str) -> Shape:
        """The shape str() wrote ('4096x4096x4096 bf16 nn'; weight 1), as result files and
        reports name shapes; ValueError saying what is wrong with any other text."""
        parts = label.split() if isinstance(label, str) else ()
        sizes = parts[0].split("x") if len(parts) == 3 else ()
        if len(sizes) != 3 or not all(_INTEGER.fullmatch(size) for size in sizes):
            raise ValueError(f"expected a shape label like '4096x4096x4096 bf16 nn', got "
                             f"{quoted(label)}")
        return checked_shape(*(_positive_int(size, name) for size, name in zip(sizes, "MNK")),
                             parts[1], parts[2])


def _positive_int(text: str, column: str) -> int:
    if not _INTEGER.fullmatch(text):
        raise ValueError(f"{column} must be an integer (ASCII digits), got {quoted(text)}")
    too_large = f"{column} must be <= 2**31-1 ({MAX_DIM}), got"
    if len(text.lstrip("+-0")) > 2 * len(str(MAX_DIM)):  # int() refuses thousands of digits
        raise ValueError(f"{too_large} {quoted(text)}")
    value = int(text)
    if value < 1:
        raise ValueError(f"{column} must be >= 1, got {value}")
    if value > MAX_DIM:
        raise ValueError(f"{too_large} {value}")
    return value


def _parse_row(row: dict) -> Shape:
    weight_text = (row.get("weight") or "1").strip()
    weight = float(weight_text) if _DECIMAL.fullmatch(weight_text) else math.nan
    if not (weight > 0 and math.isfinite(weight)):
        raise ValueError(f"weight must be a finite decimal number > 0, got {quoted(weight_text)}")
    dtype = (row["dtype"] or "").strip()
    layout = (row.get("layout") or "nn").strip()
    return checked_shape(*(_positive_int((row[c] or "").strip(), c) for c in "MNK"), dtype,
                         layout, weight)


def checked_shape(M: int, N: int, K: int, dtype: str, layout: str = "nn",
                  weight: float = 1.0) -> Shape:
    """The Shape of these values (a CSV row's, a recording's), after checking each is one a
    model's GEMM can have; ValueError naming the first that is not."""
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {quoted(dtype)}")
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {quoted(layout)}")
    dims = dict(zip("MNK", (M, N, K)))
    for name, value in dims.items():
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_DIM:
            raise ValueError(f"{name} must be an integer from 1 to 2**31-1, got "
                             f"{quoted(value)}")
    for name, (rows, cols) in (("A", "MK"), ("B", "KN"), ("C", "MN")):
        elements = dims[rows] * dims[cols]
        if elements > MAX_OPERAND_ELEMENTS:
            raise ValueError(f"{name} would hold {rows}*{cols} = {elements} elements; expected "
                             f"at most 2**36 ({MAX_OPERAND_ELEMENTS})")
    return Shape(**dims, dtype=dtype, layout=layout, weight=weight)


def load_shapes(path: str | Path) -> list[Shape]:
    """Every row of the CSV, in order, duplicates dropped; ShapesError on the first bad line."""
    path = Path(path)
    try:
        data = read_user_file(path, "shapes file", MAX_SHAPES_BYTES, ShapesError)
    except OSError as e:
        raise ShapesError(f"{path}: cannot read shapes file ({e.strerror})") from None
    text = decoded(data, str(path), ShapesError)
    if "\0" in text:
        line = text.count("\n", 0, text.index("\0")) + 1
        raise ShapesError(f"{path}:{line}: expected CSV text, got a NUL byte")
    try:
        return _read_rows(path, text)
    except csv.Error as e:
        raise ShapesError(f"{path}: not valid CSV ({e})") from None


def _read_rows(path: Path, text: str) -> list[Shape]:
    reader = csv.DictReader(io.StringIO(text, newline=""))
    header = [h.strip() for h in reader.fieldnames or []]
    seen: set[str] = set()
    twice = next((c for c in header if c in seen or seen.add(c)), None)
    if twice is not None:
        raise ShapesError(f"{path}:1: header names column {quoted(twice)} twice; expected "
                          "each of M,N,K,dtype[,layout][,weight] once")
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    unknown = [c for c in header if c not in REQUIRED_COLUMNS + OPTIONAL_COLUMNS]
    if missing or unknown:
        problem = (f"missing {', '.join(missing)}" if missing
                   else f"unknown column {quoted(unknown[0])}")
        raise ShapesError(f"{path}:1: header must be M,N,K,dtype[,layout][,weight]; {problem}")
    reader.fieldnames = header
    shapes: dict[Shape, None] = {}  # in file order, each once
    for row in reader:
        line = reader.line_num
        if None in row or any(row[c] is None for c in header):
            raise ShapesError(f"{path}:{line}: expected {len(header)} columns ({','.join(header)})")
        try:
            shape = _parse_row(row)
        except ValueError as e:
            raise ShapesError(f"{path}:{line}: {e}") from None
        shapes.setdefault(shape)
    if not shapes:
        raise ShapesError(f"{path}: no shapes listed")
    return list(shapes)


def write_shapes(path: str | Path, shapes: Iterable[Shape]) -> None:
    """Write `shapes` (every column, a whole weight as an integer) to `path`, replacing it
    atomically: a reader sees the old file or the new one."""
    from tuner.formats.files import write_text_atomic  # imports yaml, which reading needs not
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(REQUIRED_COLUMNS + OPTIONAL_COLUMNS)
    for s in shapes:
        weight = int(s.weight) if float(s.weight).is_integer() else s.weight
        writer.writerow([s.M, s.N, s.K, s.dtype, s.layout, weight])
    write_text_atomic(path, text.getvalue())


# -- serving's varying M (`tune run --m`) ----------------------------------------------------
_M_RANGE = re.compile(r"([0-9]+)-([0-9]+)")


def parse_m_values(text: str) -> tuple[int, ...]:
    """The M values `tune run --m` names, ascending, each once: comma-separated items, each an
    integer or a range LO-HI meaning LO, 2·LO, 4·LO, ... up to HI (serving's batch × tokens
    doubles). ValueError, one line, for anything else."""
    values: set[int] = set()
    for item in text.split(","):
        item = item.strip()
        ranged = _M_RANGE.fullmatch(item)
        if ranged:
            low, high = int(ranged[1]), int(ranged[2])
            if not 1 <= low <= high:
                raise ValueError(f"range {item!r} must go up from 1 or more")
            values.update(low << i for i in range((high // low).bit_length()))
        elif _INTEGER.fullmatch(item):
            values.add(int(item))
        else:
            raise ValueError(f"expected integers and ranges like 1,2,4 or 1-4096 (powers of two "
                             f"from 1 to 4096), got {item!r}")
    for value in values:
        if not 1 <= value <= MAX_DIM:
            raise ValueError(f"M must be from 1 to 2**31-1, got {value}")
    return tuple(sorted(values))


def swept_m(shapes: Iterable[Shape], ms: Iterable[int]) -> list[Shape]:
    """Each (N, K, dtype, layout) of `shapes` at every M of `ms`, in place of the shapes' own
    M values: the shapes serving runs when batch × tokens varies. Each swept shape weighs what
    the group's listed shapes weigh together (which M serving runs most is not known); a
    swept shape whose operands are too large raises ValueError naming it."""
    groups: dict[tuple, float] = {}
    for shape in shapes:
        group = (shape.N, shape.K, shape.dtype, shape.layout)
        groups[group] = groups.get(group, 0.0) + shape.weight
    swept = []
    for (N, K, dtype, layout), weight in groups.items():
        for M in ms:
            row = {"M": str(M), "N": str(N), "K": str(K), "dtype": dtype, "layout": layout,
                   "weight": repr(weight)}
            try:
                swept.append(_parse_row(row))
            except ValueError as e:
                raise ValueError(f"swept shape {M}x{N}x{K} {dtype} {layout}: {e}") from None
    return swept
