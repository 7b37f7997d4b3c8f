"""Writing an exported file: YAML as every format here dumps it, replaced atomically, so a
reader (a deployment's runtime, another process's online cache) sees the old file or the new
one, never half of one.

The new text goes to a temporary file beside the output, named `.NAME.XXXXXXXX.partial`,
then is renamed over it. The temporary file is removed on any exit the process survives (an
error, Ctrl-C, or SIGTERM, which raises while a write is under way); what a kill -9 leaves is
removed by a later write of the same output once it is STALE_AFTER_S old.
"""
from __future__ import annotations

import os
import re
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import yaml

from tuner.errors import UserError

TEMPORARY_SUFFIX = ".partial"
# Older than this, a temporary file of an output is left over from a killed write: no write
# takes minutes, since all the work is done before the temporary file is made.
STALE_AFTER_S = 600.0


class OutputError(UserError, OSError):
    """A file that cannot be written where it was asked for (a missing or read-only folder)."""


class _PlainDumper(yaml.SafeDumper):
    """yaml.safe_dump's dumper writing a value shared by several places out in each (no
    `&id001` anchors): readers cap what aliases may add (tuner.textfiles.BoundedLoader), and
    a person reading an export should see every entry whole."""

    def ignore_aliases(self, data) -> bool:
        return True


def yaml_text(doc: dict) -> str:
    return yaml.dump(doc, Dumper=_PlainDumper, sort_keys=False, default_flow_style=None,
                     width=100)


def check_writable(path: str | Path) -> None:
    """OutputError now where write_text_atomic could not write `path` later: a command checks
    its outputs before it works. The folders it would create must lie under a folder where
    this process can make a file; an existing `path` must be a regular file."""
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"cannot write {path}: it is a folder")
    if os.path.lexists(path) and not path.is_file():
        raise OutputError(f"cannot write {path}: not a regular file")
    folder = path.parent
    while not os.path.lexists(folder) and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise OutputError(f"cannot write {path}: {folder} is not a folder")
    try:  # a file made and removed at once: permissions alone miss read-only mounts, root
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=folder)
    except OSError as e:
        raise OutputError(f"cannot write {path}: {e.strerror} ({folder})") from None
    os.close(fd)
    os.unlink(probe)


def write_atomic(path: str | Path, doc: dict) -> None:
    """Write YAML to a temporary file beside `path`, then rename it over `path`."""
    write_text_atomic(path, yaml_text(doc))


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write text (UTF-8) to a temporary file beside `path`, then rename it over `path`: a
    reader sees the old file or the new one, never half of one."""
    write_bytes_atomic(path, text.encode())


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    """Write bytes as write_text_atomic writes text (a packed recording, tuner.search.replay)."""
    path = Path(path)
    with _terminate_raises():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            remove_stale_temporaries(path)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMPORARY_SUFFIX,
                                       dir=path.parent)
        except OSError as e:
            reason = (f"{e.filename} is not a folder" if isinstance(e, FileExistsError)
                      else f"{e.strerror} ({e.filename or path.parent})")
            raise OutputError(f"cannot write {path}: {reason}") from None
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o644)  # mkstemp makes it private; an export is meant to be shipped
            os.replace(tmp, path)
        except BaseException as e:
            with suppress(FileNotFoundError):  # renamed already
                os.unlink(tmp)
            if isinstance(e, OSError):  # e.g. the disk filled: nothing written
                raise OutputError(f"cannot write {path}: {e.strerror or e}") from None
            raise


def remove_stale_temporaries(path: Path, now: float | None = None) -> list[Path]:
    """Remove the temporary files of `path` (write_text_atomic's names) that writes killed
    STALE_AFTER_S ago or more left beside it; those removed."""
    own = re.compile(rf"\.{re.escape(path.name)}\.[a-z0-9_]{{8}}{re.escape(TEMPORARY_SUFFIX)}")
    cutoff = (time.time() if now is None else now) - STALE_AFTER_S
    removed = []
    for entry in os.scandir(path.parent):
        try:
            if (own.fullmatch(entry.name) and entry.is_file(follow_symlinks=False)
                    and entry.stat(follow_symlinks=False).st_mtime < cutoff):
                os.unlink(entry.path)
                removed.append(Path(entry.path))
        except FileNotFoundError:  # removed meanwhile by another write
            continue
    return removed


class Terminated(SystemExit):
    """SIGTERM arrived during a write: exit as a terminated process does, after cleaning up."""


@contextmanager
def _terminate_raises() -> Iterator[None]:
    """While a write is under way, SIGTERM raises Terminated instead of ending the process
    where it stands (where this thread may set handlers and none is set)."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        yield
        return

    def terminate(signum, _frame):
        raise Terminated(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
