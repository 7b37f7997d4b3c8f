"""The element types the tuner accepts, by the names used in shapes CSVs and YAML files.

One table holds, per dtype, the torch types of the inputs and of the output and the
correctness tolerance, so that the tuner, the tests and the benchmarks all judge a kernel's
output by the same bar.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DType:
    name: str
    torch: torch.dtype  # A and B
    # Largest accepted relative Frobenius error ||out - ref|| / ||ref||, ref in float64 from
    # the very input values (for fp8: the fp8 values times their scales).
    tolerance: float
    out: torch.dtype  # C
    # fp8 GEMMs take one fp32 scale per input tensor: out = (scale_a * A) @ (scale_b * B).
    scaled: bool = False


DTYPES: dict[str, DType] = {
    "fp16": DType("fp16", torch.float16, 1e-2, torch.float16),
    "bf16": DType("bf16", torch.bfloat16, 1e-2, torch.bfloat16),
    # IEEE fp32 (the default): far under 1e-4 in practice.
    "fp32": DType("fp32", torch.float32, 1e-4, torch.float32),
    # Hopper fp8 (e4m3) inputs, bf16 output: the error is the bf16 rounding of the output.
    "fp8e4m3": DType("fp8e4m3", torch.float8_e4m3fn, 1e-2, torch.bfloat16, scaled=True),
}

# fp32 inputs with tf32 tensor-core arithmetic (opt-in): ~3e-4 typical error.
TF32_TOLERANCE = 5e-3

# torch dtype -> our name, for code that starts from a tensor (the dispatcher).
NAME_OF_TORCH_DTYPE = {d.torch: d.name for d in DTYPES.values()}
