"""Launcher-side decisions shared by the mm and gemv kernels."""
from __future__ import annotations

import torch

_INT32_MAX = 2**31 - 1


def needs_int64(*tensors: torch.Tensor) -> bool:
    """True if an element offset of any tensor may not fit in int32.

    The kernels form offsets as index * stride. Every offset they dereference, and every
    per-K-step pointer increment of a loop with more than one step, is at most a tensor's
    largest offset, sum((size - 1) * stride); so int32 is exact while that fits. Tensors of
    more than 2**31 elements always get int64: their largest offset is at least numel - 1.
    Decided per launch because int64 index arithmetic is slower and most GEMMs don't need it.
    """
    return any(
        sum((size - 1) * stride for size, stride in zip(t.shape, t.stride())) > _INT32_MAX
        for t in tensors
    )
