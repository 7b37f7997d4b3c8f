"""What the benchmarks that time a user's call share: the call as written, for torch and for
the tuner, and the back-to-back loop and eager runs that measure it, contenders taking turns
(tuner.execution.timing.rotating_order, as device samples do)."""
from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

from tuner.execution.timing import rotating_order


def user_calls(layout: str, scaled: bool):
    """(operands, torch op, tuner op): a user's call on one Gemm's operands is
    op(*operands(g)), returning a new product: torch._scaled_mm / tuner.matmul with scales for
    fp8, F.linear / tuner.linear for the `nt` layout (b = W^T of a row-major weight W),
    torch.matmul / tuner.matmul otherwise. The ops take tensors alone, so torch.compile can
    compile the torch one."""
    import tuner
    if scaled:
        return (lambda g: (g.a, g.b, g.scale_a, g.scale_b),
                lambda a, b, sa, sb: torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16),
                lambda a, b, sa, sb: tuner.matmul(a, b, scale_a=sa, scale_b=sb))
    if layout == "nt":
        weights: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

        def operands(g) -> tuple[torch.Tensor, torch.Tensor]:
            """x and W (g's b = W^T) as a model holds W: one tensor (not a view made for
            the call) passed on every call, made once per operand set."""
            b, w = weights.get(id(g.b), (None, None))
            if b is not g.b:
                b, w = weights[id(g.b)] = g.b, g.b.t().detach()
            return g.a, w
        return operands, F.linear, tuner.linear
    return lambda g: (g.a, g.b), torch.matmul, tuner.matmul


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
