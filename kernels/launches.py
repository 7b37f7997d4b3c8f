"""Replaying a call's Triton launches for new operands of the same shape: the dispatcher's
host path for every repeated call.

A Triton JIT launch binds and specializes every argument on every call, ~25-30 µs of host
time on an H200 machine (more with host-built TMA descriptors): more than a decode GEMM's
kernel, and more than cuBLAS's whole call. Yet two calls with the same shapes, strides,
dtypes and pointer alignment run the same compiled kernels on the same grids with the same
scalar arguments; only the operands' addresses differ. So the first call's launches are
recorded (`recording`), turned into a `Replay` that writes each tensor argument as (operand,
byte offset from that operand's address), and later calls call the compiled kernels directly
with the new addresses. A TMA descriptor argument is re-issued as a copy of the recorded one
whose base is the new address: Triton's launcher encodes the hardware descriptor from it.

Where Triton 3.6's launcher is called directly, a descriptor is encoded once per address and
handed to its C launch function as it is (see _Launch), and a call's launches run as one
generated function (`Replay.issue`, _issuing_function).

Every argument must be a view of one of the call's operands, a buffer the replay may keep (a
workspace: padded operands, split-K partials), or a plain value; `Variant.replayable` says
which configs launch nothing but Triton kernels. `prepare` is the whole path for one config,
and `Prepared.repeated` how a repeated user call runs it: what the dispatcher runs, and what
tuning times as "the call".
"""
from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING

import torch
import triton
from triton import knobs
from triton.runtime import _allocation
from triton.tools.tensor_descriptor import TensorDescriptor

try:  # Gluon kernels (kernels/gluon_mm.py) take descriptors of Gluon's own class
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor
    DESCRIPTORS: tuple[type, ...] = (TensorDescriptor, GluonDescriptor)
except ImportError:
    DESCRIPTORS = (TensorDescriptor,)

if TYPE_CHECKING:
    from tuner.kernels.base import Config, Gemm, Kernel

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


def start(jit_fn, grid, args: tuple, kwargs: dict, compile_only: bool) -> None:
    """Launch a Triton kernel, or only compile exactly what that launch would run.

    Compiling needs no data: shapes, strides and dtypes decide Triton's specialization (data
    pointers of fresh allocations are 16-byte aligned, and a meta tensor's is 0). The binary
    lands in Triton's on-disk cache, where a launch in another process finds it.
    """
    if compile_only:
        jit_fn.warmup(*args, grid=grid, **kwargs)
        return
    record(jit_fn, jit_fn[grid](*args, **kwargs), grid, args, kwargs)


def _torch_scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    return torch.empty(size, dtype=torch.int8, device="cuda")  # aligned to 512 bytes or more


def use_torch_allocator() -> None:
    """Let Triton allocate kernels' global scratch (device-built TMA descriptors) through
    torch's caching allocator, unless the caller chose an allocator (triton.set_allocator)
    in this context: Triton refuses such launches without one."""
    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(_torch_scratch)


def operands_of(gemm: Gemm) -> tuple:
    """The tensors a call brings, in the order a Replay addresses them."""
    return gemm.a, gemm.b, gemm.out, gemm.bias, gemm.scale_a, gemm.scale_b


def _address_slot(arg: torch.Tensor, operands: Sequence[torch.Tensor | None]):
    """(operand index, byte offset) if `arg` views the memory of one of the operands."""
    storage = arg.untyped_storage().data_ptr()
    for i, operand in enumerate(operands):
        if operand is not None and operand.untyped_storage().data_ptr() == storage:
            return i, arg.data_ptr() - operand.data_ptr()
    return None


class _Address:
    """A device address standing in for a descriptor's base tensor: Triton's launcher reads
    only `base.data_ptr()` of a host descriptor."""
    __slots__ = ("address",)

    def __init__(self, address: int):
        self.address = address

    def data_ptr(self) -> int:
        return self.address


