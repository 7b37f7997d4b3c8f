"""End to end on a real model library: a Hugging Face `LlamaForCausalLM` records its GEMMs,
they are tuned, and the model on the tuned kernels is timed against stock transformers and
torch.compile(mode="max-autotune").

    python benchmarks/model_e2e.py record --out e2e             # e2e/shapes.csv
    python benchmarks/model_e2e.py record --out e2e --fuse      # adds the fused model's rows
    tune run --shapes e2e/shapes.csv --db sqlite:///e2e/tune.db
    tune export table --db sqlite:///e2e/tune.db -o e2e/tuned.yaml
    python benchmarks/model_e2e.py bench --out e2e --table e2e/tuned.yaml [--rows 3-5]
        [--columns ours,stock-graph,ours-graph]                  # e2e/model_e2e.md

The model: LlamaForCausalLM from a LlamaConfig of Llama-3-8B's widths (hidden 4096,
intermediate 14336, 32 heads, 8 KV heads, vocabulary 128256, rope theta 500000) with --layers
decoder layers, random weights (--seed), bf16, eval, SDPA attention; nothing is downloaded.

The cases (rows), each one forward step on transformers' StaticCache (its static KV cache, the
one its CUDA-graph and torch.compile paths use), logits of the last token only (as generate
asks): prefill 1x2048 and 8x512 (the prompt into an empty cache), decode b1, b8 and b32 (one
new token per sequence after --prefix cached tokens). Each step ends by rewinding the cache's
length (one foreach kernel, in every contender's step), so every step computes the same thing
and a CUDA graph can replay it. `record` runs each case's step once inside tuner.record; the
decode caches are filled before, outside the recording. The shapes need no values, so
`record --device meta` lists the same rows without a GPU (its skipped file adds attention's
batched products, which SDPA runs as such only on meta).

The contenders (columns): `stock`, the model as transformers runs it; `ours`, the same under
tuner.enable() with TUNE_CONFIG=--table; `ours-fuse`, the same with tuner.fuse(model) (each
layer's q/k/v and gate/up projections one GEMM each: record with --fuse too, so that the
table holds the stacked shapes); `stock-fuse`, tuner.fuse(model) on torch's kernels (what
fusing alone gives); `ours-patch`, under tuner.patch(model) instead (each
nn.Linear calls tuner.linear: no aten kernel in between); `stock-graph`, `stock-fuse-graph`,
`ours-graph` and `ours-fuse-graph`, one step captured in a torch.cuda.CUDAGraph and replayed;
`max-autotune`, torch.compile(model, mode="max-autotune", dynamic=False) of the stock model,
compiled per case (Inductor's GEMM autotuning and its own CUDA graphs; its compile seconds
and CUDA-graph skips are reported);
`ours-max-autotune`, the same compile of a patched copy (Inductor fuses and graphs the rest,
our kernels run the linears).

Time per step: in each sample, one untimed step, then --steps back-to-back steps between two
CUDA events recorded after a synchronize, over their count; the median over --samples
samples, the contenders' samples interleaved in rotating order, so that drift of a lent
machine hits all alike. tokens/s is batch x new tokens per step / time per step. A ratio of
two contenders is taken within one run.

Logits: each contender's logits of one step against stock's, and against an fp32 reference
(the same bf16 weights upcast, every operation in fp32 at torch's default precision, which
uses no TF32). A contender is within
bf16 tolerance when its largest error against the reference is at most twice stock's own:
as accurate as stock up to the different summation order of another kernel.

`bench` adds its run to --out/results.json (raw numbers; every run there must share the
device, the table and the model) and writes --out/model_e2e.md from all of them, so the
max-autotune column can run in a call of its own; `report` rewrites the markdown alone.
`--device cpu --tiny` runs the flow on the CPU with a tiny config (our kernels in Triton's
interpreter, TRITON_INTERPRET=1), its timings meaningless; `smoke --out DIR` runs and checks
that whole flow, `tune` included (a few minutes). It is no test under tests/, which may not
import benchmarks (tests/test_architecture.py).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch
from _tune_runs import ROOT, tune, write_rows

from tuner.errors import UserError
from tuner.execution.timing import rotating_order
from tuner.formats.files import check_writable, write_text_atomic
from tuner.reporting import STDERR
from tuner.textfiles import MiB, decoded, read_user_file

COLUMNS = ("stock", "stock-fuse", "ours", "ours-fuse", "ours-patch", "stock-graph",
           "stock-fuse-graph", "ours-graph", "ours-fuse-graph", "max-autotune",
           "ours-max-autotune")
CUDA_ONLY_COLUMNS = frozenset({"stock-graph", "stock-fuse-graph", "ours-graph",
                               "ours-fuse-graph", "max-autotune", "ours-max-autotune"})
COMPILED_COLUMNS = frozenset({"max-autotune", "ours-max-autotune"})
# (contender, its baseline, ratio label): the ratios the tables show, contender over baseline.
# The first five are ours against stock launched alike.
RATIOS = (("ours", "stock", "eager"), ("ours-graph", "stock-graph", "graphed"),
          ("ours-patch", "stock", "patched eager"), ("ours-fuse", "stock", "fused eager"),
          ("ours-fuse-graph", "stock-graph", "fused graphed"),
          # What fusing alone gives torch's kernels, and ours over stock both fused.
          ("stock-fuse-graph", "stock-graph", "stock fused / stock, graphed"),
          ("ours-fuse-graph", "stock-fuse-graph", "both fused, graphed"),
          ("ours-fuse", "stock-fuse", "both fused, eager"),
          ("ours-max-autotune", "max-autotune", "ours / stock, both max-autotune"),
          ("ours-graph", "max-autotune", "ours graphed / max-autotune"),
          ("ours-fuse-graph", "max-autotune", "ours fused graphed / max-autotune"),
          ("max-autotune", "stock", "max-autotune / stock eager"))
VERSUS_STOCK = RATIOS[:5]
# The goals for the decode rows: (case, launch, least ratio of ours over stock), and
# the contenders each launch's goal is read from, unfused and fused.
DECODE_GOALS = (("decode b1", "graphed", 1.12), ("decode b1", "eager", 1.10),
                ("decode b8", "graphed", 1.05))
GOAL_CONTENDERS = {"graphed": ("ours-graph", "ours-fuse-graph"), "eager": ("ours", "ours-fuse")}
# The logits of a contender are within tolerance while its error against the fp32 reference is
# at most this many times stock's own.
TOLERANCE_FACTOR = 2.0
WARMUP_STEPS = 3
DEFAULT_PREFIX = 512
SMOKE_TUNED_ROWS = "1-4"  # of the tiny recording: its fp32 rotary product and three linears
RESULTS_LIMIT = 64 * MiB
CLOCKS = {"cuda": "CUDA events", "cpu": "the CPU's clock"}

LLAMA3_8B_WIDTHS = {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
                    "num_key_value_heads": 8, "vocab_size": 128256}
TINY_WIDTHS = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
               "num_key_value_heads": 2, "vocab_size": 256}
TINY_SEQUENCE_DIVISOR = 64  # --tiny: the cases' sequence lengths and prefix, divided by this


class BenchError(UserError):
    """What stops the benchmark before it measures, said in one line."""


# -- the model and its cases --------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """One step of the model: `tokens` new tokens for each of `batch` sequences, after
    `prefix` tokens already in the cache (0: a prefill)."""
    batch: int
    tokens: int
    prefix: int

    @property
    def label(self) -> str:
        if self.prefix == 0:
            return f"prefill {self.batch}x{self.tokens}"
        return f"decode b{self.batch}"

    @property
    def tokens_per_step(self) -> int:
        return self.batch * self.tokens


def decode_prefix(prefix: int, tiny: bool) -> int:
    return max(1, prefix // TINY_SEQUENCE_DIVISOR) if tiny else prefix


def all_cases(prefix: int, tiny: bool) -> list[Case]:
    divisor = TINY_SEQUENCE_DIVISOR if tiny else 1
    return [Case(1, 2048 // divisor, 0), Case(8, 512 // divisor, 0),
            *(Case(batch, 1, decode_prefix(prefix, tiny)) for batch in (1, 8, 32))]


def selected(text: str | None, count: int) -> list[int]:
    """0-based indices of the 1-based rows `text` names ("2", "1-3", "1,4-5"; None: all)."""
    if not text:
        return list(range(count))
    indices: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        try:
            low, high = int(first), int(last or first)
        except ValueError:
            raise BenchError(f"--rows {text!r}: expected rows like 1-3 or 1,4-5") from None
        if not 1 <= low <= high <= count:
            raise BenchError(f"--rows {text!r}: rows run from 1 to {count}")
        indices.extend(i for i in range(low - 1, high) if i not in indices)
    return indices


def model_description(args) -> str:
    widths = "tiny widths" if args.tiny else "Llama-3-8B widths"
    return (f"LlamaForCausalLM, {widths}, {args.layers} layers, random weights (seed "
            f"{args.seed}), bf16, SDPA; decode after {decode_prefix(args.prefix, args.tiny)} "
            "cached tokens")


def llama(layers: int, tiny: bool, device: str, seed: int) -> torch.nn.Module:
    """The model, built on `device` from a config alone (nothing downloaded), bf16, eval."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging
    logging.set_verbosity_error()
    config = LlamaConfig(**(TINY_WIDTHS if tiny else LLAMA3_8B_WIDTHS),
                         num_hidden_layers=layers, rope_theta=500000.0,
                         max_position_embeddings=8192, rms_norm_eps=1e-5,
                         tie_word_embeddings=False, attn_implementation="sdpa")
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    return model.to(torch.bfloat16).eval()


