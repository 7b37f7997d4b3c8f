"""`tune export --format expand --time-missing`: timing on this machine's device the configs
a bounded expand file answers tuned shapes with where nothing measured them.

The narrowing (tuner.expand) prices a config a tuned shape was never timed with by the
analytical model (tuner.expand_cases), an optimistic guess. tuner.export_flaggems'
narrowed_timing_missing asks a timer for those answers; the one here times each beside the
shape's own winner, side by side (tuner.execution.cross_timing: checked, then re-timed
interleaved), and answers the ratio, which the export scales to the winner's stored time. From
a database the timings are also stored as cross timings (as `tune buckets` stores its own), so
a later export weighs them as measured.

The executor starts on the first config to time (none, if every answer is measured already).
Heavy imports happen there: tuner.tuning.Workers.check() must run before, since
`--backend interpret` sets TRITON_INTERPRET.
"""
from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from tuner.db.store import params_key
from tuner.expand_cases import Tuned
from tuner.export import ExportError
from tuner.export_flaggems import CANNOT_RUN

# One shape's side-by-side outcomes (tuner.execution.cross_timing.SideBySide), the winner's
# first, to store.
Save = Callable[[Tuned, list], None]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


@dataclass(frozen=True)
class TimeMissing:
    """Where --time-missing times: a tuner.tuning.Workers whose check() gave `devices`, and
    the seed of the inputs."""
    workers: object
    devices: tuple[int, ...]
    seed: int = 0

    def timer(self, fingerprint: str | None, device_name: str | None, save: Save | None = None,
              note: Callable[[str], None] = _stderr, strict: bool | None = None
              ) -> SideBySideTimer:
        """A timer on this machine's device, which must be the one the times came from:
        the same fingerprint where results are stored (`save`, strict), else the same GPU."""
        return SideBySideTimer(self, fingerprint, device_name, save, note,
                               save is not None if strict is None else strict)

    def db_timer(self, store, device, kernels: Mapping[str, object],
                 note: Callable[[str], None] = _stderr) -> SideBySideTimer:
        """A timer on the database device's winners (the same fingerprint) that stores what
        it times as that device's cross timings (cross_timing_saver)."""
        return self.timer(device.fingerprint, device.name,
                          cross_timing_saver(store, device, kernels), note)


class SideBySideTimer:
    """tuner.export_flaggems.Timer: a shape's winner and the configs asked, timed side by side; each
    config's time over the winner's (inf: it cannot run the shape; None: no answer). A
    context manager: the executor closes on leaving."""

    def __init__(self, where: TimeMissing, fingerprint: str | None, device_name: str | None,
                 save: Save | None, note: Callable[[str], None], strict: bool):
        self.where, self.fingerprint, self.device_name = where, fingerprint, device_name
        self.save, self.note, self.strict = save, note, strict
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
                              self.strict, self.note)
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
        if winner.status != "ok" or not winner.p50_ms:
            self.note(f"  {tuned.shape}: its own winner did not run side by side "
                      f"({winner.status}: {winner.reason}); nothing timed")
            return [None] * len(configs)
        return [o.p50_ms / winner.p50_ms if o.status == "ok" and o.p50_ms
                else math.inf if o.status in CANNOT_RUN else None for o in outcomes]


def _check_device(info, fingerprint: str | None, device_name: str | None, strict: bool,
                  note: Callable[[str], None]) -> None:
    if info.fingerprint == fingerprint:
        return
    if strict or device_name is None or info.name != device_name:
        raise ExportError(f"the winners were measured on {device_name} [{fingerprint}], not on "
                          f"this machine's device ({info.name} [{info.fingerprint}]): "
                          "--time-missing times on the device the export is for")
    note(f"note: timing on {info.name} [{info.fingerprint}], the table's GPU with another "
         f"driver or software stack [{fingerprint}]")


def cross_timing_saver(store, device, kernels: Mapping[str, object]) -> Save:
    """Save side-by-side outcomes as the database's cross timings of the shape (as `tune
    buckets` does), on the scale of the winner's stored cross timing where it has one: the
    ratios to the winner are what tuner.export_flaggems.tuned_from_db reads back."""
    def save(tuned: Tuned, outcomes: list) -> None:
        kernel = kernels.get(tuned.kernel)
        if kernel is None:
            return
        winner, *others = outcomes
        if winner.status != "ok" or not winner.p50_ms:
            return  # no ratio to trust
        stored = store.cross_timings(device, kernel, tuned.shape).get(
            params_key(tuned.winner))
        scale = 1.0
        if stored is not None and stored.status == "ok" and stored.p50_ms:
            scale = stored.p50_ms / winner.p50_ms  # keep the stored winner's row and scale
        else:
            others = outcomes
        for o in others:
            store.save_cross_timing(device, kernel, tuned.shape, o.config, o.status, o.reason,
                                    None if o.p50_ms is None else o.p50_ms * scale, o.method)
    return save
