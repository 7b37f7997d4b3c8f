"""`tune --help` and the database layer import neither torch nor triton: the CLI must be able
to set TRITON_INTERPRET before triton is first imported, and reading or writing the tuning
database needs no GPU stack. Each check runs in a fresh interpreter."""
import subprocess
import sys

import pytest

HEAVY = ("torch", "triton")


def heavy_modules_after(code: str) -> list[str]:
    check = (f"{code}\nimport sys\n"
             f"print('loaded:', *(m for m in {HEAVY!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("loaded:")]
    return line.split()[1:]


@pytest.mark.slow
def test_the_check_sees_torch():
    assert heavy_modules_after("import torch") == ["torch"]


@pytest.mark.parametrize("code", [
    "import tuner.cli",
    # the group's help and a command's help, as the console script runs them
    "import contextlib, io, tuner.cli\n"
    "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
    "    tuner.cli.main(['--help'], standalone_mode=False)\n"
    "assert 'Usage:' in out.getvalue()",
    "import contextlib, io, tuner.cli\n"
    "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
    "    tuner.cli.main(['run', '--help'], standalone_mode=False)\n"
    "assert '--backend' in out.getvalue()",
    "import tuner.db, tuner.db.store, tuner.db.models, tuner.db.session, tuner.db.database",
    "import tuner.shapes, tuner.dtypes, tuner.devices",
], ids=["import-cli", "tune-help", "tune-run-help", "import-db", "import-shapes"])
def test_imports_stay_light(code):
    assert heavy_modules_after(code) == []


def test_help_opens_no_database(tmp_path):
    done = subprocess.run([sys.executable, "-c", "from tuner.cli import main; main()", "show",
                           "--help"], capture_output=True, text=True, cwd=tmp_path,
                          timeout=120)
    assert done.returncode == 0 and "--failures" in done.stdout
    assert list(tmp_path.iterdir()) == []


def test_torch_dtypes_arrive_on_use():
    """The dtype table names torch types without importing torch; asking for one does."""
    import torch

    from tuner.dtypes import DTYPES, NAME_OF_TORCH_DTYPE

    assert DTYPES["bf16"].torch is torch.bfloat16 and DTYPES["fp8e4m3"].out is torch.bfloat16
    assert NAME_OF_TORCH_DTYPE[torch.float8_e4m3fn] == "fp8e4m3"
