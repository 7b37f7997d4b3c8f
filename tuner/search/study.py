"""One Optuna study per bucketed key: ask configs, compile them in parallel, measure, tell.

The Optuna study lives in the tuning database (Optuna's RDB storage), beside our own trial
rows, so a run killed at any moment resumes: trials Optuna still shows as running are either
found among the stored trials (told again) or redone first (re-enqueued). The sampler is TPE,
seeded, with the constant liar so that the configs in flight at once spread out; each config
draws the variant first and then only that variant's parameters (SearchSpace.suggest). Configs
known to fail for this specialization are skipped without compiling or timing, and configs
found infeasible before compiling do not count against the trial budget. A new study first
tries the configs it is given to warm-start from (tuner.search.warmstart), and a study may stop
early by the rules of tuner.search.stopping: patience, and with `early_stop` the model's bound
and a confirmed warm start (the warm start is then measured before the sampler is asked, so
that those rules can judge it), or once its time budget is spent. Then up to `polish` more trials
descend from the best config (stopping.descent_start: where cuBLAS leads, the best tile within
reach of it), one parameter a step (its runnable neighbours not yet measured, the model's
fastest first, round after round while the best moves): TPE spreads its trials over the
whole space, and the best config's GROUP_M or BLOCK_K one value away can be faster still.
At the end the top configs, where their trials left them within the noise between trials of
each other, are re-timed side by side, and the winner is the best of that re-timing. A tile
that wins over cuBLAS is then timed beside it at the bucket's fewest rows as well, since the
key answers them too, and keeps the key only if it does not lose more there than it gains at
the representative (tuner.objective.bucket_loss).

What "best" means is the study's launch mode (tuner.objective): the sampler is told, the
patience counts and the top configs are ranked and re-timed by ms per back-to-back eager call
(eager) or by device time (graph). Both figures are stored with every trial either way.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, replace
from functools import partial

import optuna
from optuna.trial import TrialState

from tuner.db.models import Device, KernelVersion, Run, Study, Trial
from tuner.db.optuna_storage import LEGACY_STUDY_PREFIX, STUDY_ID_ATTR, TunerStorage
from tuner.db.store import Store, params_key
from tuner.execution.executor import Executor
from tuner.execution.measure import TrialResult
from tuner.execution.timing import Timing
from tuner.kernels.base import Kernel, specialization
from tuner.kernels.calls import meta_gemm
from tuner.objective import (
    EAGER,
    GRAPH,
    CallTime,
    Pair,
    bucket_loss,
    call_ms,
    call_tflops,
    call_time,
    contested,
    final_field,
    final_winner,
    ranked,
    retimed,
)
from tuner.search.budget import StudyBudget
from tuner.search.phases import (
    ASK,
    COMPILE_WAIT,
    MEASURE,
    OPEN,
    RECORD,
    RETIME,
    SET_UP,
    SHORT_MEASURE,
    WARM_START,
    Phases,
)
from tuner.search.samplers import make_sampler
from tuner.search.screening import HOST_PACED_REACH, REACH, screened
from tuner.search.stopping import (
    HOST_PACED,
    RUN_BUDGET,
    SPACE_SPENT,
    STUDY_BUDGET,
    TRIALS_SPENT,
    WARM_CONFIRMED,
    ModelBound,
    Stop,
    WarmConfirmation,
    descent_order,
    descent_start,
    search_stop,
)
from tuner.shapes import Shape
from tuner.space import SearchSpace, config_signature
from tuner.statuses import TrialStatus

optuna.logging.set_verbosity(optuna.logging.WARNING)

CANNOT_RUN_TFLOPS = 0.0  # what the sampler is told of a config that cannot run
ASKS_PER_TRIAL = 10  # bound on asks when the sampler keeps proposing known configs


@dataclass(frozen=True)
class StudyOutcome:
    best: Trial | None
    final: Timing | None = None
    tied: tuple[int, ...] = ()
    ended_by: str | None = None  # why the search ended (tuner.search.stopping), for Study.reason
    # The library call's (cuBLAS's) device time where the study measured it in full: the
    # baseline a finished study keeps, taken already on the same inputs by the same method.
    library_ms: float | None = None


@dataclass(frozen=True)
class StudyRecords:
    """Where a study keeps what it learns: our rows (`store`) and Optuna's (`storage`), for
    this run, device and kernel source, under the study's own row."""
    store: Store
    storage: TunerStorage
    run: Run
    device: Device
    kernel_row: KernelVersion
    study: Study


