"""Host time per call of the dispatcher against torch, on decode shapes, in one process.

    python benchmarks/host_overhead.py [--calls 2000] [--repeats 15]

Decode GEMMs run for ~10-50 µs on the GPU, so the Python and launch path in front of the
kernel decides their speed when calls are issued back to back. Per shape this times N
back-to-back calls on the host (perf_counter, after a synchronize, then once more through the
final synchronize) for torch.matmul / F.linear and for tuner.matmul / tuner.linear, reports the
median per-call time of --repeats runs, and the ratio. A run whose per-call time is below the
kernel's own GPU time measures the GPU, not the host: the "GPU µs" column says which. Inputs
are random and the outputs are checked once against float64. Runs where no table is loaded use
the default configs (a host-cost measurement: which config runs hardly matters).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from datetime import datetime, timezone

import torch
import torch.nn.functional as F
import triton

import tuner
from tuner.dtypes import DTYPES
from tuner.execution import random_operands, relative_error
from tuner.shapes import Shape
from tuner.timing import time_gpu

SHAPES = [Shape(1, 4096, 4096, "bf16", "nt"), Shape(1, 6144, 4096, "bf16", "nt"),
          Shape(16, 4096, 4096, "bf16", "nn"), Shape(32, 4096, 4096, "bf16", "nt"),
          Shape(1, 1024, 1024, "bf16", "nn")]


def per_call_us(fn, calls: int, repeats: int) -> float:
    """Median over repeats of (wall time of `calls` back-to-back calls) / calls, in µs."""
    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def pair(shape: Shape):
    """(torch call, tuner call) for one shape: the linear-layer call for `nt`."""
    a, b = random_operands(shape, "cuda", seed=5)
    if shape.layout == "nt":
        weight = b.t()
        return (lambda: F.linear(a, weight)), (lambda: tuner.linear(a, weight)), a, b
    return (lambda: torch.matmul(a, b)), (lambda: tuner.matmul(a, b)), a, b


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore", RuntimeWarning)  # default configs: one warning per key
    props = torch.cuda.get_device_properties(0)
    print(f"# host time per call — {props.name}, torch {torch.__version__}, triton "
          f"{triton.__version__}, {datetime.now(timezone.utc):%Y-%m-%d}\n")
    print(f"{args.calls} back-to-back calls, median of {args.repeats} runs; GPU µs: the "
          "kernel's own device time (tuner.timing.time_gpu), the floor of any per-call figure\n")
    print("| shape | torch µs/call | tuner µs/call | tuner/torch | tuner GPU µs |")
    print("|---|---|---|---|---|")
    for shape in SHAPES:
        torch_call, tuner_call, a, b = pair(shape)
        err = relative_error(tuner_call(), a.double() @ b.double())
        if not err <= DTYPES[shape.dtype].tolerance:
            raise AssertionError(f"{shape}: relative error {err:.3g}")
        gpu_us = time_gpu(lambda i: tuner_call(), 1).p50_ms * 1e3
        torch_us = per_call_us(torch_call, args.calls, args.repeats)
        tuner_us = per_call_us(tuner_call, args.calls, args.repeats)
        print(f"| {shape} | {torch_us:.1f} | {tuner_us:.1f} | {tuner_us / torch_us:.2f} | "
              f"{gpu_us:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
