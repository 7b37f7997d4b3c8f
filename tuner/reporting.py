"""Where a long job's notes go: one reporter object handed down, not a callback threaded
through every signature (Triton's autotuner hooks and Optuna's callbacks are the model).

Library code calls `reporter.note(line)`; the CLI passes `STDERR`, tests a `Collected` to
assert on what was said. Nothing here imports torch, optuna or the database, so db/ and the
deployment side may use it."""
from __future__ import annotations

import sys


class Reporter:
    """Says one line per note, on standard error: notes are for the person at the
    terminal, never part of a command's output (which may be piped into a file)."""

    def note(self, line: str) -> None:
        print(line, file=sys.stderr, flush=True)


class Collected(Reporter):
    """Keeps the notes instead of printing them (tests, or callers that show them later)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def note(self, line: str) -> None:
        self.lines.append(line)


class Silent(Reporter):
    """Says nothing (quiet callers such as the runtime's background work)."""

    def note(self, line: str) -> None:
        pass


STDERR = Reporter()
