"""Launcher-side decisions shared by the variants."""
from __future__ import annotations

import os
from collections.abc import Mapping

import torch

from tuner.kernels.base import Gemm

_INT32_MAX = 2**31 - 1

# Triton picks the interpreter when @triton.jit runs, i.e. when the kernel modules are
# imported, so reading the switch at the same moment says what the kernels will run on.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) in plain Python: triton.cdiv is a jit function, microseconds per host call."""
    return -(-a // b)


def tile_count(M: int, N: int, tunables: Mapping[str, int]) -> int:
    """Output tiles of BLOCK_M x BLOCK_N covering an M x N result."""
    return cdiv(M, tunables["BLOCK_M"]) * cdiv(N, tunables["BLOCK_N"])


def wrap_point(extent: int, buffer_extent: int | None) -> int:
    """Where the tile kernels wrap rows (columns) past `extent` around onto valid ones.

    Wrapped lanes only feed output the store masks off. The kernels hint that a tile's rows
    are contiguous, which lets the compiler issue vectors of up to 16 bytes (16 fp8
    elements); a vector starting after the wrap point is misaligned unless that point is a
    multiple of 16. So where the operand's buffer reaches the next multiple of 16 (a padded
    operand's zero margin), the wrap is there and the hint holds (wrap_keeps_vectors).
    """
    aligned = cdiv(extent, 16) * 16
    return aligned if buffer_extent is not None and buffer_extent >= aligned else extent


def wrap_keeps_vectors(wrap: int) -> bool:
    """Whether the contiguity hint holds for rows (columns) wrapping at `wrap` (wrap_point)."""
    return wrap % 16 == 0


def needs_int64(*tensors: torch.Tensor) -> bool:
    """True if an element offset of any tensor may not fit in int32.

    The kernels form offsets as index * stride. Every offset they dereference, and every
    per-K-step pointer increment of a loop with more than one step, is at most a tensor's
    largest offset, sum((size - 1) * stride); so int32 is exact while that fits. Tensors of
    more than 2**31 elements always get int64: their largest offset is at least numel - 1.
    Decided per launch because int64 index arithmetic is slower and most GEMMs don't need it.
    """
    for t in tensors:  # plain loops: this runs on every dispatcher call
        largest = 0
        for size, stride in zip(t.shape, t.stride()):
            largest += (size - 1) * stride
        if largest > _INT32_MAX:
            return True
    return False


def epilogue_args(gemm: Gemm) -> tuple[tuple, dict]:
    """The (bias_ptr, scale_a_ptr, scale_b_ptr) arguments and HAS_BIAS/SCALED constexprs of
    kernels/_epilogue.py. Absent tensors pass `out` as a never-read placeholder pointer."""
    args = (gemm.out if gemm.bias is None else gemm.bias,
            gemm.out if gemm.scale_a is None else gemm.scale_a,
            gemm.out if gemm.scale_b is None else gemm.scale_b)
    return args, dict(HAS_BIAS=gemm.bias is not None, SCALED=gemm.scale_a is not None)


def dot_options(gemm: Gemm) -> dict:
    """Constexprs of how tiles are multiplied.

    INPUT_PRECISION: fp32 inputs multiply in IEEE fp32 unless allow_tf32; other dtypes use
    tensor cores as they are (None). DOT_UPCAST: the interpreter's tl.dot multiplies bf16
    operands as their raw uint16 bit patterns (triton issue #11584; Triton's docs: the
    interpreter has no bf16 arithmetic), so under it bf16 tiles go to fp32 first (fp8 too,
    which numpy lacks). Compiled kernels never take that path.
    """
    dtype = gemm.a.dtype
    is_fp32 = dtype == torch.float32
    return dict(
        INPUT_PRECISION=("tf32" if gemm.allow_tf32 else "ieee") if is_fp32 else None,
        DOT_UPCAST=INTERPRETED and dtype not in (torch.float16, torch.float32),
    )
