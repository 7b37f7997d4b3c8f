"""What TUNE_ONLINE's budget buys on keys a table never tuned, against a full tune.

    # on the GPU machine (about 6 minutes with the defaults)
    python benchmarks/online_budget.py run \
        --table benchmarks/results/vs-cublas/tuned-h100.yaml --budgets 1,3,10 \
        -o online_budget.json --report online_budget.md

Per shape (none with an entry in the table), four kinds of answer:

- `zero-shot`: what the table answers with TUNE_ONLINE unset (its `nearest`/`model`/`cublas`
  steps, timing nothing);
- `online B s`: the `online` step's winner at TUNE_ONLINE_BUDGET_S=B, each budget in a fresh
  process with an empty Triton cache and online cache (a server's first call), with the wall
  seconds of that first call and how many configs it timed (`online` below does one budget);
- `full tune`: `tune run --trials N` (its defaults otherwise) in a database of its own, the
  winner read back through `tune export table`, with the study's wall seconds.

Then every answer of a shape and cuBLAS are timed side by side on the GPU
(tuner.execution.cross_timing: checked against float64, then re-timed interleaved, device
time, L2 flushed); a ratio is cuBLAS's time / the answer's (> 1: faster than cuBLAS).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Shapes a model runs that the shapes-dev table never tuned: the zero-shot answers issue 39
# found far from a tuned tile (vocabulary projections, odd sizes), and Llama-like decode and
# prefill widths.
ROWS = ("5x50257x768 fp16 nt", "7x51865x1280 fp16 nt", "333x1537x999 bf16 nn",
        "48x6144x4096 bf16 nt", "200x4096x14336 bf16 nt")


def _answer(shape, path: str):
    """The runtime's answer for the shape from the table at `path`, as TUNE_* now say."""
    import warnings

    from tuner.kernels import kernel_for
    from tuner.runtime import get_tuned_config

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return get_tuned_config(kernel_for(shape.M, shape.N).name, path=path, **shape.key())


def online(args) -> None:
    """One budget, in this process: each shape's first lookup (the online step tuning its
    bucket), as JSON on stdout."""
    os.environ.update(TUNE_ONLINE="1", TUNE_ONLINE_BUDGET_S=str(args.budget),
                      TUNE_ONLINE_CACHE=str(Path(args.cache).resolve()))
    import torch

    from tuner.execution import in_process
    from tuner.runtime import online as online_cache
    from tuner.shapes import Shape

    # the imports and the CUDA context: not what a server's first call of a new key pays
    torch.zeros(1, device=in_process.this_process().torch_device)
    rows = []
    for label in args.rows:
        before = online_cache.stats()["configs_timed"]
        start = time.perf_counter()
        answer = _answer(Shape.from_label(label), args.table)
        rows.append({"shape": label, "source": answer.source, "config": dict(answer),
                     "first_call_s": time.perf_counter() - start,
                     "configs_timed": online_cache.stats()["configs_timed"] - before})
    print(json.dumps(rows))


