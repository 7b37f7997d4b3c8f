"""Forwards the tuner sets on nn.Linear instances (`tuner.patch`, `tuner.fuse`).

nn.Module calls an instance's own `forward` attribute before its class's, so switching a
module over is setting that attribute, and undoing it is deleting it. Each setter marks its
forwards with its own attribute name, so that undoing one removes exactly what it set and
never a forward someone else put there (accelerate's hooks, the other setter's).
"""
from __future__ import annotations

from collections.abc import Callable

from torch import nn


def is_plain_linear(module: object) -> bool:
    """An nn.Linear computing as nn.Linear does: no forward of its own (patched, hooked) and
    none from a class that overrides it (quantized linears)."""
    return (isinstance(module, nn.Linear) and type(module).forward is nn.Linear.forward
            and "forward" not in vars(module))


def set_forward(module: nn.Module, forward: Callable, mark: str) -> None:
    setattr(forward, mark, True)
    module.forward = forward


def restore(module: nn.Module, mark: str) -> None:
    """Give `module` its class's forward again, where its own is one marked `mark`."""
    if getattr(vars(module).get("forward"), mark, False):
        del module.forward


class Switched:
    """The modules a setter switched over; leaving `with` (or `undo`) restores them."""

    def __init__(self, modules: list[nn.Module], mark: str):
        self.modules = modules
        self.mark = mark

    def undo(self) -> None:
        for module in self.modules:
            restore(module, self.mark)

    def __enter__(self) -> Switched:
        return self

    def __exit__(self, *exc_info) -> None:
        self.undo()
