"""The `tune` command line: run, export, show, suggest, replay, buckets, validate, lookup.

Each command parses its options and calls one library function. The database a command
names with --db is a tuner.db.database.Database on the click context (`ctx.obj`), opened on
first use: `tune --help`, and a command refusing its input, open none.

Heavy imports (triton, the kernels, optuna, sqlalchemy) happen inside the commands: `tune run
--backend interpret` must set TRITON_INTERPRET before triton is first imported.
"""
from __future__ import annotations

import functools
import math
import os
import re
import sys

import click

from tuner.dtypes import DTYPES
from tuner.errors import UsageError, UserError
from tuner.objective import DEFAULT_LAUNCH, LAUNCH_MODES
from tuner.reporting import STDERR
from tuner.search.budget import (
    DEFAULT_PATIENCE,
    DEFAULT_POLISH,
    DEFAULT_TRIALS,
    REFERENCE_PATIENCE,
    REFERENCE_POLISH,
)
from tuner.shapes import LAYOUTS, load_shapes, parse_m_values, swept_m

# SQLite URLs of an in-memory database: gone when the command ends, with nothing tuned kept.
_IN_MEMORY_SQLITE = re.compile(r"sqlite(\+\w+)?://(/(:memory:)?)?(\?.*)?")


def _use_db(create: bool):
    """A --db callback putting the command's database, unopened, on the context for the
    command to take; `create`: the command may create it (tuner.db.database.Database)."""
    def use(ctx: click.Context, param, url: str | None) -> None:
        from tuner.db.database import Database
        from tuner.db.urls import masked_url
        if url is not None and not url.strip():
            raise click.BadParameter("expected a database URL such as sqlite:///tune.db, "
                                     "got ''", ctx, param)
        if url is not None and _IN_MEMORY_SQLITE.fullmatch(url.strip()):
            raise click.BadParameter(f"{masked_url(url)!r} is an in-memory database, gone when "
                                     "the command ends; expected a file, e.g. sqlite:///tune.db",
                                     ctx, param)
        from tuner.db.session import DatabaseError, parse_url
        try:
            if url is not None:
                parse_url(url)
        except DatabaseError as e:
            raise click.BadParameter(str(e), ctx, param) from None
        ctx.obj = Database(url, create)
    return use


