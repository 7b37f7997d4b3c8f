"""What every tunable kernel exposes to the tuner: its parameters, a launcher, a feasibility check.

The tuner never touches a Triton kernel directly. It asks a `Kernel` for the names of its
tunable parameters, checks a config with `feasible` before paying for a compile, and runs it
with `launch`. Adding a kernel means adding one module that builds one of these.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable, Mapping

import torch

Config = Mapping[str, int]

_SHORT_NAMES = {"BLOCK_M": "BM", "BLOCK_N": "BN", "BLOCK_K": "BK", "GROUP_M": "G",
                "num_stages": "s", "num_warps": "w"}


def config_label(config: Config) -> str:
    """A config in one short line for tables and logs: 'BM128 BN256 BK64 G8 s3 w8'."""
    return " ".join(f"{_SHORT_NAMES.get(k, k)}{v}" for k, v in config.items())


@dataclass(frozen=True)
class Kernel:
    name: str
    # Tunable parameters, in the order they are searched and exported.
    params: tuple[str, ...]
    # launch(a, b, out, config, allow_tf32=False): out = a @ b, a (M, K), b (K, N), out (M, N),
    # any strides; a, b, out share one dtype (fp16, bf16 or fp32); fp32 accumulation.
    launch: Callable[..., None] = field(repr=False)
    # smem_bytes(config, itemsize): estimated shared memory one program needs.
    smem_bytes: Callable[[Config, int], int] = field(repr=False)
    # The file holding the Triton source; its hash identifies results measured with it.
    source_path: Path = field(repr=False)

    @cached_property
    def source_hash(self) -> str:
        return hashlib.sha256(self.source_path.read_bytes()).hexdigest()[:16]

    def feasible(self, config: Config, itemsize: int, smem_limit: int) -> str | None:
        """None if the config may compile on this device, else the reason it cannot.

        Runs before compiling, so an obviously oversized config costs no compile time.
        """
        need = self.smem_bytes(config, itemsize)
        if need > smem_limit:
            return f"shared memory: needs ~{need} bytes, device limit {smem_limit}"
        return None
