"""Which kernel cuBLAS runs per shape, and how well its tile fits the shape and the SMs
against the best power-of-two tile ours can take.

    python benchmarks/cublas_tiles.py --shapes benchmarks/shapes/holdout-dev.csv ... > tiles.md

Per shape, torch.matmul on random operands runs under torch's profiler, which names the
kernel and its grid. cuBLAS's Hopper kernels (nvjet_sm90_tst_{tile}_{BK}x{stages}_{cluster}
...) carry their tile in the name. cuBLAS is column-major: it computes C^T, so its tile's
first extent runs along our N and its second along our M.

A tile's *geometry efficiency* is the share of the work the SMs do that is useful:
M·N / (rounds · SMs · tile area), rounds = ceil(tiles / SMs) of the persistent schedule. It
charges both the padding of ragged edges and the idle SMs of a partial last wave; it ignores
K splits. Our tiles have power-of-two sides (Triton's blocks); cuBLAS's need not (144x128,
256x152, 128x80): where its tile fits one wave and ours cannot, the ratio of the two
efficiencies is, to first order, what a tile of ours can reach there. The summary counts
the shapes of M >= 128 with half a wave of 128×128 tiles or more: below that, skinny tiles
(16-64 rows) serve a memory-bound call, and geometry is not what decides it.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import tempfile
from pathlib import Path

# Our tiles whose main loop runs near the tensor cores' rate on Hopper (two warp groups of
# wgmma, or one on 128x128): 64-row tiles fit shapes better but run each K step slower, bound
# by L2 and shared-memory bandwidth, and lose where these lose.
OUR_TILES = ((128, 128), (128, 256), (256, 128))
# nvjet_sm90_tst_144x128_64x6_2x1_...: tile, BLOCK_K x stages, cluster.
_NVJET = re.compile(r"_(\d+)x(\d+)_(\d+)x(\d+)_(\d+)x(\d+)_")


def geometry_efficiency(m: int, n: int, tile_m: int, tile_n: int, sms: int) -> float:
    """Useful share of the persistent schedule's work (module docstring)."""
    tiles = math.ceil(m / tile_m) * math.ceil(n / tile_n)
    return m * n / (math.ceil(tiles / sms) * sms * tile_m * tile_n)


def best_full_rate_tile(m: int, n: int, sms: int) -> tuple[int, int, float]:
    """(BLOCK_M, BLOCK_N, efficiency) of our best-fitting full-rate tile (OUR_TILES)."""
    return max(((bm, bn, geometry_efficiency(m, n, bm, bn, sms)) for bm, bn in OUR_TILES),
               key=lambda t: t[2])


def geometry_counts(m: int, n: int, sms: int) -> bool:
    """Whether the shape enters the summary: M >= 128 and half a wave of 128x128 tiles."""
    return m >= 128 and math.ceil(m / 128) * math.ceil(n / 128) >= sms / 2


def parse_nvjet(name: str) -> dict | None:
    """The tile (along our N, then our M), BLOCK_K, stages and cluster of a cuBLAS kernel
    name, or None for a name that does not carry them."""
    match = _NVJET.search(name)
    if not name.startswith("nvjet") or match is None:
        return None
    tile_n, tile_m, block_k, stages, cluster_a, cluster_b = map(int, match.groups())
    return dict(tile_n=tile_n, tile_m=tile_m, block_k=block_k, stages=stages,
                cluster=f"{cluster_a}x{cluster_b}")


def cublas_kernel(a, b, out) -> tuple[str, list]:
    """The name and grid of the (last, longest) kernel torch.matmul runs for these operands."""
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        torch.matmul(a, b, out=out)
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as scratch:
        trace = Path(scratch, "trace.json")
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text())["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    longest = max(kernels, key=lambda e: e.get("dur", 0))
    return longest["name"], longest.get("args", {}).get("grid", [])


def rows(shape_files: list[str]) -> tuple[str, list[str]]:
    import torch

    from tuner.execution.measure import random_gemm
    from tuner.shapes import load_shapes

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    lines, ratios = [], []
    for path in shape_files:
        for shape in load_shapes(path):
            if shape.M == 1 or shape.N == 1:
                continue  # a matrix-vector product: no tiles to compare
            gemm = random_gemm(shape, "cuda", 0)
            name, grid = cublas_kernel(gemm.a, gemm.b, gemm.out)
            bm, bn, ours = best_full_rate_tile(shape.M, shape.N, sms)
            tile = parse_nvjet(name)
            if tile is None:
                theirs_cell, ratio_cell = f"`{name[:60]}`", "-"
            else:
                theirs = geometry_efficiency(shape.M, shape.N, tile["tile_m"], tile["tile_n"],
                                             sms)
                if geometry_counts(shape.M, shape.N, sms):
                    ratios.append(ours / theirs)
                theirs_cell = (f"{tile['tile_m']}x{tile['tile_n']} BK{tile['block_k']} "
                               f"s{tile['stages']} cluster {tile['cluster']}: {theirs:.2f}")
                ratio_cell = f"{ours / theirs:.2f}"
            lines.append(f"| {shape} | {'x'.join(map(str, grid))} | {theirs_cell} | "
                         f"{bm}x{bn}: {ours:.2f} | {ratio_cell} |")
    geomean = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else float("nan")
    device = f"{torch.cuda.get_device_name(0)}, {sms} SMs, torch {torch.__version__}"
    summary = (f"ours / cuBLAS geometry efficiency, shapes of M >= 128 and half a wave of 128x128 "
               f"tiles or more: geomean {geomean:.3f}, min {min(ratios, default=float('nan')):.3f} "
               f"over {len(ratios)} shapes")
    return device, [*lines, "", summary]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", required=True, help="shapes CSV files")
    args = parser.parse_args()
    device, lines = rows(args.shapes)
    print(f"Device: {device}\n")
    print("| shape (M×N×K) | cuBLAS grid | cuBLAS tile (M×N along ours), efficiency | "
          "our best full-rate tile, efficiency | ours / cuBLAS |")
    print("|---|---|---|---|---|")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
