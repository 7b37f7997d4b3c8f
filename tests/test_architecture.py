"""The project's shape: the deployment wing (tuner.runtime) answers every kind of lookup
without the tuning side's dependencies, and no module imports itself back through others."""
import ast
import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.formats.files import write_atomic
from tuner.formats.table import TABLE_FORMAT

ROOT = Path(__file__).resolve().parent.parent
# Where each installed package's source lies (pyproject's package-dir).
SOURCE_DIRS = {"tuner": ROOT / "tuner", "tuner.kernels": ROOT / "kernels",
               "tuner.db": ROOT / "db", "tuner.search_spaces": ROOT / "search_spaces"}

SPLIT_K = {"variant": "splitk", "pad": 0, "BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64,
           "SPLIT_K": 2, "num_stages": 4, "num_warps": 4}


def key(M, N, K, dtype="bf16"):
    return {"M": M, "N": N, "K": K, "stride_am": K, "stride_bk": N, "dtype": dtype}


# Run in a fresh interpreter where importing sqlalchemy or optuna raises: a table hit, a
# nearest answer that weighs the neighbour's variations (its other splits), and the model's
# pick for a dtype the table has no entry of; cuBLAS is left out of the last two, so that the
# fallback itself answers.
PURE_LOOKUPS = """
import json, sys, warnings
sys.modules["sqlalchemy"] = None
sys.modules["optuna"] = None
warnings.simplefilter("ignore")
from tuner import runtime
path, exact, far, other_dtype = json.loads(sys.argv[1])
answers = [runtime.get_tuned_config("mm", path=path, **exact),
           runtime.get_tuned_config_without(("cublas",), "mm", path=path, **far),
           runtime.get_tuned_config_without(("cublas",), "mm", path=path, **other_dtype)]
print(json.dumps({
    "answers": [[a.source, dict(a)] for a in answers],
    "blocked": [m for m in ("sqlalchemy", "optuna") if sys.modules.get(m, 0) is not None],
    "loaded": sorted(m for m, module in sys.modules.items() if module is not None and (
        m.split(".")[0] in ("sqlalchemy", "optuna") or m.startswith(("tuner.export", "tuner.db")))),
}))
"""


@pytest.mark.slow
def test_the_runtime_answers_without_optuna_sqlalchemy_export_or_db(tmp_path):
    table = tmp_path / "t.yaml"
    tuned = key(96, 3584, 4096)
    write_atomic(table, {"format": TABLE_FORMAT, "device": {"name": "NVIDIA H100 80GB HBM3"},
                         "ops": {"mm": {"strategy": dict.fromkeys(tuned, "default"),
                                        "entries": [{"key": tuned, "config": SPLIT_K}]}}})
    lookups = [str(table), tuned, key(96, 3584, 18944), key(300, 5000, 4096, "fp16")]
    env = {k: v for k, v in os.environ.items() if k not in ("TUNE_CONFIG", "TUNE_LOG")}
    out = subprocess.run([sys.executable, "-c", PURE_LOOKUPS, json.dumps(lookups)],
                         capture_output=True, text=True, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    (table_source, table_config), (near_source, near_config), (model_source, _) = seen["answers"]
    assert table_source == "table" and table_config == SPLIT_K
    # a re-split of the neighbour: its variations were weighed, by the model
    assert near_source == "nearest" and near_config == dict(SPLIT_K,
                                                           SPLIT_K=near_config["SPLIT_K"])
    assert near_config["SPLIT_K"] > 2
    assert model_source == "model"
    assert seen["blocked"] == [] and seen["loaded"] == []


# -- no import cycle ---------------------------------------------------------------------------
# The source tree is read once per session: the checks below share these answers, and only read
# them.
@functools.cache
def project_modules() -> dict[str, Path]:
    """Every project module's dotted name (as installed) and its file."""
    modules = {}
    for package, folder in SOURCE_DIRS.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join([package, *parts])] = path
    return modules


