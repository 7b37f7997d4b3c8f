"""The `tune` command line: run, export, show, suggest.

Heavy imports (triton, the kernels, optuna, sqlalchemy) happen inside the commands: `tune run
--backend interpret` must set TRITON_INTERPRET before triton is first imported.
"""
from __future__ import annotations

import functools
import os
import signal
import sys

import click

from tuner.errors import UserError
from tuner.objective import DEFAULT_LAUNCH, GRAPH, LAUNCH_MODES
from tuner.shapes import load_shapes

# Configs in flight per study unless --batch says otherwise: enough compiling at once to keep
# one GPU measuring, few enough that the sampler still learns from most of what it proposed.
MAX_DEFAULT_BATCH = 16

db_option = click.option(
    "--db", "db_url", envvar="TUNE_DB", default=None, metavar="URL",
    help="SQLAlchemy database URL [default: sqlite:///tune.db; env: TUNE_DB].")
device_option = click.option(
    "--device", "device_selector", default=None, metavar="NAME",
    help="Which device's winners (part of its name, or a fingerprint prefix); needed only "
         "when the database holds several.")


backend_option = click.option(
    "--backend", "backend_name", type=click.Choice(["gpu", "interpret"]), default="gpu",
    show_default=True,
    help="interpret: run on the CPU through Triton's interpreter (correctness is real, "
         "timings are not GPU timings and are stored apart).")
jobs_option = click.option(
    "--jobs", default=os.cpu_count() or 1, show_default="CPU cores", type=click.IntRange(min=1),
    help="Processes compiling configs in parallel.")
compile_timeout_option = click.option(
    "--compile-timeout", "compile_timeout_s", default=120.0, show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds one config may compile; past it the trial is a 'timeout'.")


def one_line_errors(command):
    """Turn the tool's own input and environment errors into click's one-line 'Error: ...'."""
    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except UserError as e:
            raise click.ClickException(str(e)) from None
    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="gemm-tuner")
def main():
    """gemm-tuner: autotune Triton GEMM kernels for your model's shapes, and keep the results."""


