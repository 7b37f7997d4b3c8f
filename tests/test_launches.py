"""kernels/launches.py: a recorded call's launches re-issued for new operands.

The compiled kernels here are fakes that log what they are called with: the re-derivation
of arguments is plain Python, and a GPU test (tests/test_gpu.py) runs real replays.
"""
from types import SimpleNamespace

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from tuner.kernels import launches
from tuner.kernels.launches import Replay

# A JIT function's parameter names, as kernels.base.start hands it to `record`.
KERNEL = SimpleNamespace(arg_names=["a", "b", "c", "ws", "m", "k", "bias", "BLOCK"])


class FakeCompiled:
    """Stands in for Triton's CompiledKernel: compiled[grid](*args) logs (grid, args), and so
    does its launcher, compiled.run(grid..., stream, function, metadata, hooks..., *args)."""
    function, packed_metadata = "function", "metadata"

    def __init__(self, log: list):
        self.log = log

    def __getitem__(self, grid):
        return lambda *args: self.log.append((grid, args))

    def launch_metadata(self, grid, stream, *args):
        return None

    def run(self, g0, g1, g2, stream, function, metadata, launch_metadata, enter, exit, *args):
        assert (function, metadata) == (self.function, self.packed_metadata)
        self.log.append(((g0, g1, g2), args))


def test_operand_views_become_addresses_of_the_new_operands():
    log = []
    a, b, out = torch.zeros(4, 8), torch.zeros(8, 6), torch.zeros(4, 6)
    workspace = torch.zeros(3)
    with launches.recording() as recorded:
        launches.record(KERNEL, FakeCompiled(log), (2, 1),
                        (a, b.t(), out[1:], workspace, 4, 64, None), {"BLOCK": 32, "num_warps": 4})
    replay = Replay.of(recorded, (a, b, out, None))
    assert recorded and not log  # recording logs launches; it launches nothing itself

    a2, b2, out2 = torch.ones(4, 8), torch.ones(8, 6), torch.ones(4, 6)
    replay((a2, b2, out2, None))
    ((grid, args),) = log
    row = out2.stride(0) * out2.element_size()
    assert grid == (2, 1, 1)
    assert args[:3] == (a2.data_ptr(), b2.data_ptr(), out2.data_ptr() + row)
    # Constexprs follow in signature order (the launcher ignores them); options do not.
    assert args[3] == workspace.data_ptr() and args[4:] == (4, 64, None, 32)
    assert replay.held == [workspace]  # kept alive for the address the arguments hold
    # The replay holds no operand of the recorded call (they could be large weights).
    assert all(arg is None for arg in replay.launches[0].fixed[:3])


def test_a_descriptor_over_an_operand_is_reissued_over_the_new_address():
    """A host TMA descriptor (tma, persistent) replays as a copy of the recorded one whose
    base is the new operand's address: Triton's launcher encodes it from base.data_ptr()."""
    log = []
    a, out = torch.zeros(8, 4).t(), torch.zeros(4, 8)  # a: a transposed (`t`) operand
    a_desc = TensorDescriptor.from_tensor(a.t(), [8, 4])  # over a's storage, as tma.py does
    out_desc = TensorDescriptor.from_tensor(out[2:], [2, 4])
    with launches.recording() as recorded:
        launches.record(SimpleNamespace(arg_names=["a", "c"]), FakeCompiled(log), (1,),
                        (a_desc, out_desc), {})
    replay = Replay.of(recorded, (a, None, out))
    a2, out2 = torch.ones(8, 4).t(), torch.ones(4, 8)
    replay((a2, None, out2))
    ((_, (a_new, out_new)),) = log
    assert a_new.base.data_ptr() == a2.data_ptr()
    assert out_new.base.data_ptr() == out2.data_ptr() + 2 * out2.stride(0) * 4
    assert (a_new.shape, a_new.strides, a_new.block_shape) == (a_desc.shape, a_desc.strides,
                                                               a_desc.block_shape)
    assert isinstance(a_desc.base, torch.Tensor)  # the recorded descriptor is untouched
    assert all(arg is None for arg in replay.launches[0].fixed)  # no operand held


def test_launches_outside_a_recording_are_not_kept_and_host_objects_refuse_replay():
    launches.record(KERNEL, FakeCompiled([]), (1,), (1,), {})
    with launches.recording() as recorded:
        pass
    assert recorded == []

    class Descriptor:  # a host-side object the replay does not know how to rebuild
        pass

    with launches.recording() as recorded:
        launches.record(SimpleNamespace(arg_names=["x", "desc"]), FakeCompiled([]), (1,),
                        (torch.zeros(2), Descriptor()), {})
    assert Replay.of(recorded, (torch.zeros(2),)) is None
    with launches.recording() as recorded:
        launches.record(SimpleNamespace(arg_names=["x"]), None, (1,), (torch.zeros(2),),
                        {})  # the interpreter compiles nothing
    assert Replay.of(recorded, (torch.zeros(2),)) is None