def bench_model(layers: int, tiny: bool, device: str, seed: int) -> torch.nn.Module:
    """`llama`, its weights stacked as tuner.fuse lays them out before any contender is made:
    the first fuse moves them, and a graph captured before it (stock's, Inductor's) would
    replay on freed memory. Each fused contender's fuse then copies nothing, and the others
    run on views of the same rows."""
    import tuner
    model = llama(layers, tiny, device, seed)
    tuner.fuse(model).undo()
    return model


class Step:
    """One step of a case on a StaticCache of exactly prefix + tokens positions, filled with
    the prefix by `model` (seeded random tokens); each call runs the step with the forward
    given (the model, or a compiled one) and rewinds the cache, so each call computes the
    same logits."""

    def __init__(self, model: torch.nn.Module, case: Case, seed: int, device: str):
        from transformers import StaticCache
        tokens = torch.randint(model.config.vocab_size, (case.batch, case.prefix + case.tokens),
                               generator=torch.Generator().manual_seed(seed))
        self.input_ids = tokens[:, case.prefix:].to(device)
        self.tokens = case.tokens
        self.cache = StaticCache(config=model.config, max_cache_len=case.prefix + case.tokens)
        if case.prefix:
            model(input_ids=tokens[:, :case.prefix].to(device), past_key_values=self.cache,
                  use_cache=True, logits_to_keep=1)

    def __call__(self, forward: Callable) -> torch.Tensor:
        logits = forward(input_ids=self.input_ids, past_key_values=self.cache, use_cache=True,
                         logits_to_keep=1).logits
        # The cache's layers hold their lengths on the device (set up on first use).
        torch._foreach_sub_([layer.cumulative_length for layer in self.cache.layers],
                            self.tokens)
        return logits


