"""Is it the model or its pool of configs that loses on never-tuned shapes?

    # on the GPU: per shape, every config of the tables (same op and dtype) and the best
    # trials of fresh tunes of the shape, timed side by side (L2 flushed, outputs checked)
    python benchmarks/candidate_pool.py measure --table a.yaml --table b.yaml \
        --fresh sqlite:///validate.db --shapes holdout.csv -o candidates.json
    # anywhere: the model's pick among each pool, against the best config timed
    python benchmarks/candidate_pool.py report candidates.json.gz --table a.yaml --table b.yaml \
        [--shapes holdout.csv]

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
import gzip
import json
import sys
from pathlib import Path

import yaml

from tuner.bucket_search import weighted_geomean_regret
from tuner.shapes import Shape, load_shapes
from tuner.space import config_signature

TIE = 0.005  # predictions this close (relative) count as the same time


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
    from tuner.backends import require_gpu, visible_gpus
    from tuner.cross_timing import time_side_by_side
    from tuner.db.session import session_factory
    from tuner.db.store import Store
    from tuner.executor import Executor, ExecutorOptions
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
                ok = sorted((t for t in study.trials if t.status == "ok" and t.p50_ms),
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


def report(args) -> None:
    from tuner.model import predict_ms
    from tuner.suggest import suggest_device

    opener = gzip.open if args.candidates.endswith(".gz") else open
    with opener(args.candidates, "rt") as f:
        doc = json.load(f)
    spec = suggest_device(doc["device"])[1]
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
    args = parser.parse_args()
    (measure if args.command == "measure" else report)(args)


if __name__ == "__main__":
    main()
