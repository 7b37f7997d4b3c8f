"""When a study has seen enough: the rules that end its search, and the words that say which.

Measuring is what a study costs, and most of its trials cannot win: where cuBLAS is far ahead
of every tile, or the best tile was among the first configs tried. Three rules end the
sampler's part of a study early (tuner.search.study); the tuner's replay of recorded timings
(tuner.search.replay) applies the same functions, so what it reports is what `tune run` does.

- The model's bound (`ModelBound`): the analytical model (tuner.model.predict) ranks the
  whole space, but its predictions are off by a factor that differs per shape. Each measured
  config gives one sample of that factor (measured / predicted device time); their geometric
  mean less `SPREAD_Z` of their spread (never less than `MIN_SPREAD`, which a few alike
  samples would understate) is how much faster than predicted a config not yet measured may
  plausibly run. Once even the model's fastest config, at that factor, cannot beat the best
  measured device time by more than `NOISE_MARGIN`, nothing untried can: the study ends. It
  needs `MIN_CALIBRATION` samples, so the model's top configs are measured first.
- Patience (`stalled`): `patience` trials in a row brought no gain (`gained`): a trial is
  progress only where it beats the best so far by more than the noise of the two
  measurements (tuner.objective.is_tie: half the wider p20-p80 spread, at least
  TIE_FLOOR). A flat threshold would let the noise of short kernels' timings pass for gains:
  the best of many noisy samples creeps up trial after trial, and patience never runs out.
- A warm start confirmed: a study that starts from the winners of keys next to it (a
  neighbour on the same device, the next M of a sweep) ends once those are measured, where
  one of them is its best and comes as close to the device's roofline here as at its own
  key (`WarmConfirmation`). A winner that cannot run here, loses to another config, or
  falls further from the roofline has not carried over (cuBLAS on a misaligned neighbour of
  an aligned key: as slow as the model expects, and a padded tile far ahead): the study
  searches on as a cold one would.

The bound compares device times in either launch mode: the model predicts kernels, and an
eager winner's kernel must be within DEVICE_SLACK of the fastest anyway (tuner.objective).
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from tuner.objective import CallTime, is_tie
from tuner.search.screening import REACH
from tuner.space import config_signature

NOISE_MARGIN = 0.01  # a gain the bound still allows an untried config: device time noise
MIN_CALIBRATION = 4  # measured configs the model's bound needs before it can end a study
# How much further from the roofline a near key's winner may run here than at its own key
# and still finish a study: neighbouring shapes differ a little in how close any config
# comes, more than timing noise.
WARM_MARGIN = 0.05
# A library call whose eager call takes this many times its kernel's time is paced by the
# host (cuBLAS's small GEMMs: a 5 us kernel in a 20 us call), where a tile's leaner call can
# win by half of it (tuner.search.screening's HOST_PACED_REACH, search_stop's tile_kernels).
HOST_PACED = 2.0
SPREAD_Z = 2.0  # how many spreads below the mean factor an untried config may fall
# The least spread (of log measured/predicted) assumed: the model's top configs, measured
# first, agree with each other more than the rest of the space agrees with the model.
MIN_SPREAD = 0.10

# Why a study's search ended, as stored (Study.reason) and shown (`tune show`).
MODEL_BOUND = "model bound"
PATIENCE = "patience"
WARM_CONFIRMED = "warm start confirmed"
TRIALS_SPENT = "trials spent"
SPACE_SPENT = "space spent"
STUDY_BUDGET = "study budget"
RUN_BUDGET = "run budget"


def descent_start(by_time: Sequence[tuple[Mapping, float]],
                  library: frozenset[str]) -> Mapping:
    """The config the polish steps descend from (tuner.search.study, and its replay), given
    the measured (config, time) fastest first: the best; where that is a library call, which
    has nothing of its own to step, the best tile where it is within REACH of it, since a
    step or two (a BLOCK_K, a stage) may take it past."""
    best, best_time = by_time[0]
    if best["variant"] not in library:
        return best
    tile = next(((c, t) for c, t in by_time if c["variant"] not in library), None)
    return tile[0] if tile is not None and tile[1] <= best_time * (1 + REACH) else best


def descent_order(steps: Sequence[Mapping],
                  predict: Callable[[Mapping], float] | None) -> list[Mapping]:
    """The descent's steps in the order it measures them: the model's fastest first where
    there is a model (`predict`, math.inf for a config it cannot time), else as given (the
    space's parameter order). With a few polish steps and a dozen neighbours, that order
    decides which get measured: in parameter order a deeper pipeline, one of the last, was
    rarely reached where it was the step that paid."""
    if predict is None:
        return list(steps)
    return sorted(steps, key=predict)  # stable: equal predictions keep the space's order


@dataclass(frozen=True)
class WarmConfirmation:
    """Whether a warm start's near winners finish a study (the rule above). `efficiency`:
    per near winner (by config signature), the fraction of its key's roofline time
    (tuner.model.predict.roofline_ms) it ran in there; `roofline_ms`: the study shape's."""
    efficiency: Mapping[tuple, float]
    roofline_ms: float

    def holds(self, best: Mapping, best_ms: float) -> bool:
        """Whether the study's best config (`best`, at `best_ms` device time) confirms it."""
        there = self.efficiency.get(config_signature(best))
        return there is not None and self.roofline_ms / best_ms >= there * (1 - WARM_MARGIN)


@dataclass(frozen=True)
class Stop:
    """Why a study's search ended: one of the rules named above, and its figures."""
    rule: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.rule}: {self.detail}" if self.detail else self.rule

    @property
    def drops_in_flight(self) -> bool:
        """Whether the configs still in flight go unmeasured: the model's bound says they
        cannot win and a spent budget has no time for them; patience, as before it, lets
        them finish (one of them may yet improve the best)."""
        return self.rule in (MODEL_BOUND, STUDY_BUDGET, RUN_BUDGET)