# -- the contenders -----------------------------------------------------------------------------
@dataclass
class Contender:
    """A way to run one step (returning its logits), and the routing each sample runs in."""
    run: Callable[[], torch.Tensor]
    routing: Callable[[], contextlib.AbstractContextManager]
    compile_s: float | None = None
    cudagraph_skips: int | None = None


def graphed(run: Callable[[], torch.Tensor],
            routing: Callable[[], contextlib.AbstractContextManager]) -> Callable:
    """`run` captured in a CUDA graph, warmed up first on a side stream as torch asks (our
    kernels compile on their first call); the returned call replays it."""
    with routing():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_STEPS):
                run()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            logits = run()

    def replay() -> torch.Tensor:
        graph.replay()
        return logits
    return replay


def max_autotune(model: torch.nn.Module, step: Step) -> Contender:
    """torch.compile(mode="max-autotune") of the model for this case's step, compiled and
    its CUDA graphs recorded by the warm-up calls (measure_case resets Dynamo around a
    case's compiled contenders: no recompile limits, no stale graphs)."""
    from torch._dynamo.utils import counters
    forward = torch.compile(model, mode="max-autotune", dynamic=False)
    skips = counters["inductor"]["cudagraph_skips"]
    start = time.perf_counter()
    step(forward)
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - start
    return Contender(lambda: step(forward), contextlib.nullcontext, compile_s,
                     counters["inductor"]["cudagraph_skips"] - skips)


