"""Whether the process holding something in the tuning database still lives: one rule and one
heartbeat for everything a `tune run` process holds (its run row, its claims on keys, its
RUNNING Optuna trials), so that the next run can settle what a killed one left.

Each holding names its holder, an Owner ("host:pid"). A holder is dead when
- it is a process of this host that is gone (kill -9, a crash): known at once, no waiting; or
- its heartbeat, beaten every `Lease.beat_s` while it lives (Heartbeat), is older than
  `Lease.grace_s`: the only sign there is of a process on another host.
A live process of this host is alive whatever its heartbeat says. Run rows carry no
heartbeat: a run of another host is left as it is.

What a dead holder left is settled by its kind: runs are marked interrupted
(Store.interrupt_dead_runs), trials failed and redone (tuner.db.optuna_storage.
settle_dead_trials), claims taken over by the next claimant (tuner.db.claims.ClaimKeeper).
Nothing here imports torch, triton or Optuna.
"""
from __future__ import annotations

import os
import re
import socket
import threading
import uuid
from collections.abc import Callable, Hashable
from dataclasses import dataclass


@dataclass(frozen=True)
class Lease:
    """How often a live holder beats, and how long after its last beat it counts as dead."""
    beat_s: float
    grace_s: float


# A RUNNING Optuna trial (Optuna stores its heartbeats and fails stale trials itself).
TRIAL_LEASE = Lease(beat_s=30, grace_s=120)
# A claim on a key: longer than a trial's, since a claim lapsing under a live process would
# set two runs on one study, where a trial failed by mistake is only measured again.
CLAIM_LEASE = Lease(beat_s=75, grace_s=300)

_OWNER = re.compile(r"(?P<host>.+?):(?P<pid>\d+)(?::(?P<token>\w+))?")


@dataclass(frozen=True)
class Owner:
    """A holder as stored: "host:pid", or "host:pid:token" where one process keeps several
    holders apart (each claim keeper; a new process with a reused pid is then no heir)."""
    host: str
    pid: int
    token: str | None = None

    @classmethod
    def this_process(cls, token: bool = False) -> Owner:
        return cls(socket.gethostname(), os.getpid(), uuid.uuid4().hex[:8] if token else None)

    @classmethod
    def parse(cls, text: str | None) -> Owner | None:
        """The owner a stored text names; None for no text, or one that names no process."""
        found = _OWNER.fullmatch(text or "")
        return found and cls(found["host"], int(found["pid"]), found["token"])

    def __str__(self) -> str:
        return f"{self.host}:{self.pid}" + (f":{self.token}" if self.token else "")

    @property
    def local(self) -> bool:
        """A process of this host, whose liveness can be asked of the system."""
        return self.host == socket.gethostname()

    @property
    def gone(self) -> bool:
        """Dead for certain: a process of this host that no longer runs."""
        return self.local and not pid_alive(self.pid)


def pid_alive(pid: int) -> bool:
    """Whether a process of this host is alive (a zombie, killed and not yet reaped, is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return True


class Heartbeat:
    """Beats for the things this process holds, every `beat_s`, from one daemon thread
    started with the first hold: `beat(items)` stores one heartbeat for each. A beat that
    fails (a busy database) is skipped: the next comes well within the grace."""

    def __init__(self, beat: Callable[[list], None], beat_s: float, name: str):
        self._beat, self.beat_s, self.name = beat, beat_s, name
        self._held: set[Hashable] = set()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def hold(self, item: Hashable) -> None:
        with self._lock:
            self._held.add(item)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True, name=self.name)
                self._thread.start()

    def drop(self, item: Hashable) -> None:
        with self._lock:
            self._held.discard(item)

    def held(self) -> list:
        with self._lock:
            return list(self._held)

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        while not self._stopped.wait(self.beat_s):
            items = self.held()
            if not items:
                continue
            try:
                self._beat(items)
            except Exception:  # noqa: BLE001 (see the class docstring)
                pass
