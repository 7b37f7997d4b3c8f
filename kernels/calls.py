"""A call as the kernels take it, for both sides: the tuning side (studies, timing, the model,
exports) and the deployment side (the runtime's lookup and dispatcher) ask the same questions
of a kernel here, so neither imports the other to ask them.

- `meta_gemm`: a shape's GEMM on meta tensors (shapes, strides, dtype; no data), what a compile
  and a feasibility check look at;
- `laid_out` and `fp8_scales`: how that GEMM's operands are allocated, shared with the random
  GEMMs the tuner times (tuner.execution.measure), so the two never differ in layout;
- `runnable_config`: a config as one call runs it, or why the kernel cannot.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from tuner.dtypes import DTYPES
from tuner.kernels.base import Gemm, Kernel
from tuner.kernels.padding import pad_changes_nothing
from tuner.shapes import Shape


def laid_out(shape: Shape, allocate: Callable) -> tuple[torch.Tensor, torch.Tensor]:
    """A (M×K) and B (K×N) in the shape's layout: a `t` operand is the transposed view of
    storage allocated the other way round. allocate(dims) makes the storage."""
    def operand(rows, cols, transposed):
        return allocate((cols, rows)).t() if transposed else allocate((rows, cols))

    return (operand(shape.M, shape.K, shape.layout[0] == "t"),
            operand(shape.K, shape.N, shape.layout[1] == "t"))


def fp8_scales(shape: Shape, allocate: Callable) -> dict:
    """scale_a and scale_b for an fp8 shape (none otherwise), from allocate(value)."""
    if not DTYPES[shape.dtype].scaled:
        return {}
    return dict(scale_a=allocate(0.75), scale_b=allocate(1.5))


def meta_gemm(shape: Shape) -> Gemm:
    """The shape's GEMM on meta tensors (shapes, strides, dtype; no data): what a compile and
    a feasibility check need."""
    dtype = DTYPES[shape.dtype]

    def allocate(dims, like=dtype.torch):
        return torch.empty(dims, dtype=like, device="meta")

    return Gemm(*laid_out(shape, allocate), allocate((shape.M, shape.N), dtype.out),
                **fp8_scales(shape, lambda v: allocate((1,), torch.float32)))


def runnable_config(kernel: Kernel, config: Mapping, gemm: Gemm) -> tuple[Mapping, str | None]:
    """The config as this call runs it, and None; or why the kernel cannot run it here.

    A padded config on operands already aligned to its pad runs unpadded (an aligned
    bucket-mate of a padded shape needs no copies). The dispatcher launches through this, and
    `tune buckets` and `tune validate` time configs through it, so they measure what
    deployments launch.
    """
    if config["pad"] and pad_changes_nothing(gemm, config["pad"]):
        config = {**config, "pad": 0}
    return config, kernel.unsupported(config, gemm)