def _device_list(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        devices = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise click.BadParameter(f"expected comma-separated GPU indices like 0,1, got {text!r}",
                                 param_hint="--devices") from None
    if not devices or len(set(devices)) != len(devices) or min(devices) < 0:
        raise click.BadParameter(f"expected distinct GPU indices, got {text!r}",
                                 param_hint="--devices")
    return devices


@main.command()
@click.option("--shapes", "shapes_path", required=True, type=click.Path(dir_okay=False),
              help="CSV with header M,N,K,dtype[,layout][,weight].")
@click.option("--space", "space_paths", multiple=True, type=click.Path(dir_okay=False),
              help="A search-space YAML replacing the built-in one for its kernel (repeatable).")
@click.option("--trials", default=40, show_default=True, type=click.IntRange(min=1),
              help="Trials per study (one study per bucketed key).")
@click.option("--timeout", "timeout_s", default=None, type=click.FloatRange(min=0, min_open=True),
              help="Seconds per study, at most.")
@click.option("--patience", default=24, show_default=True, type=click.IntRange(min=1),
              help="Stop a study after this many trials in a row without a 0.5% gain "
                   "(replayed on an H200 recording: 20% fewer trials than 40, same median; "
                   "benchmarks/results/h200-issue5).")
@click.option("--seed", default=0, show_default=True, help="Seed of the sampler and inputs.")
@db_option
@click.option("--retune", is_flag=True, help="Tune keys again even if already tuned.")
@backend_option
@click.option("--devices", "devices_text", default=None, metavar="0,1,...",
              help="GPUs to tune on, one worker each, shapes spread over them [default: all "
                   "visible].")
@jobs_option
@click.option("--batch", default=None, type=click.IntRange(min=1),
              help="Configs in flight per study: asked of the sampler, compiling or waiting "
                   "to be measured [default: --jobs, at most 16].")
@click.option("--sampler", default="tpe", show_default=True,
              type=click.Choice(["tpe", "tpe-multivariate", "gp", "random"]),
              help="Search strategy of each study (tuner/search/samplers.py; compare them on "
                   "recorded timings with `tune replay`).")
@click.option("--exhaustive", is_flag=True,
              help="Measure every feasible config of each study's space (--trials is then "
                   "ignored): a recording for `tune replay`.")
@click.option("--launch", type=click.Choice(LAUNCH_MODES), default=DEFAULT_LAUNCH,
              show_default=True,
              help="What each study optimises: eager, the time per call of back-to-back eager "
                   "calls (host launch path included); graph, the kernel's device time (calls "
                   "replayed from a CUDA graph). Both are stored for every trial.")
@compile_timeout_option
@one_line_errors
def run(shapes_path, space_paths, trials, timeout_s, patience, seed, db_url, retune, backend_name,
        devices_text, jobs, batch, sampler, exhaustive, launch, compile_timeout_s):
    """Tune every shape listed in --shapes and store every trial in the database."""
    shapes = load_shapes(shapes_path)
    devices = _backend_devices(backend_name, devices_text)

    from tuner.db.session import optuna_storage, resolve_url, session_factory
    from tuner.db.store import Store
    from tuner.execution.executor import Executor, ExecutorOptions
    from tuner.kernels import kernel_for
    from tuner.search.pipeline import TuneJob
    from tuner.search.planning import plan_studies
    from tuner.search.progress import RichReporter
    from tuner.search.study import StudyBudget

    spaces = _load_spaces(space_paths)
    plans = plan_studies(shapes, spaces, kernel_for)
    url = resolve_url(db_url)
    store = Store(session_factory(url))
    storage = optuna_storage(url)
    # A SIGTERM (a job scheduler, `timeout`) ends the run like Ctrl-C: marked interrupted, with
    # every finished trial already committed; the same command resumes it.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    executor = Executor(ExecutorOptions(backend_name, devices, jobs, compile_timeout_s))
    try:
        sizes = ", ".join(f"{n} {spaces[n].size}" for n in sorted({p.kernel for p in plans}))
        where = f"GPUs {','.join(map(str, devices))}" if devices else "the CPU interpreter"
        click.echo(f"{len(shapes)} shapes -> {len(plans)} studies on {where}, {trials} trials "
                   f"each (configs in space: {sizes})", err=True)
        with RichReporter(len(plans)) as reporter:
            budget = StudyBudget(trials, timeout_s, seed, batch or min(jobs, MAX_DEFAULT_BATCH),
                                 patience, sampler, exhaustive, launch)
            job = TuneJob(store, storage, executor, spaces, budget, retune, reporter)
            summary = job.run(plans, sys.argv)
    finally:
        executor.close()
    click.echo(f"tuned {len(summary.tuned)}, already tuned {len(summary.skipped)}, "
               f"busy elsewhere {len(summary.busy)}, failed {len(summary.failed)}", err=True)
    if summary.failed:
        raise click.ClickException("no correct config found for: " + "; ".join(summary.failed))


def _backend_devices(backend_name: str, devices_text: str | None) -> tuple[int, ...]:
    """The GPUs to work on (none for the interpreter), after checking the backend can run:
    a GPU must be visible, and the interpreter must be chosen before triton is imported."""
    devices = _device_list(devices_text)
    if backend_name == "gpu":
        from tuner.execution.backends import require_gpu, visible_gpus
        require_gpu()
        return devices or tuple(visible_gpus())
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        raise click.ClickException("--backend interpret: triton was imported before "
                                   "TRITON_INTERPRET could be set")
    os.environ["TRITON_INTERPRET"] = "1"
    return ()


def _load_spaces(space_paths):
    """The built-in search spaces, with each --space file replacing its kernel's."""
    from tuner.kernels import kernel_variants
    from tuner.space import builtin_spaces, load_space

    variants = kernel_variants()
    own = {space.kernel: space for space in (load_space(p, variants) for p in space_paths)}
    return builtin_spaces(variants, skip=frozenset(own)) | own


@main.command()
@click.option("--shapes", "shapes_path", required=True, type=click.Path(dir_okay=False),
              help="CSV with header M,N,K,dtype[,layout][,weight].")
@click.option("--space", "space_paths", multiple=True, type=click.Path(dir_okay=False),
              help="A search-space YAML replacing the built-in one for its kernel (repeatable).")
@click.option("--device", "device_name", default=None, metavar="NAME",
              help="GPU to model, as torch names it (e.g. 'NVIDIA H200') [default: the visible "
                   "GPU, else an H100 SXM].")
@click.option("--format", "fmt", type=click.Choice(["expand", "table"]), default="table",
              show_default=True)
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="File to write (replaced atomically).")
@one_line_errors
def suggest(shapes_path, space_paths, device_name, fmt, output):
    """Export the analytical model's config per shape: no GPU, no trials, nothing measured."""
    from tuner.export import expand_text, table_document, write_atomic, write_text_atomic
    from tuner.kernels import kernel_for, source_hashes
    from tuner.search.planning import plan_studies
    from tuner.suggest import model_device_block, suggest_device, suggested_picks

    shapes = load_shapes(shapes_path)
    spaces = _load_spaces(space_paths)
    plans = plan_studies(shapes, spaces, kernel_for)
    info, spec = suggest_device(device_name)
    picks, missing = suggested_picks(plans, spaces, spec)
    for label in missing:
        click.echo(f"note: no modelled config for {label}", err=True)
    if fmt == "expand":
        write_text_atomic(output, expand_text(picks))
    else:  # the model predicts kernel time, with no host cost: a graph-mode choice
        write_atomic(output, table_document(model_device_block(info, spec), picks,
                                            source_hashes(), GRAPH))
    click.echo(f"wrote {len(picks)} suggested configs for {spec.name} to {output} ({fmt})",
               err=True)


