"""Host time per GEMM call of a model switched over by `tuner.enable` or `tuner.patch`,
against stock torch: what routing adds to each call, whatever its kernel costs.

    python benchmarks/enable_overhead.py [--device cpu|cuda] [--calls 200] [--repeats 21]

Three calls a model makes, at decode sizes: `torch.mm(a, b)` (aten mm), an `nn.Linear` with a
bias on a 2-D x (aten addmm) and one without a bias on a 3-D x (aten mm of the folded rows),
each in a dtype the tuner takes and in fp64, which it leaves to torch (routed, not taken).
Contenders, per call: stock torch; `tuner.enable(devices=(device,))`; `tuner.patch(layer)`
(nn.Linear rows only). Answers: `cublas` (no table: every key is answered cuBLAS) and, on
CUDA only, Triton (TUNE_EXCLUDE=cublas: each kernel's default config; on CPU Triton runs
only in its interpreter, so that block is left out there).
Each figure is the host µs per call of `--calls` back-to-back calls after a synchronize
(few enough that a GPU's launch queue never fills), the median of `--repeats`, the
contenders of one block taking turns; outputs are checked against stock's first. On CPU
the figure includes the (small) product itself, the same in every contender.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from datetime import datetime, timezone

import torch
from torch import nn

import tuner
from tuner.execution.timing import rotating_order
from tuner.runtime import dispatch

# M (rows of a decode step), K, N: small on CPU, where the product is part of the figure.
SIZES = {"cpu": (8, 64, 64), "cuda": (8, 4096, 4096)}
ROUTED_DTYPE = {"cpu": torch.float32, "cuda": torch.bfloat16}


def calls(device: str, dtype: torch.dtype) -> list[tuple[str, nn.Module | None, Callable]]:
    """(name, the nn.Linear it calls or None, the call) for each call a model makes."""
    M, K, N = SIZES[device]
    torch.manual_seed(0)
    options = dict(device=device, dtype=dtype)
    a, b = torch.randn(M, K, **options), torch.randn(K, N, **options)
    biased = nn.Linear(K, N, **options).requires_grad_(False)
    plain = nn.Linear(K, N, bias=False, **options).requires_grad_(False)
    x2, x3 = torch.randn(M, K, **options), torch.randn(2, M // 2, K, **options)
    return [("mm", None, lambda: torch.mm(a, b)),
            ("linear+bias 2-D (addmm)", biased, lambda: biased(x2)),
            ("linear 3-D (mm)", plain, lambda: plain(x3))]


def contenders(device: str, layer: nn.Module | None) -> dict[str, Callable]:
    """Name -> a context manager factory putting that contender in place for a loop."""
    devices = (device,)
    chosen = {"stock": contextlib.nullcontext,
              "enable": lambda: tuner.enabled(devices)}
    if layer is not None:
        chosen["patch"] = lambda: tuner.patch(layer, devices=devices)
    return chosen


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def host_us(device: str, call: Callable, setups: dict[str, Callable], calls_per_loop: int,
            repeats: int) -> dict[str, float]:
    """Per contender, the median host µs per call of `calls_per_loop` back-to-back calls,
    the contenders taking turns; each checked against stock's output first."""
    with setups["stock"]():
        expected = call()
    names = list(setups)
    for name in names:
        with setups[name]():
            call(), call()  # first call of each key, and the one its repeats learn from
            torch.testing.assert_close(call(), expected, rtol=2e-2, atol=2e-2)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for i in rotating_order(len(names), repeats):
        with setups[names[i]]():
            call()  # enabling anew forgot the routes: the first call finds them again
            synchronize(device)
            start = time.perf_counter()
            for _ in range(calls_per_loop):
                call()
            samples[names[i]].append((time.perf_counter() - start) / calls_per_loop * 1e6)
        synchronize(device)
    return {name: statistics.median(s) for name, s in samples.items()}


@contextlib.contextmanager
def answers(kind: str):
    """Every key answered `kind` ("cublas", or "triton": cuBLAS excluded) for the block."""
    saved = {name: os.environ.pop(name, None) for name in ("TUNE_CONFIG", "TUNE_EXCLUDE")}
    if kind == "triton":
        os.environ["TUNE_EXCLUDE"] = "cublas"
    dispatch.clear_cache()
    try:
        yield
    finally:
        os.environ.pop("TUNE_EXCLUDE", None)
        os.environ.update({name: value for name, value in saved.items() if value is not None})
        dispatch.clear_cache()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=sorted(SIZES), default="cpu")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args(argv)
    device = args.device
    # No table: each key's first call warns that cuBLAS answers it, as this benchmark means.
    warnings.filterwarnings("ignore", "gemm-tuner: no tuned", RuntimeWarning)
    where = torch.cuda.get_device_name(0) if device == "cuda" else "CPU"
    print(f"# host µs per GEMM call, stock vs tuner.enable / tuner.patch — {where}, torch "
          f"{torch.__version__}, {datetime.now(timezone.utc):%Y-%m-%d}\n")
    M, K, N = SIZES[device]
    print(f"M={M}, K={K}, N={N}; {args.calls} back-to-back calls, median of {args.repeats}, "
          "contenders taking turns\n")
    print("| answer | call | dtype | stock µs | enable µs | patch µs | enable − stock µs | "
          "patch − stock µs |")
    print("|---|---|---|---|---|---|---|---|")
    kinds = ["cublas", "triton"] if device == "cuda" else ["cublas"]
    for kind in kinds:
        dtypes = [ROUTED_DTYPE[device], torch.float64] if kind == "cublas" \
            else [ROUTED_DTYPE[device]]
        with answers(kind):
            for dtype in dtypes:
                for name, layer, call in calls(device, dtype):
                    us = host_us(device, call, contenders(device, layer), args.calls,
                                 args.repeats)
                    patch = us.get("patch")
                    cells = [f"{us['stock']:.2f}", f"{us['enable']:.2f}",
                             "—" if patch is None else f"{patch:.2f}",
                             f"{us['enable'] - us['stock']:+.2f}",
                             "—" if patch is None else f"{patch - us['stock']:+.2f}"]
                    answer = kind if dtype in (torch.float32, torch.bfloat16, torch.float16) \
                        else "not taken"
                    print(f"| {answer} | {name} | {str(dtype).removeprefix('torch.')} | "
                          f"{' | '.join(cells)} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
