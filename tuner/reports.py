"""What `tune show` and `tune replay` print: the winners or remembered failures of a
database as a table, and search strategies compared on recorded timings."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from tuner.reporting import STDERR, Reporter


def show_table(store, device_selector: str | None, failures: bool,
               reporter: Reporter = STDERR):
    """`tune show`: a rich Table of one device's current winners (shape, config, device time,
    host time per eager call, TFLOP/s, speed against cuBLAS, the rule that ended its study's
    search), or with `failures` of the configs remembered as failing on the matching
    devices."""
    if failures:
        return failures_table(store, device_selector)
    from rich.table import Table

    from tuner.export.picks import current_device_winners
    from tuner.kernels.base import config_label

    device, winners = current_device_winners(store, device_selector, reporter)
    table = Table(title=f"winners on {device.name} [{device.fingerprint}]")
    numbers = ("ms", "host µs", "TFLOP/s", "vs cuBLAS")
    for column in ("kernel", "tuned shape", "config", *numbers, "ended by"):
        # a narrow terminal wraps the other cells, never the shape that names the row
        table.add_column(column, justify="right" if column in numbers else "left",
                         no_wrap=column == "tuned shape")
    for w in winners:
        t, study = w.trial, w.study
        ratio = f"{study.baseline_ms / t.p50_ms:.2f}x" if study.baseline_ms else "-"
        host_us = "-" if t.host_us is None else f"{t.host_us:.1f}"
        table.add_row(w.kernel.name, study.shape_label, config_label(t.params),
                      f"{t.p50_ms:.4g}", host_us, f"{t.tflops:.4g}", ratio,
                      ended_by(study.reason))
    return table


def ended_by(reason: str | None) -> str:
    """The rule that ended a study's search (tuner.search.stopping), from its stored reason
    ("model bound: nothing untried ...; then 3 polish steps" -> "model bound"); "-" for a
    study stored before the reason was kept."""
    return reason.split(":")[0].split(";")[0] if reason else "-"


def failures_table(store, device_selector: str | None):
    """The configs remembered as failing on the devices the selector matches, as a rich
    Table; where there are none, a line saying so (none is no error)."""
    from rich.table import Table

    from tuner.kernels.base import config_label

    devices = store.devices_matching(device_selector)
    rows = store.failures([d.id for d in devices])
    if not rows:
        return "no remembered failures" + (f" for device {device_selector!r}"
                                           if device_selector else "")
    table = Table(title=f"{len(rows)} configs remembered as failing")
    for column in ("kernel", "specialization", "config", "status", "reason"):
        table.add_column(column)
    for f in rows:
        table.add_row(f"{f.kernel.name} {f.kernel.source_hash[:8]}", f.specialization,
                      config_label(f.params), f.status, f.reason or "")
    return table


def recording_from_db(store, device_selector: str | None, reporter: Reporter = STDERR):
    """The recording of the one device of the database the selector matches (shapes not
    measured exhaustively are left out, with a note each)."""
    from tuner.search.replay import ReplayError, recording_from_store

    devices = store.devices_matching(device_selector)
    if len(devices) != 1:
        names = ", ".join(f"{d.name} [{d.fingerprint}]" for d in devices) or "none"
        raise ReplayError(f"--device must pick one device of the database (matching: {names})")
    recording, skipped = recording_from_store(store, devices[0])
    for line in skipped:
        reporter.note(f"note: not exhaustive, left out: {line}")
    return recording


def replay_strategies(db, recording_path: str | None, device_selector: str | None,
                      save_recording: str | None, strategies: Sequence, seeds: int, trials: int,
                      in_flight: int, jobs: int, plot_path: str | None,
                      out: Callable[[str], None] = print,
                      reporter: Reporter = STDERR, cublas_ratio: float | None = None,
                      noise: float = 0.0) -> None:
    """`tune replay`: replay the strategies (tuner.search.replay.Strategy) on a recording,
    read from `recording_path` or else from `db` (a tuner.db.database.Database, opened only
    then), with cuBLAS added at `cublas_ratio` times each shape's best if given, each
    measure seen with `noise` (tuner.search.replay.Noise), and report
    the median curves, where the stopping rules ended the studies and the model's first pick
    to `out`."""
    from tuner.search import replay as replays
    from tuner.search import replay_report as report

    if recording_path:
        recording = replays.Recording.load(recording_path)
    else:
        recording = recording_from_db(db.store, device_selector, reporter)
    if not recording.shapes:
        raise replays.ReplayError("the recording holds no shape measured exhaustively")
    if save_recording:
        recording.save(save_recording)
    cublas = ""
    if cublas_ratio is not None:
        recording = replays.Recording(recording.device, tuple(
            replays.with_library(r, cublas_ratio) for r in recording.shapes))
        cublas = f", cuBLAS added at {cublas_ratio:g}x each shape's best"
    curves = replays.compare(recording, strategies, seeds, trials, in_flight, jobs, noise)
    noisy = f", measures seen with {noise:.1%} noise" if noise else ""
    out(f"# search strategies replayed on {len(recording.shapes)} recorded shapes "
        f"({recording.device.name}), {seeds} seeds, {in_flight} configs in flight"
        f"{cublas}{noisy}\n")
    out("median fraction of the exhaustive best found after n measured configs\n")
    out(report.curves_table(curves, trials))
    out("\n## where the studies ended\n")
    out("configs measured until the strategy's stopping rules (tuner/search/stopping.py) or "
        "--trials ended it, polish steps included, and the fraction of the best found\n")
    out(report.stops_table(curves))
    out("\n## the analytical model's first pick\n")
    out(report.model_quality_table(recording))
    if plot_path:
        report.plot(curves, trials, Path(plot_path), f"{recording.device.name}: "
                    f"{len(recording.shapes)} shapes, {seeds} seeds")
