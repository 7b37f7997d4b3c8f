"""The dispatcher as the user calls it against cuBLAS (and torch.compile max-autotune), per
shape, in one process on one GPU: device time, the eager call, and a loop of calls.

    python benchmarks/vs_cublas.py --shapes shapes.csv --config tuned.yaml [--rows 1-8]
        [--inductor-budget-s 900]

Contenders, all on the same random inputs (never zeros), each checked against float64:
- cuBLAS: `torch.matmul`, `F.linear` for the `nt` layout (x @ W^T), `torch._scaled_mm` for fp8;
- tuner: `tuner.linear(x, W)` / `tuner.matmul(a, b)` with the table from --config, as a user
  calls it (whatever variant the table or its fallback answers, cuBLAS included);
- triton: the best Triton config the runtime has for the key (cuBLAS excluded), launched
  through the kernels' own replayed path: how good our kernels are on their own;
- inductor: torch.compile(mode="max-autotune-no-cudagraphs") of the cuBLAS call, while its
  compile time stays within --inductor-budget-s in total (later shapes show "-").
Measures, per contender:
- device µs: kernel time, tuner.execution.timing.retime_interleaved over every contender of the row
  (L2 flushed by a read before each sample with a GPU spin covering the host's launch, or,
  for the whole row where any contender runs under 20 µs, CUDA-graph replays over rotating
  input sets; one sample of each contender per round, so drift hits them alike);
- eager µs: `triton.testing.do_bench` of the call as written (L2 flushed between calls, so a
  launch path longer than the flush shows), median of --eager-rounds runs;
- loop µs: wall time per call of --loop-calls back-to-back calls through the final
  synchronize, median of --loop-repeats; host µs: the same loop's time to issue the calls.
Eager and loop runs, like device samples, take turns across the row's contenders: a lent
machine's host speed drifts by tens of percent within a minute.
- roofline: the dispatcher's fraction of the device's limit for the row, max(flops / peak,
  bytes / bandwidth) / its device time, with the peak and bandwidth measured in the same run
  (`Ceilings`: a large cuBLAS GEMM of the row's dtype, a large device-to-device copy).
Ratios are cuBLAS time / contender time: above 1 the contender is faster. The output ends with
the geometric mean and minimum of each ratio over the shapes, one line each.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from datetime import datetime, timezone

import torch
import triton
from _as_called import eagers_us, loops_us, user_calls

from tuner.dtypes import DTYPES
from tuner.execution.measure import random_gemm, reference, relative_error, timing_sets
from tuner.execution.timing import retime_interleaved
from tuner.shapes import Shape, load_shapes


def parse_rows(text: str | None, count: int) -> range:
    if not text:
        return range(count)
    first, _, last = text.partition("-")
    return range(int(first) - 1, int(last or first))


def geomean(xs: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(x) for x in xs))


def best_triton_call(shape: Shape, check):
    """The runtime's best non-cuBLAS config for the key, as a call on a Gemm that writes its
    output (replayed launches, kernels/launches.py), and that config."""
    from tuner.kernels import kernel_for
    from tuner.kernels.calls import runnable_config
    from tuner.kernels.launches import prepare
    from tuner.runtime import get_tuned_config_without
    kernel = kernel_for(shape.M, shape.N)
    answer = get_tuned_config_without(("cublas",), kernel.name, M=shape.M, N=shape.N, K=shape.K,
                                      dtype=shape.dtype, stride_am=check.a.stride(0),
                                      stride_bk=check.b.stride(0))
    config, reason = runnable_config(kernel, answer, check)
    if reason:
        raise AssertionError(f"{shape}: the runtime's Triton answer cannot run it: {reason}")
    prepared = prepare(kernel, config, check)

    def call(g):
        prepared(g)
        return g.out
    return call, config


class Inductor:
    """torch.compile max-autotune of the cuBLAS call, shape by shape, within a time budget."""

    def __init__(self, budget_s: float):
        self.left_s = budget_s

    def compiled(self, operands, torch_op, gemm):
        """torch_op compiled, as a call on a Gemm (torch_op(*operands(g))), tried on `gemm`
        once; None past the budget or on failure."""
        if self.left_s <= 0:
            return None
        torch._dynamo.reset()  # one shape per compile: no recompile limits, no reuse
        op = torch.compile(torch_op, mode="max-autotune-no-cudagraphs", fullgraph=True)
        start = time.perf_counter()
        try:
            op(*operands(gemm))
        except Exception as e:  # noqa: BLE001 - a compiler failure is a table entry
            print(f"<!-- inductor failed: {type(e).__name__}: {e} -->", file=sys.stderr)
            op = None
        self.left_s -= time.perf_counter() - start
        return None if op is None else lambda g: op(*operands(g))


class Ceilings:
    """The device's measured limits: dense matmul TFLOP/s per dtype (a cuBLAS GEMM of
    PEAK_SIDE³ on random data, measured once per dtype) and HBM bytes per second (a copy of
    COPY_BYTES, counting bytes read and written)."""
    PEAK_SIDE = 8192
    COPY_BYTES = 2**30

    def __init__(self):
        self.flops_per_s: dict[str, float] = {}
        source = torch.empty(self.COPY_BYTES // 2, dtype=torch.int8, device="cuda")
        target = torch.empty_like(source)
        seconds = triton.testing.do_bench(lambda: target.copy_(source), return_mode="median")
        self.bytes_per_s = 2 * source.numel() / (seconds * 1e-3)

    def peak(self, dtype: str) -> float:
        if dtype not in self.flops_per_s:
            side = self.PEAK_SIDE
            gemm = random_gemm(Shape(side, side, side, dtype, "nt"), "cuda", seed=7)
            operands, torch_op, _ = user_calls("nt", gemm.scale_a is not None)
            args = operands(gemm)
            ms = triton.testing.do_bench(lambda: torch_op(*args), return_mode="median")
            self.flops_per_s[dtype] = 2 * side**3 / (ms * 1e-3)
        return self.flops_per_s[dtype]

    def fraction(self, shape: Shape, device_us: float) -> float:
        """The share of the row's limit a call of device_us reaches (1: at the roofline)."""
        dtype = DTYPES[shape.dtype]
        moved = ((shape.M * shape.K + shape.K * shape.N) * dtype.torch.itemsize
                 + shape.M * shape.N * dtype.out.itemsize)
        limit_s = max(2 * shape.M * shape.N * shape.K / self.peak(shape.dtype),
                      moved / self.bytes_per_s)
        return limit_s / (device_us * 1e-6)


