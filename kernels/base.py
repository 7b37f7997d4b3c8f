"""What every tunable kernel exposes to the tuner: its parameters, a launcher, a feasibility check.

The tuner never touches a Triton kernel directly. It asks a `Kernel` for the names of its
tunable parameters, checks a config with `feasible` before paying for a compile, compiles it
with `compile` (in a worker process) and runs it with `launch`. Adding a kernel means adding one module that builds one of these.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable, Mapping

import torch

Config = Mapping[str, int]
SPECIALIZED_FIELDS = ("M", "N", "K", "stride_am", "stride_bk")

_SHORT_NAMES = {"BLOCK_M": "BM", "BLOCK_N": "BN", "BLOCK_K": "BK", "GROUP_M": "G",
                "num_stages": "s", "num_warps": "w"}


def specialization(key: Mapping[str, object]) -> str:
    """The part of a raw key that decides which binary Triton builds for a config.

    Triton specializes integer arguments on being 1 or a multiple of 16; our launchers add
    EVEN_K (K a multiple of BLOCK_K <= 256, which gcd(K, 256) decides). A config that failed
    for one key fails for every key with the same specialization, so failures are
    remembered per specialization rather than per shape.
    """
    classes = []
    for f in SPECIALIZED_FIELDS:
        v = key[f]
        classes.append(f"{f}:{'1' if v == 1 else '16n' if v % 16 == 0 else 'any'}")
    return " ".join([key["dtype"], *classes, f"gcd(K,256):{math.gcd(key['K'], 256)}"])


def config_label(config: Config) -> str:
    """A config in one short line for tables and logs: 'BM128 BN256 BK64 G8 s3 w8'."""
    return " ".join(f"{_SHORT_NAMES.get(k, k)}{v}" for k, v in config.items())


@dataclass(frozen=True)
class Kernel:
    name: str
    # Tunable parameters, in the order they are searched and exported.
    params: tuple[str, ...]
    # The @triton.jit function.
    jit_fn: object = field(repr=False)
    # bind(a, b, out, config, allow_tf32) -> (grid, args, kwargs) for out = a @ b: a (M, K),
    # b (K, N), out (M, N), any strides, one dtype (fp16, bf16 or fp32), fp32 accumulation.
    bind: Callable[..., tuple] = field(repr=False)
    # smem_bytes(config, itemsize): estimated shared memory one program needs.
    smem_bytes: Callable[[Config, int], int] = field(repr=False)
    # The file holding the Triton source; its hash identifies results measured with it.
    source_path: Path = field(repr=False)

    def launch(self, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, config: Config,
               allow_tf32: bool = False) -> None:
        """out = a @ b in place. Unchecked: the dispatcher validates shapes and dtypes."""
        grid, args, kwargs = self.bind(a, b, out, config, allow_tf32)
        self.jit_fn[grid](*args, **kwargs)

    def compile(self, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, config: Config,
                allow_tf32: bool = False) -> None:
        """Compile exactly what `launch` would run, without running it.

        The tensors may be meta tensors: only shapes, strides and dtypes decide Triton's
        specialization (data pointers of fresh allocations are always 16-byte aligned, and a
        meta tensor's is 0). The binary lands in Triton's on-disk cache, where a launch in
        another process finds it.
        """
        grid, args, kwargs = self.bind(a, b, out, config, allow_tf32)
        self.jit_fn.warmup(*args, grid=grid, **kwargs)

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
