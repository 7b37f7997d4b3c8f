"""Sibling linears fused into one GEMM: `tuner.fuse`.

    with tuner.fuse(model), tuner.enabled():    # q/k/v and gate/up of each layer: one GEMM each
        model(**inputs)

Attention's q, k and v projections (and an MLP's gate and up) read the same input. At decode
each is a short GEMM that streams its weight, and the short ones (k and v: 1024 rows) cannot
fill the GPU; one GEMM over the three weights, stacked, streams them at the pace of a long
one. vLLM builds its models that way (QKVParallelLinear); a Hugging Face model is not, so
`fuse` does it in place:

- In each module holding every child a group names (default: `SIBLINGS`), the children's
  weights (and biases) are copied into one buffer, once, and each child's parameter becomes
  a view of its rows: no memory is added, and `state_dict` still holds each child's weight.
  Children whose weights already lie that way are not copied, so fusing again is free.
  The first fuse moves the weights, freeing their old storage: fuse before capturing a CUDA
  graph of the model (or compiling it with graphs), whose replays would read the old one.
- Each child's `forward` (its own attribute, as `tuner.patch` sets) runs `F.linear` over the
  stacked weight on the first sibling's call, returns its slice, and keeps the others' for
  their calls with the same input tensor. A call with another input, or with the input
  changed in place since (where it counts versions: not in inference mode), runs the
  stacked GEMM again on its own input: right, but wasted work, so group only siblings that
  read one input (not cross-attention's q with its k and v). The outputs are column slices
  of one matrix, not contiguous, as vLLM's split ones.
- F.linear reaches `aten::mm` / `addmm`, so `tuner.enable` routes the stacked GEMM, and
  `tuner.record` records it: record the fused model to tune what it runs.

Each child computes alone, as before, for inputs of more than `max_rows` rows (default
MEMORY_BOUND_ROWS: a prefill), and where fusing would be wrong or is not traced: when
autograd would need its weight's gradient (fusing serves inference), when its weight or bias
is no longer the view `fuse` made (a parameter replaced), and under torch.compile. Children
with a forward of their own (patched, hooked) or of a class that overrides it are not fused,
nor are groups whose members differ in input width, dtype, device or having a bias; and
`tuner.patch` leaves fused children alone (torch.compile traces them unfused: patch an
unfused model for it).
`undo` (or leaving `with`) deletes the forwards `fuse` set; the weights stay views, with the
same values.
"""
from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from tuner import forwards

FUSED = "tuner_fused"  # the mark of the forwards `fuse` sets (tuner.forwards)
# Attention's projections and the gated MLP's as Llama, Mistral, Qwen2 and Gemma name them.
SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
# Fusing pays while a GEMM streams its weight: a GEMM of M rows does about M flops per byte of
# a 16-bit weight, and an H100 does about 300 bf16 flops per byte of HBM. Above that the
# GEMMs are compute-bound, and the stacked one only leaves strided outputs to the ops after
# it: a Llama prefill ran slower fused (benchmarks/results/model-e2e/README.md).
MEMORY_BOUND_ROWS = 256


def _stacked(tensors: list[torch.Tensor]) -> torch.Tensor:
    """One tensor whose rows are `tensors`' in order: a view where they already lie so in one
    storage, else a new one holding their values."""
    first = tensors[0]
    storage = first.untyped_storage().data_ptr()
    offsets = itertools.accumulate((t.numel() for t in tensors), initial=first.storage_offset())
    if all(t.is_contiguous() and t.untyped_storage().data_ptr() == storage
           and t.storage_offset() == offset for t, offset in zip(tensors, offsets)):
        rows = sum(t.shape[0] for t in tensors)
        return first.as_strided((rows, *first.shape[1:]), first.stride())
    return torch.cat(tensors)


def _version(tensor: torch.Tensor) -> int | None:
    """Its count of in-place changes; None for inference tensors, which keep none."""
    return None if tensor.is_inference() else tensor._version


class _Pending(threading.local):
    """Per thread: the input of the last stacked call, its version then, and the outputs of
    the siblings not called since (None where taken)."""

    def __init__(self):
        self.input: torch.Tensor | None = None
        self.version: int | None = None
        self.outputs: list[torch.Tensor | None] = []
        self.left = 0


