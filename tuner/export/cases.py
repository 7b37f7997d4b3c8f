"""What each tuned shape measured, as the cases an expand narrowing weighs
(tuner.export.narrowing).

A `Tuned` is one tuned shape: its own winner and that winner's kernel time, and every other
config of the same expand op it was timed with: its study's trials and `tune buckets`' cross
timings (`tuned_from_db`), or a table entry's alternates (`tuned_from_table`). `case_for`
makes the narrowing's `Case` of it: a config's time is the measured one where there is one,
else the analytical model's prediction (tuner.model.predict.predict_ms) scaled by the shape's
measured winner over the model's prediction for that winner, and never below the winner's own
time (its study found nothing faster; the model is trusted for how much slower a config is,
not for beating a measurement): no GPU timing here. A config the kernel's feasibility check
refuses for the shape (shared memory, registers) never answers it.

Times are kernel (device) times, p50_ms: what FlagGems' autotuner compares configs by.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from tuner.db.models import Device, Winner
from tuner.db.store import Store, params_key
from tuner.export.flaggems_ops import op_of
from tuner.export.narrowing import Case
from tuner.export.picks import Pick, exported_trial
from tuner.formats.device import device_info
from tuner.formats.table import table_rows
from tuner.shapes import Shape
from tuner.statuses import CANNOT_RUN, TrialStatus

MODEL_NOTE = ("times a tuned shape has no measurement of are the analytical model's "
              "(tuner.model.predict.predict_ms) scaled to that shape's measured winner, and "
              "never below it")


@dataclass(frozen=True)
class Tuned:
    shape: Shape
    kernel: str  # the kernel the winner's study tuned (tuner.kernels.KERNELS)
    winner: dict  # the full config: variant, pad and the variant's parameters
    winner_ms: float
    measured: tuple = ()  # (config, ms) of other configs of the same op on this shape
    weight: float = 1.0


def projected(params: Sequence[str], config: Mapping) -> tuple:
    """A config's values in `params` order, None for a parameter it has not."""
    return tuple(config.get(p) for p in params)


def case_for(params: Sequence[str], tuned: Tuned, spec) -> Case:
    """The narrowing's case of a tuned shape, its times measured or model-filled (spec: the
    tuner.model.predict.DeviceSpec of the device it was tuned on)."""
    from tuner.model.predict import predicted_or_inf

    params = tuple(params)
    own = tuple(p in tuned.winner for p in params)

    def key(values: tuple) -> tuple:  # the parameters the winner's variant has not are free
        return tuple(v if mine else None for v, mine in zip(values, own))

    measured: dict[tuple, float] = {}
    for config, ms in tuned.measured:
        if ms and ms > 0:  # the op's variants alike: FlagGems runs its own path for them
            k = key(projected(params, config))
            measured[k] = min(measured.get(k, math.inf), ms)
    winner = projected(params, tuned.winner)
    measured[key(winner)] = tuned.winner_ms
    predicted_winner = predicted_or_inf(tuned.shape, tuned.winner, spec)
    scale = (tuned.winner_ms / predicted_winner
             if 0 < predicted_winner < math.inf else None)
    feasible = _feasibility(tuned, spec)

    def time(values: tuple) -> float:
        k = key(values)
        if k in measured:
            return measured[k]
        if scale is None:
            return math.inf
        config = {**tuned.winner, **{p: v for p, v, mine in zip(params, values, own) if mine}}
        if not feasible(config):
            return math.inf
        # never faster than the winner: the shape's study measured that as the best it found
        return max(predicted_or_inf(tuned.shape, config, spec) * scale, tuned.winner_ms)

    return Case(str(tuned.shape), winner, tuned.winner_ms, time, tuned.weight,
                lambda values: key(values) in measured)


