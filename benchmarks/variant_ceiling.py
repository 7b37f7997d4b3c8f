"""The best measured config of each variant per study, against cuBLAS timed in the same study:
after an exhaustive run over a narrow space, the kernels' own ceiling on those shapes.

    # on the GPU
    tune run --shapes benchmarks/shapes/midsize-probe.csv \
        --space benchmarks/spaces/midsize-probe.yaml --exhaustive --db sqlite:///probe.db
    # anywhere
    python benchmarks/variant_ceiling.py --db sqlite:///probe.db > ceiling.md

With `--across PARAM` (e.g. num_stages), it tabulates instead every config's time at each
value of PARAM, the other parameters fixed: how one knob moves each tile.
"""
from __future__ import annotations

import argparse

from sqlalchemy import select

from tuner.db.models import Device, Study, Trial
from tuner.db.session import session_factory
from tuner.kernels.base import config_label
from tuner.statuses import TrialStatus


def best_per_variant(trials: list[Trial]) -> dict[str, Trial]:
    """Each variant's fastest correct trial by device time (p50)."""
    best: dict[str, Trial] = {}
    for trial in trials:
        variant = trial.params["variant"]
        if trial.status is TrialStatus.OK and (
                variant not in best or trial.p50_ms < best[variant].p50_ms):
            best[variant] = trial
    return best


def across(trials: list[Trial], param: str) -> tuple[list, dict[str, dict]]:
    """The values `param` takes, and per config with `param` left out (labelled by every
    other parameter, so that no two configs share a row), its correct trials' device time
    (µs) at each value."""
    values = sorted({t.params[param] for t in trials if param in t.params})
    rows: dict[str, dict] = {}
    for trial in trials:
        if trial.status is TrialStatus.OK and param in trial.params:
            label = " ".join(str(v) if k == "variant" else f"{k}={v}"
                             for k, v in trial.params.items() if k != param)
            rows.setdefault(label, {})[trial.params[param]] = trial.p50_ms * 1e3
    return values, rows


def print_across(studies: list[Study], param: str) -> None:
    for study in studies:
        trials = list(study.trials)
        cublas = best_per_variant(trials).get("cublas")
        values, rows = across(trials, param)
        baseline = f"; cuBLAS {cublas.p50_ms * 1e3:.1f} µs" if cublas else ""
        print(f"\n### {study.shape_M}x{study.shape_N}x{study.shape_K} {study.dtype} "
              f"{study.shape_layout}: µs by {param}{baseline}\n")
        print(f"| config | {' | '.join(f'{param}={v}' for v in values)} | best | "
              "cuBLAS / best |")
        print(f"|---|{'---|' * len(values)}---|---|")
        for label, times in rows.items():
            cells = " | ".join(f"{times[v]:.1f}" if v in times else "–" for v in values)
            best = min(times, key=times.get)
            ratio = f"{cublas.p50_ms * 1e3 / times[best]:.3f}" if cublas else "–"
            print(f"| {label} | {cells} | {param}={best} | {ratio} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True, help="SQLAlchemy URL of the tuning database")
    parser.add_argument("--across", metavar="PARAM",
                        help="tabulate every config's time at each value of this parameter")
    args = parser.parse_args()
    with session_factory(args.db, create=False)() as session:
        studies = session.scalars(select(Study).order_by(Study.id)).all()
        devices = {d.id: d.name for d in session.scalars(select(Device))}
        print(f"Device: {', '.join(sorted(set(devices.values())))}\n")
        if args.across:
            print_across(studies, args.across)
            return
        print("| shape | variant | configs timed | best µs | cuBLAS / best | config |")
        print("|---|---|---|---|---|---|")
        for study in studies:
            trials = list(study.trials)
            best = best_per_variant(trials)
            cublas = best.get("cublas")
            shape = f"{study.shape_M}x{study.shape_N}x{study.shape_K} {study.dtype} " \
                    f"{study.shape_layout}"
            for variant, trial in sorted(best.items(), key=lambda item: item[1].p50_ms):
                timed = sum(t.params["variant"] == variant for t in trials)
                ratio = f"{cublas.p50_ms / trial.p50_ms:.3f}" if cublas else "–"
                print(f"| {shape} | {variant} | {timed} | {trial.p50_ms * 1e3:.1f} | {ratio} "
                      f"| {config_label(trial.params)} |")


if __name__ == "__main__":
    main()
