"""Reading a user's text file (shapes CSV, search-space YAML, table YAML) into one error line
naming the file, the line and what was wrong, whatever the file's kind."""
from __future__ import annotations

import yaml


def decoded(data: bytes, label: str, error: type[Exception]) -> str:
    """`data` as UTF-8 text (a byte-order mark, as Excel's "CSV UTF-8" writes, is fine); else
    `error` naming `label`, the line and the byte."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise error(f"{label}:{line}: expected UTF-8 text, got byte "
                    f"0x{data[e.start]:02x}") from None


def parsed_yaml(text: str, label: str, error: type[Exception],
                loader: type = yaml.SafeLoader) -> object:
    """The YAML document of `text`; else `error` naming `label` and the line."""
    try:
        return yaml.load(text, Loader=loader)  # noqa: S506 - a safe loader, or a subclass
    except RecursionError:
        raise error(f"{label}: not valid YAML (nested too deeply)") from None
    except yaml.YAMLError as e:
        raise error(f"{label}{_where(e, text)}: not valid YAML ({_problem(e)})") from None


def _where(e: yaml.YAMLError, text: str) -> str:
    """':LINE' of a YAML error, where it says."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    if mark is not None:
        return f":{mark.line + 1}"
    position = getattr(e, "position", None)  # a ReaderError: a character YAML refuses
    return f":{text.count(chr(10), 0, position) + 1}" if isinstance(position, int) else ""


def _problem(e: yaml.YAMLError) -> str:
    """A YAML error's problem on one line."""
    problem = getattr(e, "problem", None) or getattr(e, "reason", None) or str(e)
    return " ".join(str(problem).split())
