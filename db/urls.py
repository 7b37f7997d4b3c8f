"""Database URLs as the tool shows and stores them: with the password hidden, always.

A URL names its password (`postgresql://user:PASSWORD@host/db`, or `?password=` in its query)
and lands in error lines, notes, export headers and the command line a run stores; each of
those goes through masked_url. Importing this module imports no SQLAlchemy.
"""
from __future__ import annotations

import os
import re
from collections.abc import Sequence

DEFAULT_URL = "sqlite:///tune.db"
HIDDEN = "***"
# Query parameters a driver takes a password from (libpq, MySQLdb, pymysql, ...).
_PASSWORD_PARAMS = ("password", "passwd", "pwd")
# What a URL holds between `scheme://user:` and its LAST '@' (a password with a raw '@' in it
# is still hidden whole), or after `password=` in a query.
_USERINFO_SECRET = re.compile(r"(?P<keep>://[^\s:/@]*:)(?P<secret>\S*)(?=@)")
_QUERY_SECRET = re.compile(rf"(?P<keep>[?&](?:{'|'.join(_PASSWORD_PARAMS)})=)(?P<secret>[^&\s]*)",
                           re.IGNORECASE)
# In text given as a URL that is none (no `://`), anything from a ':' to the last '@'.
_LOOSE_SECRET = re.compile(r"(?P<keep>:)(?P<secret>\S*)(?=@)")


def resolve_url(url: str | None) -> str:
    """--db, else TUNE_DB, else ./tune.db."""
    return url or os.environ.get("TUNE_DB") or DEFAULT_URL


def masked_url(url: str) -> str:
    """The URL with its password replaced by ***: as SQLAlchemy renders it where it parses
    (`make_url(...).render_as_string(hide_password=True)`), else masked by pattern; a URL
    with no password as given."""
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception:  # ArgumentError, or ValueError for a port that is no number
        return _masked_text(url, _url_patterns(url))
    if "@" in (parsed.host or "") or "@" in (parsed.database or ""):
        return _masked_text(url)  # a raw '@' in the password: SQLAlchemy split it there
    if parsed.password is None and not _passwords(url):
        return url  # nothing to hide: as given (rendering would re-quote it)
    return _masked_text(parsed.render_as_string(hide_password=True), (_QUERY_SECRET,))


def _url_patterns(url: str) -> tuple[re.Pattern, ...]:
    """Where the secrets of text given as a URL are: loosely, where it has no `://`."""
    return (_USERINFO_SECRET if "://" in url else _LOOSE_SECRET, _QUERY_SECRET)


def _masked_text(text: str, patterns=(_USERINFO_SECRET, _QUERY_SECRET)) -> str:
    for pattern in patterns:
        text = pattern.sub(lambda m: m["keep"] + HIDDEN, text)
    return text


def _passwords(url: str) -> set[str]:
    """The password of the URL as written and as decoded, for hiding it in other text."""
    from urllib.parse import unquote

    found = {m["secret"] for pattern in _url_patterns(url) for m in pattern.finditer(url)}
    return {p for s in found for p in (s, unquote(s)) if p}


def masked_message(text: str, url: str) -> str:
    """A driver's message about `url` with the URL in it masked, and its password too
    wherever else it appears (a driver may quote its connection arguments)."""
    text = text.replace(url, masked_url(url))
    for secret in sorted(_passwords(url), key=len, reverse=True):
        text = text.replace(secret, HIDDEN)
    return _masked_text(text)


def masked_command(argv: Sequence[str]) -> list[str]:
    """A command line to store (tuner_runs.command): each argument naming a URL with a
    password (`--db URL`, `--db=URL`, `TUNE_DB=URL`) masked."""
    return [masked_url(arg) if _passwords(arg) else arg for arg in argv]