class FiniteFloatRange(click.FloatRange):
    """click.FloatRange refusing nan and inf (nan passes every comparison's bound check)."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"expected a finite number, got {value!r}", param, ctx)
        return number


class OutputPath(click.Path):
    """A file the command writes, checked when parsed, before any work: one that could not
    be written (tuner.formats.files.check_writable) fails as the write would, exit 1."""

    def __init__(self):
        super().__init__(dir_okay=False)

    def convert(self, value, param, ctx):
        from tuner.formats.files import OutputError, check_writable
        path = super().convert(value, param, ctx)
        try:
            check_writable(path)
        except OutputError as e:
            raise click.ClickException(str(e)) from None
        return path


OUTPUT_PATH = OutputPath()
# Seeds numpy and Optuna's samplers take.
SEED_TYPE = click.IntRange(min=0, max=2**32 - 1)


def _db_option(create: bool):
    return click.option(
        "--db", "db_url", envvar="TUNE_DB", default=None, metavar="URL", expose_value=False,
        callback=_use_db(create),
        help="SQLAlchemy database URL [default: sqlite:///tune.db; env: TUNE_DB].")


db_option = _db_option(create=False)  # commands that read: an existing database of ours
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
    type=FiniteFloatRange(min=0, min_open=True),
    help="Seconds one config may compile; past it the trial is a 'timeout'.")


def one_line_errors(command):
    """Turn the tool's own input and environment errors into click's one-line 'Error: ...'
    (exit 1; a UsageError exits 2, as click's own usage errors do)."""
    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except UsageError as e:
            raise click.UsageError(str(e)) from None
        except UserError as e:
            raise click.ClickException(str(e)) from None
        except Exception as e:
            refused = _database_refusal(e)
            if refused is None:
                raise
            raise click.ClickException(refused) from None
    return wrapper


def _database_refusal(error: BaseException) -> str | None:
    """One line for an error the database raised on us (read-only file, disk full, locked),
    found in the chain Optuna and SQLAlchemy wrap it in; None for anything else (a bug)."""
    seen = 0
    while error is not None and seen < 8:
        if any(c.__module__ == "sqlalchemy.exc" and c.__name__ == "OperationalError"
               for c in type(error).__mro__):
            from tuner.db.urls import masked_message
            first = str(getattr(error, "orig", None) or error).splitlines()[0]
            ctx = click.get_current_context(silent=True)
            db = getattr(ctx, "obj", None)
            if db is None:
                return f"the database: {first}"
            return f"database {db.shown_url}: {masked_message(first, db.url)}"
        error, seen = error.__cause__ or error.__context__, seen + 1
    return None


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


def _m_values(ctx, param, text: str | None) -> tuple[int, ...]:
    """--m's values (tuner.shapes.parse_m_values), () where not given."""
    if text is None:
        return ()
    try:
        return parse_m_values(text)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def m_option(what: str):
    """--m: the shapes file's (N, K, dtype, layout) swept over M, for `what` to do."""
    return click.option(
        "--m", "m_values", default=None, metavar="1,2,4|1-4096", callback=_m_values,
        help=f"{what} each (N, K, dtype, layout) of --shapes at these M instead of the file's "
             "(serving's varying batch × tokens): integers, and ranges LO-HI meaning LO, "
             "2·LO, 4·LO, ... up to HI. Each swept shape weighs its group's total weight.")


@main.command()
@click.option("--shapes", "shapes_path", required=True, type=click.Path(dir_okay=False),
              help="CSV with header M,N,K,dtype[,layout][,weight].")
@m_option("Tune")
@click.option("--space", "space_paths", multiple=True, type=click.Path(dir_okay=False),
              help="A search-space YAML replacing the built-in one for its kernel (repeatable).")
@click.option("--trials", default=DEFAULT_TRIALS, show_default=True,
              type=click.IntRange(min=1),
              help="Trials per study (one study per bucketed key), at most.")
@click.option("--budget-s", "budget_s", default=None, type=FiniteFloatRange(min=1),
              help="Seconds each study may search, at most, keeping the best found (its "
                   "final re-timing follows); at least 1.")
@click.option("--timeout", "timeout_s", default=None, type=FiniteFloatRange(min=1),
              help="Deprecated: the old name of --budget-s.")
@click.option("--run-budget-s", "run_budget_s", default=None, type=FiniteFloatRange(min=1),
              help="Seconds the whole run may tune: the study under way ends as --budget-s "
                   "would, and the studies not started are left for the same command to "
                   "resume.")
@click.option("--patience", default=DEFAULT_PATIENCE, show_default=True,
              type=click.IntRange(min=1),
              help="Stop a study after this many trials in a row without a gain beyond the "
                   "noise of the timings compared.")
@click.option("--polish", default=DEFAULT_POLISH, show_default=True, type=click.IntRange(min=0),
              help="Trials past the sampler's that step from a study's best config to its "
                   "neighbours, one parameter at a time (0: none).")
@click.option("--early-stop/--no-early-stop", default=True, show_default=True,
              help="End a study where nothing untried can win: cuBLAS and the model's top "
                   "configs measured first, then the model, calibrated by them, bounds the "
                   "rest; a key next to tuned ones ends once their winners are measured; a "
                   "stopped search leaves its configs in flight unmeasured. The search "
                   f"before them: --no-early-stop --patience {REFERENCE_PATIENCE} --polish "
                   f"{REFERENCE_POLISH}.")
@click.option("--seed", default=0, show_default=True, type=SEED_TYPE,
              help="Seed of the sampler and inputs.")
@_db_option(create=True)
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
@click.pass_obj
@one_line_errors
def run(db, shapes_path, m_values, space_paths, trials, budget_s, timeout_s, run_budget_s,
        patience, polish, early_stop, seed, retune, backend_name, devices_text, jobs, batch,
        sampler, exhaustive, launch, compile_timeout_s):
    """Tune every shape listed in --shapes (or, with --m, swept over M) and store every trial
    in the database."""
    from tuner.search.budget import StudyBudget
    from tuner.tuning import Workers, tune_run

    if timeout_s is not None:
        if budget_s is not None:
            raise click.UsageError("--timeout is the old name of --budget-s: give one")
        click.echo("warning: --timeout is deprecated and goes in the next release; use "
                   "--budget-s", err=True)
        budget_s = timeout_s

    shapes = load_shapes(shapes_path)
    if m_values:
        try:
            shapes = swept_m(shapes, m_values)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="'--m'") from None
    workers = Workers(backend_name, jobs, compile_timeout_s, _device_list(devices_text))
    budget = StudyBudget(trials, budget_s, seed, batch or workers.default_batch, patience,
                         sampler, exhaustive, launch, polish, early_stop)
    summary = tune_run(db, shapes, space_paths, budget, workers, sys.argv, retune, STDERR,
                       run_budget_s)
    unstarted = (f", not started (run budget spent) {len(summary.unstarted)}"
                 if summary.unstarted else "")
    click.echo(f"tuned {len(summary.tuned)}, already tuned {len(summary.skipped)}, "
               f"busy elsewhere {len(summary.busy)}, failed {len(summary.failed)}{unstarted}",
               err=True)
    if summary.failed:
        raise click.ClickException("no correct config found for: " + "; ".join(summary.failed))


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
@click.option("-o", "--output", required=True, type=OUTPUT_PATH,
              help="File to write (replaced atomically).")
