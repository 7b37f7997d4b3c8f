"""kernels/launches.py: a recorded call's launches re-issued for new operands.

The compiled kernels here are fakes that log what they are called with: the re-derivation
of arguments is plain Python, and a GPU test (tests/test_gpu.py) runs real replays.
"""
from types import SimpleNamespace

import torch

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
    assert args[3] is workspace and args[4:] == (4, 64, None, 32)
    # The replay holds no operand of the recorded call (they could be large weights).
    assert all(arg is None for arg in replay.launches[0][2][:3])


def test_launches_outside_a_recording_are_not_kept_and_host_objects_refuse_replay():
    launches.record(KERNEL, FakeCompiled([]), (1,), (1,), {})
    with launches.recording() as recorded:
        pass
    assert recorded == []

    class Descriptor:  # a host-side TMA descriptor is rebuilt per call, never replayed
        pass

    with launches.recording() as recorded:
        launches.record(SimpleNamespace(arg_names=["x", "desc"]), FakeCompiled([]), (1,),
                        (torch.zeros(2), Descriptor()), {})
    assert Replay.of(recorded, (torch.zeros(2),)) is None
    with launches.recording() as recorded:
        launches.record(SimpleNamespace(arg_names=["x"]), None, (1,), (torch.zeros(2),),
                        {})  # the interpreter compiles nothing
    assert Replay.of(recorded, (torch.zeros(2),)) is None