class _Rebased:
    """Copies of one recorded descriptor over other base addresses (its checks passed when
    recorded), and their encodings for the C launcher, the last few kept: a decode loop sees
    a handful of addresses (weights never move, and torch's caching allocator hands
    activations the same blocks again), so encoding a TMA descriptor, a few µs of host time,
    happens once per address rather than once per call."""
    KEPT = 16

    def __init__(self, recorded: TensorDescriptor):
        self.kind = type(recorded)
        self.fields = {k: v for k, v in vars(recorded).items() if k != "base"}
        self.by_address: dict[int, TensorDescriptor] = {}
        self.encoded_by_address: dict[int, list] = {}

    def __call__(self, address: int) -> TensorDescriptor:
        desc = self.by_address.get(address)
        if desc is None:
            if len(self.by_address) >= self.KEPT:
                self.by_address.clear()
            desc = self.by_address[address] = object.__new__(self.kind)
            desc.__dict__.update(self.fields, base=_Address(address))
        return desc

    def encoded(self, address: int, expand, meta) -> list:
        """The launcher's arguments for the descriptor over `address` (expand: Triton's own
        expansion of a descriptor argument, with its compile-time metadata `meta`)."""
        args = self.encoded_by_address.get(address)
        if args is None:
            if len(self.encoded_by_address) >= self.KEPT:
                self.encoded_by_address.clear()
            args = self.encoded_by_address[address] = list(expand(self(address), meta))
        return args


def _descriptor_launcher(direct) -> tuple | None:
    """(the C launcher, Triton's descriptor expansion, {argument position: its descriptor
    metadata}) behind Triton 3.6's wrapper of a launcher that takes TMA descriptors, or None
    (no wrapper: no descriptors; or another Triton). The wrapper encodes every descriptor on
    every launch; a replay encodes each once per address and calls the C launcher itself."""
    try:
        closure = inspect.getclosurevars(direct).nonlocals
        from triton.backends.nvidia.driver import make_tensordesc_arg
    except (ImportError, TypeError):
        return None
    if not {"launcher", "tensordesc_indices", "tensordesc_meta"} <= closure.keys():
        return None
    positions = sorted(closure["tensordesc_indices"])
    meta = closure["tensordesc_meta"] or [None] * len(positions)
    return closure["launcher"], make_tensordesc_arg, dict(zip(positions, meta))


def _encoded_arguments(fixed: list, slots: tuple, expand, meta: dict) -> tuple[list, tuple]:
    """`fixed` and `slots` of a launch for the C launcher itself: each descriptor argument
    becomes its expansion, a workspace's once, here; an operand's per call, through its slot
    (position, operand, offset, _Rebased, width, metadata) of `width` arguments."""
    by_position = {slot[0]: slot for slot in slots}
    flat, flat_slots = [], []
    for position, arg in enumerate(fixed):
        slot = by_position.get(position)
        if isinstance(arg, DESCRIPTORS):  # over a workspace the replay holds
            flat += expand(arg, meta[position])
        elif slot is not None and slot[3] is not None:  # a descriptor over an operand
            width = len(expand(slot[3](0), meta[position]))  # any address encodes as wide
            flat_slots.append((len(flat), *slot[1:], width, meta[position]))
            flat += [None] * width
        else:
            if slot is not None:
                flat_slots.append((len(flat), *slot[1:], 1, None))
            flat.append(arg)
    return flat, tuple(flat_slots)


def _direct_launch(run):
    """The C launch behind a compiled kernel's runner, when calling it directly is what the
    runner would do, else None.

    Triton 3.6's CudaLauncher.__call__(grid..., stream, function, *args) allocates the
    kernel's scratch buffers and passes them with the kernel's launch options to its `launch`
    (the C launcher, wrapped to expand TMA descriptors); calling `launch` with a global scratch
    held by the replay (_global_scratch) and no profiling scratch saves ~2 µs of host time per
    launch on an H100 machine. Runners of any other shape (Triton 3.9 takes more arguments),
    or of kernels built for profiling, are called as they are."""
    try:
        params = list(inspect.signature(type(run).__call__).parameters)
    except (AttributeError, TypeError, ValueError):
        return None
    if (params != ["self", "gridX", "gridY", "gridZ", "stream", "function", "args"]
            or getattr(run, "profile_scratch_size", 1)):
        return None
    return run.launch


