"""The `tune run` job: plans spread over the devices, each key claimed, searched, and won.

One thread per device worker takes planned keys from a shared queue. A key is claimed in the
database first (tuner.db.claims), so that several `tune run` processes, on one host or many,
given the same database, tune each key once.
"""
from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from tuner.db.claims import ClaimKeeper
from tuner.db.store import Store
from tuner.execution.executor import Executor
from tuner.execution.measure import TrialResult
from tuner.kernels import KERNELS
from tuner.kernels.base import config_label
from tuner.model.predict import device_spec
from tuner.objective import call_ms
from tuner.search.ahead import CompilesAhead
from tuner.search.budget import StudyBudget
from tuner.search.phases import CLAIM, FINISH, OPEN, RANK_AHEAD, SET_UP, WARM_START, Phases
from tuner.search.planning import KeyPlan
from tuner.search.stopping import ModelBound, WarmConfirmation
from tuner.search.study import DeviceSlot, StudyRecords, StudyRunner
from tuner.search.warmstart import (
    NEAR_KEYS,
    ModelRanking,
    NearWinner,
    library_configs,
    log_distance,
    merged,
    model_bound,
    nearest_winner_configs,
    nearest_winners,
    warm_confirmation,
)
from tuner.space import SearchSpace
from tuner.statuses import RunStatus


class ProgressReporter(Protocol):
    """What the job tells its user while it works (the CLI draws progress bars from it)."""

    def key_started(self, plan: KeyPlan, trials: int) -> None: ...
    def trial_done(self, plan: KeyPlan, done: int, result: TrialResult) -> None: ...
    def key_done(self, plan: KeyPlan, outcome: str) -> None: ...


@dataclass
class RunSummary:
    tuned: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    busy: list[str] = field(default_factory=list)  # being tuned by another process
    failed: list[str] = field(default_factory=list)
    unstarted: list[str] = field(default_factory=list)  # left when the run's budget was spent
    # Per key claimed, where its study's wall went (tuner.search.phases), by its label.
    phases: dict[str, Phases] = field(default_factory=dict)


@dataclass(frozen=True)
class WarmStart:
    """How a study starts (tuner.search.warmstart): the configs it tries first and the
    model's bound on the rest; or, where those configs are near keys' winners, the test by
    which they finish it alone, and the model's configs and bound it searches on with where
    they do not (ranked only then)."""
    configs: list[dict]
    bound: ModelBound | None = None
    confirmation: WarmConfirmation | None = None
    search_on: Callable[[], tuple[list[dict], ModelBound | None]] | None = None


