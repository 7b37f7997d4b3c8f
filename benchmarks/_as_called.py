"""What the benchmarks that time a user's call share: the call as written, for torch and for
the tuner, and the back-to-back loop and eager runs that measure it, contenders taking turns
(tuner.timing.rotating_order, as device samples do)."""
from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

from tuner.timing import rotating_order


def user_calls(layout: str, scaled: bool):
    """(cuBLAS, tuner): a user's call on one Gemm's operands, returning a new product:
    torch._scaled_mm / tuner.matmul with scales for fp8, F.linear / tuner.linear for the `nt`
    layout (b = W^T of a row-major weight W), torch.matmul / tuner.matmul otherwise."""
    import tuner
    if scaled:
        return (lambda g: torch._scaled_mm(g.a, g.b, g.scale_a, g.scale_b,
                                           out_dtype=g.out.dtype),
                lambda g: tuner.matmul(g.a, g.b, scale_a=g.scale_a, scale_b=g.scale_b))
    if layout == "nt":
        return lambda g: F.linear(g.a, g.b.t()), lambda g: tuner.linear(g.a, g.b.t())
    return lambda g: torch.matmul(g.a, g.b), lambda g: tuner.matmul(g.a, g.b)


def loops_us(fns, calls: int, repeats: int) -> list[tuple[float, float]]:
    """Per fn, the median over repeats of (host µs to issue one call, wall µs per call) of
    `calls` back-to-back calls after a synchronize, the fns interleaved repeat by repeat. Few
    enough calls that the launch queue never fills keeps the first figure the host's alone."""
    host: list[list[float]] = [[] for _ in fns]
    wall: list[list[float]] = [[] for _ in fns]
    for i in rotating_order(len(fns), repeats):
        fn = fns[i]
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        issued = time.perf_counter()
        torch.cuda.synchronize()
        done = time.perf_counter()
        host[i].append((issued - start) / calls * 1e6)
        wall[i].append((done - start) / calls * 1e6)
    return [(statistics.median(h), statistics.median(w)) for h, w in zip(host, wall)]


def eagers_us(fns, rounds: int, rep_ms: float) -> list[float]:
    """Per fn, the median over rounds of `triton.testing.do_bench` (L2 flushed between
    calls) of the call as written, the fns interleaved round by round."""
    from triton.testing import do_bench
    samples: list[list[float]] = [[] for _ in fns]
    for i in rotating_order(len(fns), rounds):
        samples[i].append(do_bench(fns[i], warmup=5, rep=rep_ms, return_mode="median") * 1e3)
    return [statistics.median(s) for s in samples]
