"""Values several test modules build on."""
import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import torch
from click.testing import CliRunner
from optuna.trial import TrialState

from tuner.cli import main
from tuner.db.optuna_storage import tuner_study_id
from tuner.devices import DeviceInfo
from tuner.kernels import kernel_variants
from tuner.kernels.base import TILE_PARAMS
from tuner.objective import call_tflops

# What parse_space learns from the real kernels (tuner.kernels).
KERNEL_VARIANTS = kernel_variants()

# What parse_space learns from the kernels: per kernel, per variant, the parameters a config
# holds. "splitk" here only exercises the conditional space; the search tests use "general".
VARIANTS = {"mm": {"general": ("variant", "pad", *TILE_PARAMS),
                   "splitk": ("variant", "pad", *TILE_PARAMS, "SPLIT_K")}}
H100 = DeviceInfo("NVIDIA H100 80GB HBM3", "9.0", 132, 232448, "580.1", "13.0", "2.11", "3.6")
# A 32-config mm space: small enough for interpreter runs of the whole CLI.
SMALL_SPACE = """kernel: mm
params: {variant: [general], pad: [0], BLOCK_M: [16, 32], BLOCK_N: [16, 32], BLOCK_K: [32, 64],
         GROUP_M: [1, 4], num_stages: [2], num_warps: [2, 4]}
strategy: {M: align32, N: align32, K: align32, stride_am: align32, stride_bk: align32,
           dtype: default}
"""


def told_and_objective(storage_url: str, study, trials, launch: str) -> tuple[dict, dict]:
    """Per config, what a study's sampler was told (its completed Optuna trials), and what
    it should have been told in `launch` mode: TFLOP/s at that mode's figure, 0 for a config
    that did not run. A screened config (timed short only, tuner.search.screening) was told
    an estimate from the best measured at the time; it is checked here to lie above 0 and
    below the best measured in full, and left out of both."""
    name = next(s.study_name for s in optuna.get_all_study_summaries(storage_url)
                if tuner_study_id(s) == study.id)
    told = {tuple(sorted(t.params.items())): t.value for t in optuna.load_study(
        study_name=name, storage=storage_url).trials if t.state == TrialState.COMPLETE}
    objective = {tuple(sorted(t.params.items())):
                 call_tflops(study.shape.flops, t, launch) if t.status == "ok" else 0.0
                 for t in trials if t.status != "screened"}
    best = max(objective.values(), default=0.0)
    for t in trials:
        if t.status == "screened":
            assert 0.0 < told.pop(tuple(sorted(t.params.items()))) < best
    return told, objective


# -- the command line, run in-process ----------------------------------------------------------
INTERPRETER = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="interpreter CLI tests run on CPU-only machines")
ONE_SHAPE = "M,N,K,dtype\n40,48,64,bf16\n"


def tune(*args, env=None):
    """`tune ARGS...` in-process; its result (exit code, output) to assert on."""
    return CliRunner().invoke(main, list(args), catch_exceptions=False, env=env)


def error_line(result) -> str:
    """The one 'Error: ...' line of a refused command (click's usage lines aside)."""
    errors = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and "Traceback" not in result.output, result.output
    return errors[0]


# -- Hypothesis --------------------------------------------------------------------------------
# Whether this run is the fast subset (-m "not slow ..."); set by tests/conftest.py.
FAST_SUBSET = False


def examples(full: int) -> int:
    """A property's max_examples: `full` where the slow tests run too (CI), a tenth (at least
    3) in the fast subset, which then samples the property rather than searching it."""
    return max(3, full // 10) if FAST_SUBSET else full


# -- the fast subset ---------------------------------------------------------------------------
def slow_except(values, *fast) -> list:
    """Parametrize `values` so that only those in `fast` run in the fast subset; the others
    are marked slow, for CI, which runs them all."""
    return [value if value in fast else pytest.param(value, marks=pytest.mark.slow)
            for value in values]


ROOT = Path(__file__).resolve().parent.parent
# A fresh process asking the runtime for mm keys (argv[1]: their JSON list), as a server's
# restart would: it prints the answers, online tuning's stats and the tuning-side modules it
# loaded (the runtime may load none; optuna and sqlalchemy cannot even be imported).
FRESH_LOOKUP = """
import json, sys, warnings
sys.modules["sqlalchemy"] = None
sys.modules["optuna"] = None
warnings.simplefilter("ignore")
from tuner import runtime
from tuner.runtime import online
keys = json.loads(sys.argv[1])
answers = [runtime.get_tuned_config("mm", **k) for k in keys]
print(json.dumps({"answers": [[a.source, dict(a)] for a in answers], "stats": online.stats(),
                  "loaded": sorted(m for m, mod in sys.modules.items() if mod is not None and (
                      m.split(".")[0] in ("sqlalchemy", "optuna")
                      or m.startswith(("tuner.export", "tuner.db", "tuner.search."))))}))
"""


def fresh_lookup_command(keys: list[dict]) -> list[str]:
    return [sys.executable, "-c", FRESH_LOOKUP, json.dumps(keys)]


def fresh_lookups(keys: list[dict], environ: dict) -> dict:
    """FRESH_LOOKUP's report of `keys`, run in `environ` from the repository root."""
    out = subprocess.run(fresh_lookup_command(keys), capture_output=True, text=True,
                         env=environ, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def captured_and_replayed(run):
    """What `run()` returns when captured in a CUDA graph and replayed: warmed up first on a
    side stream, as torch's graph docs ask (a first call compiles or allocates)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run()
    graph.replay()
    torch.cuda.synchronize()
    return captured