class TuneJob:
    def __init__(self, store: Store, storage, executor: Executor, spaces: dict[str, SearchSpace],
                 budget: StudyBudget, retune: bool, reporter: ProgressReporter,
                 run_budget_s: float | None = None):
        """`run_budget_s`: seconds the whole job may tune; studies it leaves unstarted are
        reported, and the same command resumes them."""
        self.store, self.storage, self.executor = store, storage, executor
        self.spaces, self.budget, self.retune, self.reporter = spaces, budget, retune, reporter
        self.run_budget_s = run_budget_s
        self.deadline: float | None = None
        self.summary = RunSummary()
        self.stop = threading.Event()
        self.error: BaseException | None = None  # a bug in a device thread, re-raised by run

    def run(self, plans: list[KeyPlan], command: list[str]) -> RunSummary:
        info = self.executor.device_info()
        self.smem_limit = info.smem_per_block
        self.spec = device_spec(info)  # for the model's warm-start picks
        self.device = self.store.device(info)
        self.kernel_rows = {n: self.store.kernel(n, KERNELS[n].source_hash) for n in self.spaces}
        self.space_rows = {n: self.store.space(space) for n, space in self.spaces.items()}
        self.run_row = self.store.start_run(self.device, self.executor.options.backend, command)
        if self.run_budget_s is not None:
            self.deadline = time.monotonic() + self.run_budget_s
        self.claims = ClaimKeeper(self.store)
        # The model's warm-start picks, ranked when a study starts (seconds each) and kept:
        # finished keys never ask, so a resume costs what its new studies cost.
        self.ranking = ModelRanking(self.spec, self.smem_limit)
        self.ahead = CompilesAhead(self.executor, self.smem_limit)
        todo: queue.Queue[KeyPlan] = queue.Queue()
        self.order = self._unfinished(plans)
        for plan in self.order:
            todo.put(plan)
        threads = [threading.Thread(target=self._device_loop, args=(slot, todo), daemon=True,
                                    name=f"device-slot-{slot}")
                   for slot in range(self.executor.slots)]
        status = RunStatus.FAILED
        try:
            for t in threads:
                t.start()
            for t in threads:
                while t.is_alive():
                    t.join(timeout=0.5)  # short waits keep Ctrl-C deliverable
            if self.error is not None:
                raise self.error
            status = RunStatus.INTERRUPTED if self.stop.is_set() else RunStatus.FINISHED
        except KeyboardInterrupt:
            status = RunStatus.INTERRUPTED
            self.stop.set()
            raise
        finally:
            self.ahead.close()
            self.ranking.close()
            self.claims.close()
            self.store.finish_run(self.run_row, status)
        return self.summary

    def _unfinished(self, plans: list[KeyPlan]) -> list[KeyPlan]:
        """The plans still to tune, in order; keys already tuned are reported skipped here,
        before any claim, ranking or study (a key finished by another process meanwhile is
        caught again under its claim, in _tune_key)."""
        if self.retune:
            return list(plans)
        todo = []
        for plan in plans:
            if self._finished(plan):
                self.summary.skipped.append(plan.label)
                self.reporter.key_done(plan, "already tuned")
            else:
                todo.append(plan)
        return todo

    def _finished(self, plan: KeyPlan) -> bool:
        return not self.retune and self.store.finished_study(
            self.device, self.kernel_rows[plan.kernel], self.space_rows[plan.kernel],
            plan.key) is not None

    def _warm_start(self, plan: KeyPlan, kernel_row, record) -> WarmStart:
        """How a study starts (tuner.search.warmstart). Only a study with nothing measured
        yet enqueues its configs, and an exhaustive one tries its whole space instead, so
        the model ranks (seconds) only for those that will use it. With early_stop, a key
        next to other tuned keys (within NEAR_KEYS) starts from their winners alone and ends
        once they are measured, the model ranking only in the background, for the search
        that goes on where they do not carry over (not with retune: it asks for a search)."""
        kernel, space = KERNELS[plan.kernel], self.spaces[plan.kernel]
        if self.budget.exhaustive:
            return WarmStart([])
        library = library_configs(kernel, space)
        if self._confirms_near() and not record.trials:
            near = self._near_winners(plan, kernel_row)
            if near:
                # Where they do not carry over, the search goes on from the model's picks,
                # ranked in the ranking's workers (ahead, or from now) as the near ones measure.
                self.ranking.prefetch(kernel, space, plan.shape)
                return WarmStart(merged(library, [w.config for w in near]),
                                 confirmation=warm_confirmation(near, plan.shape, self.spec),
                                 search_on=lambda: self._model_start(kernel, space, plan))
        picks, bound = ([], None) if record.trials else self._model_start(kernel, space, plan)
        configs = merged(library, nearest_winner_configs(self.store, self.device, kernel_row,
                                                         space, plan.shape), picks)
        return WarmStart(configs, bound)

    def _model_start(self, kernel, space: SearchSpace,
                     plan: KeyPlan) -> tuple[list[dict], ModelBound | None]:
        """The model's picks for the plan's shape, and its bound on the rest."""
        picks = self.ranking.configs(kernel, space, plan.shape)
        return picks, model_bound(kernel, plan.shape, self.spec, picks)

    def _confirms_near(self) -> bool:
        """Whether near keys' winners start a study and may end it once measured: with
        early_stop, not with retune (it asks for a search)."""
        return self.budget.early_stop and not self.retune

    def _near_winners(self, plan: KeyPlan, kernel_row) -> list[NearWinner]:
        """The winners of tuned keys within NEAR_KEYS of the plan's shape."""
        return nearest_winners(self.store, self.device, kernel_row, self.spaces[plan.kernel],
                               plan.shape, within=NEAR_KEYS)

    def _rank_ahead(self, plan: KeyPlan) -> None:
        """Start ranking the studies the device threads take after this one, in the
        ranking's workers, so that the GPU does not wait for the model between studies: also
        those that will start from near keys' winners (_warm_start), for the search that
        goes on where those do not carry over; not those next to a key planned before them,
        whose winner is not known yet. Their first configs compile ahead
        (tuner.search.ahead): near keys' winners or the nearest winners at once, the
        model's picks once ranked."""
        after = self.order[self.order.index(plan) + 1:][:self.executor.slots]
        for upcoming in after:
            kernel, space = KERNELS[upcoming.kernel], self.spaces[upcoming.kernel]
            kernel_row = self.kernel_rows[upcoming.kernel]
            if self._confirms_near():
                if near := self._near_winners(upcoming, kernel_row):
                    self.ahead.compile(upcoming, kernel, space, [w.config for w in near])
                    self.ranking.prefetch(kernel, space, upcoming.shape)
                    continue
                earlier = self.order[:self.order.index(upcoming)]
                if any(p.kernel == upcoming.kernel and p.shape.dtype == upcoming.shape.dtype
                       and log_distance(p.key, upcoming.shape) <= NEAR_KEYS for p in earlier):
                    continue
            self.ahead.compile(upcoming, kernel, space, nearest_winner_configs(
                self.store, self.device, kernel_row, space, upcoming.shape))
            self.ahead.compile_ranked(upcoming, kernel, space,
                                      self.ranking.prefetch(kernel, space, upcoming.shape))

    def _device_loop(self, slot: int, todo: queue.Queue) -> None:
        while not self.stop.is_set():
            try:
                plan = todo.get_nowait()
            except queue.Empty:
                return
            if self.deadline is not None and time.monotonic() >= self.deadline:
                self.summary.unstarted.append(plan.label)
                self.reporter.key_done(plan, "not started: the run's budget is spent")
                continue
            try:
                self._tune_key(slot, plan)
            except BaseException as e:  # a bug, not a config: stop every slot, fail the run
                self.error = e
                self.stop.set()
                return

    def _tune_key(self, slot: int, plan: KeyPlan) -> None:
        kernel_row, space_row = self.kernel_rows[plan.kernel], self.space_rows[plan.kernel]
        claim_key = "/".join(map(str, (self.device.id, kernel_row.id, space_row.id,
                                       *plan.key.values())))
        phases = Phases()
        with phases.timed(CLAIM):
            claimed = self.claims.claim(claim_key)
        if not claimed:
            self.summary.busy.append(plan.label)
            self.reporter.key_done(plan, "being tuned by another run")
            return
        try:
            with phases.timed(CLAIM):
                finished = self._finished(plan)
            if finished:
                self.summary.skipped.append(plan.label)
                self.reporter.key_done(plan, "already tuned")
                return
            self.summary.phases[plan.label] = phases
            with phases.timed(OPEN):
                record = self.store.open_study(self.device, kernel_row, space_row, plan.key,
                                               plan.shape, self.budget.seed, self.retune,
                                               self.budget.launch)
            space = self.spaces[plan.kernel]
            if not self.budget.exhaustive:  # first: the ranking workers start meanwhile
                with phases.timed(RANK_AHEAD):
                    self._rank_ahead(plan)
            with phases.timed(WARM_START):
                start = self._warm_start(plan, kernel_row, record)
            with phases.timed(SET_UP):
                runner = StudyRunner(
                    StudyRecords(self.store, self.storage, self.run_row, self.device,
                                 kernel_row, record),
                    DeviceSlot(self.executor, slot, self.smem_limit),
                    KERNELS[plan.kernel], space, plan.shape, self.budget,
                    warm_start=start.configs, bound=start.bound,
                    confirmation=start.confirmation, search_on=start.search_on,
                    run_deadline=self.deadline, low_end=plan.low_end,
                    on_trial=lambda done, result: self.reporter.trial_done(plan, done, result),
                    keep_going=lambda: not self.stop.is_set(), phases=phases)
            self.reporter.key_started(plan, runner.budget.trials)  # exhaustive: all feasible
            outcome = runner.run()
            if self.stop.is_set():
                return  # interrupted: the study stays open and resumes next time
            with phases.timed(FINISH):
                self._finish(slot, plan, record, outcome)
        finally:
            with phases.timed(CLAIM):
                self.claims.release(claim_key)

    def _finish(self, slot, plan, record, outcome) -> None:
        best = outcome.best
        if best is None:
            self.store.finish_study(record, None, None,
                                    f"no config ran correctly ({outcome.ended_by})")
            self.summary.failed.append(plan.label)
            self.reporter.key_done(plan, "no config ran correctly")
            return
        baseline_ms = outcome.library_ms  # cuBLAS measured as a config: not timed again
        if baseline_ms is None:
            baseline = self.executor.baseline(slot, plan.shape, record.seed)
            baseline_ms = baseline.p50_ms if baseline else None
        self.store.finish_study(record, best, baseline_ms, outcome.ended_by,
                                final=outcome.final, tied_trial_ids=outcome.tied)
        self.summary.tuned.append(plan.label)
        launch = self.budget.launch
        ms = outcome.final.p50_ms if outcome.final else call_ms(best, launch)
        # The baseline is device time: compared with the winner's device time in either mode.
        versus = f", {baseline_ms / best.p50_ms:.2f}x torch.matmul" if baseline_ms else ""
        tie = f", tied with {len(outcome.tied)}" if outcome.tied else ""
        self.reporter.key_done(plan, f"best {plan.shape.flops / ms / 1e9:.4g} TFLOP/s per "
                                     f"{launch} call{versus}, {config_label(best.params)}{tie}"
                                     f" (ended by {outcome.ended_by})")
