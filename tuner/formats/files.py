"""Writing an exported file: YAML as every format here dumps it, replaced atomically, so a
reader (a deployment's runtime, another process's online cache) sees the old file or the new
one, never half of one."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import yaml

from tuner.errors import UserError


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


def write_atomic(path: str | Path, doc: dict) -> None:
    """Write YAML to a temporary file beside `path`, then rename it over `path`."""
    write_text_atomic(path, yaml_text(doc))


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write text to a temporary file beside `path`, then rename it over `path`: a reader
    sees the old file or the new one, never half of one."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError as e:
        reason = (f"{e.filename} is not a folder" if isinstance(e, FileExistsError)
                  else f"{e.strerror} ({e.filename or path.parent})")
        raise OutputError(f"cannot write {path}: {reason}") from None
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it private; an export is meant to be shipped
        os.replace(tmp, path)
    except BaseException as e:
        os.unlink(tmp)
        if isinstance(e, OSError):  # e.g. the disk filled: nothing written
            raise OutputError(f"cannot write {path}: {e.strerror or e}") from None
        raise

