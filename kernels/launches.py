"""Replaying a call's Triton launches for new operands of the same shape: the dispatcher's
host path for small GEMMs.

A Triton JIT launch binds and specializes every argument on every call, ~25-30 µs of host
time on an H200 machine: more than a decode GEMM's kernel. Yet two calls with the same
shapes, strides, dtypes and pointer alignment run the same compiled kernels on the same
grids with the same scalar arguments; only the operands' addresses differ. So the
dispatcher records the first call's launches (`recording`), turns them into a `Replay`
that writes each tensor argument as (operand, byte offset from that operand's address), and
serves later calls by calling the compiled kernels directly with the new addresses.

Only launches whose every tensor argument is a view of one of the call's operands, or a
buffer the replay may keep (a workspace the launch does not reset on the host), can be
replayed; `Variant.replayable` says which configs launch nothing but Triton kernels.
"""
from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager

import torch
from triton import knobs

# The current CUDA stream of a device as a raw handle: what Triton's driver itself asks
# torch for (absent from CPU-only torch builds, where nothing is replayed on a GPU).
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
# The launches of the call being recorded, or None when nothing records.
_recorded: list[tuple] | None = None


@contextmanager
def recording():
    """Collect (compiled kernel, grid, arguments) of every `record`ed launch in the block."""
    global _recorded
    _recorded = launches = []
    try:
        yield launches
    finally:
        _recorded = None


def record(jit_fn, compiled, grid: tuple, args: Sequence, kwargs: dict) -> None:
    """Called by kernels.base.start after each real launch of `jit_fn` with `args` and
    `kwargs`: remember it if recording (nothing else: this runs on every launch)."""
    if _recorded is not None:
        # The compiled kernel takes every parameter in order, constexprs included (ignored).
        every = (*args, *(kwargs[name] for name in jit_fn.arg_names[len(args):]))
        _recorded.append((compiled, grid, every))


def _address_slot(arg: torch.Tensor, operands: Sequence[torch.Tensor | None]):
    """(operand index, byte offset) if `arg` views the memory of one of the operands."""
    storage = arg.untyped_storage().data_ptr()
    for i, operand in enumerate(operands):
        if operand is not None and operand.untyped_storage().data_ptr() == storage:
            return i, arg.data_ptr() - operand.data_ptr()
    return None


class Replay:
    """The recorded launches of one call key, re-issued for new operands' addresses."""

    def __init__(self, launches: list[tuple], device: int | None):
        # Per launch: the compiled kernel, its grid, and its arguments, with each operand
        # view as (position, operand index, byte offset) in `slots`.
        self.launches = launches
        self.device = device

    @classmethod
    def of(cls, recorded: list[tuple], operands: Sequence[torch.Tensor | None]) -> Replay | None:
        """The replay of recorded launches, or None if some argument cannot be re-derived.

        Tensors that view no operand (a split-K workspace) are kept as they are: the replay
        holds them, so they stay valid, and their contents are the kernels' own business.
        """
        launches = []
        for compiled, grid, args in recorded:
            if compiled is None:  # the interpreter runs kernels without compiling them
                return None
            fixed, slots = list(args), []
            for position, arg in enumerate(args):
                if isinstance(arg, torch.Tensor):
                    slot = _address_slot(arg, operands)
                    if slot is not None:  # not held: the replay must not keep operands alive
                        slots.append((position, *slot))
                        fixed[position] = None
                elif not (arg is None or isinstance(arg, (bool, int, float, str))):
                    return None  # a host-side object (a TMA descriptor): rebuilt per call
            grid3 = (*grid, 1, 1)[:3]  # a CompiledKernel's launcher takes all three
            compiled[grid3]  # loads the binary, so that `run` and `function` exist
            launches.append((compiled, grid3, fixed, tuple(slots)))
        return cls(launches, operands[0].device.index)

    def __call__(self, operands: Sequence[torch.Tensor | None]) -> None:
        """Launch as Triton's CompiledKernel runner does (the same launcher, hooks and launch
        metadata), but on the stream torch reports: the runner's lookup of device and stream
        through Triton's driver costs several µs per launch."""
        addresses = [0 if t is None else t.data_ptr() for t in operands]
        stream = _raw_stream(self.device) if _raw_stream is not None else None
        enter, exit_ = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
        for compiled, grid, fixed, slots in self.launches:
            args = fixed.copy()
            for position, operand, offset in slots:
                args[position] = addresses[operand] + offset
            metadata = None if enter is None else compiled.launch_metadata(grid, stream, *args)
            compiled.run(*grid, stream, compiled.function, compiled.packed_metadata, metadata,
                         enter, exit_, *args)
