"""Which configs earn the full measures: a short device measure first, the rest only in reach.

A trial's full measures (device time over ~100 ms of samples, then ~30 ms of back-to-back
eager calls) cost more than most configs are worth: most are far behind the best the study
has. So, on a GPU, once a study has a best, each new config is first timed by one short
device measure (tuner.execution.timing's SHORT_TIME_MS, the same method: cold L2, graphs for
short kernels);
only a config within `REACH` of the best device time, up to the noise of the two
(tuner.objective.within), is measured in full. The rest are stored as `screened` with their
short figures: never a winner, a finalist or progress (tuner.objective reads only `ok`
trials), and told to the sampler as what they would cost per call at the best's ratio of
call to device time.

REACH is DEVICE_SLACK: an eager winner's kernel must be within it of the fastest kernel
anyway (tuner.objective), and a graph winner is its kernel. Under a library call the host
paces (stopping.HOST_PACED: cuBLAS's 5 us kernel in a 20 us call), a tile whose kernel comes
within DEVICE_SLACK of it wins by its leaner call, by half; there the tiles' reach is
HOST_PACED_REACH, REACH beyond that slack: the short measure's few samples of a few-us kernel
must not hide such a tile, and the polish steps from the best of those measured in full.
"""
from __future__ import annotations

from dataclasses import replace

from tuner.execution.measure import TrialResult
from tuner.objective import DEVICE_SLACK, GRAPH, call_time, within
from tuner.statuses import TrialStatus

REACH = DEVICE_SLACK
HOST_PACED_REACH = DEVICE_SLACK + REACH


def screened(short: TrialResult, best, reach: float = REACH) -> TrialResult | None:
    """The short measure's result stored as screened, where its device time is beyond
    `reach` of `best`'s (the study's fastest measured in full); None where the full measures
    are due (within reach, or the short measure failed: a failure is stored as it is)."""
    mine, theirs = call_time(short, GRAPH), call_time(best, GRAPH)
    if mine is None or theirs is None or within(mine, theirs, reach):
        return None
    return replace(short, status=TrialStatus.SCREENED,
                   reason=f"short measure {mine.p50_ms:.4g} ms, beyond {reach:.0%} of the "
                          f"best {theirs.p50_ms:.4g} ms")