@main.command()
@click.option("--recording", "recording_path", type=click.Path(dir_okay=False),
              help="A recording (gzipped JSON) to replay, instead of reading --db.")
@db_option
@device_option
@click.option("--save-recording", type=click.Path(dir_okay=False),
              help="Also write the recording read from --db to this file.")
@click.option("--strategies", default="random,tpe,tpe-multivariate,gp,model,model+tpe,"
              "model+tpe-multivariate,model+gp", show_default=True,
              help="Comma-separated strategies to compare (tuner/search/replay.py).")
@click.option("--seeds", default=20, show_default=True, type=click.IntRange(min=1))
@click.option("--trials", default=40, show_default=True, type=click.IntRange(min=1))
@click.option("--in-flight", default=16, show_default=True, type=click.IntRange(min=1),
              help="Configs in flight per study, as `tune run --batch`.")
@click.option("--jobs", default=os.cpu_count() or 1, show_default="CPU cores",
              type=click.IntRange(min=1), help="Processes replaying in parallel.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="Draw the median curves to this PNG (needs matplotlib).")
@one_line_errors
def replay(recording_path, db_url, device_selector, save_recording, strategies, seeds, trials,
           in_flight, jobs, plot_path):
    """Compare search strategies on recorded timings (`tune run --exhaustive`): no GPU."""
    from pathlib import Path

    from tuner.search import replay as replays
    from tuner.search import replay_report as report

    chosen = []
    for name in strategies.split(","):
        if name not in replays.STRATEGIES:
            raise click.BadParameter(f"unknown strategy {name!r}: choose from "
                                     f"{', '.join(replays.STRATEGIES)}",
                                     param_hint="--strategies")
        chosen.append(replays.STRATEGIES[name])
    if recording_path:
        recording = replays.Recording.load(recording_path)
    else:
        recording = _recording_from_db(db_url, device_selector)
        if save_recording:
            recording.save(save_recording)
    if not recording.shapes:
        raise replays.ReplayError("the recording holds no shape measured exhaustively")
    curves = replays.compare(recording, chosen, seeds, trials, in_flight, jobs)
    click.echo(f"# search strategies replayed on {len(recording.shapes)} recorded shapes "
               f"({recording.device.name}), {seeds} seeds, {in_flight} configs in flight\n")
    click.echo("median fraction of the exhaustive best found after n measured configs\n")
    click.echo(report.curves_table(curves, trials))
    click.echo("\n## the analytical model's first pick\n")
    click.echo(report.model_quality_table(recording))
    if plot_path:
        report.plot(curves, trials, Path(plot_path), f"{recording.device.name}: "
                    f"{len(recording.shapes)} shapes, {seeds} seeds")


def _recording_from_db(db_url, device_selector):
    from tuner.db.session import session_factory
    from tuner.db.store import Store
    from tuner.search.replay import ReplayError, recording_from_store

    store = Store(session_factory(db_url))
    devices = store.devices_matching(device_selector)
    if len(devices) != 1:
        names = ", ".join(f"{d.name} [{d.fingerprint}]" for d in devices) or "none"
        raise ReplayError(f"--device must pick one device of the database (matching: {names})")
    recording, skipped = recording_from_store(store, devices[0])
    for line in skipped:
        click.echo(f"note: not exhaustive, left out: {line}", err=True)
    return recording


def _winners(db_url, device_selector):
    from tuner.db.session import session_factory
    from tuner.db.store import Store
    from tuner.export import current_only, select_device
    from tuner.kernels import source_hashes

    winners = Store(session_factory(db_url)).winners(with_trials=True)
    winners, stale = current_only(winners, source_hashes())
    if stale:
        click.echo(f"note: {stale} winners measured with older kernel source left out", err=True)
    return select_device(winners, device_selector)


@main.command()
@click.option("--format", "fmt", type=click.Choice(["expand", "table"]), default="table",
              show_default=True,
              help="expand: FlagGems' expand schema; table: exact winners for tuner.runtime.")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="File to write (replaced atomically).")