def _global_scratch(run, grid: tuple, device: torch.device) -> torch.Tensor | None:
    """The global scratch a launch of `run` over `grid` needs (each program's device-built TMA
    descriptors), allocated once for a replay that calls the C launcher itself; None if it
    needs none. Its contents live within one launch, so calls on one stream may share it."""
    size = getattr(run, "global_scratch_size", 0)
    if not size:
        return None
    programs = grid[0] * grid[1] * grid[2] * run.num_ctas
    return torch.empty(programs * size, dtype=torch.int8, device=device)


# The names a generated issuing function gives the operands (operands_of's order).
_OPERAND_NAMES = ("a", "b", "out", "bias", "scale_a", "scale_b")


def _issuing_function(replay: Replay) -> Callable | None:
    """issue(a, b, out, bias, scale_a, scale_b): every launch of `replay` as one generated
    Python function that calls the C launchers with the operands' addresses written in, or
    None where some launch cannot be called directly.

    Generated, as Triton generates its own binder and launcher: per launch the general path
    copies an argument list and loops over its slots, ~1 µs of host time that a decode call
    pays on every launch; here each argument is an expression in place. Hooks installed
    later (a profiler) send the call down the general path, which serves them.
    """
    if not replay.launches or any(launch.flat is None for launch in replay.launches):
        return None
    names: dict[str, object] = {"raw_stream": _raw_stream or (lambda device: None),
                                "device": replay.device, "hooks": knobs.runtime,
                                "general": replay}

    def named(value, name: str) -> str:
        if value is None or type(value) in (bool, int):
            return repr(value)
        names[name] = value
        return name

    calls = []
    for i, launch in enumerate(replay.launches):
        arguments = launch.flat
        slots = {slot[0]: slot[1:] for slot in launch.flat_slots}
        names[f"launch{i}"] = launch.direct
        expressions = [*map(str, launch.grid), "stream",
                       named(launch.compiled.function, f"function{i}"),
                       *(named(option, f"option{i}_{j}")
                         for j, option in enumerate(launch.options))]
        position = 0
        while position < len(arguments):
            slot = slots.get(position)
            if slot is None:
                expressions.append(named(arguments[position], f"argument{i}_{position}"))
                position += 1
                continue
            operand, offset, rebased, width, meta = slot
            address = f"{_OPERAND_NAMES[operand]}.data_ptr()" + (f" + {offset}" if offset else "")
            if rebased is None:
                expressions.append(address)
            else:
                names[f"rebased{i}_{position}"] = rebased
                names[f"meta{i}_{position}"] = meta
                names[f"expand{i}"] = launch.expand
                expressions.append(f"*rebased{i}_{position}.encoded({address}, expand{i}, "
                                   f"meta{i}_{position})")
            position += width
        calls.append(f"    launch{i}({', '.join(expressions)})")
    operands = ", ".join(_OPERAND_NAMES)
    source = "\n".join([
        f"def issue({operands}):",
        # Triton keeps empty chains of hooks; anything else may want calls.
        "    if (getattr(hooks.launch_enter_hook, 'calls', True)",
        "            or getattr(hooks.launch_exit_hook, 'calls', True)):",
        f"        return general(({operands}))",
        "    stream = raw_stream(device)",
        *calls, ""])
    exec(compile(source, f"<replay of {len(calls)} launch(es)>", "exec"), names)
    return names["issue"]


