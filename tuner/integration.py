"""Switching a model over to the tuned kernels: `tuner.enable` for eager code, `tuner.patch`
for torch.compile.

`enable()` registers Python kernels for `aten::mm`, `aten::addmm` and `aten::bmm` at the
CUDA dispatch key (torch.library, as FlagGems does), over torch's own, which it keeps
(`torch.library.get_kernel`) and calls for every call it does not route. F.linear and
torch.matmul reach those three operators, so they are routed too. By the rules of
tuner.gemm_calls (the ones tuner.record lists shapes by), a call goes to:

- `tuner.matmul`: mm of fp16, bf16 or fp32 operands of one dtype; a bmm that is one GEMM;
- `tuner.linear`: addmm whose added tensor is a bias row (F.linear's bias);
- torch's kernel, unchanged: everything else (other dtypes, a bmm of separate GEMMs, an
  addmm adding a matrix), and every GEMM the tuner itself issues (a key it answers with
  cuBLAS calls aten.mm again).

What it costs: other operators nothing (their kernels are untouched, and no Python runs for
them, unlike a TorchFunctionMode, which runs for every torch call and tensor attribute). Each
mm, addmm and bmm on the device pays one call into Python (the dispatcher boxing its
arguments) and a few attribute checks before the tuner's compiled front; a key answered by
cuBLAS pays that twice, a call not routed once plus `call_boxed`. Autograd stays torch's: its
formulas record above the CUDA key and call mm for their gradients, which are routed in turn;
the tuner runs those calls under no_grad. Autocast casts before the CUDA key, so a routed
call sees the cast operands. CUDA graphs capture the tuner's launches (warm each shape up
before capturing). Inside graphs torch.compile compiles, Inductor emits its own GEMMs, so
`enable` changes nothing there: use `patch`.

`patch(model)` sets each nn.Linear's forward (the module's own `forward` attribute, which
nn.Module calls before its class's) to a call of `tuner.linear` with its weight and bias;
Dynamo traces that as the `tuner::linear` operator. Modules whose class overrides forward
(quantized linears) or that already have their own forward (hooks such as accelerate's) are
left alone. `unpatch(model)`, or leaving `with tuner.patch(model):`, deletes exactly the
attributes it set.

`devices` names the device types routed (default CUDA; "cpu" runs the kernels on CPU, in
Triton's interpreter where TRITON_INTERPRET=1, as the tests do).
"""
from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from tuner import fronts
from tuner.gemm_calls import KERNEL_DTYPES, folded_bmm, is_bias_row

DISPATCH_KEYS = {"cuda": "CUDA", "cpu": "CPU"}
DEFAULT_DEVICES = ("cuda",)


class _Routing(threading.local):
    # True while this thread runs the tuner for a routed call: the GEMMs it issues go to torch.
    inside = False


_ROUTING = _Routing()
# The libraries holding the registered kernels while enabled (destroying one restores torch's
# kernels), and the device types they route.
_libraries: list[torch.library.Library] = []
_devices: tuple[str, ...] = ()


def _tuned(function: Callable, a: torch.Tensor, b: torch.Tensor, *bias: torch.Tensor,
           allow_tf32: bool) -> torch.Tensor:
    """function(a, b, *bias) for a routed call, the hook stepped aside for the GEMMs it
    issues; under no_grad where an input needs a gradient (autograd recorded the call
    already, above the hook)."""
    _ROUTING.inside = True
    try:
        if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad
                                        or (bias and bias[0].requires_grad)):
            with torch.no_grad():
                return function(a, b, *bias, allow_tf32=allow_tf32)
        return function(a, b, *bias, allow_tf32=allow_tf32)
    finally:
        _ROUTING.inside = False


def _tf32(dtype: torch.dtype) -> bool:
    """The precision torch's own call would take: tf32 for fp32 where torch allows it."""
    return dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32