def contender(column: str, model: torch.nn.Module, step: Step, device: str) -> Contender:
    import tuner

    def stock() -> torch.Tensor:
        return step(model)

    def ours() -> contextlib.AbstractContextManager:
        return tuner.enabled((device,))

    def fused() -> contextlib.AbstractContextManager:
        return tuner.fuse(model)

    @contextlib.contextmanager
    def ours_fused() -> Iterator[None]:
        with fused(), ours():
            yield

    if column == "stock":
        return Contender(stock, contextlib.nullcontext)
    if column == "stock-fuse":
        return Contender(stock, fused)
    if column == "ours":
        return Contender(stock, ours)
    if column == "ours-fuse":
        return Contender(stock, ours_fused)
    if column == "ours-patch":
        return Contender(stock, lambda: tuner.patch(model, (device,)))
    if column == "ours-max-autotune":
        # A copy patched for good: Dynamo guards on the modules' forward, so patching around
        # each sample would recompile.
        patched = copy.deepcopy(model)
        tuner.patch(patched, (device,))
        # One eager step first, as for any CUDA graph (tuner.integration): the workspaces of
        # split-K answers are then allocated outside Inductor's graph pool, whose warm-up
        # refuses allocations that outlive a call.
        step(patched)
        return max_autotune(patched, step)
    if column == "stock-graph":
        return Contender(graphed(stock, contextlib.nullcontext), contextlib.nullcontext)
    if column == "ours-graph":
        return Contender(graphed(stock, ours), contextlib.nullcontext)
    if column == "stock-fuse-graph":
        return Contender(graphed(stock, fused), contextlib.nullcontext)
    if column == "ours-fuse-graph":
        return Contender(graphed(stock, ours_fused), contextlib.nullcontext)
    return max_autotune(model, step)


# -- measuring ----------------------------------------------------------------------------------
def seconds_per_step(run: Callable, steps: int, device: str) -> float:
    """One sample: an untimed step (what the previous contender left settles), then `steps`
    back-to-back steps, timed by CUDA events after a synchronize (on the CPU, the clock)."""
    run()
    if device != "cuda":
        start = time.perf_counter()
        for _ in range(steps):
            run()
        return (time.perf_counter() - start) / steps
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(steps):
        run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / steps


def samples(contenders: dict[str, Contender], steps: int, count: int,
            device: str) -> dict[str, list[float]]:
    """`count` samples of seconds per step per contender, taken in rotating order."""
    names = list(contenders)
    taken: dict[str, list[float]] = {name: [] for name in names}
    for i in rotating_order(len(names), count):
        chosen = contenders[names[i]]
        with chosen.routing():
            taken[names[i]].append(seconds_per_step(chosen.run, steps, device))
    return taken


def logits_of(chosen: Contender) -> torch.Tensor:
    """One step's logits, after warm-up steps (a first call compiles)."""
    with chosen.routing():
        for _ in range(WARMUP_STEPS):
            chosen.run()
        return chosen.run().float().clone()


def logit_errors(logits: torch.Tensor, stock: torch.Tensor, reference: torch.Tensor) -> dict:
    scale = reference.abs().max().item()
    difference = (logits - stock).abs().max().item()
    return {"max_abs_vs_stock": difference, "relative_vs_stock": difference / scale,
            "max_abs_vs_fp32": (logits - reference).abs().max().item(),
            "max_abs_logit": scale}


def fp32_references(model: torch.nn.Module, cases: list[tuple[int, Case]], seed: int,
                    device: str) -> dict[str, torch.Tensor]:
    """Per case, the logits of its step computed in fp32 from the same (bf16) weights."""
    reference = copy.deepcopy(model).float()
    logits = {}
    for index, case in cases:
        logits[case.label] = Step(reference, case, seed + index, device)(reference).float()
    del reference
    if device == "cuda":
        torch.cuda.empty_cache()
    return logits


def measure_case(model, case: Case, index: int, columns: list[str], reference: torch.Tensor,
                 args, note: Callable[[str], None]) -> dict:
    """A case's row of a run: per contender its samples, median and logit errors."""
    step = Step(model, case, args.seed + index, args.device)
    compiled = COMPILED_COLUMNS.intersection(columns)
    if compiled:
        torch._dynamo.reset()
    contenders: dict[str, Contender] = {}
    logits: dict[str, torch.Tensor] = {}
    for column in columns:
        note(f"{case.label}: preparing {column}")
        contenders[column] = contender(column, model, step, args.device)
        logits[column] = logits_of(contenders[column])
    note(f"{case.label}: timing {', '.join(columns)} ({args.samples} samples of "
         f"{args.steps} steps each)")
    taken = samples(contenders, args.steps, args.samples, args.device)
    row = {"tokens_per_step": case.tokens_per_step, "contenders": {}}
    for column, chosen in contenders.items():
        result = {"median_s": statistics.median(taken[column]), "samples_s": taken[column],
                  "logits": logit_errors(logits[column], logits["stock"], reference)}
        if chosen.compile_s is not None:
            result.update(compile_s=chosen.compile_s, cudagraph_skips=chosen.cudagraph_skips)
        row["contenders"][column] = result
    if compiled:
        contenders.clear()
        torch._dynamo.reset()  # their CUDA graphs' memory goes with them
    return row


