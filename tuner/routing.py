"""Where a call of aten mm, addmm or bmm goes under `tuner.enable`, decided where the hooks
do not remember it already; and what they remember for later calls of its signature.

By the rules of tuner.gemm_calls (the ones tuner.record lists shapes by), a call goes to:

- `tuner.matmul`: mm of fp16, bf16 or fp32 operands of one dtype; a bmm that is one GEMM;
- `tuner.linear`: addmm whose added tensor is a bias row (F.linear's bias);
- torch's kernel, unchanged: everything else (other dtypes, a bmm of separate GEMMs, an
  addmm adding a matrix), and a call whose key the tuner answers with cuBLAS
  (tuner.runtime.dispatch.repeated_action says which): the hook runs torch's kernel itself
  rather than have the tuner call aten again, through the hook a second time.

Each function returns the tuner's result, or None where torch's kernel serves the call (the
hook calls the one it kept). The hook calls them with its own GEMMs going to torch: those the
tuner issues meanwhile are not routed again.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from tuner.gemm_calls import KERNEL_DTYPES, folded_bmm, is_bias_row
from tuner.runtime import dispatch

# Repeated.compiled_action's answer for torch's own GEMM (a key answered by cuBLAS).
TORCH = "torch"


def _taken(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype in KERNEL_DTYPES and b.dtype == a.dtype


def _tf32(dtype: torch.dtype) -> bool:
    """The precision torch's own call would take: tf32 for fp32 where torch allows it."""
    return dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32


def _torch_serves(op: str, args: tuple) -> None:
    dispatch.remember_route(op, args, TORCH)
    return None


class Routes:
    """The hooks' Python side over `matmul` and `linear` (tuner.matmul and tuner.linear, as
    tuner.fronts builds them); `mm`, `addmm` and `bmm` take the aten call's arguments."""

    def __init__(self, matmul: Callable, linear: Callable):
        self.matmul, self.linear = matmul, linear

    def mm(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor | None:
        if not _taken(a, b):
            return _torch_serves("mm", (a, b))
        return _tuned("mm", (a, b), self.matmul, "matmul", a, b, None)

    def addmm(self, c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, beta=1,
              alpha=1) -> torch.Tensor | None:
        args = (c, a, b, beta, alpha)
        if not _taken(a, b) or not is_bias_row(c, b, beta, alpha):
            return _torch_serves("addmm", args)
        return _tuned("addmm", args, self.linear, "linear", a, b.t(), c)

    def bmm(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor | None:
        folded = folded_bmm(a, b) if _taken(a, b) else None
        if folded is None:
            return _torch_serves("bmm", (a, b))
        return _tuned("bmm", (a, b), self.matmul, "matmul", *folded, None,
                      shape=(a.shape[0], a.shape[1], b.shape[2]))


def _tuned(op: str, args: tuple, function: Callable, name: str, a: torch.Tensor,
           b: torch.Tensor, bias: torch.Tensor | None,
           shape: tuple[int, ...] | None = None) -> torch.Tensor | None:
    """`function`(a, b, bias) (tuner.<name>), viewed as `shape`, for the aten call `op`(*args);
    None where its key is answered by cuBLAS. Run under no_grad where an input needs a
    gradient (autograd recorded the call already, above the hook)."""
    allow_tf32 = _tf32(a.dtype)
    if dispatch.repeated_action(name, a, b, bias, allow_tf32=allow_tf32) == TORCH:
        return _torch_serves(op, args)
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad
                                    or (bias is not None and bias.requires_grad)):
        with torch.no_grad():
            out = function(a, b, bias, allow_tf32=allow_tf32)
    else:
        out = function(a, b, bias, allow_tf32=allow_tf32)
    result = out if shape is None else out.view(shape)
    action = dispatch.repeated_action(name, a, b, bias, allow_tf32=allow_tf32, result=result)
    if action is not None:
        dispatch.remember_route(op, args, action)
    return result
