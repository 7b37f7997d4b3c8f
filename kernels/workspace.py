"""Scratch buffers kept between calls: padded operands, split-K partials.

Allocating device memory on every GEMM would cost more than some GEMMs, and the padded
operands must keep their zero margins, so buffers are cached per exact call shape (never per
padded shape: two shapes sharing padded dims would see each other's leftovers in the K
margin). The cache holds at most $TUNE_WORKSPACE_MB megabytes (default 1024), evicting the
least recently used buffers; a buffer larger than the bound is allocated for that call only.
Buffers are reused by the next call of the same shape, so two streams running the same shape
at once must not share this cache (one stream per process is the supported case).
"""
from __future__ import annotations

import math
import os
from collections import OrderedDict

import torch

ENV_VAR = "TUNE_WORKSPACE_MB"
DEFAULT_MB = 1024


def _limit_bytes() -> int:
    raw = os.environ.get(ENV_VAR, str(DEFAULT_MB))
    try:
        mb = float(raw)
    except ValueError:
        mb = math.nan
    if not 0 <= mb < math.inf:  # nan fails both comparisons
        raise ValueError(f"{ENV_VAR}={raw!r}: expected a finite, non-negative number of "
                         "megabytes")
    return int(mb * 2**20)


class Workspace:
    """A bounded, least-recently-used cache of zero-initialised device buffers."""

    def __init__(self, limit_bytes: int | None = None):
        self.limit_bytes = _limit_bytes() if limit_bytes is None else limit_bytes
        self.buffers: OrderedDict[tuple, torch.Tensor] = OrderedDict()
        self.bytes = 0

    def get(self, key: tuple, size: tuple[int, ...], dtype: torch.dtype,
            device: torch.device) -> torch.Tensor:
        """The buffer for `key` (zeros when first allocated, then whatever was left in it).

        Meta-device requests (compiling) get a fresh meta tensor and touch no cache.
        """
        if device.type == "meta":
            return torch.empty(size, dtype=dtype, device=device)
        full_key = (key, size, dtype, device)
        buffer = self.buffers.get(full_key)
        if buffer is not None:
            self.buffers.move_to_end(full_key)
            return buffer
        buffer = torch.zeros(size, dtype=dtype, device=device)
        need = buffer.numel() * buffer.element_size()
        if need > self.limit_bytes:
            return buffer
        while self.bytes + need > self.limit_bytes:
            _, evicted = self.buffers.popitem(last=False)
            self.bytes -= evicted.numel() * evicted.element_size()
        self.buffers[full_key] = buffer
        self.bytes += need
        return buffer

    def clear(self) -> None:
        self.buffers.clear()
        self.bytes = 0


WORKSPACE = Workspace()