@one_line_errors
def suggest(shapes_path, space_paths, device_name, fmt, output):
    """Export the analytical model's config per shape: no GPU, no trials, nothing measured."""
    if device_name is not None:
        from tuner.model.named_devices import known_device_error
        unknown = known_device_error(device_name)
        if unknown:
            raise click.BadParameter(unknown, param_hint="'--device'")
    from tuner.suggest import write_suggestions

    write_suggestions(load_shapes(shapes_path), space_paths, device_name, fmt, output,
                      STDERR)


@main.command()
@click.option("--recording", "recording_path", type=click.Path(dir_okay=False),
              help="A recording (gzipped JSON) to replay, instead of reading --db.")
@db_option
@device_option
@click.option("--save-recording", type=OUTPUT_PATH,
              help="Also write the recording read from --db to this file.")
@click.option("--strategies", default="tune-run,tune-run-before,random,tpe,tpe-multivariate,"
              "gp,model,model+tpe,model+tpe-multivariate,model+gp", show_default=True,
              help="Comma-separated strategies to compare (tuner/search/replay.py): "
                   "tune-run is `tune run`'s defaults, stopping rules included; "
                   "tune-run-before the search before them (--no-early-stop --patience "
                   f"{REFERENCE_PATIENCE} --polish {REFERENCE_POLISH}).")
@click.option("--cublas", "cublas_ratio", default=None, type=FiniteFloatRange(min=0,
                                                                               min_open=True),
              metavar="RATIO",
              help="Add cuBLAS to each recorded shape at RATIO times its best TF/s (> 1: "
                   "cuBLAS wins): recordings of Triton configs alone, replayed where cuBLAS "
                   "wins or loses.")
@click.option("--noise", default=0.0, show_default=True,
              type=FiniteFloatRange(min=0, max=1), metavar="SPREAD",
              help="Replay each measure off by a seeded log-normal factor of this relative "
                   "spread (its p20-p80 says so), as short kernels' timings are: 0 takes the "
                   "recorded medians as exact.")
@click.option("--seeds", default=20, show_default=True, type=click.IntRange(min=1))
@click.option("--trials", default=40, show_default=True, type=click.IntRange(min=1))
@click.option("--in-flight", default=16, show_default=True, type=click.IntRange(min=1),
              help="Configs in flight per study, as `tune run --batch`.")
@click.option("--jobs", default=os.cpu_count() or 1, show_default="CPU cores",
              type=click.IntRange(min=1), help="Processes replaying in parallel.")
@click.option("--plot", "plot_path", type=OUTPUT_PATH,
              help="Draw the median curves to this PNG (needs matplotlib).")
@click.pass_obj
@one_line_errors
def replay(db, recording_path, device_selector, save_recording, strategies, cublas_ratio,
           noise, seeds, trials, in_flight, jobs, plot_path):
    """Compare search strategies on recorded timings (`tune run --exhaustive`): no GPU."""
    from tuner.reports import replay_strategies
    from tuner.search.replay import STRATEGIES

    if recording_path and save_recording:
        raise click.UsageError("--save-recording writes the recording read from --db; "
                               "with --recording there is none to save")
    chosen = []
    for name in strategies.split(","):
        if name not in STRATEGIES:
            raise click.BadParameter(f"unknown strategy {name!r}: choose from "
                                     f"{', '.join(STRATEGIES)}", param_hint="--strategies")
        chosen.append(STRATEGIES[name])
    replay_strategies(db, recording_path,
                      device_selector, save_recording, chosen, seeds, trials, in_flight, jobs,
                      plot_path, click.echo, STDERR, cublas_ratio, noise)


