"""The `tune` command line end to end, on the CPU through Triton's interpreter."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from tests.factories import H100, SMALL_SPACE, told_and_objective
from tuner import runtime
from tuner.cli import main
from tuner.shapes import Shape

ROOT = Path(__file__).resolve().parent.parent
# --backend interpret must own triton's mode; on a GPU machine triton is already compiled-mode.
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="interpreter CLI tests run on CPU-only machines")
SHAPES = "M,N,K,dtype,layout,weight\n40,48,64,bf16,nn,1\n33,40,50,fp16,nt,1\n24,1,70,fp32,tn,1\n"


@pytest.fixture
def workdir(tmp_path):
    (tmp_path / "shapes.csv").write_text(SHAPES)
    (tmp_path / "space.yaml").write_text(SMALL_SPACE)
    return tmp_path


def tune(workdir, *args):
    db = f"sqlite:///{workdir / 'tune.db'}"
    return CliRunner().invoke(main, [*args, "--db", db], catch_exceptions=False)


def run_args(workdir, trials=6):
    return ["run", "--shapes", str(workdir / "shapes.csv"), "--space", str(workdir / "space.yaml"),
            "--backend", "interpret", "--trials", str(trials)]


@pytest.mark.slow
def test_interpret_run_export_show_and_lookup(workdir, monkeypatch):
    result = tune(workdir, *run_args(workdir))
    assert result.exit_code == 0, result.output
    assert "tuned 3, already tuned 0, busy elsewhere 0, failed 0" in result.output

    again = tune(workdir, *run_args(workdir))
    assert "tuned 0, already tuned 3" in again.output

    table, expand = workdir / "tuned.yaml", workdir / "expand.yaml"
    assert tune(workdir, "export", "table", "-o", str(table)).exit_code == 0
    assert tune(workdir, "export", "expand", "-o", str(expand)).exit_code == 0
    doc = yaml.safe_load(table.read_text())
    assert doc["device"]["name"] == "cpu-interpreter"
    assert {op: len(body["entries"]) for op, body in doc["ops"].items()} == {"mm": 2, "gemv": 1}
    # FlagGems' op per winning variant (the 24x1 shape's winner may be any gemv-op variant)
    assert "mm_general_tma" in set(yaml.safe_load(expand.read_text())) <= {
        "mm_general_tma", "matmul", "gemv"}  # mm_splitk only with --with-splitk

    shown = tune(workdir, "show")
    assert shown.exit_code == 0 and "40x48x64 bf16 nn" in shown.output

    runtime.clear_cache()
    monkeypatch.setenv("TUNE_CONFIG", str(table))
    entry = next(e for e in doc["ops"]["mm"]["entries"] if e["tuned_shape"].startswith("40x48"))
    assert dict(runtime.get_tuned_config("mm", M=40, N=48, K=64, dtype="bf16", stride_am=64,
                                         stride_bk=48)) == entry["config"]


@pytest.mark.slow
def test_search_flags_reach_the_study_budget(workdir, monkeypatch):
    """The flags' effects are tested on scripted timings (test_search, test_replay);
    interpreter timings are too noisy to say when a study stalls, so here only that they
    arrive."""
    from tuner.search import pipeline
    budgets = []
    real_run = pipeline.TuneJob.run
    monkeypatch.setattr(pipeline.TuneJob, "run",
                        lambda job, *a: (budgets.append(job.budget), real_run(job, *a))[1])
    result = tune(workdir, *run_args(workdir, trials=2), "--patience", "3", "--sampler",
                  "random")
    assert result.exit_code == 0 and budgets[0].patience == 3
    assert budgets[0].sampler == "random" and not budgets[0].exhaustive
    monkeypatch.setattr(pipeline.TuneJob, "run",
                        lambda job, *a: budgets.append(job.budget) or pipeline.RunSummary())
    assert tune(workdir, *run_args(workdir), "--exhaustive").exit_code == 0
    assert budgets[-1].exhaustive
    assert tune(workdir, *run_args(workdir), "--patience", "0").exit_code == 2
    assert tune(workdir, *run_args(workdir), "--sampler", "cmaes").exit_code == 2


@pytest.mark.slow
def test_the_launch_flag_picks_what_studies_optimise_and_both_figures_are_stored(workdir):
    """Interpreter figures are wall clock, so which config wins is noise; what each study
    told its sampler is not: TFLOP/s at its own mode's figure, for every trial."""
    from tuner.db.models import Study
    from tuner.db.session import session_factory
    from tuner.db.store import Store

    (workdir / "shapes.csv").write_text("M,N,K,dtype\n40,48,64,bf16\n")
    db = f"sqlite:///{workdir / 'tune.db'}"
    for launch in ("graph", "eager"):
        result = tune(workdir, *run_args(workdir, trials=3), "--launch", launch, "--retune")
        assert result.exit_code == 0 and f"per {launch} call" in result.output, result.output
    store = Store(session_factory(db))
    with store.sessions() as s:
        studies = list(s.query(Study).order_by(Study.id))
    assert [study.launch for study in studies] == ["graph", "eager"]
    for study in studies:
        trials = store.trials_of(study)
        assert all(t.host_us > 0 and t.loop_ms > 0 for t in trials if t.status == "ok")
        told, objective = told_and_objective(db, study, trials, study.launch)
        assert told == pytest.approx(objective) and len(trials) >= 3
    table = workdir / "tuned.yaml"
    assert tune(workdir, "export", "table", "-o", str(table)).exit_code == 0
    assert yaml.safe_load(table.read_text())["launch"] == "eager"  # the latest run's mode


