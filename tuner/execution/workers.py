"""Child processes that run one task at a time and can die or hang without taking the run along.

A config can poison a CUDA context (illegal memory access), crash the process (segfault,
abort) or hang the compiler. So compiling and timing happen in `Worker`s: long-lived `spawn`
children the tuner supervises. A task that kills its worker or outlives its time limit raises
`WorkerLost` in the tuner with a one-line reason; the worker is replaced before its next task.
"""
from __future__ import annotations

import contextlib
import importlib
import multiprocessing as mp
import os
import signal
import time
import traceback
from collections.abc import Callable
from typing import Any

_SPAWN = mp.get_context("spawn")
POLL_S = 0.5  # how often a waiting call checks its time limit

# Errors after which a CUDA context is unusable: the worker reports the error, then exits so
# that its replacement starts with a clean context.
_STICKY_CUDA_ERRORS = ("illegal memory access", "unspecified launch failure", "device-side assert",
                       "misaligned address", "illegal instruction", "CUDA error")


def one_line(e: BaseException) -> str:
    """'ExceptionType: first line of its message': how a failure is stored and shown."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".strip()


def is_sticky_cuda_error(text: str) -> bool:
    """Whether an error message means this process's CUDA context can no longer be used."""
    return any(marker in text for marker in _STICKY_CUDA_ERRORS)


class WorkerLost(RuntimeError):
    """The worker died or stopped answering while running a task; str() is the reason."""


class TaskFailed(RuntimeError):
    """The task raised inside the worker; str() is 'ExceptionType: first line'."""


def _worker_main(conn, env: dict[str, str], preload: tuple[str, ...], niceness: int) -> None:
    os.environ.update(env)
    os.nice(niceness)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the supervisor's to handle
    for module in preload:  # a head start only: a module that fails fails again in its task
        with contextlib.suppress(Exception):
            importlib.import_module(module)
    while True:
        try:
            fn, args = conn.recv()
        except EOFError:
            return
        try:
            try:
                conn.send(("ok", fn(*args)))
            except BaseException as e:  # noqa: BLE001 - reported to the supervisor, never lost
                conn.send(("raised", one_line(e), traceback.format_exc(limit=8)))
                if is_sticky_cuda_error(str(e)):
                    os._exit(3)
        except (BrokenPipeError, ConnectionResetError):
            return  # the supervisor is gone (an interrupted run): nobody is left to tell


def _death_reason(exitcode: int | None) -> str:
    if exitcode is None:
        return "worker stopped answering"
    if exitcode < 0:
        return f"worker killed by {signal.Signals(-exitcode).name}"
    return f"worker exited with code {exitcode}"


class Worker:
    """One supervised child process; `call` runs fn(*args) in it, within a time limit.

    `preload` names modules the child imports as soon as it starts: `start()` early and the
    seconds a fresh process spends importing torch and triton pass before the first task
    rather than inside it. `niceness` lowers the child's CPU priority (os.nice).
    """

    def __init__(self, name: str, env: dict[str, str] | None = None,
                 preload: tuple[str, ...] = (), niceness: int = 0):
        self.name, self.env, self.preload = name, dict(env or {}), preload
        self.niceness = niceness
        self.process = None
        self.conn = None

    def start(self) -> None:
        """Start the child now (if it is not running) instead of at the first call."""
        if self.process is None or not self.process.is_alive():
            self._discard()
            parent, child = _SPAWN.Pipe()
            self.process = _SPAWN.Process(target=_worker_main,
                                          args=(child, self.env, self.preload,
                                                self.niceness),
                                          name=self.name, daemon=True)
            self.process.start()
            child.close()
            self.conn = parent

    def _discard(self) -> None:
        if self.process is not None:
            if self.process.is_alive():
                self.process.kill()
            self.process.join(timeout=30)
            self.conn.close()
        self.process = self.conn = None

    def call(self, fn: Callable, *args: Any, timeout: float | Callable[[], float]) -> Any:
        """fn's result; TaskFailed if it raised; WorkerLost if the worker died or timed out.

        fn must be importable by name (a module-level function) and its args picklable.
        `timeout` may be a function, asked again every POLL_S while the task runs: a limit
        that tightens as the caller learns more (tuner.execution.executor's straggler rule).
        """
        limit = timeout if callable(timeout) else lambda: timeout
        self.start()
        self.conn.send((fn, args))
        started = time.monotonic()
        reply = None
        try:
            while not self.conn.poll(POLL_S):
                if time.monotonic() - started > limit():
                    break
            else:
                reply = self.conn.recv()
        except (EOFError, ConnectionResetError, OSError):
            pass
        if reply is None:
            self.process.join(timeout=5)
            reason = (f"timeout after {limit():g} s" if self.process.is_alive()
                      else _death_reason(self.process.exitcode))
            self._discard()
            raise WorkerLost(reason)
        if reply[0] == "raised":
            if is_sticky_cuda_error(reply[1]):
                self._discard()  # it is exiting; the next call starts a fresh one
            raise TaskFailed(reply[1])
        return reply[1]

    def close(self) -> None:
        self._discard()

    def kill(self) -> None:
        """End the child now, from any thread: a call in progress on another raises
        WorkerLost there, which discards it."""
        process = self.process
        if process is not None and process.is_alive():
            process.kill()