@db_option
@device_option
@click.option("--exact", is_flag=True,
              help="One row per tuned key even where `tune buckets` chose shared configs.")
@click.option("--launch", type=click.Choice(LAUNCH_MODES), default=None,
              show_default="the mode `tune run` used; eager if unknown",
              help="Pick each key's winner among its stored trials by this figure: eager, "
                   "time per back-to-back call; graph, device time. No re-tuning.")
@one_line_errors
def export(fmt, output, db_url, device_selector, exact, launch):
    """Write the winners of one device as YAML for deployments: per kernel, the buckets of
    its latest `tune buckets` decision if there is one, else every tuned key."""
    from tuner.db.session import session_factory
    from tuner.db.store import Store
    from tuner.export import (
        device_block,
        device_picks,
        expand_text,
        export_launch,
        table_document,
        write_atomic,
        write_text_atomic,
    )

    device, winners = _winners(db_url, device_selector)
    launch = export_launch(launch, winners)
    picks, notes = device_picks(Store(session_factory(db_url)), device, winners, launch, exact)
    for note in notes:
        click.echo(note, err=True)
    if fmt == "expand":
        write_text_atomic(output, expand_text(picks))
    else:
        write_atomic(output, table_document(device_block(device), picks, {
            w.kernel.name: w.kernel.source_hash for w in winners}, launch))
    click.echo(f"wrote {len(picks)} configs of {device.name} chosen for {launch} launch to "
               f"{output} ({fmt})", err=True)


@main.command()
@db_option
@device_option
@click.option("--failures", is_flag=True,
              help="List the configs remembered as failing instead (skipped by later runs).")
@one_line_errors
def show(db_url, device_selector, failures):
    """List the winners: shape, config (`cublas` where torch's own GEMM won), device time,
    host time per eager call, TFLOP/s and speed relative to cuBLAS."""
    from rich.console import Console
    from rich.table import Table

    from tuner.kernels.base import config_label

    if failures:
        _show_failures(db_url, device_selector)
        return
    device, winners = _winners(db_url, device_selector)
    table = Table(title=f"winners on {device.name} [{device.fingerprint}]")
    numbers = ("ms", "host µs", "TFLOP/s", "vs cuBLAS")
    for column in ("kernel", "tuned shape", "config", *numbers):
        # a narrow terminal wraps the other cells, never the shape that names the row
        table.add_column(column, justify="right" if column in numbers else "left",
                         no_wrap=column == "tuned shape")
    for w in winners:
        t, study = w.trial, w.study
        ratio = f"{study.baseline_ms / t.p50_ms:.2f}x" if study.baseline_ms else "-"
        host_us = "-" if t.host_us is None else f"{t.host_us:.1f}"
        table.add_row(w.kernel.name, study.shape_label, config_label(t.params),
                      f"{t.p50_ms:.4g}", host_us, f"{t.tflops:.4g}", ratio)
    Console().print(table)


def _show_failures(db_url, device_selector):
    from rich.console import Console
    from rich.table import Table

    from tuner.db.session import session_factory
    from tuner.db.store import Store
    from tuner.export import ExportError
    from tuner.kernels.base import config_label

    store = Store(session_factory(db_url))
    devices = store.devices_matching(device_selector)
    rows = store.failures([d.id for d in devices])
    if not rows:
        raise ExportError("no remembered failures" + (f" for device {device_selector!r}"
                                                      if device_selector else ""))
    table = Table(title=f"{len(rows)} configs remembered as failing")
    for column in ("kernel", "specialization", "config", "status", "reason"):
        table.add_column(column)
    for f in rows:
        table.add_row(f"{f.kernel.name} {f.kernel.source_hash[:8]}", f.specialization,
                      config_label(f.params), f.status, f.reason or "")
    Console().print(table)


