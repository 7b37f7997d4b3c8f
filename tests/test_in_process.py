"""Online tuning's choice among the candidates it timed (tuner.execution.in_process.fastest):
the objective's final rule, with a scripted bench in place of the GPU."""
import pytest

from tuner.execution import in_process
from tuner.execution.measure import TrialResult
from tuner.execution.timing import Timing
from tuner.objective import EAGER, GRAPH
from tuner.shapes import Shape

TILE = {"variant": "persistent", "pad": 0, "BLOCK_M": 128}
CUBLAS = {"variant": "cublas", "pad": 0}


class ScriptedBench:
    """A tile whose trial leads cuBLAS's by 10% (timed in a cooler power state); side by side,
    `paired` ms per config, device time and call alike."""
    paired: dict = {}
    retimed: list = []

    def __init__(self, backend, shape, seed):
        pass

    def run(self, op, config):
        ms = 1.0 if config is TILE else 1.1
        return TrialResult("ok", None, ms, ms, ms, 1.0, 1e-3, None, "x", host_us=5.0,
                           loop_ms=ms)

    def retime(self, op, configs, launch):
        ScriptedBench.retimed.append(launch)
        return [Timing(*(self.paired[c["variant"]],) * 3, 30, "x") for c in configs]


@pytest.mark.parametrize("launch", [GRAPH, EAGER])
@pytest.mark.parametrize("cublas_ms, winner", [(1.003, CUBLAS), (1.05, TILE)])
def test_cublas_is_re_timed_beside_the_tile_and_kept_on_a_tie(monkeypatch, launch, cublas_ms,
                                                               winner):
    monkeypatch.setattr(ScriptedBench, "paired", {"persistent": 1.0, "cublas": cublas_ms})
    monkeypatch.setattr(ScriptedBench, "retimed", [])
    monkeypatch.setattr(in_process, "ShapeBench", ScriptedBench)
    found = in_process.fastest(None, "mm", Shape(4096, 4096, 4096, "bf16", "nt"),
                               [TILE, CUBLAS], launch, seed=0)
    assert found.config is winner and found.timed == 2
    assert ScriptedBench.retimed == ([GRAPH] if launch == GRAPH else [GRAPH, EAGER])