def _fresh_env(work: Path, name: str) -> dict:
    """The environment of a child: no TUNE_* of ours, an empty Triton cache of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNE_")}
    env["TRITON_CACHE_DIR"] = str(work / f"triton-{name}")
    return env


def _online_budget(args, budget: float, work: Path) -> list[dict]:
    cache = work / f"online-{budget:g}.yaml"
    proc = subprocess.run([sys.executable, __file__, "online", "--table", args.table,
                           "--budget", str(budget), "--cache", str(cache), "--rows", *args.rows],
                          capture_output=True, text=True, env=_fresh_env(work, f"{budget:g}"))
    if proc.returncode != 0:
        raise SystemExit(f"online at {budget:g} s failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def _full_tune(args, shapes, work: Path) -> tuple[dict[str, dict], dict[str, float]]:
    """Per shape label: the winner of `tune run`, and its study's wall seconds."""
    from _tune_runs import study_stats

    csv = work / "unseen.csv"
    csv.write_text("M,N,K,dtype,layout\n" + "".join(
        f"{s.M},{s.N},{s.K},{s.dtype},{s.layout}\n" for s in shapes))
    db, table = work / "full.db", work / "full.yaml"
    env = _fresh_env(work, "full")
    for command in (["run", "--shapes", str(csv), "--trials", str(args.trials)],
                    ["export", "table", "--exact", "-o", str(table)]):
        proc = subprocess.run([sys.executable, str(ROOT / "cli.py"), *command, "--db",
                               f"sqlite:///{db}"], capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise SystemExit(f"tune {command[0]} failed:\n{proc.stderr[-3000:]}")
    walls = {stats.shape: stats.wall_s for stats in study_stats(db)}
    return ({str(s): dict(_answer(s, str(table))) for s in shapes},
            {str(s): walls.get(str(s)) for s in shapes})


def run(args) -> None:
    from tuner.execution.backends import require_gpu, visible_gpus

    require_gpu()
    sys.path.insert(0, str(Path(__file__).parent))
    for name in [name for name in os.environ if name.startswith("TUNE_")]:
        del os.environ[name]
    from _tune_runs import device_line

    from tuner.execution.cross_timing import time_side_by_side
    from tuner.execution.executor import Executor, ExecutorOptions
    from tuner.kernels import KERNELS, kernel_for
    from tuner.runtime import CUBLAS_CONFIG
    from tuner.shapes import Shape
    from tuner.space import config_signature

    shapes = [Shape.from_label(label) for label in args.rows]
    args.rows = [str(shape) for shape in shapes]  # the children's labels are these keys
    budgets = [float(b) for b in args.budgets.split(",")]
    result = {"device": device_line(), "table": args.table, "budgets": budgets,
              "trials": args.trials, "shapes": []}
    with tempfile.TemporaryDirectory(prefix="online-budget-") as tmp:
        work = Path(tmp)
        answers: dict[str, dict[str, dict]] = {str(s): {} for s in shapes}
        for shape in shapes:
            zero = _answer(shape, args.table)
            if zero.source == "table":
                raise SystemExit(f"{shape} has an entry in {args.table}: not an unseen key")
            answers[str(shape)]["zero-shot"] = {"config": dict(zero), "source": zero.source}
        for budget in budgets:
            start = time.perf_counter()
            for row in _online_budget(args, budget, work):
                answers[row.pop("shape")][f"online {budget:g} s"] = row
            print(f"online {budget:g} s: {time.perf_counter() - start:.0f} s", file=sys.stderr)
        start = time.perf_counter()
        winners, walls = _full_tune(args, shapes, work)
        print(f"full tune: {time.perf_counter() - start:.0f} s", file=sys.stderr)
        for label, config in winners.items():
            answers[label]["full tune"] = {"config": config, "tune_s": walls[label]}

        executor = Executor(ExecutorOptions("gpu", tuple(visible_gpus()), args.jobs, 120.0))
        try:
            for shape in shapes:
                kinds = answers[str(shape)]
                configs = {config_signature(CUBLAS_CONFIG): dict(CUBLAS_CONFIG)}
                for kind in kinds.values():
                    configs.setdefault(config_signature(kind["config"]), kind["config"])
                side = time_side_by_side(executor, KERNELS[kernel_for(shape.M, shape.N).name],
                                         shape, 0, list(configs.values()))
                device_ms = dict(zip(configs, (outcome.p50_ms for outcome in side)))
                cublas_ms = device_ms[config_signature(CUBLAS_CONFIG)]
                for kind in kinds.values():
                    ms = device_ms[config_signature(kind["config"])]
                    kind["device_ms"] = ms
                    kind["vs_cublas"] = cublas_ms / ms if ms and cublas_ms else None
                result["shapes"].append({"shape": str(shape), "cublas_ms": cublas_ms,
                                         "answers": kinds})
                print(f"timed {shape}", file=sys.stderr)
        finally:
            executor.close()
    Path(args.output).write_text(json.dumps(result, indent=1))
    if args.report:
        Path(args.report).write_text(report(result))
    print(report(result))


def report(result: dict) -> str:
    """The results as markdown: per shape and kind, the ratio vs cuBLAS (and what it cost);
    then per kind the geomean and min over the shapes."""
    from tuner.kernels.base import config_label

    kinds = ["zero-shot", *(f"online {b:g} s" for b in result["budgets"]), "full tune"]
    lines = [f"# What TUNE_ONLINE's budget buys against a full tune — {result['device']}", "",
             f"table: {result['table']}; full tune: `tune run --trials {result['trials']}`. "
             "Device time, cuBLAS / answer (> 1: faster than cuBLAS); online: first call's "
             "wall s and configs timed; full tune: the study's wall s.", "",
             "| shape | " + " | ".join(kinds) + " |", "|---" * (len(kinds) + 1) + "|"]
    for row in result["shapes"]:
        cells = []
        for kind in kinds:
            answer = row["answers"][kind]
            ratio = (f"{answer['vs_cublas']:.3f}" if answer["vs_cublas"] is not None
                     else "failed")
            cost = (f", {answer['first_call_s']:.1f} s, {answer['configs_timed']} timed"
                    if "first_call_s" in answer else
                    f", {answer['tune_s']:.0f} s" if answer.get("tune_s") else "")
            cells.append(f"{ratio} ({config_label(answer['config'])}{cost})")
        lines.append(f"| {row['shape']} | " + " | ".join(cells) + " |")
    lines.append("")
    for kind in kinds:
        ratios = [row["answers"][kind]["vs_cublas"] for row in result["shapes"]]
        ratios = [r for r in ratios if r is not None]
        if ratios:
            lines.append(f"{kind}: geomean {statistics.geometric_mean(ratios):.3f}, min "
                         f"{min(ratios):.3f} over {len(ratios)} shapes")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    whole = commands.add_parser("run", help="every budget, the full tune, the side-by-side "
                                "timing (GPU)")
    whole.add_argument("--table", required=True)
    whole.add_argument("--rows", nargs="+", default=list(ROWS), help="shape labels")
    whole.add_argument("--budgets", default="1,3,10", help="TUNE_ONLINE_BUDGET_S values")
    whole.add_argument("--trials", type=int, default=40, help="the full tune's trials")
    whole.add_argument("--jobs", type=int, default=16, help="parallel compiles")
    whole.add_argument("-o", "--output", required=True)
    whole.add_argument("--report", help="also write the markdown here")
    one = commands.add_parser("online", help="one budget's first calls, in this process")
    one.add_argument("--table", required=True)
    one.add_argument("--budget", type=float, required=True)
    one.add_argument("--cache", required=True)
    one.add_argument("--rows", nargs="+", default=list(ROWS))
    args = parser.parse_args()
    {"run": run, "online": online}[args.command](args)


if __name__ == "__main__":
    main()
