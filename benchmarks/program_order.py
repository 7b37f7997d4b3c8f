"""How the program order (GROUP_M) moves a tile's time where the model sees no difference:
one process, one GPU, each config timed alone against cuBLAS.

    python benchmarks/program_order.py [--variants gluon,tma]

Within one wave every tile runs at once, so the model (tuner.model.tiles.operand_dram_bytes)
predicts every GROUP_M alike, and its ranking breaks the tie (tuner.model.predict._scored).
Each row is a tile of a mid-size GEMM whose B does not fit in L2, timed through the tuner's
ShapeBench (L2 flushed, outputs checked) at GROUP_M 1, 4, 8 and 16, beside the model's
prediction and cuBLAS. The ratio columns are cuBLAS time / the tile's (> 1: faster).
"""
from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone

import torch
import triton

from tuner.execution.backends import gpu_backend
from tuner.execution.measure import ShapeBench
from tuner.kernels import KERNELS
from tuner.kernels.base import config_label
from tuner.kernels.calls import meta_gemm
from tuner.model.named_devices import named_spec
from tuner.model.predict import predicted_or_inf
from tuner.shapes import Shape

GROUPS = (1, 4, 8, 16)
OWN = {"gluon": {"BLOCK_N_TAIL": 0, "SWAP_AB": 0, "WARP_SPECIALIZE": 0}, "tma": {}}
# (shape, BLOCK_M, BLOCK_N, num_stages): one wave of 128 tiles, then two and more waves.
ROWS = [
    (Shape(512, 4096, 11008, "bf16", "nt"), 128, 128, 5),
    (Shape(200, 4096, 14336, "bf16", "nt"), 64, 128, 6),
    (Shape(160, 7168, 2048, "bf16", "nt"), 128, 128, 5),
    (Shape(384, 6144, 4096, "bf16", "nt"), 128, 128, 5),
    (Shape(384, 6144, 4096, "bf16", "nt"), 64, 128, 6),
    (Shape(768, 28672, 4096, "bf16", "nt"), 128, 256, 3),
]


def configs(variant: str, bm: int, bn: int, stages: int) -> list[dict]:
    warps = 8 if bm * bn >= 128 * 256 else 4
    return [{"variant": variant, "pad": 0, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 64,
             "GROUP_M": group, "num_stages": stages, "num_warps": warps, **OWN[variant]}
            for group in GROUPS]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default="gluon,tma",
                        help="comma-separated tile variants (of: gluon, tma)")
    args = parser.parse_args()
    variants = args.variants.split(",")
    if unknown := [v for v in variants if v not in OWN]:
        parser.error(f"--variants: unknown {', '.join(unknown)} (known: {', '.join(OWN)})")
    if not torch.cuda.is_available():
        print("program_order.py: needs a CUDA GPU", file=sys.stderr)
        return 2
    backend = gpu_backend(0)
    name = torch.cuda.get_device_name()
    spec = named_spec(name)
    kernel = KERNELS["mm"]
    print(f"# program order (GROUP_M) against cuBLAS — {name}, torch {torch.__version__}, "
          f"triton {triton.__version__}, {datetime.now(timezone.utc):%Y-%m-%d}\n")
    print("µs per call, median (ShapeBench: L2 flushed, outputs checked); predicted: the "
          "model's µs.\n")
    print("| shape | config (GROUP_M varies) | tiles | cuBLAS µs | "
          + " | ".join(f"G{g} µs (ratio)" for g in GROUPS) + " | predicted µs |")
    print("|---|---|---|---|" + "---|" * len(GROUPS) + "---|")
    for shape, bm, bn, stages in ROWS:
        bench, gemm = ShapeBench(backend, shape, 0), meta_gemm(shape)
        cublas_ms = bench.run("mm", {"variant": "cublas", "pad": 0}, short=True).p50_ms
        for variant in variants:
            row = configs(variant, bm, bn, stages)
            if why := kernel.feasible(row[0], gemm, backend.info.smem_per_block):
                print(f"| {shape} | {config_label(row[0])} | - | - | {why} |")
                continue
            cells = []
            for config in row:
                result = bench.run("mm", config, short=True)
                cells.append(f"{result.p50_ms * 1e3:.1f} ({cublas_ms / result.p50_ms:.3f})"
                             if result.p50_ms else str(result.status))
            predicted = sorted({round(predicted_or_inf(shape, c, spec) * 1e3, 1) for c in row})
            tiles = triton.cdiv(shape.M, bm) * triton.cdiv(shape.N, bn)
            print(f"| {shape} | {config_label(row[0])} | {tiles} | {cublas_ms * 1e3:.1f} | "
                  + " | ".join(cells) + f" | {', '.join(map(str, predicted))} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
