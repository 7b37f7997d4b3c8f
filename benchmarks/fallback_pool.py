"""What the runtime's nearest fallback could answer a never-tuned shape with, and what it does.

    # on the GPU: per shape, the pool the fallback weighs (the nearest neighbours' configs and
    # alternates, cuBLAS, the variations the model predicts fastest) and the runtime's answer,
    # timed side by side: device time (L2 flushed, outputs checked) and ms per back-to-back
    # call (tuner.execution.cross_timing and the `eager` objective's figure)
    python benchmarks/fallback_pool.py measure --table tuned.yaml \
        --shapes holdout-dev.csv --shapes holdout-extra.csv -o fallback_pool.json
    # anywhere: the runtime's answer per shape (asked again, with today's code and constants)
    # against cuBLAS and against the best config of its pool
    python benchmarks/fallback_pool.py report fallback_pool.json --table tuned.yaml

This is the measurement behind the fallback's rules (tuner.runtime.fallback and the `nearest`
step of tuner.runtime.policy): which of cuBLAS and the neighbours' tiles answers, the margin
the model must predict, and which tiles are too tall for a call. `report` asks the runtime
itself, so a change to those rules is scored on the same timings without the GPU; an answer
outside the timed pool is reported as untimed. Shapes the table has an entry of, and M = 1
shapes (gemv: no cuBLAS candidate to weigh), are left out.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from tuner.fallback_scoring import answers
from tuner.shapes import Shape, load_shapes
from tuner.space import config_signature
from tuner.statuses import TrialStatus
from tuner.validate import runtime_pick


def _questions(table, shapes: list[Shape]) -> list[tuple[Shape, str, list, list]]:
    """Per shape the fallback answers (mm, no table entry): its op, candidates (cuBLAS among
    them) and the variations, best predicted first."""
    from tuner.kernels import kernel_for
    from tuner.runtime import CUBLAS, CUBLAS_CONFIG
    from tuner.runtime.fallback import calibrated_predictor

    predicted = calibrated_predictor(table.device_name)
    questions = []
    for shape in shapes:
        op = kernel_for(shape.M, shape.N).name
        if op != "mm" or table.ops[op].exact(shape.key()) is not None:
            continue
        candidates, variations = table.neighbour_pool(op, shape.key())
        if all(config["variant"] != CUBLAS for config in candidates):
            candidates = [*candidates, CUBLAS_CONFIG]
        measured = table.ops[op].measured
        variations.sort(key=lambda config: predicted(shape, config, measured))
        questions.append((shape, op, candidates, variations))
    return questions


def measure(args) -> None:
    """Time each shape's pool and the runtime's answer; write them as JSON (after each shape,
    so that a run cut short keeps what it timed)."""
    from tuner.execution.backends import require_gpu, visible_gpus

    require_gpu()
    from tuner.execution.cross_timing import time_side_by_side
    from tuner.execution.executor import Executor, ExecutorOptions
    from tuner.kernels import KERNELS
    from tuner.objective import EAGER
    from tuner.runtime.lookup import open_table

    table = open_table(Path(args.table))
    shapes = list(dict.fromkeys(s for path in args.shapes for s in load_shapes(path)))
    executor = Executor(ExecutorOptions("gpu", tuple(visible_gpus()), args.jobs, 120.0))
    rows = []
    try:
        device = executor.device_info().name
        for shape, op, candidates, variations in _questions(table, shapes):
            pool = ([("candidate", c) for c in candidates]
                    + [("variation", c) for c in variations[:args.variations]])
            answer = runtime_pick(Path(args.table), shape).config
            if config_signature(answer) not in {config_signature(c) for _, c in pool}:
                pool.append(("answer", answer))
            configs = [dict(config) for _, config in pool]
            side = time_side_by_side(executor, KERNELS[op], shape, 0, configs)
            ran = [i for i, outcome in enumerate(side) if outcome.status == TrialStatus.OK]
            loops = executor.retime(0, shape, 0, op, [configs[i] for i in ran], EAGER)
            loop_ms = dict(zip(ran, [t.p50_ms for t in loops] if loops else []))
            rows.append({"shape": str(shape), "op": op, "pool": [
                {"kind": kind, "config": configs[i],
                 "bucket": list(config.bucket) if getattr(config, "bucket", None) else None,
                 "status": side[i].status, "device_ms": side[i].p50_ms,
                 "loop_ms": loop_ms.get(i)} for i, (kind, config) in enumerate(pool)]})
            Path(args.output).write_text(json.dumps({"device": device, "table": args.table,
                                                     "rows": rows}))
            print(f"timed {shape}: {len(configs)} configs", file=sys.stderr)
    finally:
        executor.close()


def report(args) -> None:
    """The runtime's answer per shape against cuBLAS and the best of its pool, as markdown."""
    from tuner.kernels.base import config_label

    data = json.loads(Path(args.timings).read_text())
    table = Path(args.table or data["table"])
    lines = [f"# The nearest fallback's answers, timed — {data['device']}", "",
             f"table: {table}. Ratios: cuBLAS's time / the config's (> 1: faster than cuBLAS); "
             "device: kernel time, L2 flushed; loop: ms per back-to-back call.", "",
             "| shape | answer (source) | device | loop | closest neighbour's config | "
             "best of the pool (device) | device |", "|---|---|---|---|---|---|---|"]
    found = answers(data, table)
    for answer in found:
        device, loop = (f"{r:.3f}" if r is not None else "untimed"
                        for r in (answer.ratio("device_ms"), answer.ratio("loop_ms")))
        lines.append(f"| {answer.shape} | {config_label(answer.pick.config)} "
                     f"({answer.pick.source}) | {device} | {loop} | "
                     f"{config_label(answer.closest)} | {config_label(answer.best['config'])} | "
                     f"{answer.ratio('device_ms', answer.best):.3f} |")
    lines.append("")
    timed = [answer for answer in found if answer.timed is not None]
    for name, values in (
            ("answers vs cuBLAS, device", [a.ratio("device_ms") for a in timed]),
            ("answers vs cuBLAS, loop", [a.ratio("loop_ms") for a in timed]),
            ("best of each pool vs cuBLAS, device",
             [a.ratio("device_ms", a.best) for a in found])):
        lines.append(f"{name}: geomean {statistics.geometric_mean(values):.3f}, "
                     f"min {min(values):.3f} over {len(values)} shapes")
    lines.append(f"answers outside the timed pool: {len(found) - len(timed)}")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    timing = commands.add_parser("measure", help="time the pools on the GPU")
    timing.add_argument("--table", required=True)
    timing.add_argument("--shapes", action="append", required=True)
    timing.add_argument("--variations", type=int, default=10,
                        help="how many of the variations predicted fastest to time per shape")
    timing.add_argument("--jobs", type=int, default=16, help="parallel compiles")
    timing.add_argument("-o", "--output", required=True)
    scoring = commands.add_parser("report", help="score the runtime's answers (CPU)")
    scoring.add_argument("timings")
    scoring.add_argument("--table", help="default: the one the timings were taken for")
    args = parser.parse_args()
    {"measure": measure, "report": report}[args.command](args)


if __name__ == "__main__":
    main()
