"""`tune run`: tune listed shapes and store every trial; and the wiring the other jobs that
tune or time share with it (`tune validate`, `tune buckets`, `tune suggest`): the backend
check, the search spaces, the executor and a tuning job with its progress display.

Nothing heavy is imported at module level: `backend_devices` must run before triton is first
imported, since `--backend interpret` sets TRITON_INTERPRET.
"""
from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from tuner.errors import UsageError, UserError
from tuner.reporting import STDERR, Reporter
from tuner.search.budget import StudyBudget

# Configs in flight per study unless --batch says otherwise: enough compiling at once to keep
# one GPU measuring, few enough that the sampler still learns from most of what it proposed.
MAX_DEFAULT_BATCH = 16


class BackendError(UserError, RuntimeError):
    """The backend asked for cannot run in this process."""


@dataclass(frozen=True)
class Workers:
    """Where configs compile and run: --backend, --jobs, --compile-timeout and --devices."""
    backend: str
    jobs: int
    compile_timeout_s: float
    devices: tuple[int, ...] | None = None  # None: every visible GPU

    def check(self) -> tuple[int, ...]:
        """The GPUs to work on (none for the interpreter), after checking the backend can
        run: call before anything imports triton."""
        return backend_devices(self.backend, self.devices)

    def executor(self, devices: tuple[int, ...]):
        """A tuner.execution.executor.Executor on these devices (close it when done)."""
        from tuner.execution.executor import Executor, ExecutorOptions
        return Executor(ExecutorOptions(self.backend, devices, self.jobs, self.compile_timeout_s))

    @property
    def default_batch(self) -> int:
        """Configs in flight per study where `tune run --batch` does not say."""
        return min(self.jobs, MAX_DEFAULT_BATCH)


def backend_devices(backend_name: str, devices: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """The GPUs to work on (none for the interpreter), after checking the backend can run:
    a GPU must be visible, and the interpreter must be chosen before triton is imported."""
    if backend_name == "gpu":
        from tuner.execution.backends import require_gpu, visible_gpus
        require_gpu()
        return devices or tuple(visible_gpus())
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        raise BackendError("--backend interpret: triton was imported before "
                           "TRITON_INTERPRET could be set")
    os.environ["TRITON_INTERPRET"] = "1"
    return ()


def load_spaces(space_paths: Sequence[str] = ()) -> dict:
    """The built-in search spaces, with each --space file replacing its kernel's, less the
    variants $TUNE_EXCLUDE names (what the deployment will never launch is not measured)."""
    from tuner.kernels import kernel_variants
    from tuner.runtime.exclude import excluded_variants
    from tuner.space import builtin_spaces, load_space

    try:
        excluded = excluded_variants()
    except ValueError as e:
        raise UsageError(str(e)) from None

    variants = kernel_variants()
    own = {}
    for path in space_paths:
        space = load_space(path, variants)
        if space.kernel in own:
            raise UsageError(f"--space {own[space.kernel].source} and --space {path} are both "
                             f"for kernel {space.kernel}; give one space per kernel")
        own[space.kernel] = space
    spaces = builtin_spaces(variants, skip=frozenset(own)) | own
    return {kernel: space.without(excluded) for kernel, space in spaces.items()}


def tune_plans(db, executor, spaces: dict, plans: list, budget, retune: bool,
               command: list[str], run_budget_s: float | None = None):
    """Run the studies of the plans (tuner.search.pipeline.TuneJob) on `db` (a
    tuner.db.database.Database), within `run_budget_s` seconds if given, showing progress;
    the RunSummary."""
    from tuner.search.pipeline import TuneJob
    from tuner.search.progress import RichReporter

    with RichReporter(len(plans)) as reporter:
        job = TuneJob(db.store, db.optuna_storage, executor, spaces, budget, retune, reporter,
                      run_budget_s)
        return job.run(plans, command)


def tune_run(db, shapes: list, space_paths: Sequence[str], budget: StudyBudget,
             workers: Workers, command: list[str], retune: bool = False,
             reporter: Reporter = STDERR, run_budget_s: float | None = None):
    """`tune run`: tune every shape into `db` (a tuner.db.database.Database), each study
    within `budget` and the whole within `run_budget_s` seconds (tuned keys again with
    `retune`); the RunSummary. The reporter hears the one-line summary of the plan."""
    devices = workers.check()

    from tuner.kernels import kernel_for
    from tuner.search.planning import plan_studies

    spaces = load_spaces(space_paths)
    plans = plan_studies(shapes, spaces, kernel_for)
    db.store, db.optuna_storage  # noqa: B018 (opened now: a bad URL fails before any work)
    # A SIGTERM (a job scheduler, `timeout`) ends the run like Ctrl-C: marked interrupted, with
    # every finished trial already committed; the same command resumes it.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    executor = workers.executor(devices)
    try:
        sizes = ", ".join(f"{n} {spaces[n].size}" for n in sorted({p.kernel for p in plans}))
        where = f"GPUs {','.join(map(str, devices))}" if devices else "the CPU interpreter"
        reporter.note(f"{len(shapes)} shapes -> {len(plans)} studies on {where}, "
                      f"{budget.trials} trials each (configs in space: {sizes})")
        return tune_plans(db, executor, spaces, plans, budget, retune, command, run_budget_s)
    finally:
        executor.close()
