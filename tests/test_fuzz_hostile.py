"""Hostile files fed to every reader: random bytes, YAML whose aliases multiply, huge values,
near-valid tables and special files (FIFO, /dev/zero, a directory), through the CLI
in-process and through the runtime's loader.

Whatever the input: success or one clean line (tests/test_fuzz_inputs.assert_clean), within a
few seconds, and nothing written on error. The loader is also run on the nastiest inputs in a
subprocess whose address space is capped, so that a blow-up in memory fails the test instead
of the machine.
"""
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.factories import SMALL_SPACE, examples
from tests.test_fuzz_inputs import assert_clean, invoke
from tuner.formats.table import TABLE_FORMAT

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="interpreter CLI tests run on CPU-only machines")
FUZZ = settings(max_examples=examples(20), deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
# The most one command or load may take on any input here.
SECONDS = 10
GOOD_CSV = "M,N,K,dtype\n64,64,64,bf16\n"
KEY = {"M": 64, "N": 64, "K": 64, "stride_am": 64, "stride_bk": 64, "dtype": "bf16"}
CONFIG = {"variant": "general", "pad": 0, "BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32,
          "GROUP_M": 1, "num_stages": 2, "num_warps": 4}
TABLE = {"format": TABLE_FORMAT, "device": {"name": "NVIDIA H100 80GB HBM3"},
         "ops": {"mm": {"kernel_source_hash": "0", "strategy": dict.fromkeys(KEY, "default"),
                        "entries": [{"key": KEY, "config": CONFIG, "ms": 0.1, "cublas_ms": 0.1,
                                     "tuned_shape": "64x64x64 bf16 nn"}]}}}


# -- inputs ------------------------------------------------------------------------------------
def laughs(depth: int, width: int, recursive: bool = False) -> str:
    """A YAML document whose aliases multiply: `width` ** `depth` leaves."""
    lines = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, depth)]
    if recursive:
        lines.append("loop: &loop [*loop]")
    return "\n".join(lines) + "\n"


aliases = st.builds(laughs, st.integers(1, 12), st.integers(2, 12), st.booleans())
huge_values = st.sampled_from([
    "9" * 5000, "-" + "9" * 400, "1e99999", "x" * 200_000, "2001-13-45", "[" * 5000,
    "{a: " * 2000, "!!binary zz", "!!python/object:os.system x", "\x00", "\ufeff" * 3,
]).map(lambda value: f"a: {value}\n")


@st.composite
def near_valid_table(draw) -> str:
    """The good table with one value replaced by something hostile."""
    doc = json.loads(json.dumps(TABLE))
    entry = doc["ops"]["mm"]["entries"][0]
    target, name = draw(st.sampled_from([
        (doc, "format"), (doc, "ops"), (doc, "device"), (doc["ops"]["mm"], "strategy"),
        (doc["ops"]["mm"], "entries"), (entry, "key"), (entry, "config"),
        (entry, "alternates"), (entry, "ms"), (entry, "tuned_shape"), (entry["key"], "M"),
        (entry["key"], "dtype"), (entry["config"], "variant"), (entry["config"], "BLOCK_M"),
        (entry["config"], "BLOCK_K"), (doc["ops"]["mm"]["strategy"], "M")]))
    target[name] = draw(hostile_values)
    return yaml.safe_dump(doc)


hostile_values = st.one_of(
    st.integers(-2**70, 2**70), st.text(max_size=8), st.none(), st.booleans(),
    st.floats(allow_nan=True), st.sampled_from([[], {}, [1, 2], {"a": 1}, "x" * 5000,
                                                "buckets:[" + "9" * 5000 + "]", 48, [48],
                                                [0], [-16], ["64"], [2**40]]))
EXPAND = {"mm_general_tma": [
    {"config": None, "param_map": {"META": {"BLOCK_M": "block_m", "BLOCK_N": "block_n",
                                            "BLOCK_K": "block_k"},
                                   "num_stages": "stages", "num_warps": "warps"},
     "block_m": [32], "block_n": [32], "block_k": [32], "stages": [2], "warps": [4]},
    {"strategy": {"M": "log"}}]}


@st.composite
def near_valid_expand(draw) -> str:
    """A good expand file with one value replaced by something hostile."""
    doc = json.loads(json.dumps(EXPAND))
    lists, strategy = doc["mm_general_tma"]
    target, name = draw(st.sampled_from([
        (doc, "mm_general_tma"), (lists, "param_map"), (lists["param_map"], "META"),
        (lists["param_map"], "num_warps"), (lists["param_map"]["META"], "BLOCK_K"),
        (lists, "block_m"), (lists, "block_k"), (lists, "warps"), (lists, "stages"),
        (strategy, "strategy"), (strategy["strategy"], "M"), (doc, "mm_splitk")]))
    target[name] = draw(hostile_values)
    return yaml.safe_dump(doc)


yaml_bytes = st.one_of(st.binary(max_size=300), aliases.map(str.encode),
                       huge_values.map(str.encode), near_valid_table().map(str.encode),
                       near_valid_expand().map(str.encode))


# -- the CLI -------------------------------------------------------------------------------------
def run_clean(args: list[str], files: dict[str, bytes]) -> None:
    """Run the command on the files in a fresh folder: clean, in time, nothing new on error."""
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        for name, data in files.items():
            (workdir / name).write_bytes(data)
        start = time.perf_counter()
        failed = assert_clean(invoke(args, workdir))
        assert time.perf_counter() - start < SECONDS, args
        if failed:
            assert sorted(p.name for p in workdir.iterdir()) == sorted(files), (
                "a refused command wrote a file")


