"""How well the analytical model (tuner.model.predict) ranks the configs that tuning studies
measured.

The exhaustive recording (benchmarks/data/recording-h200.json.gz) scores the model on one
narrowed space; the studies of real `tune run`s cover the whole space (BLOCK_K 128 and 256,
every variant) on more shapes, though only the configs each search chose to measure. Per
study: the measured best over the measured time of the config the model predicts fastest
among the measured ones. That is the choice the runtime's nearest fallback makes (among a
few measured configs), and what a constant of the model should be judged by.

    # wherever the databases are: the studies' timings as one file
    python benchmarks/model_on_studies.py extract --db sqlite:///tune.db \
        --db sqlite:///validate.db -o studies.json.gz
    # anywhere, no GPU: the model's pick per study (--shapes: also the geomean over those)
    python benchmarks/model_on_studies.py report studies.json.gz --shapes shapes.csv
"""
from __future__ import annotations

import argparse
import gzip
import json
import statistics

from tuner.formats.files import write_bytes_atomic
from tuner.shapes import Shape, load_shapes
from tuner.statuses import TrialStatus


def extract(args) -> None:
    from tuner.db.session import session_factory
    from tuner.db.store import Store

    studies, devices = [], set()
    for url in args.db:
        store = Store(session_factory(url))
        for device in store.devices_matching(None):
            devices.add(device.name)
            for study in store.finished_studies(device.id):
                measured = [[t.params, t.p50_ms] for t in study.trials
                            if t.status == TrialStatus.OK and t.p50_ms]
                if measured:
                    studies.append({"shape": study.shape_label, "kernel": study.kernel.name,
                                    "trials": measured})
    if len(devices) != 1:
        raise SystemExit(f"the databases hold studies of {len(devices)} devices; give one")
    write_bytes_atomic(args.output, gzip.compress(json.dumps(
        {"device": devices.pop(), "studies": studies}).encode(), mtime=0))
    print(f"{len(studies)} studies -> {args.output}")


def report(args) -> None:
    from tuner.model.named_devices import named_spec
    from tuner.search.replay_report import model_pick_among

    with gzip.open(args.studies, "rt") as f:
        doc = json.load(f)
    spec = named_spec(doc["device"])
    listed = {str(s) for s in load_shapes(args.shapes)} if args.shapes else set()
    rows = sorted(((model_pick_among(Shape.from_label(s["shape"]), s["trials"], spec), s)
                   for s in doc["studies"]), key=lambda row: row[0])
    print(f"# the model's pick among each study's measured configs ({doc['device']})\n")
    print("| study | measured configs | model's pick / measured best |\n|---|---|---|")
    for ratio, study in rows:
        print(f"| {study['shape']} ({study['kernel']}) | {len(study['trials'])} | {ratio:.3f} |")
    groups = {"all studies": [r for r, _ in rows]}
    if listed:
        groups[f"shapes of {args.shapes}"] = [r for r, s in rows if s["shape"] in listed]
        groups["the others"] = [r for r, s in rows if s["shape"] not in listed]
    print()
    for name, ratios in groups.items():
        print(f"- {name}: {len(ratios)} studies, geomean "
              f"{statistics.geometric_mean(ratios):.3f}, min {min(ratios):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    e = commands.add_parser("extract")
    e.add_argument("--db", action="append", required=True)
    e.add_argument("-o", "--output", required=True)
    r = commands.add_parser("report")
    r.add_argument("studies")
    r.add_argument("--shapes")
    args = parser.parse_args()
    (extract if args.command == "extract" else report)(args)


if __name__ == "__main__":
    main()