def gained(best: CallTime | None, new: CallTime) -> bool:
    """Whether `new` is progress over `best` (the fastest so far, None before any): faster
    by more than the noise of the two measurements."""
    return best is None or new.p50_ms < best.p50_ms and not is_tie(best, new)


def stalled(calls: Iterable[CallTime | None], patience: int | None) -> bool:
    """True when the last `patience` of `calls` (each attempted trial's time per call by the
    study's figure, in order; None for one that did not run) brought no gain; never without
    patience. A faster call within the noise becomes the best without being progress, so
    noise that creeps the best up does not reset the count."""
    if patience is None:
        return False
    best, since = None, 0
    for call in calls:
        since += 1
        if call is None:
            continue
        if gained(best, call):
            since = 0
        if best is None or call.p50_ms < best.p50_ms:
            best = call
    return since >= patience


@dataclass(frozen=True)
class ModelBound:
    """The model's fastest prediction for one study's space, and how to predict the rest.

    `predict(config)` is the model's device ms for a config (math.inf for a variant it does
    not know); `fastest_ms` the least it predicts for any config of the space the study
    searches beyond the library calls (cuBLAS is measured, never predicted); `library` the
    variants that are library calls, left out of the calibration as well.
    """
    predict: Callable[[Mapping], float]
    fastest_ms: float
    library: frozenset[str] = frozenset()

    def optimistic_factor(self, measured: Sequence[tuple[Mapping, float]]) -> float | None:
        """How much faster than predicted an untried config may plausibly run, from the
        (config, device ms) measured so far; None with fewer than MIN_CALIBRATION samples."""
        logs = []
        for config, ms in measured:
            predicted = self.predict(config)
            if config["variant"] not in self.library and 0 < predicted < math.inf:
                logs.append(math.log(ms / predicted))
        if len(logs) < MIN_CALIBRATION:
            return None
        spread = max(statistics.stdev(logs), MIN_SPREAD) * math.sqrt(1 + 1 / len(logs))
        return math.exp(statistics.fmean(logs) - SPREAD_Z * spread)

    def reason(self, measured: Sequence[tuple[Mapping, float]]) -> Stop | None:
        """Why the study can end (MODEL_BOUND and the figures), or None while an untried
        config may still beat the best measured device time by more than NOISE_MARGIN."""
        if not measured or not math.isfinite(self.fastest_ms):
            return None
        factor = self.optimistic_factor(measured)
        best = min(ms for _, ms in measured)
        if factor is None or self.fastest_ms * factor < best * (1 - NOISE_MARGIN):
            return None
        return Stop(MODEL_BOUND, f"nothing untried predicted under "
                                 f"{self.fastest_ms * factor:.4g} ms, best {best:.4g} ms")


def search_stop(calls: Sequence[CallTime | None], device_ms: Sequence[tuple[Mapping, float]],
                patience: int | None, bound: ModelBound | None,
                tile_kernels: Sequence[CallTime | None] | None = None) -> Stop | None:
    """Why the sampler's part of a study ends now (the model's bound first, then patience),
    or None: `calls` are the attempted trials' times per call in order (as `stalled`
    takes them), `device_ms` the (config, device ms) of those that ran. `tile_kernels`,
    under a library call the host paces (HOST_PACED): per attempted trial, its kernel time
    where it is a tile (measured in full or screened), else None. While those still gain,
    the tiles are closing on DEVICE_SLACK, where a tile's leaner call wins by far: patience
    waits for them too."""
    if bound is not None and (why := bound.reason(device_ms)):
        return why
    if stalled(calls, patience) and (tile_kernels is None or stalled(tile_kernels, patience)):
        return Stop(PATIENCE, f"{patience} trials in a row without a gain beyond the noise")
    return None
