"""`tune export expand --time-missing`: timing on this machine's device the configs a
bounded expand file answers tuned shapes with where nothing measured them.

The narrowing (tuner.export.narrowing) prices a config a tuned shape was never timed with by
the analytical model (tuner.export.cases), an optimistic guess. `narrowed_timing_missing`
asks a timer for those answers, then narrows again; the timer here (SideBySideTimer) times
each beside the shape's own winner, side by side (tuner.execution.cross_timing: checked, then
re-timed interleaved), and answers the ratio, which the export scales to the winner's stored
time. From a database the timings are also stored as cross timings (as `tune buckets` stores
its own), so a later export weighs them as measured.

The executor starts on the first config to time (none, if every answer is measured already).
Heavy imports happen there: tuner.tuning.Workers.check() must run before, since
`--backend interpret` sets TRITON_INTERPRET.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from tuner.db.store import params_key
from tuner.export import ExportError
from tuner.export.cases import Tuned, device_spec_of
from tuner.export.flaggems_ops import op_of
from tuner.export.op_lists import NarrowedOp, bounded_ops
from tuner.export.picks import Pick
from tuner.reporting import STDERR, Reporter
from tuner.statuses import CANNOT_RUN, TrialStatus

# How often the narrowing is redone after timing its model-filled answers, at most.
TIMING_ROUNDS = 3

# (tuned shape, full configs) -> each config's kernel time over the shape's winner's, both
# timed side by side now (inf: the config cannot run the shape; None: no answer); e.g.
# SideBySideTimer.
Timer = Callable[[Tuned, list[dict]], list]
# One shape's side-by-side outcomes (tuner.execution.cross_timing.SideBySide), the winner's
# first, to store.
Save = Callable[[Tuned, list], None]


@dataclass(frozen=True)
class TimedMissing:
    """What --time-missing did: configs timed, narrowing rounds that timed some, and the
    model-filled answers left (none, unless the rounds ran out or a timing was lost)."""
    configs: int
    rounds: int
    left: int

    def line(self) -> str:
        return (f"--time-missing timed {self.configs} model-filled answers on this device "
                f"side by side with their shape's winner ({self.rounds} rounds); "
                f"{self.left} answers still model-predicted")


def model_filled(ops: Sequence[NarrowedOp], tuned: Sequence[Tuned]
                 ) -> list[tuple[Tuned, dict]]:
    """Each tuned shape whose best config inside its op's product has a model-filled time,
    with that config in full: the shape's winner with the product's values put in (as
    tuner.export.cases.case_for prices it)."""
    missing = []
    for narrowed in ops:
        n = narrowed.narrowing
        mine = {str(t.shape): t for t in tuned if op_of(t.kernel, t.winner) == narrowed.op}
        for label, outcome in n.outcomes.items():
            t = mine.get(label)
            if t is None or outcome.replacement is None or outcome.measured:
                continue
            missing.append((t, {**t.winner, **{p: v for p, v in zip(n.params,
                                                                    outcome.replacement)
                                               if p in t.winner and v is not None}}))
    return missing


def narrowed_timing_missing(picks: Sequence[Pick], tuned: Sequence[Tuned], device: Mapping,
                            max_configs: int, with_splitk: bool, timer: Timer,
                            reporter: Reporter = STDERR
                            ) -> tuple[list[NarrowedOp], list[str], TimedMissing]:
    """bounded_ops, with each tuned shape whose answer inside the product is model-filled
    timed by `timer` (that config beside the shape's winner, the ratio scaled to the winner's
    stored time) and the lists narrowed again, until no answer is model-filled
    or TIMING_ROUNDS rounds have timed."""
    spec = device_spec_of(device)
    tuned = list(tuned)
    ops, left_out = bounded_ops(picks, tuned, device, max_configs, with_splitk, spec)
    tried: set[tuple[str, str]] = set()
    timed = rounds = 0
    for _ in range(TIMING_ROUNDS):
        missing = [(t, c) for t, c in model_filled(ops, tuned)
                   if (str(t.shape), params_key(c)) not in tried]
        if not missing:
            break
        rounds += 1
        reporter.note(f"--time-missing round {rounds}: timing {len(missing)} model-filled "
                      "answers beside their shapes' winners")
        index = {id(t): i for i, t in enumerate(tuned)}
        for t, config in missing:
            tried.add((str(t.shape), params_key(config)))
            (ratio,) = timer(t, [config])
            if ratio is None:
                reporter.note(f"  {t.shape}: no timing of {params_key(config)}; it stays "
                              "model-filled")
                continue
            timed += 1
            i = index[id(t)]
            tuned[i] = replace(tuned[i], measured=(*tuned[i].measured,
                                                   (config, ratio * t.winner_ms)))
        ops, left_out = bounded_ops(picks, tuned, device, max_configs, with_splitk, spec)
    return ops, left_out, TimedMissing(timed, rounds, len(model_filled(ops, tuned)))


@dataclass(frozen=True)
class TimeMissing:
    """Where --time-missing times: a tuner.tuning.Workers whose check() gave `devices`, and
    the seed of the inputs."""
    workers: object
    devices: tuple[int, ...]
    seed: int = 0

    def timer(self, fingerprint: str | None, device_name: str | None, save: Save | None = None,
              reporter: Reporter = STDERR, strict: bool | None = None) -> SideBySideTimer:
        """A timer on this machine's device, which must be the one the times came from:
        the same fingerprint where results are stored (`save`, strict), else the same GPU."""
        return SideBySideTimer(self, fingerprint, device_name, save, reporter,
                               save is not None if strict is None else strict)

    def db_timer(self, store, device, kernels: Mapping[str, object],
                 reporter: Reporter = STDERR) -> SideBySideTimer:
        """A timer on the database device's winners (the same fingerprint) that stores what
        it times as that device's cross timings (cross_timing_saver)."""
        return self.timer(device.fingerprint, device.name,
                          cross_timing_saver(store, device, kernels), reporter)


