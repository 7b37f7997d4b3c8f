"""Recording the GEMMs a workload runs as a shapes CSV to tune: `tuner.record`.

    with tuner.record("shapes.csv"):
        model(**inputs)

A TorchDispatchMode sees each aten operator the block runs, on any device, after F.linear and
torch.matmul have decomposed and below autograd (backward GEMMs are recorded too). Each call
of `aten.mm`, `aten.addmm` or `aten.bmm` (their out= forms included) counts once, by the rules
of tuner.gemm_calls, the ones `tuner.enable` routes by:

- mm: the GEMM M×K @ K×N (F.linear without bias, torch.matmul of 2-D operands or of a batched
  operand torch folds into rows);
- addmm: where its added tensor is a bias row (N,) with beta and alpha 1 (F.linear's bias);
- bmm: where it is one GEMM: batch 1, or one b for every batch (batch stride 0, as
  torch.matmul broadcasts a weight) with a's batches continuing each other's rows, recorded
  with M = batch × rows.

A row is M, N, K, dtype, layout (from the operands' strides: a letter is `n` where the rows
are contiguous, `t` where the columns are) and weight, the number of calls. When the block
ends, the rows merge into the file: a row already there adds its weight to the new count,
rows only there stay, and the file is replaced atomically under a lock (`<file>.lock`, kept),
so several processes may record into one file. Calls the kernels cannot run are listed apart
in `<stem>.skipped.csv` beside it (op,batch,M,N,K,dtype,reason,count; counts add the same
way): other dtypes, a bmm of separate GEMMs, an addmm adding a full matrix, a zero-size
dimension, an operand whose rows and columns are both strided (a broadcast).

Not recorded: matrix-vector products (`aten.mv`), fp8 `_scaled_mm`, GEMMs inside graphs that
torch.compile compiled (record the eager model), and Triton launches (record before enabling).
Only the thread that entered the block is recorded, with the autograd threads it starts.

`TUNE_RECORD=shapes.csv python -m tuner.recording script.py args...` (or `-m module
args...`) runs a script unchanged inside one recording, written when it ends, however it
ends. `import tuner` starts none by itself: the tune CLI and its worker processes import tuner
too, and would record the tuner's own GEMMs.
"""
from __future__ import annotations

import csv
import io
import os
import runpy
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tuner.dtypes import NAME_OF_TORCH_DTYPE
from tuner.filelock import locked_beside
from tuner.formats.files import check_writable, write_text_atomic
from tuner.gemm_calls import KERNEL_DTYPE_NAMES, KERNEL_DTYPES, folded_bmm, is_bias_row
from tuner.shapes import MAX_SHAPES_BYTES, Shape, ShapesError, load_shapes, write_shapes
from tuner.textfiles import decoded, read_user_file

ENV_VAR = "TUNE_RECORD"
_RECORDED = {torch.ops.aten.mm: "mm", torch.ops.aten.addmm: "addmm",
             torch.ops.aten.bmm: "bmm"}
SKIPPED_COLUMNS = ("op", "batch", "M", "N", "K", "dtype", "reason")


class Skipped(NamedTuple):
    """A call the kernels cannot run, as the skipped file lists it (dtype as torch names it)."""
    op: str
    batch: int
    M: int
    N: int
    K: int
    dtype: str
    reason: str


def skipped_path(path: str | Path) -> Path:
    """Where the calls skipped by a recording into `path` are listed."""
    path = Path(path)
    return path.with_name(f"{path.stem}.skipped{path.suffix}")


def _layout_letter(t: torch.Tensor) -> str | None:
    """`n` for a matrix whose rows are contiguous, `t` for one whose columns are (a size-1
    dimension is either), None for neither."""
    rows, cols = t.shape
    if cols == 1 or t.stride(1) == 1:
        return "n"
    if rows == 1 or t.stride(0) == 1:
        return "t"
    return None


def classify(op: str, args: tuple, kwargs: dict) -> Shape | Skipped:
    """The shape (weight 1) of one aten `op` call ("mm", "addmm" or "bmm"), or why the
    kernels cannot run it."""
    a, b = args[1:3] if op == "addmm" else args[:2]
    batch = a.shape[0] if op == "bmm" else 1
    (M, K), N = a.shape[-2:], b.shape[-1]

    def skipped(reason: str) -> Skipped:
        return Skipped(op, batch, M, N, K, str(a.dtype).removeprefix("torch."), reason)

    if 0 in (batch, M, N, K):
        return skipped("a zero-size dimension: nothing to compute")
    if a.dtype not in KERNEL_DTYPES or b.dtype != a.dtype:
        return skipped(f"the kernels take {KERNEL_DTYPE_NAMES}")
    if op == "addmm" and not is_bias_row(args[0], b, kwargs.get("beta", 1),
                                         kwargs.get("alpha", 1)):
        return skipped("adds a matrix or scales: the kernels add only a bias row (N,)")
    if op == "bmm":
        folded = folded_bmm(a, b)
        if folded is None:
            return skipped("separate GEMMs, one per batch: the kernels run one GEMM a call")
        a, b = folded
        M = a.shape[0]
    layout = (_layout_letter(a), _layout_letter(b))
    if None in layout:
        return skipped(f"operand strides {a.stride()}, {b.stride()}: neither rows nor "
                       "columns contiguous")
    return Shape(M, N, K, NAME_OF_TORCH_DTYPE[a.dtype], "".join(layout))


