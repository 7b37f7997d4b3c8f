"""Host time per call of the dispatcher against torch: one shape per variant and pad, one
process.

    python benchmarks/host_overhead.py [--calls 200] [--repeats 15]

A user's eager call costs its host time (Python, argument handling, descriptors, launches)
as well as its kernel: a decode GEMM whose kernel takes 10 µs behind a 30 µs launch path is a
30 µs call. Each row forces one config (a one-entry table, read through TUNE_CONFIG as a
deployment reads it) and calls `tuner.linear(x, W)` (`nt`), `tuner.matmul(a, b)` (`nn`), or
`tuner.matmul(a, b, scale_a=, scale_b=)` (fp8), against `F.linear` / `torch.matmul` /
`torch._scaled_mm` on the same operands. Columns:
- host µs: `--calls` back-to-back calls after a synchronize, timed on the host without
  waiting for the GPU (few enough calls that the launch queue never fills), median of
  `--repeats`, torch's and the tuner's loops taking turns (a lent machine's host speed
  drifts by tens of percent within a minute);
- wall µs: the same loop through its final synchronize, per call: what a loop of calls costs;
- device µs: the tuner's kernels alone, CUDA-graph replay (triton.testing.do_bench_cudagraph);
- first call s: the first call of the key (compile or disk-cache load, and recording).
Outputs are checked against float64 first. The last line is the worst host ratio.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from datetime import datetime, timezone

import torch
import triton
import yaml
from _as_called import loops_us, user_calls
from triton.testing import do_bench_cudagraph

from tuner.dtypes import DTYPES
from tuner.execution.measure import random_gemm, reference, relative_error
from tuner.shapes import Shape

TILE = {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_stages": 4,
        "num_warps": 4}
BIG_TILE = {**TILE, "BLOCK_M": 128, "BLOCK_N": 256, "num_stages": 3, "num_warps": 8}
SPLITK = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_K": 8, "num_stages": 4,
          "num_warps": 4}
PERSISTENT = {"WARP_SPECIALIZE": 0, "FLATTEN": 0, "EPILOGUE_SUBTILE": 0}
GLUON = {"BLOCK_N_TAIL": 0, "SWAP_AB": 0, "WARP_SPECIALIZE": 0}
# (config, shape): every variant, padded configs, and fp8.
ROWS = [
    ({"variant": "gemv", "pad": 0, "BLOCK_M": 4, "BLOCK_K": 512, "num_stages": 2,
      "num_warps": 4}, Shape(1, 4096, 4096, "bf16", "nt")),
    ({"variant": "general", "pad": 0, **TILE}, Shape(77, 768, 768, "fp16", "nn")),
    ({"variant": "tma", "pad": 0, **TILE}, Shape(300, 3072, 768, "fp16", "nt")),
    ({"variant": "persistent", "pad": 0, **BIG_TILE, **PERSISTENT},
     Shape(512, 4096, 4096, "bf16", "nt")),
    ({"variant": "splitk", "pad": 0, **SPLITK}, Shape(16, 4096, 4096, "bf16", "nn")),
    ({"variant": "general", "pad": 64, **TILE}, Shape(509, 765, 1023, "bf16", "nn")),
    ({"variant": "tma", "pad": 64, **TILE}, Shape(509, 765, 1023, "bf16", "nn")),
    ({"variant": "tma", "pad": 0, **TILE}, Shape(64, 4096, 4096, "fp8e4m3", "nt")),
    # Gluon descriptors built on the host: three (a tail adds two), and transposed.
    ({"variant": "gluon", "pad": 0, **TILE, **GLUON}, Shape(300, 3072, 768, "fp16", "nt")),
    ({"variant": "gluon", "pad": 0, **TILE, **GLUON, "BLOCK_N": 64, "BLOCK_N_TAIL": 16,
      "SWAP_AB": 1}, Shape(400, 3072, 768, "fp16", "nt")),
    ({"variant": "cublas", "pad": 0}, Shape(256, 4096, 4096, "bf16", "nt")),
]


def calls(shape: Shape):
    """(torch call, tuner call, the Gemm whose operands both use) for one shape: the user's
    call as written (_as_called.user_calls)."""
    g = random_gemm(shape, "cuda", seed=5)
    operands, torch_op, tuner_op = user_calls(shape.layout, scaled=g.scale_a is not None)
    args = operands(g)
    return lambda: torch_op(*args), lambda: tuner_op(*args), g


def table_for(config: dict, shape: Shape, g) -> dict:
    """A one-entry table answering this shape's key with `config`."""
    kernel = "gemv" if 1 in (shape.M, shape.N) else "mm"
    key = {"M": shape.M, "N": shape.N, "K": shape.K, "stride_am": g.a.stride(0),
           "stride_bk": g.b.stride(0), "dtype": shape.dtype}
    strategy = dict.fromkeys(key, "default")
    return {"format": "gemm-tuner-table/2", "ops": {kernel: {
        "strategy": strategy, "entries": [{"key": key, "config": config}]}}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=41)
    args = parser.parse_args(argv)
    from tuner.kernels.base import config_label
    from tuner.runtime import dispatch
    props = torch.cuda.get_device_properties(0)
    print(f"# host time per call — {props.name}, torch {torch.__version__}, triton "
          f"{triton.__version__}, {datetime.now(timezone.utc):%Y-%m-%d}\n")
    print(f"{args.calls} back-to-back calls, median of {args.repeats} runs, torch and tuner "
          "taking turns\n")
    print("| config | shape | torch host µs | tuner host µs | tuner/torch host | "
          "torch wall µs | tuner wall µs | tuner device µs | first call s | rel. error |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (config, shape) in enumerate(ROWS):
            torch_call, tuner_call, g = calls(shape)
            path = os.path.join(tmp, f"table{i}.yaml")
            with open(path, "w") as f:
                yaml.safe_dump(table_for(config, shape, g), f)
            os.environ["TUNE_CONFIG"] = path
            dispatch.clear_cache()
            start = time.perf_counter()
            tuner_call()
            torch.cuda.synchronize()
            first_s = time.perf_counter() - start
            err = relative_error(tuner_call(), reference(g))
            if not err <= DTYPES[shape.dtype].tolerance:
                raise AssertionError(f"{shape} {config_label(config)}: relative error {err:.3g}")
            device_us = do_bench_cudagraph(tuner_call, rep=50) * 1e3
            (torch_host, torch_wall), (tuner_host, tuner_wall) = loops_us(
                [torch_call, tuner_call], args.calls, args.repeats)
            ratios.append(tuner_host / torch_host)
            print(f"| {config_label(config)} | {shape} | {torch_host:.1f} | {tuner_host:.1f} | "
                  f"{ratios[-1]:.2f} | {torch_wall:.1f} | {tuner_wall:.1f} | {device_us:.1f} | "
                  f"{first_s:.2f} | {err:.1e} |", flush=True)
    print(f"\nhost tuner/torch: max {max(ratios):.2f} over {len(ratios)} shapes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
