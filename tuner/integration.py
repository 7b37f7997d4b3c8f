"""Switching a model over to the tuned kernels: `tuner.enable` for eager code, `tuner.patch`
for torch.compile.

`enable()` puts hooks over `aten::mm`, `aten::addmm` and `aten::bmm` at the CUDA dispatch key
(a torch.library registration, as FlagGems does), over torch's own kernels, which they keep
(`getComputedKernelForDispatchKey`, torch.library.get_kernel) and call for every call they do
not route. F.linear and torch.matmul reach those three operators, so they are routed too.
tuner.routing says where a call goes (tuner.matmul, tuner.linear, or torch's kernel for calls
the tuner does not take and keys it answers with cuBLAS) and why; every GEMM the tuner itself
issues goes to torch's kernel.

What it costs: other operators nothing (their kernels are untouched, and no Python runs for
them, unlike a TorchFunctionMode, which runs for every torch call and tensor attribute). The
hooks are compiled with the front of tuner.matmul (tuner/runtime/fastpath.cpp) and remember
each call's route by its signature: a repeated call the tuner does not take, or whose key
cuBLAS answers, runs torch's kernel from the hook without entering Python; one answered by a
Triton config enters Python only for the replay of its recorded launches. A first call, or
one whose route cannot be remembered (a dispatch mode, a tensor subclass, a Triton call the
interpreter runs), goes through tuner.routing in Python. Where the front is not compiled
(TUNE_FASTPATH=0, no compiler), the hooks are Python functions, and every call pays one call
into Python and its routing (a cuBLAS answer still runs torch's kernel directly). The routes
are forgotten with the dispatcher's plans (tuner.runtime.dispatch.clear_cache: a new table or
$TUNE_EXCLUDE) and on every enable or disable.
Autograd stays torch's: its formulas record above the CUDA key and call mm for their
gradients, which are routed in turn; the tuner runs those calls under no_grad. Autocast casts
before the CUDA key, so a routed call sees the cast operands. CUDA graphs capture the tuner's
launches (warm each shape up before capturing). Inside graphs torch.compile compiles, Inductor
emits its own GEMMs, so `enable` changes nothing there: use `patch`.

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

from tuner import forwards, fronts, routing
from tuner.gemm_calls import KERNEL_DTYPES
from tuner.runtime import fastpath

DISPATCH_KEYS = {"cuda": "CUDA", "cpu": "CPU"}
DEFAULT_DEVICES = ("cuda",)


class _Routing(threading.local):
    # True while this thread runs the tuner for a routed call: the GEMMs it issues go to torch.
    inside = False


_ROUTING = _Routing()
# The libraries holding the Python hooks while enabled where the compiled ones are missing
# (destroying one restores torch's kernels), and the device types routed.
_libraries: list[torch.library.Library] = []
_devices: tuple[str, ...] = ()
HOOKED_OPS = ("mm", "addmm", "bmm")
PATCHED = "tuner_patched"  # the mark of the forwards `patch` sets (tuner.forwards)


def _register(library: torch.library.Library, key: str, routes: routing.Routes) -> None:
    """Put Python hooks of mm, addmm and bmm over torch's kernels at dispatch key `key`: what
    the compiled ones do, without remembering routes."""
    for op in HOOKED_OPS:
        library.impl(op, _python_hook(torch.library.get_kernel(f"aten::{op}", key),
                                      getattr(routes, op)), key, with_keyset=True)


def _python_hook(kept, route: Callable) -> Callable:
    def hook(keyset, *args, **kwargs):
        if not _ROUTING.inside:
            _ROUTING.inside = True
            try:
                out = route(*args, **kwargs)
            finally:
                _ROUTING.inside = False
            if out is not None:
                return out
        return kept.call_boxed(keyset, *args, **kwargs)
    return hook


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
    routes = routing.Routes(fronts.front("matmul"), fronts.front("linear"))
    with warnings.catch_warnings():  # torch warns once that aten kernels are overridden
        warnings.filterwarnings("ignore", "Warning only once for all operators")
        if not fastpath.install_hooks(keys, routes):
            for key in keys:
                library = torch.library.Library("aten", "IMPL")
                _libraries.append(library)
                _register(library, key, routes)
    _devices = tuple(devices)


def disable() -> None:
    """Give mm, addmm and bmm back to torch's own kernels (nothing where not enabled)."""
    global _devices
    fastpath.remove_hooks()
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

    return forward


class Patched(forwards.Switched):
    """The nn.Linear modules `patch` switched over; leaving `with` (or `undo`) restores them."""

    def __init__(self, modules: list[nn.Linear]):
        super().__init__(modules, PATCHED)


def patch(model: nn.Module, devices: Sequence[str] = DEFAULT_DEVICES) -> Patched:
    """Switch each nn.Linear of `model` (itself included) over to tuner.linear for inputs on
    `devices`; modules patched already, with a forward of their own, or of a class that
    overrides forward, are left as they are."""
    _dispatch_keys(devices)
    device_types = frozenset(devices)
    modules = [m for m in model.modules() if forwards.is_plain_linear(m)]
    for module in modules:
        forwards.set_forward(module, _tuned_forward(module, device_types), PATCHED)
    return Patched(modules)


def unpatch(model: nn.Module) -> None:
    """Undo `patch` on every module of `model`: their forward is their class's again."""
    for module in model.modules():
        forwards.restore(module, PATCHED)
