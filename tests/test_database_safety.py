"""The database as a careless or hostile user meets it: a password never printed or stored,
another application's database never touched, nothing created by a command that only reads,
and one line for what cannot be opened or found."""
import os
import sqlite3
from pathlib import Path

import pytest

from tests.factories import INTERPRETER, error_line, tune
from tests.test_store_export import H100, SQUARE, config, ok, tune_fake
from tuner.db.database import Database
from tuner.db.session import DatabaseError, session_factory
from tuner.db.store import Store
from tuner.db.urls import masked_command, masked_url

SECRET = "S3cr3tPW"




def listing(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


# -- secrets ----------------------------------------------------------------------------------
@pytest.mark.parametrize("url, code, words", [
    (f"mysql://u:{SECRET}@host/db", 1,
     "Error: database URL 'mysql://u:***@host/db': driver not available"),
    (f"nosuchdialect://u:{SECRET}@host/db", 1,
     "Error: database URL 'nosuchdialect://u:***@host/db': driver not available"),
    (f"postgresql://u:{SECRET}@host:abc/db", 2,
     "Error: Invalid value for '--db': bad database URL 'postgresql://u:***@host:abc/db': its "
     "port must be a number"),
    (f"not a url u:{SECRET}@x", 2,
     "Error: Invalid value for '--db': bad database URL 'not a url u:***@x': expected "
     "dialect[+driver]://user:password@host[:port]/database"),
    (f"postgresql://u:p@{SECRET}@host:abc/db", 2,
     "Error: Invalid value for '--db': bad database URL 'postgresql://u:***@host:abc/db'"),
    (f"sqlite:///x.db?timeout=abc&password={SECRET}", 1,
     "Error: bad database URL 'sqlite:///x.db?password=***&timeout=abc': could not convert "
     "string to float: 'abc'"),
])
@pytest.mark.parametrize("command", [["show"], ["export", "table", "-o", "t.yaml"],
                                     ["db", "upgrade"]])
def test_a_url_that_cannot_be_opened_never_shows_its_password(shapes_dir, url, code, words,
                                                              command):
    for result in (tune(*command, "--db", url), tune(*command, env={"TUNE_DB": url})):
        assert result.exit_code == code
        assert error_line(result).startswith(words)
        assert SECRET not in result.output
    assert listing(shapes_dir).keys() == {"s.csv"}


def test_a_connection_failure_never_shows_its_password(shapes_dir):
    pytest.importorskip("psycopg")
    for url in (f"postgresql+psycopg://u:{SECRET}@127.0.0.1:1/db",
                f"postgresql+psycopg://u@127.0.0.1:1/db?password={SECRET}"):
        result = tune("show", "--db", url)
        assert result.exit_code == 1 and SECRET not in result.output
        assert error_line(result).startswith("Error: cannot open database postgresql+psycopg://u")


def test_masked_url_hides_every_form_of_password():
    assert masked_url(f"postgresql://u:{SECRET}@h:5432/db") == "postgresql://u:***@h:5432/db"
    assert masked_url("postgresql://u:p%40ss@h/db") == "postgresql://u:***@h/db"
    assert masked_url("postgresql://u:p@ss@h/db") == "postgresql://u:***@h/db"
    assert masked_url(f"mysql://u@h/db?passwd={SECRET}&x=1") == "mysql://u@h/db?passwd=***&x=1"
    assert masked_url(f"not a url u:{SECRET}@h") == "not a url u:***@h"
    assert masked_url("sqlite:///:memory:") == "sqlite:///:memory:"  # nothing hidden: as given


def test_the_stored_command_line_masks_database_urls(tmp_path):
    url = f"sqlite:///{tmp_path / 'tune.db'}"
    store = Store(session_factory(url))
    device = store.device(H100)
    argv = ["tune", "run", "--db", f"postgresql://u:{SECRET}@h/db",
            f"--db=mysql://u:{SECRET}@h/db", f"TUNE_DB=postgresql://u@h/db?password={SECRET}",
            "--shapes", "s.csv"]
    store.start_run(device, "interpret", argv)
    with sqlite3.connect(tmp_path / "tune.db") as conn:
        (stored,) = conn.execute("SELECT command FROM tuner_runs").fetchone()
    assert SECRET not in stored
    assert "postgresql://u:***@h/db" in stored and '"--shapes", "s.csv"' in stored
    assert masked_command(["tune", "show"]) == ["tune", "show"]
    assert SECRET.encode() not in (tmp_path / "tune.db").read_bytes()


# -- only our own databases -------------------------------------------------------------------
def foreign_database(path: Path) -> None:
    """Another application's SQLite file that happens to hold a tuner_trials table."""
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("CREATE TABLE tuner_trials (id INTEGER PRIMARY KEY, score REAL)")
        conn.execute("INSERT INTO users VALUES (1, 'ada')")
    conn.close()


READERS = [["show"], ["show", "--failures"], ["export", "table", "-o", "t.yaml"],
           ["export", "tune-configs", "-o", "t.yaml"], ["replay"], ["db", "upgrade"],
           ["buckets", "--shapes", "s.csv", "--backend", "interpret"]]


@INTERPRETER
@pytest.mark.parametrize("command", READERS + [
    ["run", "--shapes", "s.csv", "--backend", "interpret", "--trials", "1"]])
def test_another_applications_database_is_refused_unchanged(shapes_dir, command):
    foreign_database(shapes_dir / "app.db")
    before = listing(shapes_dir)
    result = tune(*command, "--db", "sqlite:///app.db")
    assert result.exit_code == 1
    assert error_line(result) == (
        "Error: app.db is not a gemm-tuner database: it holds users, neither gemm-tuner's nor "
        "Optuna's; refusing to open it (nothing changed)")
    assert listing(shapes_dir) == before  # byte for byte, and no lock, WAL or output file


def test_our_table_names_with_other_columns_are_refused(shapes_dir):
    with sqlite3.connect(shapes_dir / "app.db") as conn:
        conn.execute("CREATE TABLE tuner_trials (id INTEGER PRIMARY KEY, score REAL)")
    conn.close()
    before = listing(shapes_dir)
    with pytest.raises(DatabaseError, match="its table tuner_trials lacks gemm-tuner's columns"):
        Database("sqlite:///app.db", create=True).store  # noqa: B018
    assert listing(shapes_dir) == before


def test_a_file_that_is_not_sqlite_is_refused_unchanged(shapes_dir):
    (shapes_dir / "notes.db").write_text("remember the milk\n" * 100)
    before = listing(shapes_dir)
    result = tune("show", "--db", "sqlite:///notes.db")
    assert result.exit_code == 1
    assert error_line(result).startswith("Error: notes.db is not a SQLite database")
    with pytest.raises(DatabaseError, match="not a SQLite database"):
        Database("sqlite:///notes.db", create=True).store  # noqa: B018
    assert listing(shapes_dir) == before


@pytest.mark.parametrize("make, words", [
    (lambda d: os.mkfifo(d / "x.db"), "x.db is a FIFO (named pipe), not a database file"),
    (lambda d: os.symlink("nowhere", d / "x.db"), "x.db is a broken link, not a database file"),
    (lambda d: os.symlink("/dev/zero", d / "x.db"), "x.db is a character device, not a "
                                                     "database file"),
], ids=["fifo", "broken-link", "device"])
@pytest.mark.parametrize("create", [False, True], ids=["reader", "tuner"])
def test_a_special_file_is_no_database_for_any_command(shapes_dir, make, words, create):
    make(shapes_dir)
    with pytest.raises(DatabaseError) as e:
        Database("sqlite:///x.db", create=create).store  # noqa: B018
    assert str(e.value) == f"{words} (--db sqlite:///x.db)"
    assert sorted(p.name for p in shapes_dir.iterdir()) == ["s.csv", "x.db"]


@INTERPRETER
@pytest.mark.parametrize("command", READERS)
def test_readers_open_no_empty_or_missing_file(shapes_dir, command):
    (shapes_dir / "empty.db").touch()
    result = tune(*command, "--db", "sqlite:///empty.db")
    assert result.exit_code == 1
    assert error_line(result) == ("Error: empty.db is an empty file, not a gemm-tuner "
                                  "database; `tune run` creates one")
    result = tune(*command, "--db", "sqlite:///missing.db")
    assert result.exit_code == 1
    assert error_line(result) == ("Error: no database at missing.db (--db sqlite:///missing.db); "
                                  "`tune run` creates one")
    assert listing(shapes_dir) == {"empty.db": b"", "s.csv": b"M,N,K,dtype\n40,48,64,bf16\n"}


def test_readers_refuse_a_sqlite_database_without_our_tables(shapes_dir):
    with sqlite3.connect(shapes_dir / "optuna.db") as conn:
        conn.execute("CREATE TABLE studies (study_id INTEGER PRIMARY KEY)")
    conn.close()
    before = listing(shapes_dir)
    result = tune("show", "--db", "sqlite:///optuna.db")
    assert result.exit_code == 1
    assert error_line(result) == ("Error: optuna.db holds no gemm-tuner tables; `tune run` "
                                  "creates them")
    assert listing(shapes_dir) == before


def test_a_tuning_command_initialises_a_new_or_empty_file(shapes_dir):
    (shapes_dir / "empty.db").touch()
    for name in ("empty.db", "new.db"):
        store = Database(f"sqlite:///{name}", create=True).store
        assert store.winners() == []
        assert (shapes_dir / name).stat().st_size > 0


def test_a_newer_optuna_schema_is_one_line(shapes_dir):
    url = f"sqlite:///{shapes_dir / 'tune.db'}"
    Database(url, create=True).optuna_storage  # noqa: B018
    with sqlite3.connect(shapes_dir / "tune.db") as conn:
        conn.execute("UPDATE alembic_version SET version_num = 'v99.0.0.a'")
        conn.execute("UPDATE version_info SET library_version = '99.0.0'")
    conn.close()
    with pytest.raises(DatabaseError) as refused:
        Database(url, create=True).optuna_storage  # noqa: B018
    message = str(refused.value)
    assert message.startswith(f"database {url}: Optuna's tables: The runtime optuna version ")
    assert "(set up by optuna 99.0.0)" in message and "\n" not in message


@INTERPRETER
def test_run_on_a_newer_optuna_schema_is_one_line(shapes_dir):
    Database("sqlite:///tune.db", create=True).optuna_storage  # noqa: B018
    with sqlite3.connect(shapes_dir / "tune.db") as conn:
        conn.execute("UPDATE alembic_version SET version_num = 'v99.0.0.a'")
    conn.close()
    result = tune("run", "--shapes", "s.csv", "--backend", "interpret", "--jobs", "1")
    assert result.exit_code == 1
    assert "Optuna's tables: The runtime optuna version" in error_line(result)


# -- messages that mislead --------------------------------------------------------------------
def test_a_timeout_too_short_to_measure_anything_is_a_usage_error(shapes_dir):
    result = tune("run", "--shapes", "s.csv", "--backend", "interpret", "--timeout", "1e-9")
    assert result.exit_code == 2
    assert error_line(result) == "Error: Invalid value for '--timeout': 1e-09 is not in the " \
                                 "range x>=1."
    assert listing(shapes_dir).keys() == {"s.csv"}


def test_winners_of_older_kernel_source_are_named_not_denied(shapes_dir):
    store = Store(session_factory("sqlite:///tune.db"))
    tune_fake(store, H100, SQUARE, [(config(128, 256, 64), ok(0.19, 720.0))],
              kernel_hash="older")
    for command in (["show"], ["export", "table", "-o", "t.yaml"]):
        result = tune(*command)
        assert result.exit_code == 1
        assert error_line(result) == (
            "Error: no winners measured with this gemm-tuner's kernel source: the database "
            "holds 1 winners measured with older kernel source, left out since the kernels "
            "changed; re-tune their shapes with `tune run --shapes ...`")
    assert not (shapes_dir / "t.yaml").exists()