class _Group:
    """Sibling linears sharing one stacked weight (and bias)."""

    def __init__(self, members: list[nn.Linear], max_rows: int):
        self.members = members
        self.max_rows = max_rows
        with torch.no_grad():
            self.weight = _stacked([m.weight.detach() for m in members])
            self.bias = (None if members[0].bias is None
                         else _stacked([m.bias.detach() for m in members]))
            self.sizes = [m.out_features for m in members]
            start = 0
            for m, size in zip(members, self.sizes):
                m.weight.data = self.weight[start:start + size]
                if m.bias is not None:
                    m.bias.data = self.bias[start:start + size]
                start += size
        self.pointers = self._pointers()
        self.pending = _Pending()

    def _pointers(self) -> list[tuple[int, int | None]]:
        return [(m.weight.data_ptr(), None if m.bias is None else m.bias.data_ptr())
                for m in self.members]

    def fusable(self, input: torch.Tensor) -> bool:
        """Whether the stacked call pays for `input` and computes what each member would."""
        if input.dim() == 0 or input.numel() > self.max_rows * input.shape[-1]:
            return False
        if torch.is_grad_enabled() and any(p.requires_grad for m in self.members
                                           for p in m.parameters(recurse=False)):
            return False
        return self._pointers() == self.pointers

    def forward_of(self, index: int):
        member = self.members[index]

        def forward(input: torch.Tensor) -> torch.Tensor:
            # Every check a sibling's call repeats is kept cheap: eager decode is host-bound.
            if torch.compiler.is_compiling():
                return F.linear(input, member.weight, member.bias)
            pending = self.pending
            if pending.input is input and pending.outputs[index] is not None and (
                    pending.version == _version(input)):
                output, pending.outputs[index] = pending.outputs[index], None
                pending.left -= 1
                if not pending.left:
                    pending.input, pending.outputs = None, []
                return output
            if not self.fusable(input):
                return F.linear(input, member.weight, member.bias)
            outputs = list(F.linear(input, self.weight, self.bias).split(self.sizes, dim=-1))
            output, outputs[index] = outputs[index], None
            pending.input, pending.version = input, _version(input)
            pending.outputs, pending.left = outputs, len(outputs) - 1
            return output

        return forward


class Fused(forwards.Switched):
    """The sibling groups `fuse` joined; leaving `with` (or `undo`) gives each member its
    class's forward again."""

    def __init__(self, groups: list[_Group]):
        super().__init__([member for group in groups for member in group.members], FUSED)
        self.groups = groups


def _members(parent: nn.Module, names: Sequence[str]) -> list[nn.Linear] | None:
    """`parent`'s children `names`, where they can share one stacked weight."""
    children = [getattr(parent, name, None) for name in names]
    distinct = len({id(c) for c in children}) == len(children)
    if not distinct or not all(forwards.is_plain_linear(c) for c in children):
        return None
    first = children[0]
    if any(c.in_features != first.in_features or c.weight.dtype != first.weight.dtype
           or c.weight.device != first.weight.device or (c.bias is None) != (first.bias is None)
           for c in children):
        return None
    return children


def fuse(model: nn.Module, groups: Sequence[Sequence[str]] = SIBLINGS,
         max_rows: int = MEMORY_BOUND_ROWS) -> Fused:
    """In every module of `model` (itself included) holding all children a group names, fuse
    those children into one GEMM for inputs of at most `max_rows` rows; returns what was
    fused."""
    if isinstance(groups, str) or any(isinstance(g, str) or len(g) < 2 or not all(
            isinstance(n, str) and n for n in g) for g in groups):
        raise ValueError("groups must each name two or more sibling modules, e.g. "
                         f"{SIBLINGS}; got {groups!r}")
    if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
        raise ValueError(f"max_rows must be a positive int; got {max_rows!r}")
    fused: list[_Group] = []
    for parent in list(model.modules()):
        for names in groups:
            members = _members(parent, names)
            if members is not None:
                group = _Group(members, max_rows)
                for index, member in enumerate(members):
                    forwards.set_forward(member, group.forward_of(index), FUSED)
                fused.append(group)
    return Fused(fused)


def unfuse(model: nn.Module) -> None:
    """Undo `fuse` on every module of `model`: their forward is their class's again."""
    for module in model.modules():
        forwards.restore(module, FUSED)