@main.command()
@click.option("--shapes", "shapes_path", required=True, type=click.Path(dir_okay=False),
              help="CSV with header M,N,K,dtype[,layout][,weight]; every shape tuned already.")
@click.option("--max-regret", default=0.02, show_default=True, type=click.FloatRange(min=0),
              help="The most any listed shape may lose by sharing a config (0.02: 2% slower "
                   "than its own winner).")
@click.option("--strategy", "candidates", multiple=True, metavar="NAME",
              help="A candidate strategy for each searched field (repeatable, finest first; "
                   "start with default) [default: tuner.bucketing.search.DEFAULT_CANDIDATES].")
@db_option
@device_option
@click.option("--seed", default=0, show_default=True, help="Seed of the inputs.")
@backend_option
@jobs_option
@compile_timeout_option
@one_line_errors
def buckets(shapes_path, max_regret, candidates, db_url, device_selector, seed, backend_name,
            jobs, compile_timeout_s):
    """Choose which listed shapes share a config: each shape is timed with the winners of the
    shapes it could share a bucket with, then the smallest bucketing (rows plus single shapes
    in widened buckets) whose worst regret is within --max-regret is stored for `tune export`,
    with its Pareto table."""
    devices = _backend_devices(backend_name, None)  # before anything imports triton

    from rich.console import Console
    from rich.progress import Progress

    from tuner.bucketing.job import (
        SharingError,
        bucketing_record,
        distinct_shapes,
        exact_members,
        gather_times,
        pareto_markdown,
    )
    from tuner.bucketing.search import DEFAULT_CANDIDATES, SEARCHED_FIELDS, needed_configs, search
    from tuner.bucketing.strategies import strategy_function
    from tuner.db.session import session_factory
    from tuner.db.store import Store, params_key
    from tuner.execution.cross_timing import time_side_by_side
    from tuner.execution.executor import Executor, ExecutorOptions
    from tuner.kernels import KERNELS, kernel_for

    for name in candidates:
        strategy_function(name)  # a bad name is one line now, before any work
    per_field = {f: tuple(candidates or DEFAULT_CANDIDATES) for f in SEARCHED_FIELDS}
    shapes = distinct_shapes(load_shapes(shapes_path))
    store = Store(session_factory(db_url))
    device, winners = _winners(db_url, device_selector)
    members = exact_members(winners, shapes)
    by_kernel: dict[str, list] = {}
    for m in members:
        by_kernel.setdefault(kernel_for(m.shape.M, m.shape.N).name, []).append(m)
    kernel_rows = {w.kernel.name: w.kernel for w in winners}
    needed = {k: needed_configs(ms, per_field) for k, ms in by_kernel.items()}
    to_time = sum(any(params_key(c) not in store.cross_timings(device, kernel_rows[k], shape)
                      for c in configs)
                  for k, per_shape in needed.items() for shape, configs in per_shape.items())
    pairs = sum(len(c) for n in needed.values() for c in n.values())
    click.echo(f"{len(members)} shapes, {pairs} (shape, config) timings needed; {to_time} shapes "
               "to time", err=True)
    executor = None
    if to_time:
        executor = Executor(ExecutorOptions(backend_name, devices, jobs, compile_timeout_s))
    try:
        if executor is not None and executor.device_info().fingerprint != device.fingerprint:
            raise SharingError(f"the winners were measured on {device.name} "
                               f"[{device.fingerprint}], not on this machine's device")
        results = {}
        with Progress(console=Console(stderr=True)) as progress:
            task = progress.add_task("timing shapes", total=len(members))
            for kernel_name, kernel_needed in needed.items():
                times = gather_times(
                    store, device, kernel_rows[kernel_name], kernel_needed,
                    timer=lambda shape, configs, kernel=KERNELS[kernel_name]: time_side_by_side(
                        executor, kernel, shape, seed, configs),
                    on_shape=lambda shape: progress.advance(task))
                results[kernel_name] = search(by_kernel[kernel_name], times, per_field,
                                              max_regret, seed)
    finally:
        if executor is not None:
            executor.close()
    for kernel_name, result in results.items():
        buckets_json, pareto_json = bucketing_record(result)
        store.save_bucketing(device, kernel_rows[kernel_name], result.chosen.strategy,
                             max_regret, buckets_json, pareto_json, shapes_path)
        click.echo(pareto_markdown(kernel_name, result, max_regret) + "\n")
    click.echo("stored; `tune export` now writes one row per bucket", err=True)


