"""The tuned dispatcher against cuBLAS (and torch.compile max-autotune), per shape, in one
process on one GPU.

    python benchmarks/vs_cublas.py --shapes shapes.csv --config tuned.yaml [--rows 1-8]
        [--inductor-budget-s 240]

Contenders, all on the same random inputs (never zeros), all returning a new output as a user
call does, and each checked against a float64 reference:
- cuBLAS: torch.matmul, or torch.nn.functional.linear for the `nt` layout (x @ W^T);
  torch._scaled_mm for fp8 (which takes only the `nt` layout);
- tuned: gemm-tuner as a user calls it, tuner.linear(x, W) for `nt`, tuner.matmul(a, b)
  otherwise, with the table from --config;
- inductor: torch.compile(mode="max-autotune-no-cudagraphs") of the cuBLAS call, while its
  compile time stays within --inductor-budget-s in total (later shapes show "-").
Every contender is timed exactly as the tuner times a config (tuner.timing.time_gpu): device
time per call, median of at least 10 samples (and >= --min-time-ms of them), L2 flushed before
each sample with a GPU spin covering the host's launch, CUDA-graph replays for calls under
20 us, rotating over input sets that together exceed L2. Host cost per call is what
benchmarks/host_overhead.py measures. The table is Markdown with the device and versions on
top, and ends with the geometric mean and the minimum of tuned/cuBLAS.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import datetime, timezone

import torch
import torch.nn.functional as F
import triton

from tuner.dtypes import DTYPES
from tuner.execution import random_gemm, reference, relative_error, timing_sets
from tuner.shapes import Shape, load_shapes
from tuner.timing import time_gpu


def parse_rows(text: str | None, count: int) -> range:
    if not text:
        return range(count)
    first, _, last = text.partition("-")
    return range(int(first) - 1, int(last or first))


def geomean(xs: list[float]) -> float:
    xs = [x for x in xs if x == x and x > 0]
    return statistics.geometric_mean(xs) if xs else float("nan")


def contenders(layout: str, scaled: bool):
    """(cuBLAS, tuned): calls of one Gemm's operands that return the product."""
    import tuner
    if scaled:
        return (lambda g: torch._scaled_mm(g.a, g.b, g.scale_a, g.scale_b,
                                           out_dtype=g.out.dtype),
                lambda g: tuner.matmul(g.a, g.b, scale_a=g.scale_a, scale_b=g.scale_b))
    if layout == "nt":  # b = W^T of a row-major weight W: the linear-layer call
        return lambda g: F.linear(g.a, g.b.t()), lambda g: tuner.linear(g.a, g.b.t())
    return lambda g: torch.matmul(g.a, g.b), lambda g: tuner.matmul(g.a, g.b)


class Inductor:
    """torch.compile max-autotune of the cuBLAS call, shape by shape, within a time budget."""

    def __init__(self, budget_s: float):
        self.left_s = budget_s

    def compiled(self, cublas, gemm):
        """cublas(gemm) compiled, tried on `gemm` once; None past the budget or on failure."""
        if self.left_s <= 0:
            return None
        torch._dynamo.reset()  # one shape per compile: no recompile limits, no reuse
        fn = torch.compile(cublas, mode="max-autotune-no-cudagraphs", fullgraph=True)
        start = time.perf_counter()
        try:
            fn(gemm)
        except Exception as e:  # noqa: BLE001 - a compiler failure is a table entry
            print(f"<!-- inductor failed: {type(e).__name__}: {e} -->", file=sys.stderr)
            fn = None
        self.left_s -= time.perf_counter() - start
        return fn


def compare(shape: Shape, seed: int, min_time_ms: float, inductor: Inductor) -> dict:
    """TFLOP/s and errors of every contender on one shape, and the tuned config's variant."""
    from tuner import dispatch
    sets = timing_sets(shape, "cuda", seed)
    check = random_gemm(shape, "cuda", seed - 1)
    ref = reference(check)
    cublas, tuned = contenders(shape.layout, check.scale_a is not None)
    row = {}
    for name, fn in (("cublas", cublas), ("tuned", tuned),
                     ("inductor", inductor.compiled(cublas, check))):
        if fn is None:
            continue
        err = relative_error(fn(check), ref)
        if name != "cublas" and not err <= DTYPES[shape.dtype].tolerance:
            raise AssertionError(f"{shape} {name}: relative error {err:.3g}")
        timing = time_gpu(lambda i, fn=fn: fn(sets[i]), len(sets), min_time_ms=min_time_ms)
        row[name] = (shape.flops / (timing.p50_ms * 1e-3) / 1e12, err)
    _, config = dispatch.plan(check)
    row["config"] = config["variant"] + (f" pad{config['pad']}" if config["pad"] else "")
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", required=True)
    parser.add_argument("--config", required=True, help="table YAML from `tune export`")
    parser.add_argument("--rows", help="1-based data rows to run, e.g. 1-8")
    parser.add_argument("--min-time-ms", type=float, default=300.0,
                        help="timed milliseconds per contender and shape, at least")
    parser.add_argument("--inductor-budget-s", type=float, default=240.0,
                        help="total seconds of max-autotune compiling (0: no inductor column)")
    args = parser.parse_args(argv)

    os.environ["TUNE_CONFIG"] = args.config  # before the dispatcher's first lookup
    shapes = load_shapes(args.shapes)
    props = torch.cuda.get_device_properties(0)
    print(f"# tuned gemm-tuner vs cuBLAS vs torch.compile max-autotune — {props.name}, "
          f"{props.multi_processor_count} SMs, torch {torch.__version__}, triton "
          f"{triton.__version__}, CUDA {torch.version.cuda}, "
          f"{datetime.now(timezone.utc):%Y-%m-%d}\n")
    print(f"table: {args.config}; device time per call, tuner.timing.time_gpu medians over "
          f">= {args.min_time_ms:g} ms (L2 flushed, host launch covered, graphs under 20 us, "
          "rotating inputs); errors are relative Frobenius vs float64; nt rows call linear "
          "(x @ W^T)\n")
    print("| M | N | K | dtype | layout | cuBLAS TF/s | tuned TF/s | tuned/cuBLAS | variant | "
          "inductor TF/s | inductor/cuBLAS | err cuBLAS | err tuned |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    inductor = Inductor(args.inductor_budget_s)
    ratios = []
    for i in parse_rows(args.rows, len(shapes)):
        shape = shapes[i]
        row = compare(shape, 1000 + 100 * i, args.min_time_ms, inductor)
        torch.cuda.empty_cache()  # compare's buffers are gone; give their memory back
        (cublas_tf, err_cublas), (tuned_tf, err_tuned) = row["cublas"], row["tuned"]
        ratios.append(tuned_tf / cublas_tf)
        inductor_tf = row.get("inductor", (None,))[0]
        inductor_cells = (f"{inductor_tf:.1f} | {inductor_tf / cublas_tf:.2f}" if inductor_tf
                          else "- | -")
        print(f"| {shape.M} | {shape.N} | {shape.K} | {shape.dtype} | {shape.layout} | "
              f"{cublas_tf:.1f} | {tuned_tf:.1f} | {ratios[-1]:.2f} | {row['config']} | "
              f"{inductor_cells} | {err_cublas:.1e} | {err_tuned:.1e} |", flush=True)
    print(f"\ngeomean tuned/cuBLAS {geomean(ratios):.3f}, min {min(ratios):.2f} over "
          f"{len(ratios)} shapes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
