"""Progress bars for `tune run`: one over keys, one over the current key's trials."""
from __future__ import annotations

from collections import Counter

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                           TimeElapsedColumn)

from tuner.execution import TrialResult
from tuner.planning import KeyPlan


class RichReporter:
    """Implements tuner.pipeline.Reporter with rich progress bars on stderr."""

    def __init__(self, total_keys: int, console: Console | None = None):
        self.console = console or Console(stderr=True)
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TextColumn("{task.fields[status]}"),
                                 TimeElapsedColumn(), console=self.console)
        self.keys = self.progress.add_task("shapes", total=total_keys, status="")
        self.trials = None
        self.statuses: Counter[str] = Counter()
        self.best = 0.0

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        return self.progress.__exit__(*exc)

    def key_started(self, plan: KeyPlan, trials: int) -> None:
        self.statuses.clear()
        self.best = 0.0
        if self.trials is not None:
            self.progress.remove_task(self.trials)
        self.trials = self.progress.add_task(f"  {plan.label}", total=trials, status="")

    def trial_done(self, done: int, result: TrialResult) -> None:
        self.statuses[result.status] += 1
        if result.tflops:
            self.best = max(self.best, result.tflops)
        counts = " ".join(f"{k}={v}" for k, v in sorted(self.statuses.items()))
        self.progress.update(self.trials, completed=done,
                             status=f"best {self.best:.4g} TFLOP/s  {counts}")

    def key_done(self, plan: KeyPlan, outcome: str) -> None:
        self.progress.console.print(f"{plan.label}: {outcome}")
        self.progress.advance(self.keys)
