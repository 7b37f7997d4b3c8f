"""Is it the model or its pool of configs that loses on never-tuned shapes?

    # on the GPU: per shape, every config of the tables (same op and dtype) and the best
    # trials of fresh tunes of the shape, timed side by side (L2 flushed, outputs checked)
    python benchmarks/candidate_pool.py measure --table a.yaml --table b.yaml \
        --fresh sqlite:///validate.db --shapes holdout.csv -o candidates.json
    # anywhere: the model's pick among each pool, against the best config timed
    python benchmarks/candidate_pool.py report candidates.json.gz --table a.yaml --table b.yaml \
        [--shapes holdout.csv]
    # anywhere: how often the model orders two configs of a shape as measured, by how far apart
    # it predicts them (what the runtime's VARIATION_MARGIN rests on)
    python benchmarks/candidate_pool.py order candidates.json.gz

`report` asks, per shape, for the fastest config the analytical model predicts among:
- one table's configs and alternates (each table alone);
- the configs of all the tables together.
Regret is the pick's time over the best config timed on the shape, from the same side-by-side
run. When the pooled tables lose far less than each table alone, the candidates, not the
model's ranking of them, limit the runtime's `nearest` answers. The model often predicts
several configs the same time (one wave of tiles at the tensor-core bound, whatever their
GROUP_M or variant), and which of them it picks is then the pool's order: the `ties` columns
count picks with another config within TIE of the predicted best, and give the regret had
the fastest of those tied configs been picked (what a finer model could win).
"""
from __future__ import annotations

import argparse
import bisect
import gzip
import json
import math
import sys
from pathlib import Path

import yaml

from tuner.bucketing.search import weighted_geomean_regret
from tuner.shapes import Shape, load_shapes
from tuner.space import config_signature
from tuner.statuses import TrialStatus

TIE = 0.005  # predictions this close (relative) count as the same time
# `order` compares the configs within this factor of each shape's best (the competitive ones),
# grouped by how much faster the model predicts one than the other.
COMPETITIVE = 1.5
GAP_EDGES = (0.0, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3)


def _table_pools(paths: list[str]) -> dict[str, dict[tuple, dict]]:
    """Per table: (op, dtype) -> {signature: config} of its entries' configs and alternates."""
    pools = {}
    for path in paths:
        pool: dict = {}
        for op, body in yaml.safe_load(Path(path).read_text())["ops"].items():
            for entry in body["entries"]:
                for config in (entry["config"], *entry.get("alternates", ())):
                    pool.setdefault((op, entry["key"]["dtype"]), {})[
                        config_signature(config)] = config
        pools[Path(path).name] = pool
    return pools


def measure(args) -> None:
    from tuner.db.session import session_factory
    from tuner.db.store import Store
    from tuner.execution.backends import require_gpu, visible_gpus
    from tuner.execution.cross_timing import time_side_by_side
    from tuner.execution.executor import Executor, ExecutorOptions
    from tuner.kernels import kernel_for

    require_gpu()
    pool: dict = {}
    for table in _table_pools(args.table).values():
        for op_dtype, configs in table.items():
            pool.setdefault(op_dtype, {}).update(configs)
    fresh: dict[str, dict] = {}
    for url in args.fresh:
        store = Store(session_factory(url))
        for device in store.devices_matching(None):
            for study in store.finished_studies(device.id):
                ok = sorted((t for t in study.trials if t.status == TrialStatus.OK and t.p50_ms),
                            key=lambda t: t.p50_ms)
                for trial in ok[:args.top]:
                    fresh.setdefault(study.shape_label, {})[
                        config_signature(trial.params)] = dict(trial.params)
    output = Path(args.output)
    shapes = json.loads(output.read_text())["shapes"] if output.exists() else {}  # resume
    executor = Executor(ExecutorOptions("gpu", tuple(visible_gpus()), args.jobs, 120.0))
    try:
        for shape in (s for f in args.shapes for s in load_shapes(f)):
            if str(shape) in shapes:
                continue
            kernel = kernel_for(shape.M, shape.N)
            configs = {**pool.get((kernel.name, shape.dtype), {}), **fresh.get(str(shape), {})}
            outcomes = time_side_by_side(executor, kernel, shape, 0, list(configs.values()))
            shapes[str(shape)] = {"kernel": kernel.name,
                                  "fresh": list(fresh.get(str(shape), {}).values()),
                                  "times": [[o.config, o.p50_ms] for o in outcomes]}
            print(f"timed {shape}: {len(configs)} configs", file=sys.stderr, flush=True)
            output.write_text(json.dumps({"device": executor.device_info().name,
                                          "shapes": shapes}))
    finally:
        executor.close()