def _register(library: torch.library.Library, key: str) -> None:
    """Put the routing kernels of mm, addmm and bmm over torch's at dispatch key `key`."""
    matmul, linear = fronts.front("matmul"), fronts.front("linear")
    torch_mm, torch_addmm, torch_bmm = (torch.library.get_kernel(f"aten::{op}", key)
                                        for op in ("mm", "addmm", "bmm"))

    def mm(keyset, a, b):
        if _ROUTING.inside or a.dtype not in KERNEL_DTYPES or b.dtype != a.dtype:
            return torch_mm.call_boxed(keyset, a, b)
        return _tuned(matmul, a, b, allow_tf32=_tf32(a.dtype))

    def addmm(keyset, c, a, b, *, beta=1, alpha=1):
        if (_ROUTING.inside or a.dtype not in KERNEL_DTYPES or b.dtype != a.dtype
                or not is_bias_row(c, b, beta, alpha)):
            return torch_addmm.call_boxed(keyset, c, a, b, beta=beta, alpha=alpha)
        return _tuned(linear, a, b.t(), c, allow_tf32=_tf32(a.dtype))

    def bmm(keyset, a, b):
        if not _ROUTING.inside and a.dtype in KERNEL_DTYPES and b.dtype == a.dtype:
            folded = folded_bmm(a, b)
            if folded is not None:
                out = _tuned(matmul, *folded, allow_tf32=_tf32(a.dtype))
                return out.view(a.shape[0], a.shape[1], b.shape[2])
        return torch_bmm.call_boxed(keyset, a, b)

    with warnings.catch_warnings():  # torch warns once that aten kernels are overridden
        warnings.filterwarnings("ignore", "Warning only once for all operators")
        for name, kernel in (("mm", mm), ("addmm", addmm), ("bmm", bmm)):
            library.impl(name, kernel, key, with_keyset=True)


def _dispatch_keys(devices: Sequence[str]) -> list[str]:
    unknown = [d for d in devices if d not in DISPATCH_KEYS]
    if unknown or not devices:
        raise ValueError(f"devices must name some of {', '.join(DISPATCH_KEYS)}; got "
                         f"{list(devices)}")
    return [DISPATCH_KEYS[d] for d in devices]


def enable(devices: Sequence[str] = DEFAULT_DEVICES) -> None:
    """Route mm, addmm and bmm (and so F.linear and torch.matmul) on `devices` through the
    tuner; calls it does not handle go to torch unchanged. Enabling again replaces the
    routed devices."""
    global _devices
    keys = _dispatch_keys(devices)
    disable()
    for key in keys:
        library = torch.library.Library("aten", "IMPL")
        _libraries.append(library)
        _register(library, key)
    _devices = tuple(devices)


def disable() -> None:
    """Give mm, addmm and bmm back to torch's own kernels (nothing where not enabled)."""
    global _devices
    while _libraries:
        _libraries.pop()._destroy()
    _devices = ()


@contextlib.contextmanager
def enabled(devices: Sequence[str] = DEFAULT_DEVICES) -> Iterator[None]:
    """`enable(devices)` for the block; then the routing as it was before."""
    before = _devices
    enable(devices)
    try:
        yield
    finally:
        if before:
            enable(before)
        else:
            disable()


# -- patching nn.Linear -----------------------------------------------------------------------
def _tuned_forward(module: nn.Linear, device_types: frozenset[str]) -> Callable:
    """`module`'s forward through tuner.linear, or F.linear where the tuner does not take the
    call (another dtype, a device not routed)."""
    linear = fronts.front("linear")

    def forward(input: torch.Tensor) -> torch.Tensor:
        weight, bias = module.weight, module.bias
        if (input.dtype in KERNEL_DTYPES and weight.dtype == input.dtype
                and input.device.type in device_types):
            return linear(input, weight, bias)
        return F.linear(input, weight, bias)

    forward.tuner_patched = True  # what unpatch removes
    return forward


class Patched:
    """The nn.Linear modules `patch` switched over; leaving `with` (or `undo`) restores them."""

    def __init__(self, modules: list[nn.Linear]):
        self.modules = modules

    def undo(self) -> None:
        for module in self.modules:
            _unpatch_module(module)

    def __enter__(self) -> Patched:
        return self

    def __exit__(self, *exc_info) -> None:
        self.undo()


def patch(model: nn.Module, devices: Sequence[str] = DEFAULT_DEVICES) -> Patched:
    """Switch each nn.Linear of `model` (itself included) over to tuner.linear for inputs on
    `devices`; modules patched already, with a forward of their own, or of a class that
    overrides forward, are left as they are."""
    _dispatch_keys(devices)
    device_types = frozenset(devices)
    modules = [m for m in model.modules() if type(m).forward is nn.Linear.forward
               and "forward" not in vars(m)]
    for module in modules:
        module.forward = _tuned_forward(module, device_types)
    return Patched(modules)


def _unpatch_module(module: nn.Module) -> None:
    if getattr(vars(module).get("forward"), "tuner_patched", False):
        del module.forward


def unpatch(model: nn.Module) -> None:
    """Undo `patch` on every module of `model`: their forward is their class's again."""
    for module in model.modules():
        _unpatch_module(module)