@functools.cache
def parsed(path: Path) -> ast.Module:
    """A file's syntax tree."""
    return ast.parse(path.read_text(), str(path))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """Every import statement, at any depth (inside functions too), except the body of an
    `if TYPE_CHECKING:` (never run)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                yield from _imports(ast.Module(body=[child], type_ignores=[]))
            continue
        yield from _imports(node)


def _owner(name: str, modules) -> str | None:
    """The project module `name` is, or the innermost project package holding it."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


@functools.cache
def import_graph() -> dict[str, set[str]]:
    """Per project module, the project modules it imports. `from package import name` counts
    as an import of the submodule where `name` is one, else of the package; importing a
    submodule is not counted as importing its parent packages' __init__."""
    modules = project_modules()
    graph = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        edges = set()
        for node in _imports(parsed(path)):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = name.split(".")
                    anchor = anchor[:len(anchor) - node.level + (1 if is_package else 0)]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                           for alias in node.names]
            edges.update(t for t in map(lambda t: _owner(t, modules), targets) if t)
        edges.discard(name)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (its modules, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)):
            return cycle
    return None


def test_the_graph_finds_a_cycle_it_is_given():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_the_import_graph_sees_the_wings_edges():
    graph = import_graph()
    assert "tuner.formats.table" in graph["tuner.export.writers"]
    assert "tuner.model.named_devices" in graph["tuner.runtime.fallback"]  # inside a function
    assert "tuner.kernels.launches" not in graph["tuner.kernels.base"]  # under TYPE_CHECKING


def test_no_module_imports_itself_back():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


# -- which way the wings import -----------------------------------------------------------------
# What the deployment side (tuner.runtime) never imports, lazily or not: the tuning machinery,
# the search, the export (the tuner.export package, and any module beside it named after it)
# and the database; and the tuning side's libraries. The file formats (tuner.formats) it may.
TUNING_SIDE = ("tuner.execution", "tuner.search", "tuner.export", "tuner.db")
TUNING_LIBRARIES = ("optuna", "sqlalchemy", "alembic")
# Online tuning's one door into the measuring code, imported only when a key is tuned online.
ONLINE_DOOR = ("tuner.runtime.online", "tuner.execution.in_process")


def _in(prefixes: tuple[str, ...], module: str) -> bool:
    """Whether the module is one of those named, or inside one, or one of their siblings named
    after them (tuner.export_x after tuner.export)."""
    return any(module == p or module.startswith((p + ".", p + "_")) for p in prefixes)


def reach(graph: dict[str, set[str]], prefix: str, skip: tuple[str, str] | None = None
          ) -> dict[str, str]:
    """Every module the modules under `prefix` import, at any depth (lazy imports too), each
    with the module that imports it; not following the edge `skip`."""
    todo = [m for m in graph if _in((prefix,), m)]
    reached = dict.fromkeys(todo, "")
    while todo:
        module = todo.pop()
        for target in graph[module]:
            if (module, target) != skip and target not in reached:
                reached[target] = module
                todo.append(target)
    return reached