# -- results: merged runs, the markdown -------------------------------------------------------
def table_setup(args) -> dict:
    """What every run merged into one results file must share: the device, the model, the
    library versions and the table."""
    return {"device": device_name(args.device), "model": model_description(args),
            "versions": versions(),
            "table_sha256": hashlib.sha256(Path(args.table).read_bytes()).hexdigest()}


def device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else "CPU (Triton's interpreter)"


def versions() -> dict:
    import transformers
    import triton
    return {"torch": torch.__version__, "triton": triton.__version__,
            "transformers": transformers.__version__, "cuda": torch.version.cuda}


def read_results(path: Path) -> dict:
    text = decoded(read_user_file(path, "results file", RESULTS_LIMIT, BenchError), str(path),
                   BenchError)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise BenchError(f"{path}:{e.lineno}: not the JSON bench writes: {e.msg}") from None


def earlier_results(path: Path, setup: dict) -> dict:
    """The runs the results file holds (none where it does not exist); BenchError where they
    are of another setup (device, table or model)."""
    if not path.exists():
        return {"setup": setup, "runs": []}
    results = read_results(path)
    for field, value in setup.items():
        if results.get("setup", {}).get(field) != value:
            raise BenchError(f"{path}: its runs have another {field} "
                             f"({results.get('setup', {}).get(field)!r}, here {value!r}); use "
                             "another --out")
    return results


def latest(runs: list[dict], label: str, *columns: str) -> dict | None:
    """The case's row from the latest run that measured all of `columns` for it."""
    for run in reversed(runs):
        row = run["cases"].get(label)
        if row and all(column in row["contenders"] for column in columns):
            return row
    return None


def speedup(row: dict, contender: str, baseline: str) -> float | None:
    """tokens/s of `contender` over `baseline`'s in one run's row (None: not both there)."""
    figures = row["contenders"]
    if contender not in figures or baseline not in figures:
        return None
    return figures[baseline]["median_s"] / figures[contender]["median_s"]


def ratio(runs: list[dict], label: str, contender: str, baseline: str) -> float | None:
    """speedup of `contender` over `baseline` in the latest run that measured both."""
    row = latest(runs, label, contender, baseline)
    return None if row is None else speedup(row, contender, baseline)


def cell(value: float | None, form: str) -> str:
    return "-" if value is None else format(value, form)


def case_labels(runs: list[dict]) -> list[str]:
    labels: list[str] = []
    for run in runs:
        labels.extend(label for label in run["cases"] if label not in labels)
    return labels


def within_tolerance(errors: dict, stock: dict) -> bool:
    return errors["max_abs_vs_fp32"] <= TOLERANCE_FACTOR * stock["max_abs_vs_fp32"]


def run_columns(run: dict) -> list[str]:
    measured = {c for row in run["cases"].values() for c in row["contenders"]}
    return [c for c in COLUMNS if c in measured]


def run_tables(run: dict) -> list[str]:
    """One run's figures: µs per step with the ratios it can give, tokens/s, logits."""
    columns = run_columns(run)
    ratios = [(c, b, label) for c, b, label in RATIOS if c in columns and b in columns]
    timing = ["| case | tokens/step | " + " | ".join(f"{c} µs" for c in columns) + " | "
              + " | ".join(label for _, _, label in ratios) + " |",
              "|" + "---|" * (2 + len(columns) + len(ratios))]
    speed = ["| case | " + " | ".join(f"{c} tokens/s" for c in columns) + " |",
             "|" + "---|" * (1 + len(columns))]
    logits = ["| case | contender | max abs Δ vs stock | ÷ max abs logit | max abs error vs "
              f"fp32 | stock's | within tolerance (≤ {TOLERANCE_FACTOR:g}× stock's) |",
              "|---|---|---|---|---|---|---|"]
    for label, row in run["cases"].items():
        figures, tokens = row["contenders"], row["tokens_per_step"]
        seconds = [figures[c]["median_s"] if c in figures else None for c in columns]
        timing.append(f"| {label} | {tokens} | "
                      + " | ".join(cell(s and s * 1e6, ".1f") for s in seconds) + " | "
                      + " | ".join(cell(speedup(row, c, b), ".3f") for c, b, _ in ratios)
                      + " |")
        speed.append(f"| {label} | "
                     + " | ".join(cell(s and tokens / s, ",.0f") for s in seconds) + " |")
        stock = figures["stock"]["logits"]
        for column in (c for c in columns if c in figures):
            errors = figures[column]["logits"]
            logits.append(f"| {label} | {column} | {errors['max_abs_vs_stock']:.3g} | "
                          f"{errors['relative_vs_stock']:.2e} | "
                          f"{errors['max_abs_vs_fp32']:.3g} | {stock['max_abs_vs_fp32']:.3g} | "
                          f"{'yes' if within_tolerance(errors, stock) else 'NO'} |")
    compiled = [f"- {label}, {column}: compiled in {figures['compile_s']:.0f} s, CUDA graphs "
                f"skipped {figures['cudagraph_skips']} times"
                for label, row in run["cases"].items()
                for column, figures in row["contenders"].items() if "compile_s" in figures]
    return [*timing, "", *speed, "",
            "Logits of one step against stock's and against the fp32 reference:", "", *logits,
            *(["", "Compiled contenders:", *compiled] if compiled else [])]


