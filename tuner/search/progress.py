"""Progress bars for `tune run`: one over keys, one over the current key's trials."""
from __future__ import annotations

from collections import Counter

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tuner.execution.measure import TrialResult
from tuner.search.planning import KeyPlan


class RichReporter:
    """Implements tuner.search.pipeline.ProgressReporter with rich progress bars on stderr."""

    def __init__(self, total_keys: int, console: Console | None = None):
        self.console = console or Console(stderr=True)
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TextColumn("{task.fields[status]}"),
                                 TimeElapsedColumn(), console=self.console)
        self.keys = self.progress.add_task("shapes", total=total_keys, status="")
        # per key being tuned (one per device): its bar, status counts and best TFLOP/s
        self.trials: dict[str, int] = {}
        self.statuses: dict[str, Counter[str]] = {}
        self.best: dict[str, float] = {}

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        return self.progress.__exit__(*exc)

    def key_started(self, plan: KeyPlan, trials: int) -> None:
        self.statuses[plan.label], self.best[plan.label] = Counter(), 0.0
        self.trials[plan.label] = self.progress.add_task(f"  {plan.label}", total=trials,
                                                         status="")

    def trial_done(self, plan: KeyPlan, done: int, result: TrialResult) -> None:
        counts = self.statuses[plan.label]
        counts[result.status] += 1
        if result.tflops:
            self.best[plan.label] = max(self.best[plan.label], result.tflops)
        text = " ".join(f"{k}={v}" for k, v in sorted(counts.items()))
        self.progress.update(self.trials[plan.label], completed=done,
                             status=f"best {self.best[plan.label]:.4g} TFLOP/s  {text}")

    def key_done(self, plan: KeyPlan, outcome: str) -> None:
        self.progress.console.print(f"{plan.label}: {outcome}")
        self.progress.advance(self.keys)
        task = self.trials.pop(plan.label, None)
        if task is not None:
            self.progress.remove_task(task)