class _Launch:
    """One recorded launch, ready to re-issue: the compiled kernel's runner and binary, its
    grid, its arguments with each operand view left as None, and `slots` (position, operand
    index, byte offset, and a _Rebased for a descriptor, else None) saying what to write there
    per call. Where the C launcher can be called directly (`direct`, after its leading
    `options`), `flat` and `flat_slots` are the same arguments as it takes them (descriptors
    expanded, see _encoded_arguments); both are None where it cannot."""
    __slots__ = ("run", "compiled", "grid", "fixed", "slots", "direct", "scratch", "options",
                 "expand", "flat", "flat_slots")

    def __init__(self, compiled, grid: tuple, fixed: list, slots: tuple, device: torch.device):
        self.run, self.compiled, self.grid = compiled.run, compiled, grid
        self.fixed, self.slots = fixed, slots
        self.direct = _direct_launch(self.run)
        self.scratch = None if self.direct is None else _global_scratch(self.run, grid, device)
        self.options = () if self.direct is None else (
            self.run.launch_cooperative_grid, self.run.launch_pdl,
            None if self.scratch is None else self.scratch.data_ptr(), None,  # scratches
            compiled.packed_metadata, None, None, None)  # metadata, hooks
        self.expand = self.flat = self.flat_slots = None
        if self.direct is None:
            return
        encoder = _descriptor_launcher(self.direct)
        if encoder is not None:
            self.direct, self.expand, meta = encoder
        elif (any(rebased is not None for *_, rebased in slots)
              or any(isinstance(arg, DESCRIPTORS) for arg in fixed)):
            self.direct = None  # descriptors, but no expansion of Triton's to encode them
            return
        else:
            meta = {}  # a launcher without descriptors takes the arguments as they are
        self.flat, self.flat_slots = _encoded_arguments(fixed, slots, self.expand, meta)

    def arguments(self, operands: Sequence[torch.Tensor | None]) -> list:
        """The runner's arguments for these operands."""
        args = self.fixed.copy()
        for position, operand, offset, rebased in self.slots:
            address = operands[operand].data_ptr() + offset
            args[position] = address if rebased is None else rebased(address)
        return args


class Replay:
    """The recorded launches of one call key, re-issued for new operands' addresses."""

    def __init__(self, launches: list[_Launch], device: int | None,
                 held: list[torch.Tensor]):
        self.launches = launches
        self.device = device
        self.held = held  # workspaces whose addresses the arguments hold as plain integers
        # issue(a, b, out, bias, scale_a, scale_b): what a repeated call runs.
        self.issue = _issuing_function(self) or (lambda *operands: self(operands))

    @classmethod
    def of(cls, recorded: list[tuple], operands: Sequence[torch.Tensor | None]) -> Replay | None:
        """The replay of recorded launches, or None if some argument cannot be re-derived.

        Tensors that view no operand (a workspace) are kept by the replay, so they stay
        valid, and passed as their addresses (the launcher would check a tensor's pointer
        with the driver on every call); their contents are the kernels' own business.
        """
        launches, held = [], []
        for compiled, grid, args in recorded:
            if compiled is None:  # the interpreter runs kernels without compiling them
                return None
            fixed, slots = list(args), []
            for position, arg in enumerate(args):
                if isinstance(arg, DESCRIPTORS):
                    slot = _address_slot(arg.base, operands)
                    if slot is not None:  # not held: the replay must not keep operands alive
                        slots.append((position, *slot, _Rebased(arg)))
                        fixed[position] = None
                elif isinstance(arg, torch.Tensor):
                    slot = _address_slot(arg, operands)
                    if slot is None:
                        held.append(arg)
                        fixed[position] = arg.data_ptr()
                    else:
                        slots.append((position, *slot, None))
                        fixed[position] = None
                elif not (arg is None or isinstance(arg, (bool, int, float, str))):
                    return None  # a host-side object this module does not know how to rebuild
            grid3 = (*grid, 1, 1)[:3]  # a CompiledKernel's launcher takes all three
            compiled[grid3]  # loads the binary, so that `run` and `function` exist
            launches.append(_Launch(compiled, grid3, fixed, tuple(slots), operands[0].device))
        return cls(launches, operands[0].device.index, held)

    def __call__(self, operands: Sequence[torch.Tensor | None]) -> None:
        """Launch as Triton's CompiledKernel runner does (the same launcher, hooks and launch
        metadata), but on the stream torch reports: the runner's lookup of device and stream
        through Triton's driver costs several µs per launch."""
        stream = _raw_stream(self.device) if _raw_stream is not None else None
        enter = knobs.runtime.launch_enter_hook
        for launch in self.launches:
            x, y, z = launch.grid
            compiled = launch.compiled
            args = launch.arguments(operands)
            metadata = compiled.launch_metadata((x, y, z), stream, *args)
            launch.run(x, y, z, stream, compiled.function, compiled.packed_metadata, metadata,
                       enter, knobs.runtime.launch_exit_hook, *args)