@main.command()
@click.option("--config", "table_path", required=True, type=click.Path(dir_okay=False,
                                                                      exists=True),
              help="The exported table (`tune export --format table`) to validate.")
@click.option("--shapes", "shapes_path", required=True, type=click.Path(dir_okay=False),
              help="Hold-out CSV: shapes the table was not tuned on.")
@click.option("--trials", default=24, show_default=True, type=click.IntRange(min=1),
              help="Trials of each hold-out shape's fresh tune (the reference).")
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="Also write the report here (replaced atomically).")
@click.option("--db", "db_url", envvar="TUNE_VALIDATE_DB", default="sqlite:///validate.db",
              show_default=True, metavar="URL",
              help="Where the fresh tunes go [env: TUNE_VALIDATE_DB]; not the tuning database "
                   "(nor TUNE_DB), so the hold-out winners never reach a later export.")
@click.option("--seed", default=0, show_default=True, help="Seed of the sampler and inputs.")
@backend_option
@jobs_option
@compile_timeout_option
@one_line_errors
def validate(table_path, shapes_path, trials, output, db_url, seed, backend_name, jobs,
             compile_timeout_s):
    """Time each hold-out shape with the config the runtime would pick from --config against
    a fresh short tune of that shape; report the regret per shape, its geomean and maximum."""
    from pathlib import Path

    devices = _backend_devices(backend_name, None)  # before anything imports triton
    shapes = load_shapes(shapes_path)

    from tuner.bucketing.job import distinct_shapes
    from tuner.db.session import optuna_storage, session_factory
    from tuner.db.store import Store
    from tuner.execution.cross_timing import time_side_by_side
    from tuner.execution.executor import Executor, ExecutorOptions
    from tuner.export import current_only
    from tuner.kernels import KERNELS, kernel_for, source_hashes
    from tuner.search.pipeline import TuneJob
    from tuner.search.planning import plan_studies
    from tuner.search.progress import RichReporter
    from tuner.search.study import StudyBudget
    from tuner.validate import Validation, report, runtime_pick

    shapes = distinct_shapes(shapes)
    picks = {shape: runtime_pick(Path(table_path), shape) for shape in shapes}  # bad table: now
    spaces = _load_spaces(())
    plans = plan_studies(shapes, spaces, kernel_for)
    store = Store(session_factory(db_url))
    executor = Executor(ExecutorOptions(backend_name, devices, jobs, compile_timeout_s))
    try:
        with RichReporter(len(plans)) as reporter:
            # graph: the fresh winner is the reference for device-time regrets
            budget = StudyBudget(trials, None, seed, min(jobs, MAX_DEFAULT_BATCH), launch=GRAPH)
            TuneJob(store, optuna_storage(db_url), executor, spaces, budget, False,
                    reporter).run(plans, sys.argv)
        info = executor.device_info()
        current, _ = current_only(store.winners(), source_hashes())
        winners = {(w.kernel.name, tuple(w.key.values())): dict(w.trial.params)
                   for w in current if w.device.fingerprint == info.fingerprint}
        rows = []
        for plan in plans:
            tuned = winners.get((plan.kernel, tuple(plan.key.values())))
            for shape in plan.members:
                if tuned is None:
                    raise click.ClickException(f"the fresh tune of {shape} found no config")
                runtime, fresh = time_side_by_side(executor, KERNELS[plan.kernel], shape, seed,
                                                   [picks[shape].config, tuned])
                rows.append(Validation(shape, picks[shape], tuned, runtime, fresh))
    finally:
        executor.close()
    text = report(Path(table_path), rows, info.name, trials)
    click.echo(text)
    if output:
        from tuner.export import write_text_atomic
        write_text_atomic(output, text + "\n")