def goal_lines(runs: list[dict]) -> list[str]:
    """The bottom lines the issue's goal asks for, each ratio from the latest run with both."""
    def verdict(value: float | None, least: float) -> str:
        if value is None:
            return "not measured"
        return f"{value:.3f} (goal ≥ {least:.2f}: {'met' if value >= least else 'MISSED'})"

    baselines = {c: (b, launch) for c, b, launch in VERSUS_STOCK}
    lines = []
    named = set()
    for label, launch, least in DECODE_GOALS:
        for contender in GOAL_CONTENDERS[launch]:
            baseline, launch_label = baselines[contender]
            value = ratio(runs, label, contender, baseline)
            if value is not None or contender == GOAL_CONTENDERS[launch][0]:
                lines.append(f"- {label}, {launch_label} ours / stock: {verdict(value, least)}")
            named.add((label, contender))
    others = [(f"{label} {launch}", ratio(runs, label, c, b))
              for label in case_labels(runs) for c, b, launch in VERSUS_STOCK
              if (label, c) not in named]

    def against_compiled(contender: str) -> list:
        return [(label, ratio(runs, label, contender, "max-autotune"))
                for label in case_labels(runs)]

    for title, found in (("every other row, ours / stock", others),
                         ("ours patched and compiled / stock compiled, both max-autotune",
                          against_compiled("ours-max-autotune")),
                         ("ours graphed, not compiled / max-autotune",
                          against_compiled("ours-graph")),
                         ("ours fused and graphed, not compiled / max-autotune",
                          against_compiled("ours-fuse-graph"))):
        measured = [(name, value) for name, value in found if value is not None]
        if measured:
            lines.append(f"- {title} (goal ≥ 1.00): min {min(v for _, v in measured):.3f}; "
                         + ", ".join(f"{name} {value:.3f}" for name, value in measured))
    failed = [f"{label} {column} ({run['started']})" for run in runs
              for label, row in run["cases"].items() for column in row["contenders"]
              if not within_tolerance(row["contenders"][column]["logits"],
                                      row["contenders"]["stock"]["logits"])]
    lines.append("- logits: " + ("every contender of every run within tolerance" if not failed
                                  else "outside tolerance: " + ", ".join(failed)))
    return lines


def markdown(results: dict) -> str:
    setup, runs = results["setup"], results["runs"]
    versions = setup["versions"]
    lines = [f"# {setup['model']}: stock transformers vs gemm-tuner vs torch.compile "
             f"max-autotune — {setup['device']}", "",
             f"torch {versions['torch']}, triton {versions['triton']}, transformers "
             f"{versions['transformers']}, CUDA {versions['cuda']}; table `{runs[-1]['table']}`"
             f" (sha256 {setup['table_sha256'][:12]}); `benchmarks/model_e2e.py`.", "",
             "Each case is one forward step on transformers' StaticCache, logits of the last "
             "token only, the cache rewound after the step (one foreach kernel, in every "
             "contender). ours: tuner.enable() with the table; graph: the step captured in a "
             "torch.cuda.CUDAGraph and replayed; ours-fuse: tuner.fuse(model) as well (q/k/v "
             "and gate/up each one GEMM); stock-fuse: tuner.fuse(model) on torch's kernels; "
             "ours-patch: tuner.patch(model) instead; "
             "max-autotune: torch.compile(model, mode=\"max-autotune\", dynamic=False) per "
             "case; ours-max-autotune: the same of a patched copy. µs per step: the median of a "
             "run's samples, each one untimed step then back-to-back steps timed after a "
             "synchronize, the contenders' samples interleaved. Ratios: tokens/s of the first "
             "over the second, within one run. Logits: against stock's, and against an fp32 "
             "reference (the same weights upcast, fp32 at torch's default precision, no TF32); "
             f"within bf16 tolerance while the error against it is at most "
             f"{TOLERANCE_FACTOR:g}× stock's own.", ""]
    for number, run in enumerate(runs, 1):
        lines += [f"## Run {number}: {run['started']}, {run['samples']} samples of "
                  f"{run['steps']} steps, timed by {run['clock']}", "", *run_tables(run), ""]
    lines += ["## Bottom lines", "", *goal_lines(runs), ""]
    return "\n".join(lines)


