"""What the benchmarks that time a user's call share: the call as written, for torch and for
the tuner, and the back-to-back loop that measures its host and wall time."""
from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F


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


def loop_us(fn, calls: int, repeats: int) -> tuple[float, float]:
    """Median over repeats of (host µs to issue one call, wall µs per call) of `calls`
    back-to-back calls after a synchronize; few enough calls that the launch queue never
    fills keeps the first figure the host's alone."""
    host, wall = [], []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        issued = time.perf_counter()
        torch.cuda.synchronize()
        done = time.perf_counter()
        host.append((issued - start) / calls * 1e6)
        wall.append((done - start) / calls * 1e6)
    return statistics.median(host), statistics.median(wall)
