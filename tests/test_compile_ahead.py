"""Issue 40: the next studies' first configs compile while this study measures, on compile
workers it leaves idle (the executor's side: tests/test_executor.py), and a compile ahead
that fails changes nothing in the study it was for."""
import threading
from concurrent.futures import Future

import pytest

from tests.factories import H100
from tests.test_stopping import CUBLAS, SweepExecutor, sweep
from tuner.execution.measure import TrialResult
from tuner.execution.workers import WorkerLost
from tuner.kernels import KERNELS
from tuner.kernels.calls import meta_gemm
from tuner.search.ahead import AHEAD_CONFIGS
from tuner.search.budget import StudyBudget
from tuner.search.stopping import WARM_CONFIRMED

BUDGET = StudyBudget(8, None, 0, batch=8, patience=4, polish=2, early_stop=True)


class AheadLogged(SweepExecutor):
    """Logs every compile and measure in order, as ("ahead" | "compile" | "measure", M,
    config); a compile ahead ends as `ahead_outcome` says (seconds, a failed TrialResult or
    a raised error). The study at M = `first_m` (if any) measures only once a compile ahead has
    been submitted: the model ranks the next key in its worker meanwhile."""

    def __init__(self, first_m: int, ahead_outcome=1.0):
        super().__init__(1.0)
        self.first_m, self.ahead_outcome = first_m, ahead_outcome
        self.log, self.ahead_started = [], threading.Event()

    def submit_compile(self, shape, kernel_name, config, ahead=False):
        self.log.append(("ahead" if ahead else "compile", shape.M, config))
        if not ahead:
            return super().submit_compile(shape, kernel_name, config)
        self.ahead_started.set()
        done = Future()
        if isinstance(self.ahead_outcome, BaseException):
            done.set_exception(self.ahead_outcome)
        else:
            done.set_result(self.ahead_outcome)
        return done

    def measure(self, slot, shape, seed, kernel_name, config, short=False):
        if shape.M == self.first_m:
            assert self.ahead_started.wait(60)
        self.log.append(("measure", shape.M, config))
        return super().measure(slot, shape, seed, kernel_name, config, short)


@pytest.mark.slow
@pytest.mark.parametrize("ahead_outcome", [
    1.0, TrialResult("compile_error", "OutOfResources: shared memory"),
    WorkerLost("worker killed by SIGKILL")], ids=["compiled", "failed", "worker-lost"])
def test_the_next_keys_first_configs_compile_ahead_of_its_study(tmp_path, ahead_outcome):
    """Two far-apart keys: while the first measures, the model's picks for the second
    (ranked in the ranking worker) compile ahead, a few Triton configs that can run there,
    before the second study asks for anything; that study still compiles each config it
    measures itself, and whatever became of the compiles ahead, it runs as it would."""
    executor = AheadLogged(64, ahead_outcome)
    run = sweep(tmp_path, BUDGET, ms=(64, 4096), executor=executor)
    assert len(run.summary.tuned) == 2 and len(run.winners) == 2
    ahead = [config for event, m, config in executor.log if event == "ahead"]
    assert ahead and all(m == 4096 for event, m, _ in executor.log if event == "ahead")
    assert len(ahead) <= AHEAD_CONFIGS and CUBLAS not in ahead
    kernel, gemm = KERNELS["mm"], meta_gemm(run.studies[1].shape)
    assert all(kernel.feasible(c, gemm, H100.smem_per_block) is None for c in ahead)
    second = [i for i, (event, m, _) in enumerate(executor.log)
              if m == 4096 and event != "ahead"]
    last_ahead = max(i for i, (event, _, _) in enumerate(executor.log) if event == "ahead")
    assert last_ahead < second[0]
    own = [config for event, m, config in executor.log if event == "compile" and m == 4096]
    measured = [config for event, m, config in executor.log if event == "measure" and m == 4096]
    assert ahead[0] in own and all(c in own for c in measured if c != CUBLAS)


@pytest.mark.slow
def test_a_near_keys_winner_compiles_ahead_at_once_and_nothing_waits_for_a_ranking(tmp_path):
    """The key next to a tuned one starts from that key's winner: it compiles ahead as the
    study before it starts, with no ranking; a key next to one planned before it (its
    winner not found yet) compiles nothing ahead."""
    first = sweep(tmp_path, BUDGET, ms=(64,))
    executor = AheadLogged(None)
    later = sweep(tmp_path, BUDGET, ms=(4096, 8192, 128), executor=executor)
    assert later.studies[3].reason.startswith(WARM_CONFIRMED)
    ahead = [(m, config) for event, m, config in executor.log if event == "ahead"]
    assert first.winners[0] != CUBLAS and ahead == [(128, first.winners[0])]
