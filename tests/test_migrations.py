"""Schema migrations (tuner.db.migrations): a database written by the code at cea1d47, before
the schema was versioned, opens with today's code, upgraded with one line and nothing lost; a
database newer than the code is refused with one line; the head revision is the models.

tests/fixtures/tune-cea1d47.db: `tune run --backend interpret --trials 2` at cea1d47 over
32x32x32 and 64x32x32 fp32 nn (2 studies, 4 trials, 2 winners, Optuna's tables beside)."""
import shutil
import sqlite3
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from click.testing import CliRunner
from sqlalchemy import create_engine

from tuner.cli import main
from tuner.db.migrations import VERSION_TABLE, head_revision, ours
from tuner.db.models import Base
from tuner.db.session import DatabaseError, open_engine

FIXTURE = Path(__file__).parent / "fixtures" / "tune-cea1d47.db"
OURS = ("tuner_devices", "tuner_kernels", "tuner_search_spaces", "tuner_runs", "tuner_studies",
        "tuner_trials", "tuner_winners", "tuner_failures", "tuner_claims",
        "tuner_cross_timings", "tuner_bucketings")


def rows(db: Path, table: str, columns: str = "*") -> list[tuple]:
    with sqlite3.connect(db) as c:
        return c.execute(f"select {columns} from {table} order by 1").fetchall()


def columns(db: Path, table: str) -> list[str]:
    with sqlite3.connect(db) as c:
        return [r[1] for r in c.execute(f"pragma table_info({table})")]


def differences(url: str) -> list:
    """What separates the database's tables from the models (ours only)."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"include_object": ours,
                                                             "compare_type": True})
            return compare_metadata(context, Base.metadata)
    finally:
        engine.dispose()


@pytest.fixture
def old_db(tmp_path) -> Path:
    db = tmp_path / "old.db"
    shutil.copy(FIXTURE, db)
    return db


def test_the_fixture_is_the_unversioned_cea1d47_schema(old_db):
    assert "host_us" not in columns(old_db, "tuner_trials")
    assert "launch" not in columns(old_db, "tuner_studies")
    with sqlite3.connect(old_db) as c:
        tables = {r[0] for r in c.execute("select name from sqlite_master where type='table'")}
    assert set(OURS) <= tables and VERSION_TABLE not in tables
    assert len(rows(old_db, "tuner_trials")) == 4 and len(rows(old_db, "tuner_winners")) == 2


def test_opening_an_old_database_upgrades_it_losing_nothing(old_db, capsys):
    before = {table: rows(old_db, table) for table in OURS}
    old_columns = {table: columns(old_db, table) for table in OURS}
    optuna_before = rows(old_db, "trials"), rows(old_db, "alembic_version")

    open_engine(f"sqlite:///{old_db}").dispose()

    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "upgraded database" in err and head_revision() in err
    assert rows(old_db, VERSION_TABLE) == [(head_revision(),)]
    for table in OURS:  # every old row, every old value
        assert rows(old_db, table, ", ".join(f'"{c}"' for c in old_columns[table])) \
            == before[table], table
    assert rows(old_db, "tuner_trials", "host_us, loop_ms") == [(None, None)] * 4
    assert rows(old_db, "tuner_studies", "launch") == [(None,)] * 2
    # Optuna's tables and version are Optuna's: untouched
    assert (rows(old_db, "trials"), rows(old_db, "alembic_version")) == optuna_before
    assert differences(f"sqlite:///{old_db}") == []

    open_engine(f"sqlite:///{old_db}").dispose()  # at head: silent
    assert capsys.readouterr().err == ""


def test_the_upgraded_trials_read_through_the_store(old_db):
    from tuner.db.session import session_factory
    from tuner.db.store import Store

    store = Store(session_factory(f"sqlite:///{old_db}"))
    winners = store.winners(with_trials=True)
    assert len(winners) == 2
    assert sorted(len(w.study.trials) for w in winners) == [2, 2]
    assert all(t.loop_ms is None and t.params for w in winners for t in w.study.trials)


def test_a_new_database_is_created_at_head_silently(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'new.db'}"
    open_engine(url).dispose()
    assert capsys.readouterr().err == ""
    assert rows(tmp_path / "new.db", VERSION_TABLE) == [(head_revision(),)]
    assert differences(url) == []


def test_tune_db_upgrade(old_db):
    result = CliRunner().invoke(main, ["db", "upgrade", "--db", f"sqlite:///{old_db}"])
    assert result.exit_code == 0, result.output
    assert f"schema at revision {head_revision()} (upgraded)" in result.output
    again = CliRunner().invoke(main, ["db", "upgrade", "--db", f"sqlite:///{old_db}"])
    assert again.exit_code == 0 and "(already current)" in again.output
    assert len(rows(old_db, "tuner_trials")) == 4


def test_tune_db_upgrade_creates_no_database(tmp_path):
    result = CliRunner().invoke(main, ["db", "upgrade", "--db",
                                       f"sqlite:///{tmp_path / 'typo.db'}"])
    assert result.exit_code == 1 and result.output.startswith("Error: no database at")
    assert list(tmp_path.iterdir()) == []


def test_a_database_newer_than_the_code_is_refused_with_one_line(old_db):
    open_engine(f"sqlite:///{old_db}").dispose()
    with sqlite3.connect(old_db) as c:
        c.execute(f"update {VERSION_TABLE} set version_num = 'f00dfeed'")
    trials = rows(old_db, "tuner_trials")

    with pytest.raises(DatabaseError, match="newer than this gemm-tuner") as refused:
        open_engine(f"sqlite:///{old_db}")
    assert "\n" not in str(refused.value) and "f00dfeed" in str(refused.value)

    export = ["export", "table", "-o", str(old_db.parent / "t.yaml")]
    for args in (["db", "upgrade"], ["show"], export):
        result = CliRunner().invoke(main, [*args, "--db", f"sqlite:///{old_db}"])
        assert result.exit_code == 1, result.output
        (line,) = result.output.strip().splitlines()
        assert line.startswith("Error: database") and "newer than this gemm-tuner" in line
    assert rows(old_db, VERSION_TABLE) == [("f00dfeed",)] and rows(old_db, "tuner_trials") \
        == trials
    assert not (old_db.parent / "t.yaml").exists()
