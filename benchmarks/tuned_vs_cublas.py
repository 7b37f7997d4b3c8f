"""Tuned Triton (through tuner.matmul, as a user calls it) against cuBLAS and against the best
of Triton's matmul-tutorial configs, per shape, in one process on one GPU.

    python benchmarks/tuned_vs_cublas.py --shapes shapes.csv --config tuned.yaml [--rows 1-8]

Every contender runs on the same random inputs (never zeros) and is checked against a float64
reference; times are triton.testing.do_bench medians (L2 flushed before every run, repeated for
--rep-ms). The table is printed as Markdown with the device and versions on top.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from datetime import datetime, timezone

import torch
import triton
import triton.testing

from tuner.dtypes import DTYPES
from tuner.execution import random_operands, relative_error
from tuner.kernels import KERNELS
from tuner.shapes import load_shapes

# The configs of Triton's matmul tutorial (get_cuda_autotune_config), GROUP_SIZE_M=8.
TUTORIAL_CONFIGS = [
    dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_stages=s, num_warps=w)
    for bm, bn, bk, s, w in [(128, 256, 64, 3, 8), (64, 256, 32, 4, 4), (128, 128, 32, 4, 4),
                             (128, 64, 32, 4, 4), (64, 128, 32, 4, 4), (128, 32, 32, 4, 4),
                             (64, 32, 32, 5, 2), (32, 64, 32, 5, 2)]]


def parse_rows(text: str | None, count: int) -> range | list[int]:
    if not text:
        return range(count)
    first, _, last = text.partition("-")
    return range(int(first) - 1, int(last or first))


def bench(fn, rep_ms):
    return triton.testing.do_bench(fn, warmup=25, rep=rep_ms, return_mode="median")


def checked(fn, out, ref, tolerance):
    out.fill_(float("nan"))
    fn()
    err = relative_error(out, ref)
    if not err <= tolerance:
        raise AssertionError(f"relative error {err:.3g} > {tolerance:g}")
    return err


def compare(shape, seed: int, rep_ms: int, matmul) -> tuple:
    """TF/s of cuBLAS, of `matmul` (the tuned dispatcher) and of the best tutorial config on one
    shape, plus the relative errors of the first two; every output is checked."""
    tol = DTYPES[shape.dtype].tolerance
    a, b = random_operands(shape, "cuda", seed=seed)
    ref = a.double() @ b.double()
    out = torch.empty((shape.M, shape.N), dtype=a.dtype, device="cuda")

    def run_cublas():
        torch.matmul(a, b, out=out)

    def run_tuned():
        matmul(a, b, out=out)

    run_cublas()
    err_cublas = relative_error(out, ref)
    err_tuned = checked(run_tuned, out, ref, tol)
    tflop = shape.flops / 1e12
    cublas_tf = tflop / (bench(run_cublas, rep_ms) * 1e-3)
    tuned_tf = tflop / (bench(run_tuned, rep_ms) * 1e-3)
    tutorial_tf = 0.0
    for cfg in TUTORIAL_CONFIGS:
        def run_cfg(cfg=cfg):
            KERNELS["mm"].launch(a, b, out, cfg)
        try:
            checked(run_cfg, out, ref, tol)
        except Exception as e:  # noqa: BLE001 - a tutorial config may not fit this shape
            print(f"<!-- tutorial {cfg} failed: {type(e).__name__} -->", file=sys.stderr)
            continue
        tutorial_tf = max(tutorial_tf, tflop / (bench(run_cfg, rep_ms) * 1e-3))
    return cublas_tf, tuned_tf, tutorial_tf, err_cublas, err_tuned


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", required=True)
    parser.add_argument("--config", required=True, help="table YAML from `tune export`")
    parser.add_argument("--rows", help="1-based data rows to run, e.g. 1-8")
    parser.add_argument("--rep-ms", type=int, default=300)
    args = parser.parse_args(argv)

    os.environ["TUNE_CONFIG"] = args.config
    import tuner  # after TUNE_CONFIG, so the dispatcher's lookup reads it

    shapes = load_shapes(args.shapes)
    props = torch.cuda.get_device_properties(0)
    print(f"# tuned Triton vs cuBLAS vs tutorial configs — {props.name}, "
          f"{props.multi_processor_count} SMs, torch {torch.__version__}, triton "
          f"{triton.__version__}, CUDA {torch.version.cuda}, "
          f"{datetime.now(timezone.utc):%Y-%m-%d}\n")
    print(f"table: {args.config}; do_bench medians over {args.rep_ms} ms, L2 flushed; "
          "errors are relative Frobenius vs float64\n")
    print("| M | N | K | dtype | layout | cuBLAS TF/s | tuned TF/s | tuned/cuBLAS | "
          "tutorial best TF/s | tuned/tutorial | err cuBLAS | err tuned |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    ratios_cublas, ratios_tutorial = [], []
    for i in parse_rows(args.rows, len(shapes)):
        shape = shapes[i]
        cublas_tf, tuned_tf, tutorial_tf, err_cublas, err_tuned = compare(
            shape, 1000 + i, args.rep_ms, tuner.matmul)
        torch.cuda.empty_cache()  # compare's buffers are gone; give their memory back
        ratios_cublas.append(tuned_tf / cublas_tf)
        ratios_tutorial.append(tuned_tf / tutorial_tf if tutorial_tf else float("nan"))
        print(f"| {shape.M} | {shape.N} | {shape.K} | {shape.dtype} | {shape.layout} | "
              f"{cublas_tf:.1f} | {tuned_tf:.1f} | {ratios_cublas[-1]:.2f} | {tutorial_tf:.1f} | "
              f"{ratios_tutorial[-1]:.2f} | {err_cublas:.1e} | {err_tuned:.1e} |", flush=True)

    def geomean(xs):
        xs = [x for x in xs if x == x and x > 0]
        return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")

    print(f"\ngeomean tuned/cuBLAS {geomean(ratios_cublas):.3f} (min {min(ratios_cublas):.2f}); "
          f"geomean tuned/tutorial-best {geomean(ratios_tutorial):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
