"""Where the TMA kernels' descriptors are built: on the host or on the device, for the tma
variant (a program per tile) and the persistent one (a program per SM), one process, one GPU.

    python benchmarks/descriptor_placement.py

A device-built descriptor costs each program a 128-byte write and a fence before its first
load; a host-built one costs the host an encoding per new operand address (the replay keeps
the last few) and ties block shapes to the launch, which Triton's warp specializer cannot
split (kernels/tma.py). Each variant's launcher takes either (`on_device`); both run through
the dispatcher's replayed path (kernels/launches.py `prepare`), on the same operands and
configs, outputs checked against float64. Columns: device µs (L2 flushed, interleaved,
graphs under 20 µs: tuner.execution.timing.retime_interleaved), and the back-to-back
loop's wall and host µs per call (benchmarks/_as_called.loops_us). Ratios are host-built
time / device-built time (> 1: device-built is faster). The last lines are their geometric
means and minima.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from datetime import datetime, timezone
from functools import partial

import torch
import triton
from _as_called import loops_us

from tuner.dtypes import DTYPES
from tuner.execution.measure import random_gemm, reference, relative_error, timing_sets
from tuner.execution.timing import retime_interleaved
from tuner.kernels import persistent, tma
from tuner.kernels.base import Kernel, config_label
from tuner.kernels.launches import prepare
from tuner.shapes import Shape

FLAGS = {"WARP_SPECIALIZE": 0, "FLATTEN": 0, "EPILOGUE_SUBTILE": 0}


def tile(bm: int, bn: int, bk: int, stages: int, warps: int, variant: str = "tma") -> dict:
    return {"variant": variant, "pad": 0, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk,
            "GROUP_M": 8, "num_stages": stages, "num_warps": warps,
            **(FLAGS if variant == "persistent" else {})}


# Decode-sized calls (few programs, host-bound), mid and large tiles, and a grid of 16384
# small programs (the most descriptor set-ups per byte moved).
ROWS = [
    (Shape(16, 4096, 4096, "bf16", "nt"), tile(64, 64, 128, 4, 4)),
    (Shape(128, 4096, 4096, "bf16", "nt"), tile(64, 128, 64, 4, 4)),
    (Shape(64, 4096, 4096, "fp8e4m3", "nt"), tile(64, 128, 128, 4, 4)),
    (Shape(1024, 1024, 1024, "fp16", "nn"), tile(128, 128, 64, 3, 8)),
    (Shape(4096, 4096, 4096, "bf16", "nt"), tile(128, 256, 64, 3, 8)),
    (Shape(8192, 8192, 512, "bf16", "nn"), tile(64, 64, 64, 3, 4)),
    (Shape(16, 4096, 4096, "bf16", "nt"), tile(64, 64, 128, 4, 4, "persistent")),
    (Shape(512, 4096, 4096, "bf16", "nt"), tile(128, 256, 64, 3, 8, "persistent")),
    (Shape(4096, 4096, 4096, "bf16", "nt"), tile(128, 256, 64, 3, 8, "persistent")),
]


VARIANTS = {"tma": (tma.TMA, tma.launch), "persistent": (persistent.PERSISTENT,
                                                         persistent.launch)}


def placed(name: str, on_device: bool) -> Kernel:
    """An mm kernel of one variant whose descriptors are built where `on_device` says."""
    variant, launch = VARIANTS[name]
    return Kernel("mm", (replace(variant, launch=partial(launch, on_device=on_device)),))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args(argv)
    props = torch.cuda.get_device_properties(0)
    print(f"# TMA descriptors built on the host vs on the device — {props.name}, torch "
          f"{torch.__version__}, triton {triton.__version__}, "
          f"{datetime.now(timezone.utc):%Y-%m-%d}\n")
    print("| shape | config | device µs host / device-built | ratio | loop µs host / device | "
          "ratio | host µs host / device | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    ratios: dict[str, list[float]] = {"device": [], "loop": [], "host": []}
    for i, (shape, config) in enumerate(ROWS):
        sets = timing_sets(shape, "cuda", 100 + i)
        check = random_gemm(shape, "cuda", 99 + i)
        prepared = {name: prepare(placed(config["variant"], on_device), config, check)
                    for name, on_device in (("host", False), ("device", True))}
        for name, p in prepared.items():
            check.out.fill_(float("nan"))
            p(check)
            error = relative_error(check.out, reference(check))
            if not error <= DTYPES[shape.dtype].tolerance:
                raise AssertionError(f"{name}-built {shape}: relative error {error:.3g}")
        device = retime_interleaved(
            [lambda j, p=p, sets=sets: p(sets[j]) for p in prepared.values()], len(sets),
            rounds=args.rounds)
        repeated = [p.as_repeated(check) for p in prepared.values()]
        loops = loops_us([lambda r=r, g=check: r(g) for r in repeated], args.calls, args.repeats)
        (host_d, device_d) = (t.p50_ms * 1e3 for t in device)
        ((host_h, host_w), (device_h, device_w)) = loops
        row = {"device": host_d / device_d, "loop": host_w / device_w,
               "host": host_h / device_h}
        for k, v in row.items():
            ratios[k].append(v)
        print(f"| {shape} | {config_label(config)} | {host_d:.1f} / {device_d:.1f} | "
              f"{row['device']:.3f} | {host_w:.1f} / {device_w:.1f} | {row['loop']:.3f} | "
              f"{host_h:.1f} / {device_h:.1f} | {row['host']:.3f} |", flush=True)
    print()
    for name, xs in ratios.items():
        print(f"{name}: host-built / device-built geomean {statistics.geometric_mean(xs):.3f}, "
              f"min {min(xs):.3f} over {len(xs)} shapes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
