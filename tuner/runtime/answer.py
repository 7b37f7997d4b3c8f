"""What a lookup answers: a read-only config that says where it came from, and the answers
that need no table (cuBLAS, and each op's default)."""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import MappingProxyType


class TunedConfig(Mapping):
    """A config to launch, read-only (the runtime hands the same object to every call of a key),
    with where it came from: `source` names the step of the fallback policy that answered,
    "table", "online", "trusted", "nearest", "model", "cublas" or "default"
    (tuner.runtime.policy), or
    from an expand file "expand-online" or "expand-model";
    `bucket` is the bucket key of the table entry it came from (None for the others)."""

    __slots__ = ("_values", "_source", "_bucket")

    def __init__(self, values: Mapping[str, int | str], source: str,
                 bucket: tuple | None = None):
        self._values = MappingProxyType(dict(values))
        self._source = source
        self._bucket = bucket

    @property
    def source(self) -> str:
        return self._source

    @property
    def bucket(self) -> tuple | None:
        return self._bucket

    def __getitem__(self, name: str) -> int | str:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return (f"TunedConfig({dict(self._values)}, source={self._source!r}, "
                f"bucket={self._bucket!r})")


# What a key gets where neither a tuned config nor cuBLAS can run it: safe on any CUDA GPU for
# every dtype (fits shared memory on pre-Hopper parts too) and reasonable on large shapes; the
# variants they name run any call of their kernel (the pointer GEMM; gemv for a single row or
# column).
DEFAULT_CONFIGS: dict[str, TunedConfig] = {
    "mm": TunedConfig({"variant": "general", "pad": 0, "BLOCK_M": 128, "BLOCK_N": 128,
                       "BLOCK_K": 32, "GROUP_M": 8, "num_stages": 3, "num_warps": 8}, "default"),
    "gemv": TunedConfig({"variant": "gemv", "pad": 0, "BLOCK_M": 64, "BLOCK_K": 128,
                         "num_stages": 2, "num_warps": 4}, "default"),
}
# What a key gets where cuBLAS answers: the variant calling torch's own GEMM
# (kernels/cublas.py), which every op has. It runs every key but fp8 ones in another layout
# than torch._scaled_mm's and fp32 ones whose tf32 choice is not torch's.
CUBLAS = "cublas"
CUBLAS_CONFIG = TunedConfig({"variant": CUBLAS, "pad": 0}, "cublas")
