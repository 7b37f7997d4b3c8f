"""One database URL, opened on first use: what a command's store and Optuna's storage share.

A command gets one of these before it has checked its input; nothing connects, and no file
is created, until a job first asks for `store` or `optuna_storage`. Importing this module
imports neither SQLAlchemy nor torch.
"""
from __future__ import annotations

from functools import cached_property


class Database:
    """`create`: the command may create the database (`tune run`, `tune validate`); without
    it, only an existing database of ours is opened (tuner.db.ownership)."""

    def __init__(self, url: str | None = None, create: bool = False):
        self.requested_url = url  # None: TUNE_DB, else ./tune.db (tuner.db.urls.resolve_url)
        self.create = create

    @cached_property
    def url(self) -> str:
        from tuner.db.urls import resolve_url
        return resolve_url(self.requested_url)

    @cached_property
    def shown_url(self) -> str:
        """The URL as messages and files show it: its password masked."""
        from tuner.db.urls import masked_url
        return masked_url(self.url)

    @cached_property
    def store(self):
        """The tuner.db.store.Store of this database, its schema created or upgraded."""
        from tuner.db.session import session_factory
        from tuner.db.store import Store
        return Store(session_factory(self.url, create=self.create))

    @cached_property
    def optuna_storage(self):
        """Optuna's RDB storage in the same database (tuner.db.optuna_storage).

        Only `tune run` opens it, before its workers start; so this is where what killed runs
        left is settled: their runs marked interrupted and their Optuna trials failed
        (Store.interrupt_dead_runs, tuner.db.optuna_storage.settle_dead_trials).
        """
        from tuner.db.optuna_storage import optuna_storage, settle_dead_trials
        storage = optuna_storage(self.url)
        self.store.interrupt_dead_runs()
        settle_dead_trials(storage, self.store)
        return storage


def upgrade_database(url: str | None = None) -> tuple[str | None, str]:
    """`tune db upgrade`: open the existing database, which brings its schema to this code's
    (tuner.db.session.open_engine, tuner.db.migrations); (revision it was at, head)."""
    from tuner.db.session import open_engine

    seen: list[tuple[str | None, str]] = []
    open_engine(url, on_schema=lambda before, head: seen.append((before, head)),
                create=False).dispose()
    return seen[0]
