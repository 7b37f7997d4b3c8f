"""The Triton kernels the tuner tunes, each wrapped as a `Kernel` (see `base.py`).

`mm` is the general GEMM (matmul.py); `gemv` is the matrix-vector product used when N == 1
(gemv.py). KERNELS maps the names stored in the database and exported tables to them.
"""
from tuner.kernels.base import Kernel
from tuner.kernels.gemv import GEMV
from tuner.kernels.matmul import MM

KERNELS: dict[str, Kernel] = {"mm": MM, "gemv": GEMV}


def kernel_for(n: int) -> Kernel:
    """The kernel that computes a GEMM with N output columns.

    N == 1 goes to gemv: a tensor-core tile at least 16 columns wide would be almost all
    padding there, while gemv streams A once on the CUDA cores, which is what bounds a
    matrix-vector product.
    """
    return GEMV if n == 1 else MM
