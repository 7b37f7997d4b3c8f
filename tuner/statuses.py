"""How a trial, a study and a run end: the statuses the tuner stores, as enums.

Each is a str (StrEnum-like: it compares, hashes, formats and serializes to JSON as its
value), and the database stores that value (tuner.db.models), so rows written before the
enums read back unchanged. Nothing here imports anything: execution, search, db and the
runtime share it.
"""
from __future__ import annotations

import enum


class _Status(str, enum.Enum):
    """What enum.StrEnum (Python 3.11) is: str() and format() give the value."""
    __str__ = str.__str__
    __format__ = str.__format__


class TrialStatus(_Status):
    """How measuring one config on one shape ended."""
    OK = "ok"
    INFEASIBLE = "infeasible"  # refused before compiling (resources, the kernel's own check)
    # the kernel refuses the config on a shape it is timed on beside others (cross timings)
    UNSUPPORTED = "unsupported"
    COMPILE_ERROR = "compile_error"
    TIMEOUT = "timeout"  # compiling or measuring outlasted its limit
    RUNTIME_ERROR = "runtime_error"
    CRASHED = "crashed"  # the worker died under it
    WRONG = "wrong"  # ran, but its result differs from the float64 reference
    # correct, but its short device measure (tuner.search.screening) was too far behind the
    # best to earn the full measures: its figures are the short measure's, never a winner's
    SCREENED = "screened"

    @property
    def remembered(self) -> bool:
        """Whether the failure is not worth repeating for the config's specialization: it is
        stored as a failure, and later runs skip the config without compiling (a crash or a
        timeout costs a worker, or minutes, every time)."""
        return self in REMEMBERED

    @property
    def cannot_run(self) -> bool:
        """Whether it says the config cannot run the shape (an export prices it as never
        answering it); a lost worker or a timeout says nothing of the config."""
        return self in CANNOT_RUN


REMEMBERED = frozenset({TrialStatus.COMPILE_ERROR, TrialStatus.TIMEOUT, TrialStatus.CRASHED,
                        TrialStatus.WRONG})
CANNOT_RUN = frozenset({TrialStatus.UNSUPPORTED, TrialStatus.INFEASIBLE,
                        TrialStatus.COMPILE_ERROR, TrialStatus.RUNTIME_ERROR, TrialStatus.WRONG})


class StudyStatus(_Status):
    RUNNING = "running"  # open: the next `tune run` of its key resumes it
    DONE = "done"  # closed with a winner
    FAILED = "failed"  # closed: no config ran correctly


class RunStatus(_Status):
    RUNNING = "running"  # its process is at work, or died without saying so
    FINISHED = "finished"
    INTERRUPTED = "interrupted"  # Ctrl-C, SIGTERM, or found dead by a later run
    FAILED = "failed"  # a bug stopped it