@dataclass(frozen=True)
class DeviceSlot:
    """Where a study measures: one device slot of the executor, and that device's shared
    memory per block (what the feasibility checks allow)."""
    executor: Executor
    slot: int
    smem_limit: int


@dataclass(frozen=True)
class _Pending:
    """A config asked of the sampler and compiling, or compiled and waiting to be measured."""
    trial: optuna.trial.Trial
    params: dict
    signature: tuple


class StudyRunner:
    """Runs one study to its budget; `run` returns the winner and its final timing."""

    def __init__(self, records: StudyRecords, bench: DeviceSlot, kernel: Kernel,
                 space: SearchSpace, shape: Shape, budget: StudyBudget, *,
                 warm_start: Sequence[dict] = (), bound: ModelBound | None = None,
                 confirmation: WarmConfirmation | None = None,
                 search_on: Callable[[], tuple[list[dict], ModelBound | None]] | None = None,
                 run_deadline: float | None = None, low_end: Shape | None = None,
                 on_trial: Callable[[int, TrialResult], None] = lambda done, result: None,
                 keep_going: Callable[[], bool] = lambda: True, phases: Phases | None = None):
        """Where it stores and measures, what it searches and its knobs; by name, the configs
        it tries first, the model's bound on the rest (with budget.early_stop), the test by
        which its warm start (near keys' winners) ends it once measured, with
        budget.early_stop, and the configs and bound it searches on with where that fails
        (tuner.search.stopping), the run's deadline (time.monotonic()), the shape at the
        fewest rows of its bucket (tuner.search.planning.KeyPlan.low_end), its hooks:
        `on_trial(trials stored, result)` after each trial, and `keep_going()`, asked
        between steps (False: stop, the study left open to resume), and where it files the
        seconds of its steps (tuner.search.phases)."""
        self.store, self.storage, self.run_row = records.store, records.storage, records.run
        self.device, self.kernel_row, self.record = (records.device, records.kernel_row,
                                                     records.study)
        self.executor, self.slot, self.smem_limit = bench.executor, bench.slot, bench.smem_limit
        self.kernel, self.shape, self.budget = kernel, shape, budget
        self.low_end = low_end
        self.on_trial, self.keep_going = on_trial, keep_going
        self.phases = Phases() if phases is None else phases
        self.run_deadline, self.deadline = run_deadline, run_deadline
        self.specialization = specialization(shape.key())
        self.meta_gemm = meta_gemm(shape)  # what feasibility checks look at
        # The study's own view of the space: a pad that leaves this shape as it is would only
        # produce infeasible proposals (on an aligned shape, most of them), so it is not offered.
        self.space = space.for_call(self.meta_gemm)
        # Configs a new study tries first (tuner.search.warmstart), those this study can propose;
        # an exhaustive study tries all of its feasible configs, and only those.
        self.warm_start = [c for c in warm_start if self.space.holds(c)]
        if budget.exhaustive:
            self.warm_start = kernel.feasible_configs(self.space, self.meta_gemm,
                                                      self.smem_limit)
            self.budget = replace(budget, trials=len(self.warm_start), patience=None,
                                  polish=0, early_stop=False)
        self.bound = bound if self.budget.early_stop else None
        self.confirmation = (confirmation if self.budget.early_stop and self.warm_start
                             else None)
        self.search_on = search_on
        self.warm_confirmed = False
        self.stored: dict[tuple, Trial] = {}
        self.in_flight: dict[Future, _Pending] = {}
        self.asks = 0
        self.polished = 0  # trials granted to the descent from the best config so far
        # The descent's steps enqueued and not yet asked: once the search has ended, the only
        # configs asked (the sampler proposes nothing more).
        self.queued = 0
        # The warm start's configs not asked of Optuna yet: with early_stop the sampler waits
        # until they are asked and measured (none for a resumed study, which enqueues none).
        self.unasked = {config_signature(c) for c in self.warm_start}
        self.ended_by: Stop | None = None  # the rule that ended the search, if one did

    @property
    def trial_limit(self) -> int:
        """The sampler's trials, and those the descent was granted."""
        return self.budget.trials + self.polished

    @property
    def attempted(self) -> int:
        """Trials that cost a compile or more: what the trial budget counts."""
        return sum(t.status != TrialStatus.INFEASIBLE for t in self.stored.values())

    def objective(self, row: Trial) -> float:
        """What the sampler maximises: TFLOP/s at the launch mode's time per call, 0 for a
        config that cannot run; for a screened one, at its short device time scaled by the
        best's ratio of call to device time (tuner.search.screening)."""
        launch = self.budget.launch
        if row.status == TrialStatus.SCREENED and (best := self._fastest()) is not None:
            per_call = call_ms(best, launch) / best.p50_ms
            return self.shape.flops / (row.p50_ms * per_call * 1e-3) / 1e12
        if row.status != TrialStatus.OK:
            return CANNOT_RUN_TFLOPS
        return call_tflops(self.shape.flops, row, launch)

    def _fastest(self) -> Trial | None:
        """The stored trial measured in full with the fastest kernel, if any."""
        return min((t for t in self.stored.values() if call_time(t, GRAPH) is not None
                    and call_time(t, self.budget.launch) is not None),
                   key=lambda t: t.p50_ms, default=None)

    def _attempted(self) -> list[Trial]:
        """The trials attempted (all but the infeasible), in order."""
        return [t for t in sorted(self.stored.values(), key=lambda t: t.number)
                if t.status != TrialStatus.INFEASIBLE]

    def _attempted_calls(self) -> list[CallTime | None]:
        """Each attempted trial's time per call by the launch mode's figure, in order."""
        return [call_time(t, self.budget.launch) for t in self._attempted()]

    def _opening(self) -> bool:
        """With early_stop, whether the warm start is still being measured: all of it asked
        and some of it in flight (the sampler waits, and the rules judge it whole)."""
        if not self.budget.early_stop or self.unasked:
            return False
        warm = {config_signature(c) for c in self.warm_start}
        return any(p.signature in warm for p in self.in_flight.values())

    def search_stop(self) -> Stop | None:
        """Why the sampler should be asked no more (tuner.search.stopping), or None; the
        latest answer is kept: the study's row says why its search ended."""
        if self._past_deadline():
            why = Stop(RUN_BUDGET if self.deadline == self.run_deadline else STUDY_BUDGET,
                       "time spent")
        elif self.warm_confirmed:
            why = Stop(WARM_CONFIRMED, "the near keys' winners measured, the best of them "
                                       "as close to the roofline as at its key")
        else:
            ran = [(t.params, t.p50_ms) for t in self.stored.values()
                   if t.status in (TrialStatus.OK, TrialStatus.SCREENED) and t.p50_ms]
            why = search_stop(self._attempted_calls(), ran, self.budget.patience,
                              self.bound, self._tile_kernels())
        self.ended_by = why
        return why

    # -- bookkeeping ----------------------------------------------------------------------
    def _store(self, params: dict, result: TrialResult) -> Trial:
        row = self.store.add_trial(self.record, self.run_row, len(self.stored), params,
                                   **result.as_columns())
        self.stored[config_signature(params)] = row
        if result.status.remembered:
            self.store.remember_failure(self.device, self.kernel_row, self.specialization,
                                        params, result.status, result.reason)
        self.on_trial(len(self.stored), result)
        return row

    def _tell(self, study: optuna.Study, trial, row: Trial | None) -> None:
        """What the sampler learns of a config: its objective, 0 for one that cannot run
        (infeasible, failing, wrong). TPE leaves FAIL trials out of its model, so a config
        told as FAIL teaches it nothing, and on a space that is mostly infeasible for a
        shape it would keep proposing infeasible configs; told as worth nothing, they steer
        it away. None (nothing known) is a FAIL."""
        if row is None:
            study.tell(trial, state=TrialState.FAIL)
        else:
            study.tell(trial, self.objective(row))

    def _settle_interrupted(self, study: optuna.Study) -> None:
        """Trials a killed run left running: told from our rows if stored, else redone first."""
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            row = self.stored.get(config_signature(t.params))
            self._tell(study, t.number, row)
            if row is None and t.params:
                study.enqueue_trial(t.params, skip_if_exists=False)

    # -- the loop -------------------------------------------------------------------------
    def optuna_name(self) -> str:
        """What the study tunes, as optuna-dashboard lists it: kernel, the shape timed, its
        bucket, the launch mode, and our study id (unique: retunes and devices repeat the
        rest), e.g. `mm 4096x4096x4096 bf16 nn [bucket M=4096 N=4096 K=4096 stride_am=4096
        stride_bk=4096] eager #7`."""
        bucket = " ".join(f"{f}={v}" for f, v in self.record.key.items() if f != "dtype")
        return (f"{self.kernel.name} {self.shape} [bucket {bucket}] "
                f"{self.budget.launch} #{self.record.id}")

    def _open(self) -> optuna.Study:
        sampler = make_sampler(self.budget.sampler, self.record.seed)
        name = self.optuna_name()
        legacy = f"{LEGACY_STUDY_PREFIX}{self.record.id}"  # stored before studies were named
        try:
            self.storage.get_study_id_from_name(legacy)
            name = legacy
        except KeyError:
            pass
        study = optuna.create_study(study_name=name, storage=self.storage.cached, sampler=sampler,
                                    direction="maximize", load_if_exists=True)
        if STUDY_ID_ATTR not in study.user_attrs:  # a new study: what it tunes, for dashboards
            shape = self.shape
            for attr, value in {
                    "kernel": self.kernel.name, "launch": self.budget.launch,
                    "device": self.device.name, "seed": self.record.seed,
                    "shape": {"M": shape.M, "N": shape.N, "K": shape.K, "dtype": shape.dtype,
                              "layout": shape.layout, "label": str(shape)},
                    "bucket": self.record.key, STUDY_ID_ATTR: self.record.id}.items():
                study.set_user_attr(attr, value)
        return study

    def _asking(self) -> bool:
        """Whether the study still wants new configs (those in flight count as taken): in
        the descent, while steps it queued are unasked; before it, while no rule ended the
        search."""
        if self.polished:
            return self.queued > 0 and self.keep_going() and not self._past_deadline()
        taken = len(self.in_flight)
        return (self.attempted + taken < self.trial_limit
                and len(self.stored) + taken < self.space.size
                and self.asks < self.trial_limit * ASKS_PER_TRIAL
                and self.keep_going() and not self._opening()
                and self.search_stop() is None)

    def _past_deadline(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def _drop_in_flight(self, study: optuna.Study) -> None:
        """The configs in flight, left unmeasured: told as failed, never stored; those still
        waiting for a compile worker are cancelled."""
        for future, pending in self.in_flight.items():
            future.cancel()
            study.tell(pending.trial, state=TrialState.FAIL)
        self.in_flight.clear()

    def _polish(self, study: optuna.Study, known_failures: set[str]) -> bool:
        """Queue the runnable neighbours not measured yet of the config the descent starts
        from (stopping.descent_start), within what is left of the polish budget and the
        time; False when there is nothing to queue."""
        left = self.budget.polish - self.polished
        by_call = ranked(self.stored.values(), self.budget.launch)  # the best so far leads
        if (left <= 0 or not by_call or self._past_deadline()
                or self.ended_by is not None and self.ended_by.rule == WARM_CONFIRMED):
            return False
        start = descent_start([(t.params, call_ms(t, self.budget.launch)) for t in by_call],
                              self.kernel.library_variants)
        steps = [c for c in self.space.neighbours(start)
                 if config_signature(c) not in self.stored
                 and params_key(c) not in known_failures
                 and self.kernel.feasible(c, self.meta_gemm, self.smem_limit) is None]
        steps = descent_order(steps, self.bound.predict if self.bound else None)[:left]
        for config in steps:  # Optuna hands enqueued trials out first, in order
            study.enqueue_trial(config, skip_if_exists=False)
        self.polished += len(steps)
        self.queued += len(steps)
        return bool(steps)

    def _host_paced_library(self) -> Trial | None:
        """The best so far where this is an eager study and that is a library call the host
        paces (stopping.HOST_PACED), else None."""
        if self.budget.launch != EAGER:
            return None
        leader = next(iter(ranked(self.stored.values(), EAGER)), None)
        if (leader is None or not self.kernel.calls_library(leader.params)
                or leader.loop_ms < HOST_PACED * leader.p50_ms):
            return None
        return leader

    def _reach(self, config: dict) -> float:
        """How far behind the fastest kernel a config's short measure may fall and still be
        measured in full (tuner.search.screening): further for a tile under a library call
        the host paces."""
        tile = not self.kernel.calls_library(config)
        return HOST_PACED_REACH if tile and self._host_paced_library() is not None else REACH

    def _timed_tile(self, trial: Trial) -> bool:
        """Whether the trial is a tile with a device time, measured in full or screened (a
        short measure's is one too)."""
        return (trial.status in (TrialStatus.OK, TrialStatus.SCREENED)
                and trial.p50_ms is not None
                and not self.kernel.calls_library(trial.params))

    def _tile_kernels(self) -> list[CallTime | None] | None:
        """search_stop's `tile_kernels` under a library call the host paces, else None."""
        if self._host_paced_library() is None:
            return None
        return [CallTime(t.p20_ms or t.p50_ms, t.p50_ms, t.p80_ms or t.p50_ms)
                if self._timed_tile(t) else None for t in self._attempted()]

    def _ask(self, study: optuna.Study, known_failures: set[str]) -> None:
        """Tops the configs in flight up to `batch`: each new, feasible config asked starts
        compiling; everything else is answered on the spot. In the descent only its queued
        steps are asked: the search has ended, and the sampler's proposals past that point
        would run the study on to its trial budget."""
        room = min(self.budget.batch - len(self.in_flight),
                   self.trial_limit - self.attempted - len(self.in_flight))
        for _ in range(max(room, 0) * ASKS_PER_TRIAL):
            if room <= 0 or self.polished and not self.queued:
                return
            if self._opening() or self._past_deadline():
                return
            trial = study.ask()
            self.asks += 1
            self.queued = max(self.queued - 1, 0)
            params = self.space.suggest(trial)
            signature = config_signature(params)
            self.unasked.discard(signature)
            if signature in self.stored:
                self._tell(study, trial, self.stored[signature])
            elif signature in (p.signature for p in self.in_flight.values()):
                study.tell(trial, state=TrialState.FAIL)  # told once measured
            elif params_key(params) in known_failures:
                study.tell(trial, CANNOT_RUN_TFLOPS)
            elif reason := self.kernel.feasible(params, self.meta_gemm, self.smem_limit):
                infeasible = TrialResult(TrialStatus.INFEASIBLE, reason)
                self._tell(study, trial, self._store(params, infeasible))
            else:
                self.storage.cached.flush(trial._trial_id)  # redone if killed now
                future = self.executor.submit_compile(self.shape, self.kernel.name, params)
                self.in_flight[future] = _Pending(trial, params, signature)
                room -= 1

    def _measure(self, study: optuna.Study, pending: _Pending,
                 compiled: float | TrialResult) -> None:
        """A compiled config checked and timed on this study's device; a failed one stored.
        On a GPU with early_stop, once the study has a best, by the short measure first and
        in full only within its reach (tuner.search.screening): it saves device time, and the
        interpreter's wall-clock figures are too noisy to screen by. A full measure is not
        started past the deadline: the config is left unmeasured, like one still in flight."""
        if isinstance(compiled, TrialResult):
            result = compiled
        else:
            gpu = self.executor.options.backend == "gpu"
            measure = partial(self.executor.measure, self.slot, self.shape, self.record.seed,
                              self.kernel.name, pending.params)
            result, best = None, self._fastest() if self.budget.early_stop and gpu else None
            if best is not None:
                with self.phases.timed(SHORT_MEASURE):
                    short = measure(short=True)
                result = (short if short.status != TrialStatus.OK
                          else screened(short, best, self._reach(pending.params)))
            if result is None and best is not None and self._past_deadline():
                study.tell(pending.trial, state=TrialState.FAIL)  # as if left in flight
                return
            if result is None:
                with self.phases.timed(MEASURE):
                    result = measure()
            if gpu:
                result = replace(result, compile_s=compiled)
        with self.phases.timed(RECORD):
            self._tell(study, pending.trial, self._store(pending.params, result))

    def run(self) -> StudyOutcome:
        """Streams configs through: up to `batch` compile at once, and each is measured as
        soon as it has compiled, so neither the device nor the compile pool waits for a
        batch's slowest config. On a stop request the study returns at once, its configs in
        flight left running in Optuna (redone on resume)."""
        with self.phases.timed(OPEN):
            study = self._open()
        with self.phases.timed(SET_UP):
            known_failures = self._set_up(study)
        if self.budget.budget_s is not None:
            own = time.monotonic() + self.budget.budget_s
            self.deadline = own if self.run_deadline is None else min(own, self.run_deadline)
        timed = self.phases.timed
        while self.keep_going():
            if self.confirmation is not None and not self.unasked and not self._opening():
                with timed(WARM_START):  # where it fails: the model's picks ranked
                    self._judge_warm_start(study)
            with timed(ASK):
                asking = self._asking()
                if asking:
                    self._ask(study, known_failures)
            if not asking and self.in_flight and self._dropping():
                with timed(RECORD):
                    self._drop_in_flight(study)
            elif not asking and not self.in_flight:
                with timed(ASK):  # the descent's next steps, asked as the sampler's
                    polishing = self._polish(study, known_failures)
                if not polishing:
                    break
            if self.in_flight:  # short waits: a stop request is seen within a second
                with timed(COMPILE_WAIT):
                    done, _ = wait(self.in_flight, timeout=1.0, return_when=FIRST_COMPLETED)
                for future in [f for f in self.in_flight if f in done]:  # in submission order
                    if future in self.in_flight:  # not dropped by the measure before it
                        self._measure(study, self.in_flight.pop(future), future.result())
                    if self.in_flight and self._dropping():
                        with timed(RECORD):
                            self._drop_in_flight(study)
        if not self.keep_going():
            return StudyOutcome(None)
        outcome, lost_rows = self._over_bucket(self._final())
        return replace(outcome, ended_by=self._ended_by() + lost_rows,
                       library_ms=self._library_ms())

    def _judge_warm_start(self, study: optuna.Study) -> None:
        """Once the near keys' winners are measured: confirmed, the study ends; else it
        searches on as a cold study, from the model's picks (enqueued, measured before the
        sampler is asked) under the model's bound."""
        by_call = ranked(self.stored.values(), self.budget.launch)  # the best so far leads
        self.warm_confirmed = bool(by_call) and self.confirmation.holds(by_call[0].params,
                                                                        by_call[0].p50_ms)
        self.confirmation = None
        if self.warm_confirmed or self.search_on is None:
            return
        picks, bound = self.search_on()
        picks = [c for c in picks if self.space.holds(c)
                 and config_signature(c) not in self.stored]
        for config in picks:
            study.enqueue_trial(config, skip_if_exists=False)
        self.warm_start += picks
        self.unasked |= {config_signature(c) for c in picks}
        self.bound = bound

    def _set_up(self, study: optuna.Study) -> set[str]:
        """A new study's warm start enqueued, a resumed one's trials read back and what a
        killed run left settled; the configs known to fail for this specialization."""
        self.stored = {config_signature(t.params): t for t in self.store.trials_of(self.record)}
        if not study.get_trials(deepcopy=False):  # a new study: known-good configs first
            for config in self.warm_start:  # distinct, and the study holds nothing yet
                study.enqueue_trial(config, skip_if_exists=False)
        self._settle_interrupted(study)
        if study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)):
            self.unasked.clear()  # a resumed study: its warm start was asked before
        return self.store.known_failures(self.device, self.kernel_row, self.specialization)

    def _library_trial(self) -> Trial | None:
        """The library call's (cuBLAS's) fastest trial measured in full, if the study has one."""
        return min((t for t in self.stored.values() if t.status == TrialStatus.OK
                    and self.kernel.calls_library(t.params) and t.p50_ms is not None),
                   key=lambda t: t.p50_ms, default=None)

    def _library_ms(self) -> float | None:
        """The device time of the library call measured in full, if the study did."""
        library = self._library_trial()
        return None if library is None else library.p50_ms

    def _dropping(self) -> bool:
        """Whether the configs in flight go unmeasured: past the deadline always; before
        the polish, when the search stopped by a rule that says so or with early_stop."""
        if self._past_deadline():
            self.search_stop()  # records which budget ended it
            return True
        if self.polished:
            return False
        why = self.search_stop()
        return why is not None and (why.drops_in_flight or self.budget.early_stop)

    def _ended_by(self) -> str:
        """Why the search ended, as the study's row keeps it."""
        why = self.ended_by
        if why is None:
            why = (Stop(SPACE_SPENT) if len(self.stored) >= self.space.size
                   else Stop(TRIALS_SPENT, f"{self.budget.trials} trials"))
        return f"{why}; then {self.polished} polish steps" if self.polished else str(why)

    def _final(self) -> StudyOutcome:
        """Re-time the final field (tuner.objective.final_field: the top configs, and cuBLAS
        where a tile's lead over it is within the power state's swing) side by side where
        their trials leave the winner open (tuner.objective.contested): device times, and
        for eager the back-to-back calls too (a config's host path is part of what won it
        its place); the winner by tuner.objective.final_winner, fewer resources on a tie."""
        launch = self.budget.launch

        def is_library(trial: Trial) -> bool:
            return self.kernel.calls_library(trial.params)

        field = final_field(self.stored.values(), launch, is_library)
        if not contested(field, launch, is_library):
            return StudyOutcome(field[0] if field else None)
        with self.phases.timed(RETIME):
            retimed = self._retimed(self.shape, [t.params for t in field])
        if retimed is None:
            return StudyOutcome(field[0])
        kernels, calls = retimed
        best, tied = final_winner(field, kernels, calls, launch, is_library, lambda t: (
            self.kernel.smem_bytes(t.params, self.meta_gemm), t.compile_s or 0.0))
        return StudyOutcome(field[best], calls[best],
                            tuple(field[i].id for i in tied if i != best))

    def _over_bucket(self, outcome: StudyOutcome) -> tuple[StudyOutcome, str]:
        """The final's winner, or the library call where the winner is a tile that does not
        hold the bucket's fewest rows (tuner.objective.bucket_loss), with what the study's
        reason adds. The two are re-timed side by side at both ends, by device time and for
        eager by the call as well (the figures the final chose by); a re-timing that fails
        keeps the library call, the answer that runs at every M."""
        best, library = outcome.best, self._library_trial()
        if (self.low_end is None or best is None or library is None
                or self.kernel.calls_library(best.params)):
            return outcome, ""
        launch, configs = self.budget.launch, [best.params, library.params]
        with self.phases.timed(RETIME):
            ends = [self._pair_at(shape, configs) for shape in (self.shape, self.low_end)]
        rows = f"M={self.low_end.M}"
        if None in ends:
            return StudyOutcome(library), f"; the library kept: no re-timing at {rows}"
        lost = bucket_loss(*ends, launch)
        if lost is None:
            return outcome, ""
        return (StudyOutcome(library, ends[0].library_call),
                f"; the library kept: the tile took {lost:.2f}x its time at {rows}")

    def _pair_at(self, shape: Shape, configs: list[dict]) -> Pair | None:
        """The tile and the library call (`configs`) re-timed side by side at `shape`; None if
        a re-timing failed."""
        retimed = self._retimed(shape, configs)
        if retimed is None:
            return None
        kernels, calls = retimed
        return Pair(kernels[0], kernels[1], calls[0], calls[1])

    def _retimed(self, shape: Shape, configs: list[dict]
                 ) -> tuple[list[Timing], list[Timing]] | None:
        """The configs re-timed side by side at `shape`: their device times, and the launch
        mode's calls (the device times again for graph); None if a re-timing failed."""
        return retimed(lambda figure: self.executor.retime(
            self.slot, shape, self.record.seed, self.kernel.name, configs, figure),
            self.budget.launch)
