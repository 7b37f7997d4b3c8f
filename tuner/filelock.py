"""The one lock between processes of a host: an exclusive flock of a lock file.

The lock file is kept, never removed: removing it would let two processes lock two different
files. Nothing here imports anything heavy, so the database and the runtime both use it.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX
    fcntl = None


@contextlib.contextmanager
def exclusive_lock(path: str | os.PathLike, *, required: bool = True) -> Iterator[None]:
    """Hold an exclusive flock on `path` (created if need be) for the block.

    Where the lock file cannot be made (a read-only folder, no flock) an OSError is raised,
    unless not `required`: then the block runs unlocked, for callers whose own work fails
    there anyway, with its own message."""
    try:
        if fcntl is None:
            raise OSError(f"cannot lock {path}: no fcntl.flock on this system")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        if required:
            raise
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the flock


@contextlib.contextmanager
def locked_beside(path: str | os.PathLike) -> Iterator[None]:
    """An exclusive lock on the file at `path`, held through `<path>.lock` beside it (the file
    itself is replaced atomically by its writers, so it cannot carry the lock)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(path.with_name(path.name + ".lock")):
        yield