def libraries(module: str) -> set[str]:
    """The top-level names of the modules a project module imports (any depth, as _imports)."""
    tree = parsed(project_modules()[module])
    names = set()
    for node in _imports(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif not node.level and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_the_runtime_reaches_neither_the_tuning_machinery_the_export_nor_the_database():
    """Every import the wing may run, lazy ones too, not only those a lookup above took; all
    but online tuning's door (the next test)."""
    reached = reach(import_graph(), "tuner.runtime", skip=ONLINE_DOOR)
    assert {m: by for m, by in reached.items() if _in(TUNING_SIDE, m)} == {}
    assert {m: sorted(libraries(m) & set(TUNING_LIBRARIES)) for m in reached
            if m.startswith("tuner.") and libraries(m) & set(TUNING_LIBRARIES)} == {}


def test_online_tuning_opens_its_door_only_on_need():
    """The runtime's one edge into the tuning machinery is the door, imported inside a
    function: loading an expand file, or answering from its cache, imports none of it."""
    tree = parsed(project_modules()[ONLINE_DOOR[0]])
    at_module_level = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert not [node for node in at_module_level
                if (getattr(node, "module", None) or "").startswith("tuner.execution")
                or any(alias.name.startswith("tuner.execution") for alias in node.names)]
    assert ONLINE_DOOR[1] in import_graph()[ONLINE_DOOR[0]]


def test_the_tuning_machinery_never_imports_the_runtime():
    """tuner.execution measures what the runtime launches through tuner.kernels.calls, never
    through the runtime itself: a change to the deployment side cannot break tuning."""
    reached = reach(import_graph(), "tuner.execution")
    assert {m: by for m, by in reached.items() if _in(("tuner.runtime",), m)} == {}


def test_the_direction_checks_see_a_forbidden_edge():
    graph = {"tuner.runtime.a": {"tuner.kernels.b"}, "tuner.kernels.b": {"tuner.export_x"},
             "tuner.export_x": set()}
    assert reach(graph, "tuner.runtime")["tuner.export_x"] == "tuner.kernels.b"
    assert _in(TUNING_SIDE, "tuner.export_x") and not _in(TUNING_SIDE, "tuner.exported")
    assert not _in(TUNING_SIDE, "tuner.runtime.expand")


EXPAND_LOOKUP = """
import json, sys, warnings
sys.modules["sqlalchemy"] = None
sys.modules["optuna"] = None
warnings.simplefilter("ignore")
from tuner import runtime
path, raw = json.loads(sys.argv[1])
answer = runtime.get_tuned_config("mm", path=path, **raw)
print(json.dumps({"source": answer.source, "loaded": sorted(
    m for m, module in sys.modules.items() if module is not None and (
        m.split(".")[0] in ("sqlalchemy", "optuna")
        or m.startswith(("tuner.export", "tuner.db"))))}))
"""


@pytest.mark.slow
def test_an_expand_file_lookup_needs_neither_optuna_sqlalchemy_export_nor_db(tmp_path):
    """The model's pick from a FlagGems expand file (tests/test_runtime_expand.py checks the
    online path the same way)."""
    expand = tmp_path / "mm_hopper_expand.yaml"
    expand.write_text("# device: NVIDIA H100 80GB HBM3\n" + json.dumps({"mm_general_tma": [
        {"param_map": {"META": {"BLOCK_M": "block_m", "BLOCK_N": "block_n",
                                "BLOCK_K": "block_k"}, "num_stages": "stages",
                       "num_warps": "warps"},
         "block_m": [64, 128], "block_n": [128], "block_k": [64], "stages": [3, 4],
         "warps": [4, 8]}, {"strategy": {"M": "log"}}]}))
    env = {k: v for k, v in os.environ.items()
           if k not in ("TUNE_CONFIG", "TUNE_LOG", "TUNE_ONLINE")}
    out = subprocess.run([sys.executable, "-c", EXPAND_LOOKUP,
                          json.dumps([str(expand), key(96, 3584, 4096)])],
                         capture_output=True, text=True, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"source": "expand-model", "loaded": []}


def test_no_test_imports_a_benchmark_or_reads_its_files():
    """Benchmarks are GPU scripts and their records, free to change with each measurement: a
    test imports nothing from them and names no path under them (what it needs lives in the
    library or under tests/data/). This module names the folder only to forbid it."""
    offenders = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if path == Path(__file__).resolve():
            continue
        text = path.read_text()
        nodes = list(ast.walk(ast.parse(text)))
        imported = {alias.name for node in nodes if isinstance(node, ast.Import)
                    for alias in node.names}
        imported |= {node.module or "" for node in nodes if isinstance(node, ast.ImportFrom)}
        if any(name.split(".")[0] == "benchmarks" for name in imported):
            offenders.append(f"{path.name}: imports benchmarks")
        if "benchmarks/" in text or '"benchmarks"' in text:
            offenders.append(f"{path.name}: names a path under benchmarks/")
    assert offenders == []


def test_every_property_sizes_itself_for_the_fast_subset():
    """A Hypothesis property's own example count goes through tests.factories.examples, so
    that the fast subset tries a tenth of it (tests/conftest.py), as it does Hypothesis'
    default; a bare count would run in full there."""
    bare = [f"{path.name}:{number}" for path in sorted((ROOT / "tests").rglob("test_*.py"))
            if path != Path(__file__).resolve()
            for number, line in enumerate(path.read_text().splitlines(), 1)
            if re.search(r"max_examples=(?!examples\()", line)]
    assert bare == []


# -- the formats wing: each file format read and written in one place --------------------------
FORMATS_ALONE = """
import sys
for name in ("torch", "triton", "optuna", "sqlalchemy"):
    sys.modules[name] = None
import tuner.formats.device, tuner.formats.files, tuner.formats.flaggems, tuner.formats.table
print(sorted(m for m in sys.modules if m.startswith(("tuner.db", "tuner.export", "tuner.kernels",
                                                     "tuner.execution", "tuner.search"))))
"""
# Literals of the files' schemas that only tuner.formats may type: FlagGems' op and key names,
# and our table's format tag and structure. Kernels declare their own FlagGems op
# (Variant.expand_op); the runtime still reads a table op's body itself (tuner.runtime.lookup,
# tuner.runtime.online), so the table's body keys are checked everywhere else.
FLAGGEMS_LITERALS = {"mm_general_tma", "mm_splitk", "param_map", "META"}
TABLE_LITERALS = {TABLE_FORMAT, "kernel_source_hash", "entries", "alternates", "generated_at"}


def test_the_formats_wing_needs_no_database_tuning_or_torch():
    out = subprocess.run([sys.executable, "-c", FORMATS_ALONE], capture_output=True, text=True,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_no_module_outside_the_formats_wing_types_a_schema_literal():
    typed = []
    for name, path in project_modules().items():
        if name.startswith("tuner.formats"):
            continue
        tree = parsed(path)
        declared = {id(node.value) for node in ast.walk(tree)
                    if isinstance(node, ast.keyword) and node.arg == "expand_op"}
        checked = set(FLAGGEMS_LITERALS)
        if not name.startswith("tuner.runtime"):
            checked |= TABLE_LITERALS
        typed += [f"{name}:{node.lineno}: {node.value!r}" for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and node.value in checked
                  and id(node) not in declared]
    assert typed == []


# -- one copy of each rule ---------------------------------------------------------------------
def _status_literals(node: ast.AST) -> list[str]:
    """The bare strings a comparison of a `.status` holds (alone, or in a tuple or set)."""
    sides = [node.left, *node.comparators]
    if not any(isinstance(side, ast.Attribute) and side.attr == "status" for side in sides):
        return []
    found = []
    for side in sides:
        items = side.elts if isinstance(side, (ast.Tuple, ast.Set, ast.List)) else [side]
        found += [item.value for item in items
                  if isinstance(item, ast.Constant) and isinstance(item.value, str)]
    return found


def test_statuses_are_compared_as_enums_and_notes_go_to_a_reporter():
    """A status is one of tuner.statuses' enums, not a string typed again where it is
    compared (the migrations keep the values they were written with); a long job's notes go
    to a tuner.reporting.Reporter, not a `note` callback."""
    typed, callbacks = [], []
    for name, path in project_modules().items():
        if name.startswith("tuner.db.migrations"):
            continue
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.Compare) and (literals := _status_literals(node)):
                typed.append(f"{name}:{node.lineno}: {literals}")
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                callbacks += [f"{name}:{node.lineno}: {node.name}" for arg in
                              [*args.posonlyargs, *args.args, *args.kwonlyargs]
                              if arg.arg == "note"]
    assert typed == [] and callbacks == []