class Runner36:
    """Stands in for Triton 3.6's CudaLauncher: __call__ allocates scratch (none here) and
    calls `launch`, a wrapper whose closure holds the C launcher and the descriptor
    positions and metadata, which encodes every descriptor argument on every call."""
    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid = launch_pdl = False

    def __init__(self, log: list, encodings: list):
        launcher = lambda *args: log.append(args)  # noqa: E731 - the "C" launcher
        tensordesc_indices, tensordesc_meta = {0}, [None]

        def inner(*args):
            return launcher(tensordesc_indices, tensordesc_meta, *args)
        self.launch = inner
        self.encodings = encodings

    def __call__(self, gridX, gridY, gridZ, stream, function, *args):
        raise AssertionError("a replay calls the C launcher itself")


def test_a_replay_encodes_each_descriptor_address_once_and_calls_the_launcher_itself(
        monkeypatch):
    log, encodings = [], []
    compiled = FakeCompiled([])
    compiled.run = Runner36(log, encodings)
    a = torch.zeros(8, 4)
    with launches.recording() as recorded:
        launches.record(SimpleNamespace(arg_names=["a", "m"]), compiled, (3,),
                        (TensorDescriptor.from_tensor(a, [8, 4]), 7), {})
    import triton.backends.nvidia.driver as driver
    monkeypatch.setattr(driver, "make_tensordesc_arg", lambda desc, meta: (
        encodings.append(desc.base.data_ptr()), ["map", *desc.shape, *desc.strides])[1])
    replay = Replay.of(recorded, (a,))
    encodings.clear()  # building the replay measures one expansion
    others = [torch.zeros(8, 4) for _ in range(2)]
    for operand in (*others, others[0], others[1]):
        replay.issue(operand, None, None, None, None, None)
    assert encodings == [t.data_ptr() for t in others]  # once per address
    assert len(log) == 4
    args = log[0]  # as the C launcher takes them: no wrapper in between
    assert args[:5] == (3, 1, 1, None, "function")  # grid, stream (none on CPU), function
    assert args[-6:] == ("map", 8, 4, 4, 1, 7)  # the descriptor expanded, then m


class DirectRunner(Runner36):
    """A runner whose launcher takes no descriptors: the C launcher itself, no wrapper."""

    def __init__(self, log: list):
        self.launch = lambda *args: log.append(("direct", args))
        self.log = log

    def __call__(self, gridX, gridY, gridZ, stream, function, *args):
        self.log.append(("runner", args[4:]))  # after both metadatas and both hooks


def test_repeated_launches_run_as_one_generated_function_until_a_hook_wants_them(monkeypatch):
    """Each argument of the generated call is the operand's address plus its offset, or the
    recorded value; a launch hook (a profiler) gets the runner's path, which calls it."""
    log = []
    compiled = FakeCompiled([])
    compiled.run = DirectRunner(log)
    a, b, out, workspace = torch.zeros(4, 8), torch.zeros(8, 6), torch.zeros(4, 6), torch.zeros(3)
    with launches.recording() as recorded:
        for grid in ((2, 1), (5,)):
            launches.record(KERNEL, compiled, grid, (a, b.t(), out[1:], workspace, 4, 64, None),
                            {"BLOCK": 32})
    replay = Replay.of(recorded, (a, b, out, None, None, None))
    a2, b2, out2 = torch.ones(4, 8), torch.ones(8, 6), torch.ones(4, 6)
    replay.issue(a2, b2, out2, None, None, None)
    row = out2.stride(0) * out2.element_size()
    expected = (a2.data_ptr(), b2.data_ptr(), out2.data_ptr() + row, workspace.data_ptr(), 4,
                64, None, 32)
    options = (False, False, None, None, "metadata", None, None, None)
    assert log == [("direct", (2, 1, 1, None, "function", *options, *expected)),
                   ("direct", (5, 1, 1, None, "function", *options, *expected))]

    log.clear()
    hook = launches.knobs.runtime.launch_enter_hook
    monkeypatch.setattr(hook, "calls", [lambda metadata: None])
    replay.issue(a2, b2, out2, None, None, None)
    assert log == [("runner", expected), ("runner", expected)]