def measure(contenders: dict, check, ref, dtype: str, args) -> dict:
    """Per contender on one shape: its error, then eager, host and loop figures, each taken
    with the contenders interleaved (the host's speed drifts within a row)."""
    row = {}
    for name, fn in contenders.items():
        err = relative_error(fn(check), ref)
        if not err <= DTYPES[dtype].tolerance:
            raise AssertionError(f"{name}: relative error {err:.3g}")
        row[name] = {"err": err}
    calls = [lambda fn=fn: fn(check) for fn in contenders.values()]
    eagers = eagers_us(calls, args.eager_rounds, rep_ms=25)
    loops = loops_us(calls, args.loop_calls, args.loop_repeats)
    for name, eager, (host, loop) in zip(contenders, eagers, loops):
        row[name].update(eager=eager, host=host, loop=loop)
    return row


def compare(shape: Shape, seed: int, args, inductor: Inductor) -> dict:
    from tuner.kernels.base import config_label
    from tuner.runtime import dispatch
    sets = timing_sets(shape, "cuda", seed)
    check = random_gemm(shape, "cuda", seed - 1)
    ref = reference(check)
    operands, torch_op, tuner_op = user_calls(shape.layout, check.scale_a is not None)
    cublas, tuned = (lambda g: torch_op(*operands(g))), (lambda g: tuner_op(*operands(g)))
    start = time.perf_counter()
    tuned(check)
    torch.cuda.synchronize()
    first_call_s = time.perf_counter() - start
    triton_call, triton_config = best_triton_call(shape, check)
    contenders = {"cublas": cublas, "tuner": tuned, "triton": triton_call}
    compiled = inductor.compiled(operands, torch_op, check)
    if compiled is not None:
        contenders["inductor"] = compiled
    row = measure(contenders, check, ref, shape.dtype, args)
    # Device time side by side, interleaved round by round, so that clock and temperature
    # drift over the row (large GEMMs throttle) hits every contender alike.
    timings = retime_interleaved([lambda i, fn=fn: fn(sets[i]) for fn in contenders.values()],
                                 len(sets), rounds=args.device_rounds)
    for name, timing in zip(contenders, timings):
        row[name]["device"] = timing.p50_ms * 1e3
    row["first_call_s"] = first_call_s
    _, config = dispatch.plan(check)
    row["config"] = f"{config_label(config)} ({config.source})"
    row["triton_config"] = config_label(triton_config)
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", required=True)
    parser.add_argument("--config", required=True, help="table YAML from `tune export`")
    parser.add_argument("--rows", help="1-based data rows to run, e.g. 1-8")
    parser.add_argument("--device-rounds", type=int, default=30,
                        help="interleaved device-time samples per contender and shape")
    parser.add_argument("--eager-rounds", type=int, default=5,
                        help="interleaved do_bench runs (25 ms each) per contender and shape")
    parser.add_argument("--loop-calls", type=int, default=200)
    parser.add_argument("--loop-repeats", type=int, default=15)
    parser.add_argument("--inductor-budget-s", type=float, default=900.0,
                        help="total seconds of max-autotune compiling (0: no inductor column)")
    args = parser.parse_args(argv)

    os.environ["TUNE_CONFIG"] = args.config  # before the dispatcher's first lookup
    shapes = load_shapes(args.shapes)
    props = torch.cuda.get_device_properties(0)
    ceilings = Ceilings()
    print(f"# gemm-tuner as called vs cuBLAS vs torch.compile max-autotune — {props.name}, "
          f"{props.multi_processor_count} SMs, torch {torch.__version__}, triton "
          f"{triton.__version__}, CUDA {torch.version.cuda}, "
          f"{datetime.now(timezone.utc):%Y-%m-%d}\n")
    print(f"table: {args.config}. µs per call; ratio = cuBLAS / contender (> 1: faster than "
          "cuBLAS). device: median of interleaved samples (L2 flushed by a read, host launch "
          "covered; graphs for the row if any contender is under 20 µs); "
          "eager: do_bench of the call; loop: wall per call of back-to-back calls; host: the "
          "time to issue one call of that loop. nt rows call linear (x @ W^T). roofline: the "
          "tuner's device time against max(flops / peak, bytes / bandwidth), measured here: "
          f"HBM {ceilings.bytes_per_s / 1e12:.2f} TB/s (copy), peaks per dtype below.\n")
    print("| shape | tuner config (source) | cuBLAS device / eager / loop / host | "
          "tuner device / eager / loop / host | device | eager | loop | best triton config | "
          "triton device | triton ratio | inductor device / eager | inductor ratio | "
          "roofline | first call s | err cuBLAS / tuner |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    inductor = Inductor(args.inductor_budget_s)
    ratios: dict[str, list[float]] = {k: [] for k in ("eager", "loop", "device", "triton",
                                                      "inductor", "roofline")}
    for i in parse_rows(args.rows, len(shapes)):
        shape = shapes[i]
        row = compare(shape, 1000 + 100 * i, args, inductor)
        torch.cuda.empty_cache()  # compare's buffers are gone; give their memory back
        cb, tu, tr = row["cublas"], row["tuner"], row["triton"]
        for measure_name in ("eager", "loop", "device"):
            ratios[measure_name].append(cb[measure_name] / tu[measure_name])
        ratios["triton"].append(cb["device"] / tr["device"])
        ratios["roofline"].append(ceilings.fraction(shape, tu["device"]))
        ind = row.get("inductor")
        if ind:
            ratios["inductor"].append(cb["device"] / ind["device"])
        ind_cells = (f"{ind['device']:.1f} / {ind['eager']:.1f} | "
                     f"{cb['device'] / ind['device']:.3f}" if ind else "- | -")
        print(f"| {shape} | {row['config']} | {cb['device']:.1f} / {cb['eager']:.1f} / "
              f"{cb['loop']:.1f} / {cb['host']:.1f} | {tu['device']:.1f} / {tu['eager']:.1f} / "
              f"{tu['loop']:.1f} / {tu['host']:.1f} | {ratios['device'][-1]:.3f} | "
              f"{ratios['eager'][-1]:.3f} | {ratios['loop'][-1]:.3f} | {row['triton_config']} | "
              f"{tr['device']:.1f} | {ratios['triton'][-1]:.3f} | {ind_cells} | "
              f"{ratios['roofline'][-1]:.3f} | {row['first_call_s']:.2f} | "
              f"{cb['err']:.1e} / {tu['err']:.1e} |", flush=True)
    print()
    print("peaks (cuBLAS, TFLOP/s): " + ", ".join(
        f"{dtype} {flops / 1e12:.0f}" for dtype, flops in ceilings.flops_per_s.items()) + "\n")
    for label, key in (("eager", "eager"), ("loop", "loop"), ("device", "device"),
                       ("triton-only device", "triton"), ("inductor device", "inductor"),
                       ("roofline", "roofline")):
        xs = ratios[key]
        if xs:
            print(f"{label}: geomean {geomean(xs):.3f}, min {min(xs):.3f} over {len(xs)} shapes")
        else:
            print(f"{label}: no shapes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
