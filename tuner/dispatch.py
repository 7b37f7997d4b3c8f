"""`tuner.matmul`: a GEMM that launches the tuned Triton config for its shape.

The config comes from `tuner.runtime.get_tuned_config` (the table in $TUNE_CONFIG); N == 1
goes to the gemv kernel, everything else to the general mm kernel.
"""
from __future__ import annotations

import torch

from tuner.dtypes import NAME_OF_TORCH_DTYPE
from tuner.kernels import kernel_for
from tuner.runtime import get_tuned_config

def matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None, *,
           allow_tf32: bool = False) -> torch.Tensor:
    """a @ b for 2-D a (M×K) and b (K×N) of one dtype (fp16, bf16, fp32), any strides.

    fp32 inputs are multiplied in IEEE fp32 unless allow_tf32. `out`, if given, must be M×N
    of the same dtype and device.
    """
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul: expected a (M×K) and b (K×N), got {tuple(a.shape)} and "
                         f"{tuple(b.shape)}")
    dtype = NAME_OF_TORCH_DTYPE.get(a.dtype)
    if dtype is None or b.dtype != a.dtype:
        raise TypeError(f"matmul: a and b must share one of fp16, bf16, fp32; got {a.dtype} "
                        f"and {b.dtype}")
    if a.device != b.device:
        raise ValueError(f"matmul: a is on {a.device}, b on {b.device}")
    (M, K), N = a.shape, b.shape[1]
    if out is None:
        out = torch.empty((M, N), dtype=a.dtype, device=a.device)
    elif out.shape != (M, N) or out.dtype != a.dtype or out.device != a.device:
        raise ValueError(f"matmul: out must be {M}×{N} {a.dtype} on {a.device}, got "
                         f"{tuple(out.shape)} {out.dtype} on {out.device}")
    if M == 0 or N == 0:
        return out
    if K == 0:
        return out.zero_()
    kernel = kernel_for(N)
    config = get_tuned_config(kernel.name, M=M, N=N, K=K, dtype=dtype,
                              stride_am=a.stride(0), stride_bk=b.stride(0))
    kernel.launch(a, b, out, config, allow_tf32=allow_tf32)
    return out