# -- the subcommands ----------------------------------------------------------------------------
def check_transformers() -> None:
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise BenchError("needs Hugging Face transformers (pip install transformers)") from None


def check_device(args) -> None:
    if args.device == "cuda" and not torch.cuda.is_available():
        raise BenchError("no CUDA GPU here: this benchmark times one (--device cpu --tiny "
                         "runs its flow on the CPU; record also takes --device meta)")
    if args.device == "cpu" and not args.tiny:
        raise BenchError("--device cpu runs only the --tiny model")


def progress(started: float) -> Callable[[str], None]:
    def note(line: str) -> None:
        STDERR.note(f"[{time.perf_counter() - started:6.0f} s] {line}")
    return note


def record(args) -> int:
    """Run each case's step once inside tuner.record(--out/shapes.csv) (of the model under
    tuner.fuse with --fuse); print the shapes."""
    import tuner
    from tuner.recording import skipped_path
    from tuner.shapes import load_shapes
    note = progress(time.perf_counter())
    path = Path(args.out) / "shapes.csv"
    check_writable(path)
    torch.set_grad_enabled(False)
    note(f"building the model ({model_description(args)})")
    model = llama(args.layers, args.tiny, args.device, args.seed)
    cases = all_cases(args.prefix, args.tiny)
    steps = [Step(model, case, args.seed + i, args.device) for i, case in enumerate(cases)]
    with tuner.fuse(model) if args.fuse else contextlib.nullcontext(), tuner.record(path):
        for case, step in zip(cases, steps):
            note(f"recording {case.label}")
            step(model)
    print(f"recorded into {path} (merged with what it held): M,N,K dtype layout x calls")
    for shape in load_shapes(path):
        print(f"  {shape} x{shape.weight:g}")
    if skipped_path(path).exists():
        print(f"calls our kernels cannot run: {skipped_path(path)}")
    return 0


def bench(args) -> int:
    """Time the chosen cases and contenders; merge the run into --out/results.json and write
    --out/model_e2e.md."""
    from tuner.formats.table import read_table
    note = progress(time.perf_counter())
    out = Path(args.out)
    if not Path(args.table).is_file():
        raise BenchError(f"--table {args.table}: no such file")
    read_table(Path(args.table))  # one line naming the field where it is no table
    os.environ["TUNE_CONFIG"] = args.table  # before the dispatcher's first lookup
    columns = chosen_columns(args)
    cases = all_cases(args.prefix, args.tiny)
    chosen = [(i, cases[i]) for i in selected(args.rows, len(cases))]
    setup = table_setup(args)
    results_path = out / "results.json"
    results = earlier_results(results_path, setup)
    for path in (results_path, out / "model_e2e.md"):
        check_writable(path)
    torch.set_grad_enabled(False)
    note(f"building the model ({setup['model']}) on {setup['device']}")
    model = bench_model(args.layers, args.tiny, args.device, args.seed)
    note("fp32 reference logits")
    references = fp32_references(model, chosen, args.seed, args.device)
    run = {"started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "table": args.table, "steps": args.steps,
           "samples": args.samples, "clock": CLOCKS[args.device], "cases": {}}
    results["runs"].append(run)
    for index, case in chosen:
        run["cases"][case.label] = measure_case(model, case, index, columns,
                                                references[case.label], args, note)
        if args.device == "cuda":
            torch.cuda.empty_cache()
        # Written after each case: a call cut short by its time limit keeps the cases done.
        write_text_atomic(results_path, json.dumps(results, indent=1) + "\n")
        write_text_atomic(out / "model_e2e.md", markdown(results))
    print(markdown(results))
    return 0


def chosen_columns(args) -> list[str]:
    """stock (every ratio's baseline) and the --columns asked for, in COLUMNS' order."""
    available = [c for c in COLUMNS if args.device == "cuda" or c not in CUDA_ONLY_COLUMNS]
    if args.columns is None:
        return available
    asked = {c.strip() for c in args.columns.split(",") if c.strip()}
    unknown = asked - set(available)
    if unknown:
        raise BenchError(f"--columns: {', '.join(sorted(unknown))} not among "
                         f"{', '.join(available)} on {args.device}")
    return [c for c in available if c == "stock" or c in asked]


