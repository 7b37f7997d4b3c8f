"""The element types the tuner accepts, by the names used in shapes CSVs and YAML files.

One table holds, per dtype, the torch types of the inputs and of the output and the
correctness tolerance, so that the tuner, the tests and the benchmarks all judge a kernel's
output by the same bar.

Importing this module does not import torch: the table names the torch types, and
`DType.torch`, `DType.out` and `NAME_OF_TORCH_DTYPE` import torch on first use, so that
reading a shapes CSV (the CLI, the database) stays light.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DType:
    name: str
    torch_name: str  # A and B, as torch names the type (torch.float16: "float16")
    # Largest accepted relative Frobenius error ||out - ref|| / ||ref||, ref in float64 from
    # the very input values (for fp8: the fp8 values times their scales).
    tolerance: float
    out_name: str  # C
    # fp8 GEMMs take one fp32 scale per input tensor: out = (scale_a * A) @ (scale_b * B).
    scaled: bool = False

    @property
    def torch(self):
        """The torch.dtype of A and B."""
        import torch
        return getattr(torch, self.torch_name)

    @property
    def out(self):
        """The torch.dtype of C."""
        import torch
        return getattr(torch, self.out_name)


DTYPES: dict[str, DType] = {
    "fp16": DType("fp16", "float16", 1e-2, "float16"),
    "bf16": DType("bf16", "bfloat16", 1e-2, "bfloat16"),
    # IEEE fp32 (the default): far under 1e-4 in practice.
    "fp32": DType("fp32", "float32", 1e-4, "float32"),
    # Hopper fp8 (e4m3) inputs, bf16 output: the error is the bf16 rounding of the output.
    "fp8e4m3": DType("fp8e4m3", "float8_e4m3fn", 1e-2, "bfloat16", scaled=True),
}

# fp32 inputs with tf32 tensor-core arithmetic (opt-in): ~3e-4 typical error.
TF32_TOLERANCE = 5e-3


def name_of_torch_dtype() -> dict:
    """torch dtype -> our name, for code that starts from a tensor (the dispatcher)."""
    return {d.torch: d.name for d in DTYPES.values()}


def __getattr__(name: str):
    # NAME_OF_TORCH_DTYPE (torch dtype -> our name) is built, importing torch, on first use.
    if name == "NAME_OF_TORCH_DTYPE":
        value = globals()[name] = name_of_torch_dtype()  # later lookups skip this hook
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