@pytest.mark.slow
def test_suggest_exports_the_models_pick_without_a_gpu(workdir, monkeypatch):
    from tuner.kernels import KERNELS
    from tuner.model.named_devices import named_device
    from tuner.model.predict import device_spec, rank_configs
    from tuner.space import load_space

    table = workdir / "suggested.yaml"
    result = CliRunner().invoke(main, [
        "suggest", "--shapes", str(workdir / "shapes.csv"), "--space", str(workdir / "space.yaml"),
        "--device", "NVIDIA H200", "-o", str(table)], catch_exceptions=False)
    assert result.exit_code == 0 and "3 suggested configs for H200 SXM" in result.output
    doc = yaml.safe_load(table.read_text())
    assert doc["device"]["fingerprint"] == "model"
    space = load_space(workdir / "space.yaml",
                       {n: k.variant_params for n, k in KERNELS.items()})
    spec = device_spec(named_device("NVIDIA H200"))
    ((_, best),) = rank_configs(Shape(40, 48, 64, "bf16", "nn"), space, KERNELS["mm"], spec,
                                k=1)
    runtime.clear_cache()
    monkeypatch.setenv("TUNE_CONFIG", str(table))
    assert dict(runtime.get_tuned_config("mm", M=40, N=48, K=64, dtype="bf16", stride_am=64,
                                         stride_bk=48)) == best


@pytest.mark.slow
def test_excluded_variants_are_never_measured(workdir, monkeypatch):
    """A deployment that never launches cuBLAS (TUNE_EXCLUDE=cublas) tunes without it: its
    studies search the rest of the space, and its table's answers are Triton's."""
    from tuner.db.models import Trial
    from tuner.db.session import session_factory

    space = SMALL_SPACE.replace("variant: [general]", "variant: [general, cublas]")
    (workdir / "space.yaml").write_text(space)
    (workdir / "shapes.csv").write_text("M,N,K,dtype\n40,48,64,bf16\n")
    monkeypatch.setenv("TUNE_EXCLUDE", "cublas")
    result = tune(workdir, *run_args(workdir, trials=4), "--no-early-stop")
    assert result.exit_code == 0 and "tuned 1," in result.output, result.output
    with session_factory(f"sqlite:///{workdir / 'tune.db'}")() as session:
        variants = {trial.params["variant"] for trial in session.query(Trial)}
    assert variants == {"general"}


@pytest.mark.slow
def test_retune_runs_again(workdir):
    tune(workdir, *run_args(workdir, trials=2))
    result = tune(workdir, *run_args(workdir, trials=2), "--retune")
    assert "tuned 3, already tuned 0" in result.output


@pytest.mark.parametrize("shapes, message", [
    ("M,N,K,dtype\n4,4,4,int8\n", "shapes.csv:2: dtype must be one of"),
    ("M,N\n4,4\n", "shapes.csv:1: header must be"),
])
def test_bad_shapes_write_nothing(workdir, shapes, message):
    (workdir / "shapes.csv").write_text(shapes)
    result = tune(workdir, *run_args(workdir))
    assert result.exit_code == 1
    assert message in result.output and result.output.count("\n") == 1
    assert not (workdir / "tune.db").exists()


def test_bad_space_is_one_line(workdir):
    (workdir / "space.yaml").write_text(SMALL_SPACE.replace("num_warps: [2, 4]", "num_warps: 4"))
    result = tune(workdir, *run_args(workdir))
    assert result.exit_code == 1
    assert "space.yaml: field 'params.num_warps': expected a non-empty list" in result.output


def test_export_with_nothing_tuned(workdir):
    from tuner.db.session import session_factory
    from tuner.db.store import Store

    result = tune(workdir, "export", "table", "-o", str(workdir / "x.yaml"))
    assert result.exit_code == 1 and "no database at" in result.output
    assert not (workdir / "tune.db").exists()  # a read-only command creates none
    Store(session_factory(f"sqlite:///{workdir / 'tune.db'}"))
    result = tune(workdir, "export", "table", "-o", str(workdir / "x.yaml"))
    assert result.exit_code == 1 and "no winners in the database" in result.output


@pytest.mark.slow
def test_gpu_backend_without_gpu_is_one_clear_line(workdir):
    """In a fresh process (no interpreter set): the default backend needs a GPU."""
    if __import__("torch").cuda.is_available():
        pytest.skip("this machine has a GPU")
    proc = subprocess.run([sys.executable, str(ROOT / "cli.py"), "run", "--shapes",
                           str(workdir / "shapes.csv"), "--db",
                           f"sqlite:///{workdir / 'tune.db'}"],
                          capture_output=True, text=True, cwd=workdir)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "Error: no CUDA GPU visible (torch.cuda.is_available() is False); use --backend "
        "interpret to run on the CPU through Triton's interpreter"]
    assert not (workdir / "tune.db").exists()


def test_show_failures_lists_remembered_configs(workdir):
    from tuner.db.session import session_factory
    from tuner.db.store import Store

    store = Store(session_factory(f"sqlite:///{workdir / 'tune.db'}"))
    device, kernel = store.device(H100), store.kernel("mm", "abc")
    store.remember_failure(device, kernel, "bf16 M:16n", {"BLOCK_M": 256, "num_warps": 2},
                           "timeout", "timeout after 120 s")
    result = tune(workdir, "show", "--failures")
    assert result.exit_code == 0, result.output
    assert "timeout after 120 s" in result.output and "BM256 w2" in result.output
    assert "no remembered failures" in tune(workdir, "show", "--failures", "--device",
                                            "a100").output