def _feasibility(tuned: Tuned, spec):
    """config -> whether the tuned kernel may run it on the shape (always, for a kernel not
    registered here)."""
    from tuner.kernels import KERNELS

    kernel = KERNELS.get(tuned.kernel)
    if kernel is None:
        return lambda config: True
    from tuner.kernels.calls import meta_gemm

    gemm = meta_gemm(tuned.shape)
    return lambda config: kernel.feasible(config, gemm, spec.smem_per_block) is None


def device_spec_of(device: Mapping):
    """The model's DeviceSpec for an export's device header (tuner.formats.device)."""
    from tuner.model.predict import device_spec

    return device_spec(device_info(device))


def tuned_from_db(store: Store, device: Device, winners: list[Winner], launch: str,
                  picks: Sequence[Pick] = ()) -> list[Tuned]:
    """Each tuned shape of the winners (their studies' trials loaded) as the narrowing
    weighs it: the config exported for it under `launch`, its kernel time, and every other
    config of its op it was timed with: its study's trials, and `tune buckets`' cross
    timings (scaled to the study's timing of the winner where both timed it). Weights: the
    shapes CSV's, where a bucketed pick's members name them, else 1."""
    weights = {m["shape"]: m.get("weight", 1.0)
               for p in picks for m in p.provenance.get("members", ())}
    tuned = []
    for w in winners:
        trial = exported_trial(w, launch)
        if trial is None or not trial.p50_ms:
            continue
        if op_of(w.kernel.name, trial.params) is None:  # cuBLAS won: its fastest Triton trial
            trial = min((t for t in w.study.trials if t.status == TrialStatus.OK and t.p50_ms
                         and op_of(w.kernel.name, t.params)),
                        key=lambda t: t.p50_ms, default=trial)
        op = op_of(w.kernel.name, trial.params)
        if op is None:
            continue
        shape = w.study.shape
        timed = [(t.params, t.p50_ms) for t in w.study.trials if t.status == TrialStatus.OK]
        rows = store.cross_timings(device, w.kernel, shape)
        cross = {k: row for k, row in rows.items() if row.status == TrialStatus.OK and row.p50_ms}
        mine = cross.get(params_key(trial.params))
        scale = trial.p50_ms / mine.p50_ms if mine is not None else 1.0
        timed += [(row.params, row.p50_ms * scale) for row in cross.values()]
        # a config found unable to run the shape (refused, wrong, failed to compile) is
        # measured as never answering it; a lost worker or a timeout says nothing of it
        timed += [(row.params, math.inf) for row in rows.values() if row.status in CANNOT_RUN]
        tuned.append(Tuned(shape, w.kernel.name, dict(trial.params), trial.p50_ms,
                           _same_op(w.kernel.name, op, timed), weights.get(str(shape), 1.0)))
    return tuned


def _same_op(kernel: str, op: str, timed: Iterable[tuple[Mapping, float | None]]) -> tuple:
    return tuple((dict(c), ms) for c, ms in timed if ms and op_of(kernel, c) == op)


def tuned_from_table(doc: Mapping) -> list[Tuned]:
    """Each measured entry of a table document as the narrowing weighs it: its tuned shape,
    config and time, and its alternates' times (tuner.formats.table.EntryTimes). Entries of a
    bucketed export state no time of their own: their configs join the lists, but weigh no
    shape."""
    tuned = []
    for row in table_rows(doc):
        kernel, config, times = row.op, row.config, row.times()
        ms = times.ms
        timed = [(c, t) for c, t in times.alternates if t is not None]
        if op_of(kernel, config) is None:  # cuBLAS won: its fastest Triton runner-up
            config, ms = min(((c, t) for c, t in timed if op_of(kernel, c)),
                             key=lambda pair: pair[1], default=(config, ms))
        op = op_of(kernel, config)
        if ms is None or times.tuned_shape is None or op is None:
            continue
        others = [(c, t) for c, t in timed if c != config]
        tuned.append(Tuned(Shape.from_label(times.tuned_shape), kernel, dict(config), ms,
                           _same_op(kernel, op, others)))
    return tuned
