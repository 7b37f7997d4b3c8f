"""Output files: checked before any work, and no temporary file left behind by a write that
was interrupted, terminated or killed."""
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.factories import INTERPRETER, error_line, tune
from tuner.formats.files import STALE_AFTER_S, check_writable, write_text_atomic


def listing(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


# -- outputs ----------------------------------------------------------------------------------
@INTERPRETER
def test_validate_checks_its_output_before_tuning(shapes_dir):
    (shapes_dir / "file").write_text("")
    (shapes_dir / "t.yaml").write_text("format: gemm-tuner-table/2\n")
    before = listing(shapes_dir)
    result = tune("validate", "--config", "t.yaml", "--shapes", "s.csv", "--backend",
                  "interpret", "-o", "file/report.md")
    assert result.exit_code == 1
    assert error_line(result) == "Error: cannot write file/report.md: file is not a folder"
    assert listing(shapes_dir) == before  # no validate.db: nothing was tuned
    (shapes_dir / "folder").mkdir()
    result = tune("export", "table", "-o", "folder")
    assert result.exit_code == 2 and "is a directory" in error_line(result)


def test_check_writable(tmp_path):
    check_writable(tmp_path / "new" / "deeper" / "o.yaml")  # folders it would create
    assert list(tmp_path.iterdir()) == []  # checked, nothing made
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError, match="file is not a folder"):
        check_writable(tmp_path / "file" / "o.yaml")
    with pytest.raises(OSError, match="it is a folder"):
        check_writable(tmp_path)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(OSError, match="not a regular file"):
        check_writable(tmp_path / "fifo")
    if os.geteuid() != 0:  # root writes anywhere
        (tmp_path / "ro").mkdir(mode=0o555)
        with pytest.raises(OSError, match="Permission denied"):
            check_writable(tmp_path / "ro" / "o.yaml")


def test_an_interrupted_write_leaves_no_temporary(tmp_path, monkeypatch):
    def interrupted(_fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_text_atomic(tmp_path / "out.yaml", "a: 1\n")
    assert list(tmp_path.iterdir()) == []


def test_sigterm_during_a_write_leaves_no_temporary(tmp_path):
    script = ("import os, signal, sys\n"
              "from tuner.formats import files\n"
              "os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGTERM)\n"
              "files.write_text_atomic(sys.argv[1], 'a: 1\\n' * 1000)\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "out.yaml")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 128 + signal.SIGTERM, done.stderr
    assert "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_later_write_removes_stale_temporaries_of_its_own(tmp_path):
    old = time.time() - STALE_AFTER_S - 60
    stale = tmp_path / ".out.yaml.abcd1234.partial"
    fresh = tmp_path / ".out.yaml.wxyz6789.partial"  # a write under way
    others = [tmp_path / ".other.yaml.abcd1234.partial", tmp_path / ".out.yaml.abcd1234"]
    for path in (stale, fresh, *others):
        path.write_text("half")
    for path in (stale, *others):
        os.utime(path, (old, old))
    write_text_atomic(tmp_path / "out.yaml", "a: 1\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["out.yaml", fresh.name, *(p.name for p in others)])


def test_a_saved_recording_replaces_the_old_one_whole_or_not_at_all(tmp_path, monkeypatch):
    from tests.test_replay import RECORDING

    path = tmp_path / "recording.json.gz"
    path.write_bytes(b"the old recording")

    def interrupted(_fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        RECORDING.save(path)
    assert listing(tmp_path) == {"recording.json.gz": b"the old recording"}


def test_replay_refuses_save_recording_beside_a_recording(tmp_path):
    result = tune("replay", "--recording", str(tmp_path / "r.gz"), "--save-recording",
                  str(tmp_path / "copy.gz"))
    assert result.exit_code == 2
    assert error_line(result) == ("Error: --save-recording writes the recording read from "
                                  "--db; with --recording there is none to save")
    assert list(tmp_path.iterdir()) == []
