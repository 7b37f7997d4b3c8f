"""What "fastest" means for a config: the time of a call as the deployment will issue it.

Every trial stores two figures measured on the same inputs (tuner.execution.measure): `p50_ms`, the
kernel's device time with the host's launch hidden, which is what a CUDA graph replay of the
call pays; and `loop_ms`, the wall time per call of back-to-back eager calls through the
dispatcher's launch path, where a slow host path costs as much as a slow kernel. The launch
mode says which of the two a study optimises (`tune run --launch`) and which an export picks
winners by (`tune export --launch`).

An eager winner must also keep its kernel within DEVICE_SLACK of the fastest kernel measured
for the key, up to the noise of the two timings (`within`). Back-to-back calls of a small GEMM
are paced by the host, so by the loop alone a cheap-to-issue tile could win while its kernel
runs 10-20% behind cuBLAS's; that tile then loses wherever the GPU sets the pace: under CUDA
graphs, and in a model whose other work keeps the GPU's queue full.

The library call (cuBLAS) is the incumbent: a tile replaces it only by beating it timed in
pairs. A long GEMM's device time moves 10-15% with the GPU's power state, so two trials
measured moments apart can order the two wrongly (benchmarks/results/vs-cublas/
power_state-h100.md); the final re-times the library beside the leaders where its trial came
within LIBRARY_REACH (`final_field`), and keeps it on a tie (`final_winner`).

Which measured config wins is decided here once, over measured records of any kind (stored
trials or TrialResults: a `status` and the two figures), for the study's final re-timing
(tuner.search.study), online tuning (tuner.execution.in_process) and the export's
choice under the other launch mode (tuner.export.picks): `ranked`, `final_field`,
`contested` and `final_winner`; and whether a tile that won a key answers its whole bucket
better than the library call (`bucket_loss`).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from tuner.statuses import TrialStatus

EAGER, GRAPH = "eager", "graph"
LAUNCH_MODES = (EAGER, GRAPH)
DEFAULT_LAUNCH = EAGER
# Which stored figure each mode reads, for messages.
FIGURES = {EAGER: "loop_ms", GRAPH: "p50_ms"}
# How much slower than the key's fastest kernel an eager winner's kernel may be: about the
# spread of one config's device time between trials.
DEVICE_SLACK = 0.05
# How many of the fastest configs are re-timed side by side before the winner is chosen.
FINALISTS = 3
# How far behind the fastest kernel the library call's trial may fall and still meet the
# leaders in the final: about the swing of a long GEMM's device time with the power state.
LIBRARY_REACH = 0.15
# Eager calls within this fraction of the fastest are one call time: a host-bound call's loop
# time is the host's, and host time per call swings by this much and more between loops of the
# same code.
CALL_NOISE = 0.10


def call_ms(measured, launch: str) -> float | None:
    """The ms per call that `launch` ranks by, of a stored trial or a TrialResult (None where
    it was not measured: a failed config, or a trial stored before loop_ms existed)."""
    return getattr(measured, FIGURES[launch])


# Two medians closer than this fraction of the faster one are a tie however tight their
# spreads: run-to-run drift (clocks, temperature) is about this large even when one run's
# samples agree closely.
TIE_FLOOR = 0.01


@dataclass(frozen=True)
class CallTime:
    """A measured record's ms per call by a launch mode's figure, with the spread of its
    samples: what is_tie weighs to tell a gain from noise."""
    p20_ms: float
    p50_ms: float
    p80_ms: float


def is_tie(a, b) -> bool:
    """True when the medians of two timings (anything with p20_ms, p50_ms and p80_ms: a
    CallTime, tuner.execution.timing.Timing) differ by no more than the noise of the two.

    The noise is the larger of half the wider p20–p80 spread (how far a typical sample lies
    from its median) and `TIE_FLOOR` of the faster median (drift that a single timing's
    spread does not show).
    """
    spread = max(a.p80_ms - a.p20_ms, b.p80_ms - b.p20_ms)
    noise = max(spread / 2, TIE_FLOOR * min(a.p50_ms, b.p50_ms))
    return abs(a.p50_ms - b.p50_ms) <= noise


def within(kernel, fastest, slack: float) -> bool:
    """Whether a kernel timing comes within `slack` of the fastest's, up to the noise of the
    two (is_tie with the fastest's timing stretched by 1 + slack). Drawn without the noise,
    the line falls where each study's noise puts it: a tile a hair past it loses a call the
    host paces twice as fast in one study and wins it in the next."""
    stretched = CallTime(*(getattr(fastest, q) * (1 + slack)
                           for q in ("p20_ms", "p50_ms", "p80_ms")))
    return kernel.p50_ms <= stretched.p50_ms or is_tie(kernel, stretched)


# Which stored quantiles each mode's figure has: the device timing's, or the call loop's.
_QUANTILES = {EAGER: ("loop_p20_ms", "loop_ms", "loop_p80_ms"),
              GRAPH: ("p20_ms", "p50_ms", "p80_ms")}


def call_time(measured, launch: str) -> CallTime | None:
    """The `launch` figure of a correct record with its spread, or None (a config that did
    not run, or was not measured in full); a record stored without the spread of its call
    loop has none (the median three times)."""
    if measured.status != TrialStatus.OK or call_ms(measured, launch) is None:
        return None
    low, median, high = (getattr(measured, name) for name in _QUANTILES[launch])
    return CallTime(median if low is None else low, median, median if high is None else high)


def call_tflops(flops: int, measured, launch: str) -> float:
    """TFLOP/s at the `launch` figure's time per call: the value a study maximises (in graph
    mode the trial's stored tflops)."""
    return flops / (call_ms(measured, launch) * 1e-3) / 1e12


def eligible(measured: list, launch: str) -> list:
    """The correct trials (or TrialResults) `launch` may choose a winner among: for eager,
    those whose kernel is within DEVICE_SLACK of the fastest kernel in `measured`, up to the
    noise of the two (within); for graph, all."""
    if launch != EAGER:
        return list(measured)
    kernels = [(t, call_time(t, GRAPH)) for t in measured]
    fastest = min((k for _, k in kernels if k is not None), key=lambda k: k.p50_ms, default=None)
    if fastest is None:
        return list(measured)
    return [t for t, k in kernels if k is not None and within(k, fastest, DEVICE_SLACK)]


def ranked(measured: Iterable, launch: str) -> list:
    """The correct records that have the `launch` figure and that `launch` may choose among
    (eligible), fastest call first (the given order on a tie): the first wins where nothing
    is re-timed."""
    timed = [m for m in measured if m.status == TrialStatus.OK and call_ms(m, launch) is not None]
    return sorted(eligible(timed, launch), key=lambda m: call_ms(m, launch))


# How far apart two trials' measures of one config may fall, by each mode's figure: beyond
# it, the order of two configs measured in separate trials is settled without re-timing.
BETWEEN_TRIALS = {EAGER: CALL_NOISE, GRAPH: DEVICE_SLACK}


def contested(field: list, launch: str, is_library: Callable[[object], bool]) -> bool:
    """Whether a side-by-side re-timing of a final field (as `final_field` gives it) can change
    the winner: another record's call is within BETWEEN_TRIALS of the fastest one's, or a
    tile leads the library call that came within reach (only pairs settle that). Otherwise
    the order the trials measured stands, and a re-timing would cost each a device measure
    for nothing (a warm start's winner far ahead of cuBLAS, most often)."""
    times = sorted(call_ms(m, launch) for m in field)
    close = len(times) > 1 and times[1] <= times[0] * (1 + BETWEEN_TRIALS[launch])
    return close or any(is_library(m) for m in field[1:])


def finalists(measured: Iterable, launch: str, top: int = FINALISTS) -> list:
    """The `top` records a final side-by-side re-timing compares, among those `launch` may
    choose (ranked): the fastest by the mode's figure; for eager, first the fastest on the
    device among those whose calls take the same time (within CALL_NOISE), then the next
    fastest calls. When the host sets a call's pace, every config's call costs the same and
    the kernel that finishes first leaves the GPU free sooner (and wins under graphs too),
    where the loop figure alone would leave the choice to host noise."""
    by_call = ranked(measured, launch)
    if launch == GRAPH or not by_call:
        return by_call[:top]
    slowest_same = call_ms(by_call[0], launch) * (1 + CALL_NOISE)
    same_call = sorted((m for m in by_call if call_ms(m, launch) <= slowest_same),
                       key=lambda m: m.p50_ms)[:top]
    taken = {id(m) for m in same_call}
    return same_call + [m for m in by_call if id(m) not in taken][:top - len(same_call)]


def final_field(measured: Iterable, launch: str, is_library: Callable[[object], bool]) -> list:
    """The records a final re-timing compares: the finalists, then the library call's record
    where they lack it and its kernel came within LIBRARY_REACH of the leader's (it may have
    been timed in a hotter power state than the tile that beat it); a library record further
    behind is dropped from the field, as nothing a re-timing shows could make it win."""
    measured = list(measured)
    field = finalists(measured, launch)
    if not field:
        return field
    reach = field[0].p50_ms * (1 + LIBRARY_REACH)
    incumbent = [m for m in measured if is_library(m) and call_time(m, GRAPH) is not None
                 and m.p50_ms <= reach]
    tiles = [m for m in field if not is_library(m)]
    return field if field[0] in incumbent else tiles + incumbent[:1]


def retimed(retime: Callable[[str], Sequence | None], launch: str
            ) -> tuple[Sequence, Sequence] | None:
    """(kernels, calls) as `final_winner` takes them: `retime(figure)` re-times a field side
    by side, the device times first, then the launch mode's calls (the device times again
    for graph); None where a re-timing returns None (it failed)."""
    kernels = retime(GRAPH)
    if kernels is None:
        return None
    calls = kernels if launch == GRAPH else retime(launch)
    return None if calls is None else (kernels, calls)


def final_winner(field: Sequence, kernels: Sequence, calls: Sequence, launch: str,
                 is_library: Callable[[object], bool],
                 cost: Callable[[object], tuple]) -> tuple[int, list[int]]:
    """The winner of a final field re-timed side by side, as an index, and the indices of
    those whose calls tie with the fastest call. `kernels` are the re-timed device times,
    `calls` the launch mode's figure (the same timings for graph), both as `is_tie` reads them.

    For eager, only kernels within DEVICE_SLACK of the fastest re-timed kernel may win (as
    `eligible` on trials). Among the tied calls, those whose kernels tie with the fastest
    kernel among them are one: the library call if it is one of them, else the one of least
    `cost` (fewer resources)."""
    allowed = range(len(field))
    if launch == EAGER:
        fastest = min(kernels, key=lambda k: k.p50_ms)
        allowed = [i for i in allowed if within(kernels[i], fastest, DEVICE_SLACK)]
    quickest = min(allowed, key=lambda i: calls[i].p50_ms)
    tied = [i for i in allowed if is_tie(calls[quickest], calls[i])]
    leader = min(tied, key=lambda i: kernels[i].p50_ms)
    same = [i for i in tied if is_tie(kernels[leader], kernels[i])]
    library = [i for i in same if is_library(field[i])]
    return (library[0] if library else min(same, key=lambda i: (cost(field[i]), i))), tied


@dataclass(frozen=True)
class Pair:
    """A tile and the library call re-timed side by side at one M: their kernels' device
    times, and the launch mode's calls (the kernels again for graph)."""
    tile_kernel: CallTime
    library_kernel: CallTime
    tile_call: CallTime
    library_call: CallTime

    def deciding(self, launch: str) -> tuple[CallTime, CallTime]:
        """(tile, library) by the figure `final_winner` orders the two by: the calls, unless
        they tie, or (eager) the tile's kernel falls past DEVICE_SLACK of the library's;
        then the kernels."""
        calls = (self.tile_call, self.library_call)
        kernels = (self.tile_kernel, self.library_kernel)
        if launch == GRAPH or is_tie(*calls):
            return kernels
        return calls if within(self.tile_kernel, self.library_kernel, DEVICE_SLACK) else kernels


def bucket_loss(top: Pair, low: Pair, launch: str) -> float | None:
    """What a tile that won a key over the library call loses to it at the bucket's fewest
    rows (its time over the library's), where that is more than it gains at the bucket's
    representative and the library call takes the key; None where the tile keeps it. The
    two are timed side by side at the representative (`top`) and at the fewest rows (`low`),
    each end read by the figure the final orders them by (Pair.deciding). Keeping the
    smaller worst regret of the two over the bucket: a tile pays for its row tiles whether
    they are full or not, while the library picks a smaller tile for fewer rows."""
    tile_low, library_low = low.deciding(launch)
    if tile_low.p50_ms <= library_low.p50_ms or is_tie(tile_low, library_low):
        return None
    tile_top, library_top = top.deciding(launch)
    lost = tile_low.p50_ms / library_low.p50_ms
    return None if lost <= library_top.p50_ms / tile_top.p50_ms else lost