# What the deprecated `tune export --format X` names, as subcommands.
_EXPORT_FORMATS = {"table": "table", "expand": "expand", "flaggems-tune-configs": "tune-configs"}


def _format_given(args: list[str]) -> tuple[str | None, list[str]]:
    """The value of a --format option among `args`, and the args without it."""
    rest, fmt, i = [], None, 0
    while i < len(args):
        arg = args[i]
        if arg == "--format" and i + 1 < len(args):
            fmt, i = args[i + 1], i + 2
            continue
        if arg.startswith("--format="):
            fmt = arg.partition("=")[2]
        else:
            rest.append(arg)
        i += 1
    return fmt, rest


class ExportGroup(click.Group):
    """`tune export`'s subcommands, one per file format. For one release the old form, `tune
    export [--format X] OPTIONS` (X: table by default), still runs `tune export X OPTIONS`,
    after one deprecation line on standard error."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or args[0] in self.commands or args[0] in ctx.help_option_names:
            return super().parse_args(ctx, args)
        fmt, rest = _format_given(args)
        name = _EXPORT_FORMATS.get(fmt or "table")
        if name is None:
            raise click.BadParameter(f"{fmt!r} is not one of "
                                     f"{', '.join(map(repr, _EXPORT_FORMATS))}",
                                     ctx, param_hint="'--format'")
        given = "`tune export --format`" if fmt else "`tune export` without a format"
        click.echo(f"warning: {given} is deprecated and goes in the next release; use "
                   f"`tune export {name}`", err=True)
        return super().parse_args(ctx, [name, *rest])


output_option = click.option("-o", "--output", required=True, type=OUTPUT_PATH,
                             help="File to write (replaced atomically).")


def selection_options(command):
    """--device, --exact and --launch: which of the database's picks an export ships."""
    for option in reversed((
            device_option,
            click.option("--exact", is_flag=True,
                         help="One row per tuned key even where `tune buckets` chose shared "
                              "configs."),
            click.option("--launch", type=click.Choice(LAUNCH_MODES), default=None,
                         show_default="the mode `tune run` used; eager if unknown",
                         help="Pick each key's winner among its stored trials by this figure: "
                              "eager, time per back-to-back call; graph, device time. No "
                              "re-tuning."))):
        command = option(command)
    return command


def flaggems_options(command):
    """--with-splitk, --allow-cpu and --table: the options of both FlagGems files."""
    for option in reversed((
            click.option("--with-splitk", is_flag=True,
                         help="Also write mm_splitk (FlagGems 5.x's ConfigLoader has no such "
                              "op)."),
            click.option("--allow-cpu", is_flag=True,
                         help="Allow CPU interpreter results under a GPU file name (e.g. "
                              "mm_hopper_expand.yaml)."),
            click.option("--table", "table_path",
                         type=click.Path(dir_okay=False, exists=True),
                         help="Convert this table file (`tune export table`) instead of "
                              "reading the database."))):
        command = option(command)
    return command


@main.group(cls=ExportGroup)
def export():
    """Write the winners of one device for deployments: per kernel, the buckets of its latest
    `tune buckets` decision if there is one, else every tuned key. (`tune export --format X`
    still runs `tune export X` in this release, deprecated.)"""


@export.command("table")
@output_option
@db_option
@selection_options
@click.option("--merge", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="Add the entries of this table (e.g. a runtime online cache, "
                   "<expand>.online.yaml) for buckets the database lacks; repeatable.")
@click.pass_obj
@one_line_errors
def export_table(db, output, device_selector, exact, launch, merge):
    """The exact winners, one row per key, for tuner.runtime."""
    from tuner.export import writers
    from tuner.export.picks import Selection

    writers.export_table(db.store, output, Selection(device_selector, exact, launch),
                         merge, STDERR)


@export.command("expand")
@output_option
@db_option
@selection_options
@click.option("--max-configs", default=16, show_default=True, type=click.IntRange(min=0),
              help="The most configs each op's value lists may multiply to (what FlagGems "
                   "times on a key's first call), chosen for the least regret against each "
                   "tuned shape's winner; 0 keeps the winners' union.")
