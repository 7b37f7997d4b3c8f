"""The element types the tuner accepts, by the names used in shapes CSVs and YAML files.

One table holds, per dtype, the torch type and the correctness tolerance, so that the
tuner, the tests and the benchmarks all judge a kernel's output by the same bar.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DType:
    name: str
    torch: torch.dtype
    # Largest accepted relative Frobenius error ||out - ref|| / ||ref||, ref in float64.
    tolerance: float


DTYPES: dict[str, DType] = {
    "fp16": DType("fp16", torch.float16, 1e-2),
    "bf16": DType("bf16", torch.bfloat16, 1e-2),
    # IEEE fp32 (the default): far under 1e-4 in practice.
    "fp32": DType("fp32", torch.float32, 1e-4),
}

# fp32 inputs with tf32 tensor-core arithmetic (opt-in): ~3e-4 typical error.
TF32_TOLERANCE = 5e-3

# torch dtype -> our name, for code that starts from a tensor (the dispatcher).
NAME_OF_TORCH_DTYPE = {d.torch: d.name for d in DTYPES.values()}