class SideBySideTimer:
    """A Timer: a shape's winner and the configs asked, timed side by side; each config's
    time over the winner's (inf: it cannot run the shape; None: no answer). A context
    manager: the executor closes on leaving."""

    def __init__(self, where: TimeMissing, fingerprint: str | None, device_name: str | None,
                 save: Save | None, reporter: Reporter, strict: bool):
        self.where, self.fingerprint, self.device_name = where, fingerprint, device_name
        self.save, self.reporter, self.strict = save, reporter, strict
        self._executor = None

    def __enter__(self) -> SideBySideTimer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._executor is not None:
            self._executor.close()
            self._executor = None

    def executor(self):
        if self._executor is None:
            executor = self.where.workers.executor(self.where.devices)
            try:
                _check_device(executor.device_info(), self.fingerprint, self.device_name,
                              self.strict, self.reporter)
            except BaseException:
                executor.close()
                raise
            self._executor = executor
        return self._executor

    def __call__(self, tuned: Tuned, configs: list[dict]) -> list[float | None]:
        from tuner.execution.cross_timing import time_side_by_side
        from tuner.kernels import KERNELS

        kernel = KERNELS.get(tuned.kernel)
        if kernel is None:
            return [None] * len(configs)
        winner, *outcomes = time_side_by_side(self.executor(), kernel, tuned.shape,
                                              self.where.seed, [tuned.winner, *configs])
        if self.save is not None:
            self.save(tuned, [winner, *outcomes])
        if winner.status != TrialStatus.OK or not winner.p50_ms:
            self.reporter.note(f"  {tuned.shape}: its own winner did not run side by side "
                               f"({winner.status}: {winner.reason}); nothing timed")
            return [None] * len(configs)
        return [o.p50_ms / winner.p50_ms if o.status == TrialStatus.OK and o.p50_ms
                else math.inf if o.status in CANNOT_RUN else None for o in outcomes]


def _check_device(info, fingerprint: str | None, device_name: str | None, strict: bool,
                  reporter: Reporter) -> None:
    if info.fingerprint == fingerprint:
        return
    if strict or device_name is None or info.name != device_name:
        raise ExportError(f"the winners were measured on {device_name} [{fingerprint}], not on "
                          f"this machine's device ({info.name} [{info.fingerprint}]): "
                          "--time-missing times on the device the export is for")
    reporter.note(f"note: timing on {info.name} [{info.fingerprint}], the table's GPU with "
                  f"another driver or software stack [{fingerprint}]")


def cross_timing_saver(store, device, kernels: Mapping[str, object]) -> Save:
    """Save side-by-side outcomes as the database's cross timings of the shape (as `tune
    buckets` does), on the scale of the winner's stored cross timing where it has one: the
    ratios to the winner are what tuner.export.cases.tuned_from_db reads back."""
    def save(tuned: Tuned, outcomes: list) -> None:
        kernel = kernels.get(tuned.kernel)
        if kernel is None:
            return
        winner, *others = outcomes
        if winner.status != TrialStatus.OK or not winner.p50_ms:
            return  # no ratio to trust
        stored = store.cross_timings(device, kernel, tuned.shape).get(
            params_key(tuned.winner))
        scale = 1.0
        if stored is not None and stored.status == TrialStatus.OK and stored.p50_ms:
            scale = stored.p50_ms / winner.p50_ms  # keep the stored winner's row and scale
        else:
            others = outcomes
        for o in others:
            store.save_cross_timing(device, kernel, tuned.shape, o.config, o.status, o.reason,
                                    None if o.p50_ms is None else o.p50_ms * scale, o.method)
    return save