@flaggems_options
@click.option("--time-missing", is_flag=True,
              help="Time on this machine's device, beside each tuned shape's winner, the "
                   "config the bounded lists answer it with where only the model priced it, "
                   "then narrow again (at most 3 rounds); from a database the timings are "
                   "stored as cross timings for later exports.")
@backend_option
@click.option("--devices", "devices_text", default=None, metavar="0,1,...",
              help="(--time-missing) GPUs to time on [default: all visible; the first is "
                   "used].")
@jobs_option
@compile_timeout_option
@click.option("--seed", default=0, show_default=True, type=SEED_TYPE,
              help="(--time-missing) Seed of the inputs.")
@click.pass_obj
@one_line_errors
def export_expand(db, output, device_selector, exact, launch, max_configs, with_splitk,
                  allow_cpu, table_path, time_missing, backend_name, devices_text, jobs,
                  compile_timeout_s, seed):
    """FlagGems' expand schema, each op's value lists bounded by --max-configs."""
    timing = None
    if time_missing:
        from tuner.tuning import Workers

        workers = Workers(backend_name, jobs, compile_timeout_s, _device_list(devices_text))
        devices = workers.check()  # before anything imports triton

        from tuner.export.time_missing import TimeMissing

        timing = TimeMissing(workers, devices, seed)
    from tuner.export.picks import Selection
    from tuner.export.writers import EXPAND, FlagGemsOptions

    _write_flaggems(db, EXPAND, output, table_path, Selection(device_selector, exact, launch),
                    FlagGemsOptions(max_configs, with_splitk, allow_cpu, timing))


@export.command("tune-configs")
@output_option
@db_option
@selection_options
@flaggems_options
@click.pass_obj
@one_line_errors
def export_tune_configs(db, output, device_selector, exact, launch, with_splitk, allow_cpu,
                        table_path):
    """The exact winners as FlagGems' tune_configs.yaml op list."""
    from tuner.export.picks import Selection
    from tuner.export.writers import TUNE_CONFIGS, FlagGemsOptions

    _write_flaggems(db, TUNE_CONFIGS, output, table_path,
                    Selection(device_selector, exact, launch),
                    FlagGemsOptions(with_splitk=with_splitk, allow_cpu=allow_cpu))


def _write_flaggems(db, fmt: str, output: str, table_path: str | None, selection,
                    options) -> None:
    """A FlagGems file (tuner.export.writers.FlagGemsOptions `options`) of the table file at
    `table_path`, else of the database's picks (tuner.export.picks.Selection `selection`)."""
    from tuner.export.writers import export_device_file, export_table_file

    if table_path is not None:
        export_table_file(table_path, fmt, output, options, STDERR)
    else:
        export_device_file(db.store, fmt, output, selection, options,
                           db.shown_url, STDERR)


@main.command()
@db_option
@device_option
@click.option("--failures", is_flag=True,
              help="List the configs remembered as failing instead (skipped by later runs).")
@click.pass_obj
@one_line_errors
def show(db, device_selector, failures):
    """List the winners: shape, config (`cublas` where torch's own GEMM won), device time,
    host time per eager call, TFLOP/s and speed relative to cuBLAS."""
    from rich.console import Console

    from tuner.reports import show_table

    Console().print(show_table(db.store, device_selector, failures, STDERR))


@main.command()
@click.option("--shapes", "shapes_path", required=True, type=click.Path(dir_okay=False),
              help="CSV with header M,N,K,dtype[,layout][,weight]; every shape tuned already.")
@m_option("Bucket (as `tune run --m` tuned them)")
@click.option("--max-regret", default=0.02, show_default=True,
              type=FiniteFloatRange(min=0),
              help="The most any listed shape may lose by sharing a config (0.02: 2% slower "
                   "than its own winner).")
@click.option("--strategy", "candidates", multiple=True, metavar="NAME",
              help="A candidate strategy for each searched field (repeatable, finest first; "
                   "start with default) [default: tuner.bucketing.search.DEFAULT_CANDIDATES].")
@db_option
@device_option
@click.option("--seed", default=0, show_default=True, type=SEED_TYPE,
              help="Seed of the inputs.")