def _geomean_regret(regrets: list[float]) -> float:
    return weighted_geomean_regret(regrets, [1.0] * len(regrets))


def _load(path: str) -> dict:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def report(args) -> None:
    from tuner.model.named_devices import named_spec
    from tuner.model.predict import predict_ms

    doc = _load(args.candidates)
    spec = named_spec(doc["device"])
    tables = _table_pools(args.table)
    pools = {**{name: [name] for name in tables}, "all tables": list(tables)}
    only = {str(s) for f in args.shapes for s in load_shapes(f)} if args.shapes else None
    print(f"# the model's pick among each pool, against the best config timed ({doc['device']})"
          "\n\n| pool | shapes | geomean regret | max | over 10% | picks tied | ties broken "
          "by measurement: geomean | max |\n|---|---|---|---|---|---|---|---|")
    for pool_name, members in pools.items():
        regrets, tied_regrets, tied = [], [], 0
        for label, row in doc["shapes"].items():
            if only is not None and label not in only:
                continue
            shape = Shape.from_label(label)
            timed = {config_signature(c): ms for c, ms in row["times"] if ms}
            pool = {s: c for name in members
                    for s, c in tables[name].get((row["kernel"], shape.dtype), {}).items()
                    if s in timed}
            if not pool:
                continue
            predicted = {s: predict_ms(shape, c, spec) for s, c in pool.items()}
            pick = min(predicted, key=predicted.get)
            ties = [s for s, ms in predicted.items() if ms <= predicted[pick] * (1 + TIE)]
            tied += len(ties) > 1
            best = min(timed.values())
            regrets.append(timed[pick] / best - 1)
            tied_regrets.append(min(timed[s] for s in ties) / best - 1)
        print(f"| {pool_name} | {len(regrets)} | {_geomean_regret(regrets):.1%} | "
              f"{max(regrets):.1%} | {sum(r > 0.10 for r in regrets)} | {tied} | "
              f"{_geomean_regret(tied_regrets):.1%} | {max(tied_regrets):.1%} |")


def order(args) -> None:
    from tuner.model.named_devices import named_spec
    from tuner.model.predict import predicted_or_inf

    doc = _load(args.candidates)
    spec = named_spec(doc["device"])
    pairs = [[0, 0, []] for _ in GAP_EDGES]  # per gap: pairs, ordered as measured, ratios
    for label, row in doc["shapes"].items():
        shape = Shape.from_label(label)
        timed = [(predicted_or_inf(shape, c, spec), ms) for c, ms in row["times"] if ms]
        best = min(ms for _, ms in timed)
        timed = [(p, ms) for p, ms in timed if ms <= COMPETITIVE * best and math.isfinite(p)]
        for faster_p, faster_ms in timed:
            for slower_p, slower_ms in timed:
                if faster_p < slower_p:
                    gap = 1 - faster_p / slower_p
                    bin_ = pairs[bisect.bisect_right(GAP_EDGES, gap) - 1]
                    bin_[0] += 1
                    bin_[1] += faster_ms < slower_ms
                    bin_[2].append(slower_ms / faster_ms)
    print(f"# the model's order of two configs of a shape, by predicted gap ({doc['device']}; "
          f"configs within {COMPETITIVE}x of each shape's best)\n\n| predicted gap | pairs | "
          "ordered as measured | measured time of the one predicted slower over the other's: "
          "median | 10th percentile |\n|---|---|---|---|---|")
    for i, (count, right, ratios) in enumerate(pairs):
        if count:
            ratios.sort()
            top = f"{GAP_EDGES[i + 1]:.1%}" if i + 1 < len(GAP_EDGES) else ""
            print(f"| {GAP_EDGES[i]:.1%}-{top} | {count} | {right / count:.1%} | "
                  f"{ratios[len(ratios) // 2]:.3f} | {ratios[len(ratios) // 10]:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    m = commands.add_parser("measure")
    m.add_argument("--table", action="append", required=True)
    m.add_argument("--fresh", action="append", default=[])
    m.add_argument("--shapes", action="append", required=True)
    m.add_argument("--top", type=int, default=3, help="best trials per fresh study")
    m.add_argument("--jobs", type=int, default=16)
    m.add_argument("-o", "--output", required=True)
    r = commands.add_parser("report")
    r.add_argument("candidates")
    r.add_argument("--table", action="append", required=True)
    r.add_argument("--shapes", action="append", help="only these shapes (a CSV, repeatable)")
    o = commands.add_parser("order")
    o.add_argument("candidates")
    args = parser.parse_args()
    {"measure": measure, "report": report, "order": order}[args.command](args)


if __name__ == "__main__":
    main()
