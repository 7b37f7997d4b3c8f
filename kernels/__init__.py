"""The Triton kernels the tuner tunes, each wrapped as a `Kernel` (see `base.py`).

`mm` is the general GEMM (matmul.py); `gemv` is the matrix-vector product used when N == 1
(gemv.py). KERNELS maps the names stored in the database and exported tables to them.
"""
import importlib
import os

from tuner.kernels.base import Kernel
from tuner.kernels.gemv import GEMV
from tuner.kernels.matmul import MM

KERNELS: dict[str, Kernel] = {"mm": MM, "gemv": GEMV}

# Kernels from elsewhere: TUNE_KERNEL_MODULES=pkg.mod,... names modules that each define
# KERNEL, registered under KERNEL.name (replacing a built-in of that name). Worker processes
# inherit the variable, so they resolve names the same way as the tuner.
for _module in filter(None, os.environ.get("TUNE_KERNEL_MODULES", "").split(",")):
    _kernel = importlib.import_module(_module.strip()).KERNEL
    KERNELS[_kernel.name] = _kernel


def kernel_for(n: int) -> Kernel:
    """The kernel that computes a GEMM with N output columns.

    N == 1 goes to gemv: a tensor-core tile at least 16 columns wide would be almost all
    padding there, while gemv streams A once on the CUDA cores, which is what bounds a
    matrix-vector product.
    """
    return KERNELS["gemv" if n == 1 else "mm"]