class Repeated:
    """A repeated user call of one signature, as the dispatcher serves it once validated
    (tuner.runtime.dispatch): `linear(x, weight, bias)` and `matmul(a, b, out, scale_a, scale_b)`,
    each returning the result. Tuning times `matmul` as the cost of a call (Prepared.
    as_repeated), so that what it measures is what a deployment runs."""
    # Whether it reads the operands where the recorded call's launches read them: a linear
    # whose x was copied by its reshape cannot be served so.
    reads_recorded_views = False

    def linear(self, x, weight, bias) -> torch.Tensor:
        raise NotImplementedError

    def matmul(self, a, b, out, scale_a, scale_b) -> torch.Tensor:
        raise NotImplementedError

    def compiled_action(self, out: torch.Tensor):
        """What the dispatcher's compiled front (tuner/runtime/fastpath.cpp) runs for later
        calls whose results look like `out`: "torch" for the operator torch's own call
        reaches, (issue, out) for recorded launches issue(a, b, out, bias, scale_a, scale_b)
        into a new output like `out`, None for this Python object."""
        return None


class _ReplayedCall(Repeated):
    """Allocate the output, re-issue the recorded launches. The shape is kept as a plain
    tuple and linear's output comes from x.new_empty: both spare torch's argument parsing
    some work on every call."""
    reads_recorded_views = True

    def __init__(self, replay: Replay, out: torch.Tensor):
        self.issue = replay.issue
        self.out_shape, self.out_dtype, self.device = tuple(out.shape), out.dtype, out.device

    def linear(self, x, weight, bias):
        out = x.new_empty(self.out_shape)  # linear's output has x's dtype and device
        self.issue(x, weight, out, bias, None, None)
        return out

    def matmul(self, a, b, out, scale_a, scale_b):
        if out is None:
            out = torch.empty(self.out_shape, dtype=self.out_dtype, device=self.device)
        self.issue(a, b, out, None, scale_a, scale_b)
        return out

    def compiled_action(self, out):
        return self.issue, out


class Prepared:
    """One call key's way to compute a Gemm: its replay, or `kernel.launch` where the config's
    launches cannot be replayed (a library call, the interpreter)."""

    def __init__(self, kernel: Kernel, config: Config, replay: Replay | None):
        self.kernel, self.config, self.replay = kernel, config, replay

    def __call__(self, gemm: Gemm) -> None:
        if self.replay is None:
            self.kernel.launch(gemm, self.config)
        else:
            self.replay.issue(*operands_of(gemm))

    def repeated(self, out: torch.Tensor) -> Repeated | None:
        """How repeated calls whose results look like `out` are served: a library variant's
        own torch call, the replay into a new output, or None (nothing to replay)."""
        library = self.kernel.variant[self.config["variant"]].library_calls
        if library is not None:
            return library()
        return None if self.replay is None else _ReplayedCall(self.replay, out)

    def as_repeated(self, gemm: Gemm) -> Callable[[Gemm], torch.Tensor]:
        """A repeated `tuner.matmul` of Gemms like `gemm` (no bias), returning a new output
        as the dispatcher computes it (`repeated`), or, on the interpreter, a new output and
        the full launch."""
        repeated = self.repeated(gemm.out)
        if repeated is not None:
            return lambda g: repeated.matmul(g.a, g.b, None, g.scale_a, g.scale_b)
        shape, dtype, device = tuple(gemm.out.shape), gemm.out.dtype, gemm.out.device

        def launched(g: Gemm) -> torch.Tensor:
            out = torch.empty(shape, dtype=dtype, device=device)
            self.kernel.launch(replace(g, out=out), self.config)
            return out
        return launched


def prepare(kernel: Kernel, config: Config, gemm: Gemm) -> Prepared:
    """Compute `gemm` with `config` (through Triton, compiling if needed) and return how to
    compute any other Gemm of the same shapes, strides, dtypes and alignment."""
    with recording() as recorded:
        kernel.launch(gemm, config)
    replay = Replay.of(recorded, operands_of(gemm)) if kernel.replayable(config) else None
    return Prepared(kernel, config, replay)
