"""How much a long GEMM's time depends on the GPU's power state, and whether cuBLAS and a
Triton config still order the same way when timed as pairs.

    python benchmarks/power_state.py [--shapes 4096x14336x4096,4096x4096x14336]
        [--config '{"variant": "persistent", ...}'] [--rounds 40] > power_state.md

For each bf16 nt shape (a linear's layout, the operands the tuner times on), cuBLAS and the
config are each captured in a CUDA graph of --launches launches over rotating input sets.
Rounds replay the two graphs in alternating order, timed by CUDA events: once back to back,
the GPU busy throughout (its clocks drop under the power limit), and once after --gap-ms of
idle before each replay (the clocks recover, as between a model's GEMMs, which memory-bound
kernels separate). A pairwise ratio compares the two graphs of one round: the same power
state for both. The tuner times configs at different moments; where the states differ, a
long compute-bound kernel's time moves by more than the gap between two good kernels.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import date

import torch
from _tune_runs import device_line

from tuner.execution.backends import gpu_backend
from tuner.execution.measure import ShapeBench
from tuner.kernels import KERNELS
from tuner.kernels.base import config_label
from tuner.shapes import Shape

# The tile the e2e table of fedf283 gave the Llama prefill's large GEMMs (before the final
# re-timed cuBLAS in pairs, which now keeps them).
DEFAULT_CONFIG = {"variant": "persistent", "pad": 0, "BLOCK_M": 128, "BLOCK_N": 256,
                  "BLOCK_K": 64, "GROUP_M": 8, "num_stages": 4, "num_warps": 8,
                  "WARP_SPECIALIZE": 0, "FLATTEN": 1, "EPILOGUE_SUBTILE": 1}
CUBLAS = {"variant": "cublas", "pad": 0}


def graph_of(config: dict, sets: list, launches: int) -> torch.cuda.CUDAGraph:
    mm = KERNELS["mm"]
    mm.launch(sets[0], config)  # compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(launches):
            mm.launch(sets[i % len(sets)], config)
    return graph


def rounds(graphs: dict[str, torch.cuda.CUDAGraph], count: int, gap_s: float,
           launches: int) -> dict[str, list[float]]:
    """µs per launch of each graph per round, the order alternating between rounds."""
    taken: dict[str, list[float]] = {name: [] for name in graphs}
    for index in range(count):
        for name in (list(graphs) if index % 2 == 0 else list(reversed(graphs))):
            if gap_s:
                torch.cuda.synchronize()
                time.sleep(gap_s)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graphs[name].replay()
            end.record()
            end.synchronize()
            taken[name].append(start.elapsed_time(end) * 1e3 / launches)
    return taken


def spread(values: list[float]) -> str:
    ordered = sorted(values)
    tenth = len(ordered) // 10
    return f"{statistics.median(ordered):.1f} ({ordered[tenth]:.0f}-{ordered[-1 - tenth]:.0f})"


def parse_shape(text: str) -> Shape:
    try:
        m, n, k = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise SystemExit(f"power_state: --shapes {text!r}: expected MxNxK") from None
    return Shape(m, n, k, "bf16", "nt")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="4096x14336x4096,4096x4096x14336")
    parser.add_argument("--config", type=json.loads, default=DEFAULT_CONFIG,
                        help="the Triton config, as JSON (default: a persistent tile)")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--launches", type=int, default=5, help="launches per graph")
    parser.add_argument("--gap-ms", type=float, default=5.0)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("power_state: needs a CUDA GPU", file=sys.stderr)
        return 1
    label = config_label(args.config)
    print(f"# Power state and GEMM time — {device_line()}, {date.today()}\n\n"
          f"cuBLAS against `{label}`; {args.rounds} rounds of a graph of {args.launches} "
          f"launches each, alternating; µs per launch as median (p10-p90); the ratio is "
          f"cuBLAS / config per round, its median (< 1: cuBLAS faster); the error is each one's "
          f"relative error against the float64 product on the tuner's check inputs. "
          f"`benchmarks/power_state.py`.\n")
    print("| shape | before each replay | cuBLAS µs | config µs | cuBLAS / config | "
          "error cuBLAS / config |")
    print("|---|---|---|---|---|---|")
    backend = gpu_backend(torch.cuda.current_device())
    wrong = []
    for shape in (parse_shape(s) for s in args.shapes.split(",")):
        bench = ShapeBench(backend, shape, 0)  # the tuner's inputs and correctness check
        sets = bench.sets
        errors = [bench.check_error("mm", config)[0] for config in (CUBLAS, args.config)]
        if not max(errors) <= bench.tolerance:
            wrong.append(f"{shape}: relative errors {errors[0]:.2g} / {errors[1]:.2g}")
        graphs = {"cublas": graph_of(CUBLAS, sets, args.launches),
                  "config": graph_of(args.config, sets, args.launches)}
        for gap_s, state in ((0.0, "nothing (back to back)"),
                             (args.gap_ms / 1e3, f"{args.gap_ms:g} ms idle")):
            taken = rounds(graphs, args.rounds, gap_s, args.launches)
            ratio = statistics.median(c / t for c, t in zip(taken["cublas"], taken["config"]))
            print(f"| {shape.M}x{shape.N}x{shape.K} | {state} | {spread(taken['cublas'])} | "
                  f"{spread(taken['config'])} | {ratio:.3f} | "
                  f"{errors[0]:.1e} / {errors[1]:.1e} |", flush=True)
    for line in wrong:
        print(f"power_state: wrong output at {line}", file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