@backend_option
@jobs_option
@compile_timeout_option
@click.pass_obj
@one_line_errors
def buckets(db, shapes_path, m_values, max_regret, candidates, device_selector, seed,
            backend_name, jobs, compile_timeout_s):
    """Choose which listed shapes share a config: each shape is timed with the winners of the
    shapes it could share a bucket with, then the smallest bucketing (rows plus single shapes
    in widened buckets) whose worst regret is within --max-regret is stored for `tune export`,
    with its Pareto table. With --m, M is bucketed so that every M up to the largest swept
    one falls in a bucket of a swept shape."""
    from tuner.tuning import Workers

    workers = Workers(backend_name, jobs, compile_timeout_s)
    devices = workers.check()  # before anything imports triton

    from tuner.bucketing.job import choose_buckets

    choose_buckets(db, shapes_path, max_regret, candidates, device_selector, seed, workers,
                   devices, click.echo, STDERR, m_values)


@main.command()
@click.option("--config", "table_path", required=True, type=click.Path(dir_okay=False,
                                                                      exists=True),
              help="The exported table (`tune export table`) to validate.")
@click.option("--shapes", "shapes_path", required=True, type=click.Path(dir_okay=False),
              help="Hold-out CSV: shapes the table was not tuned on.")
@click.option("--trials", default=24, show_default=True, type=click.IntRange(min=1),
              help="Trials of each hold-out shape's fresh tune (the reference).")
@click.option("-o", "--output", type=OUTPUT_PATH,
              help="Also write the report here (replaced atomically).")
@click.option("--db", "db_url", envvar="TUNE_VALIDATE_DB", default="sqlite:///validate.db",
              show_default=True, metavar="URL", expose_value=False, callback=_use_db(create=True),
              help="Where the fresh tunes go [env: TUNE_VALIDATE_DB]; not the tuning database "
                   "(nor TUNE_DB), so the hold-out winners never reach a later export.")
@click.option("--seed", default=0, show_default=True, type=SEED_TYPE,
              help="Seed of the sampler and inputs.")
@backend_option
@jobs_option
@compile_timeout_option
@click.pass_obj
@one_line_errors
def validate(db, table_path, shapes_path, trials, output, seed, backend_name, jobs,
             compile_timeout_s):
    """Time each hold-out shape with the config the runtime would pick from --config against
    a fresh short tune of that shape; report the regret per shape, its geomean and maximum."""
    from tuner.tuning import Workers

    workers = Workers(backend_name, jobs, compile_timeout_s)
    devices = workers.check()  # before anything imports triton

    from tuner.validate import validate_table

    click.echo(validate_table(db, table_path, shapes_path, trials, seed, workers, devices,
                              sys.argv, output))


@main.command()
@click.argument("M", type=click.IntRange(min=1))
@click.argument("N", type=click.IntRange(min=1))
@click.argument("K", type=click.IntRange(min=1))
@click.option("--dtype", required=True, type=click.Choice(list(DTYPES)))
@click.option("--layout", default="nn", show_default=True, type=click.Choice(LAYOUTS),
              help="A then B: n as written, t transposed (nt: x @ W.T, nn.Linear's).")
@click.option("--table", "table_path", type=click.Path(dir_okay=False, exists=True),
              help="The table or expand file to ask [default: $TUNE_CONFIG].")
@one_line_errors
def lookup(m, n, k, dtype, layout, table_path):
    """Print the config tuner.matmul would launch for an M×N×K call, the fallback step that
    chose it and the bucket it came from: no GPU, nothing compiled (honours TUNE_EXCLUDE)."""
    from tuner.runtime.explain import explain

    try:
        lines = explain(m, n, k, dtype, layout, table_path)
    except ValueError as e:  # TUNE_EXCLUDE's unknown names, a key past the kernels' sizes
        raise click.ClickException(str(e)) from None
    click.echo("\n".join(lines))


@main.group("db")
def db_group():
    """The tuning database itself: its schema version."""


@db_group.command("upgrade")
@db_option
@click.pass_obj
@one_line_errors
def db_upgrade(db):
    """Upgrade the database's schema to this gemm-tuner's (any command opening it does too);
    a database written by a newer gemm-tuner is refused."""
    from tuner.db.database import upgrade_database

    before, head = upgrade_database(db.url)
    state = "already current" if before == head else "upgraded"
    STDERR.note(f"database {db.shown_url}: schema at revision {head} ({state})")