class _Seen(TorchDispatchMode):
    """Hands each recorded aten call to the recording, then runs it."""

    def __init__(self, recording: Recording):
        super().__init__()
        self.recording = recording

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        op = _RECORDED.get(func.overloadpacket)
        if op is not None:
            self.recording.note(classify(op, args, kwargs))
        return func(*args, **kwargs)


class Recording:
    """The GEMMs seen while the block runs: `shapes` and `skipped` (each to its number of
    calls), merged into `path` and its skipped file when the block ends."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.shapes: Counter[Shape] = Counter()
        self.skipped: Counter[Skipped] = Counter()
        self._mode = _Seen(self)

    def __enter__(self) -> Recording:
        # What the block's end would refuse is refused before it runs: a model may run long.
        for path, read in ((self.path, load_shapes), (skipped_path(self.path), read_skipped)):
            check_writable(path)
            if path.exists():
                read(path)
        self._mode.__enter__()
        return self

    def __exit__(self, *exc_info) -> None:
        self._mode.__exit__(*exc_info)
        self.write()  # what ran before an error is recorded too

    def note(self, call: Shape | Skipped) -> None:
        (self.skipped if isinstance(call, Skipped) else self.shapes)[call] += 1

    def write(self) -> None:
        """Merge what was recorded since the last write into the files (counts add), then
        start counting afresh. ShapesError where the file there is no shapes CSV."""
        if not self.shapes and not self.skipped:
            return
        with locked_beside(self.path):
            if self.shapes:
                existing = load_shapes(self.path) if self.path.exists() else []
                write_shapes(self.path, merged(existing, self.shapes))
            if self.skipped:
                path = skipped_path(self.path)
                counts = read_skipped(path) if path.exists() else Counter()
                write_skipped(path, counts + self.skipped)
        self.shapes, self.skipped = Counter(), Counter()


def record(path: str | Path) -> Recording:
    """A context manager recording every GEMM its block runs into the shapes CSV `path`
    (merged with what the file holds): see this module's docstring."""
    return Recording(path)


def merged(existing: list[Shape], counts: Counter[Shape]) -> list[Shape]:
    """The rows of a file (`existing`, in order) with the recorded calls (`counts`, keyed by
    shapes of weight 1) added: one row per shape, its weight the sum."""
    weights: dict[Shape, float] = {}
    for shape in existing:
        key = replace(shape, weight=1.0)
        weights[key] = weights.get(key, 0) + shape.weight
    for key, count in counts.items():
        weights[key] = weights.get(key, 0) + count
    return [replace(key, weight=weight) for key, weight in weights.items()]


def read_skipped(path: Path) -> Counter[Skipped]:
    """A skipped file's calls and counts; ShapesError naming the file where it is not one."""
    counts: Counter[Skipped] = Counter()
    data = read_user_file(path, "skipped-calls file", MAX_SHAPES_BYTES, ShapesError)
    reader = csv.DictReader(io.StringIO(decoded(data, str(path), ShapesError), newline=""))
    try:
        if tuple(reader.fieldnames or ()) != (*SKIPPED_COLUMNS, "count"):
            raise ShapesError(f"{path}:1: expected the header {','.join(SKIPPED_COLUMNS)},count")
        for row in reader:
            try:
                call = Skipped(row["op"], *(int(row[c]) for c in ("batch", "M", "N", "K")),
                               row["dtype"], row["reason"])
                counts[call] += int(row["count"])
            except (TypeError, ValueError):
                raise ShapesError(f"{path}:{reader.line_num}: expected integers in batch, M, "
                                  "N, K and count") from None
    except csv.Error as e:  # a NUL byte, a field past csv's size limit
        raise ShapesError(f"{path}:{reader.line_num}: expected CSV text ({e})") from None
    return counts


def write_skipped(path: Path, counts: Counter[Skipped]) -> None:
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow((*SKIPPED_COLUMNS, "count"))
    writer.writerows((*call, count) for call, count in counts.items())
    write_text_atomic(path, text.getvalue())


USAGE = (f"usage: {ENV_VAR}=shapes.csv python -m tuner.recording (script.py | -m module) "
         "[args...]")


def main(argv: list[str] | None = None) -> int:
    """Run a script or module as `python` would, inside a recording into $TUNE_RECORD."""
    argv = sys.argv[1:] if argv is None else argv
    path = os.environ.get(ENV_VAR)
    as_module = argv[:1] == ["-m"]
    if not path or len(argv) < 1 + as_module:
        print(USAGE, file=sys.stderr)
        return 2
    target = argv[1] if as_module else argv[0]
    sys.argv = argv[1:] if as_module else argv
    with record(path):
        if as_module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.path[0] = os.path.dirname(os.path.abspath(target))  # as `python script.py`
            runpy.run_path(target, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