def report(args) -> int:
    """Write --out/model_e2e.md again from --out/results.json."""
    path = Path(args.out) / "results.json"
    if not path.exists():
        raise BenchError(f"{path}: no results yet (run bench first)")
    text = markdown(read_results(path))
    write_text_atomic(Path(args.out) / "model_e2e.md", text)
    print(text)
    return 0


def smoke(args) -> int:
    """The whole flow on the CPU, tiny and through Triton's interpreter, checked: record, `tune
    run` on a few of the recorded rows, `tune export table`, bench (a few minutes)."""
    out = Path(args.out)
    script = [sys.executable, str(Path(__file__).resolve())]
    tiny = ["--out", str(out), "--device", "cpu", "--tiny", "--layers", "1"]
    # Our kernels answer every call (the interpreter's tuning mostly picks cuBLAS).
    env = {**os.environ, "TRITON_INTERPRET": "1", "TUNE_EXCLUDE": "cublas"}
    subprocess.run([*script, "record", *tiny], env=env, check=True)
    shapes = write_rows(out / "shapes.csv", SMOKE_TUNED_ROWS, out / "tuned-rows.csv")
    tune(shapes, out / "tune.db", out / "triton-cache", "--backend", "interpret", "--trials",
         "2", "--patience", "1", "--polish", "0")
    subprocess.run([sys.executable, str(ROOT / "cli.py"), "export", "table", "--db",
                    f"sqlite:///{out / 'tune.db'}", "-o", str(out / "tuned.yaml")],
                   env=env, check=True)
    subprocess.run([*script, "bench", *tiny, "--table", str(out / "tuned.yaml"), "--steps", "1",
                    "--samples", "2"], env=env, check=True, stdout=subprocess.DEVNULL)
    runs = read_results(out / "results.json")["runs"]
    labels = [case.label for case in all_cases(DEFAULT_PREFIX, tiny=True)]
    problems = [f"{label}: no ours" for label in labels if not latest(runs, label, "ours")]
    problems += [line for line in goal_lines(runs) if line.startswith("- logits: outside")]
    if problems:
        raise BenchError("smoke run: " + "; ".join(problems))
    print(f"smoke run ok: {', '.join(labels)} measured, logits within tolerance ({out})")
    return 0


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The model's and its cases' options (--layers, --prefix, --seed)."""
    parser.add_argument("--layers", type=int, default=4, help="decoder layers (default 4)")
    parser.add_argument("--prefix", type=int, default=DEFAULT_PREFIX,
                        help=f"tokens cached before a decode step (default {DEFAULT_PREFIX})")
    parser.add_argument("--seed", type=int, default=0, help="weights and tokens")


def parser() -> argparse.ArgumentParser:
    main_parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = main_parser.add_subparsers(dest="command", required=True)
    for name, function in (("record", record), ("bench", bench), ("report", report),
                           ("smoke", smoke)):
        sub = commands.add_parser(name, help=function.__doc__.splitlines()[0])
        sub.set_defaults(function=function)
        sub.add_argument("--out", required=True, help="folder of this benchmark's files")
        if name in ("report", "smoke"):
            continue
        add_model_arguments(sub)
        devices = ("cuda", "cpu", "meta") if name == "record" else ("cuda", "cpu")
        sub.add_argument("--device", choices=devices, default="cuda",
                         help="where the model runs" + (" (meta: the shapes alone, nothing "
                                                        "computed)" if name == "record" else ""))
        sub.add_argument("--tiny", action="store_true",
                         help="a tiny config and short sequences: a smoke run of the flow")
    commands.choices["record"].add_argument(
        "--fuse", action="store_true", help="record the model under tuner.fuse: the GEMMs the "
        "ours-fuse contenders run")
    bench_parser = commands.choices["bench"]
    bench_parser.add_argument("--table", required=True, help="table YAML from `tune export`")
    bench_parser.add_argument("--rows", help="1-based cases to run, e.g. 3-5 or 1,4 "
                              "(1-2 prefill 1x2048, 8x512; 3-5 decode b1, b8, b32)")
    bench_parser.add_argument("--columns", help="contenders besides stock, comma-separated, "
                              f"from {', '.join(COLUMNS[1:])} (default: all the device has)")
    bench_parser.add_argument("--steps", type=int, default=10, help="steps per sample")
    bench_parser.add_argument("--samples", type=int, default=30,
                              help="samples per contender and case")
    return main_parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command != "report":
            check_transformers()
        if args.command in ("record", "bench"):
            check_device(args)
        return args.function(args)
    except UserError as e:
        print(f"model_e2e: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
