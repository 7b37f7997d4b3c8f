"""A test-only GEMM that writes far out of bounds when its OOB parameter is 1.

Registered as "mm" through TUNE_KERNEL_MODULES=tests.oob_kernel, it proves crash isolation on
a GPU: a run over a space containing OOB=1 must complete and record those configs as failed,
while OOB=0 configs tune normally.
"""
from pathlib import Path

import triton
import triton.language as tl

from tuner.kernels.base import Kernel, Variant
from tuner.kernels.launches import start
from tuner.kernels.mma import pipeline_smem_bytes


@triton.jit
def _oob_matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, OOB: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        kk = k * BLOCK_K + ks
        a = tl.load(a_ptr + rows[:, None] * stride_am + kk[None, :] * stride_ak,
                    mask=(rows[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + kk[:, None] * stride_bk + cols[None, :] * stride_bn,
                    mask=(kk[:, None] < K) & (cols[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
    c = c_ptr + rows[:, None] * stride_cm + cols[None, :] * stride_cn
    if OOB:
        c += 1 << 40  # a terabyte past the output: an illegal address on any GPU
    tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


def _launch(gemm, tunables, compile_only):
    a, b, out = gemm.a, gemm.b, gemm.out
    M, N, K = gemm.mnk
    grid = (triton.cdiv(M, tunables["BLOCK_M"]), triton.cdiv(N, tunables["BLOCK_N"]))
    start(_oob_matmul, grid, (a, b, out, M, N, K, *a.stride(), *b.stride(), *out.stride()),
          dict(tunables), compile_only)


_OOB = Variant("oob", ("BLOCK_M", "BLOCK_N", "BLOCK_K", "OOB", "num_stages", "num_warps"),
               launch=_launch, smem_bytes=pipeline_smem_bytes, source_path=Path(__file__))
KERNEL = Kernel("mm", (_OOB,))