@FUZZ
@given(yaml_bytes)
def test_suggest_with_a_hostile_space_file(space):
    run_clean(["suggest", "--shapes", "s.csv", "--space", "space.yaml", "-o", "out.yaml"],
              {"s.csv": GOOD_CSV.encode(), "space.yaml": space})


@FUZZ
@given(st.one_of(st.binary(max_size=300), huge_values.map(str.encode),
                 st.integers(1, 20_000).map(lambda n: (  # one shape, listed n times
                     "M,N,K,dtype\n" + "64,64,64,bf16\n" * n).encode())))
def test_suggest_with_a_hostile_shapes_file(shapes):
    run_clean(["suggest", "--shapes", "s.csv", "--space", "space.yaml", "-o", "out.yaml"],
              {"s.csv": shapes, "space.yaml": SMALL_SPACE.encode()})


@pytest.mark.slow
@FUZZ
@given(yaml_bytes, st.sampled_from(["expand", "tune-configs"]))
def test_export_of_a_hostile_table(table, fmt):
    run_clean(["export", fmt, "--table", "t.yaml", "-o", "out.yaml"], {"t.yaml": table})


@FUZZ
@given(st.one_of(st.binary(max_size=300),
                 st.binary(max_size=300).map(lambda b: __import__("gzip").compress(b)),
                 st.sampled_from([b"{}", b"[]", b'{"device": {}, "shapes": [{}]}'])
                 .map(lambda b: __import__("gzip").compress(b))))
def test_replay_of_a_hostile_recording(recording):
    run_clean(["replay", "--recording", "r.json.gz", "--strategies", "random", "--seeds",
               "1", "--trials", "1", "--jobs", "1"], {"r.json.gz": recording})


SPECIAL = {"fifo": None, "directory": None, "dev-zero": "/dev/zero"}


@pytest.fixture(params=sorted(SPECIAL))
def special_path(request, tmp_path):
    if request.param == "fifo":
        os.mkfifo(tmp_path / "pipe")
        return str(tmp_path / "pipe")
    if request.param == "directory":
        return str(tmp_path)
    return SPECIAL[request.param]


@pytest.mark.parametrize("command", [
    ["suggest", "--shapes", "{}", "-o", "out.yaml"],
    ["suggest", "--shapes", "s.csv", "--space", "{}", "-o", "out.yaml"],
    ["export", "expand", "--table", "{}", "-o", "out.yaml"],
    ["replay", "--recording", "{}", "--strategies", "random", "--seeds", "1"],
], ids=["shapes", "space", "table", "recording"])
def test_a_special_file_is_one_line_at_once(command, special_path):
    run_clean([arg.replace("{}", special_path) for arg in command],
              {"s.csv": GOOD_CSV.encode()})


# -- the runtime's loader ------------------------------------------------------------------------
def load(path: Path) -> None:
    """The runtime's loader on one file: an answer, or one clean line of the errors a loader
    raises, in time."""
    from tuner import runtime
    from tuner.errors import UserError

    runtime.clear_cache()
    start = time.perf_counter()
    try:
        answer = runtime.get_tuned_config("mm", path=path, **KEY)
        assert answer["variant"]
    except (UserError, ValueError, TypeError, FileNotFoundError) as e:
        assert "\n" not in str(e) and len(str(e)) < len(str(path)) + 400, str(e)[:500]
    finally:
        runtime.clear_cache()
    assert time.perf_counter() - start < SECONDS


@FUZZ
@given(yaml_bytes)
def test_the_runtime_loader_on_a_hostile_table(table):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.yaml"
        path.write_bytes(table)
        load(path)
        assert [p.name for p in Path(tmp).iterdir()] == ["t.yaml"]


def test_the_runtime_loader_on_special_files(special_path):
    load(Path(special_path))


# Run in a fresh interpreter with its address space capped: torch is kept out (the loader
# then checks entries without the kernels), as importing it reserves more than the cap.
CAPPED_LOADS = textwrap.dedent("""
    import json, resource, sys, warnings
    sys.modules["torch"] = None
    warnings.simplefilter("ignore")
    from tuner import runtime
    from tuner.errors import UserError
    resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))
    key = dict(M=64, N=64, K=64, stride_am=64, stride_bk=64, dtype="bf16")
    for path in json.loads(sys.argv[1]):
        runtime.clear_cache()
        try:
            runtime.get_tuned_config("mm", path=path, **key)
            print("answered", path)
        except (UserError, ValueError, TypeError, FileNotFoundError) as e:
            print("refused", path, str(e).replace(chr(10), " ")[:200])
""")
MEMORY_CAP = 400 << 20


@pytest.mark.slow
def test_the_nastiest_tables_load_in_bounded_memory_and_time(tmp_path):
    nasty = {"laughs.yaml": laughs(12, 12), "wide-laughs.yaml": laughs(3, 2000),
             "recursive.yaml": laughs(2, 2, recursive=True),
             "deep.yaml": "[" * 50_000 + "]" * 50_000,
             "many-entries.yaml": yaml.safe_dump({**TABLE, "ops": {"mm": {
                 **TABLE["ops"]["mm"], "entries": [{"key": {**KEY, "M": i + 1}, "config": CONFIG}
                                                   for i in range(500)]}}}),
             "long-line.yaml": "a: " + "x" * (1 << 20) + "\n",
             "big-int.yaml": "a: " + "9" * 100_000 + "\n"}
    for name, text in nasty.items():
        (tmp_path / name).write_text(text)
    paths = [str(tmp_path / name) for name in nasty] + ["/dev/zero", str(tmp_path)]
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CAPPED_LOADS.replace("CAP", str(MEMORY_CAP)),
                           json.dumps(paths)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert len(lines) == len(paths), done.stdout
    assert all(line.startswith("refused") for line in lines if "many-entries" not in line)
    assert time.perf_counter() - start < 30
