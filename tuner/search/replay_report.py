"""What `tune replay` prints and draws: the curves per strategy, the goal, the model's quality.

Kept apart from the replays themselves (tuner.search.replay) so that the numbers can be computed
without matplotlib, an optional extra needed only for `--plot`.
"""
from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

from tuner.model.predict import DeviceSpec, fastest_of
from tuner.search.replay import Recording, ReplayError, ShapeRecording, median_curve, model_ranking
from tuner.shapes import Shape
from tuner.space import config_signature

CHECKPOINTS = (1, 4, 8, 12, 16, 24, 32, 40, 64)
# The goal for the default strategy: the median over shapes and seeds reaches these
# fractions of the exhaustive best within these many trials.
GOAL = {12: 0.95, 32: 0.98}


def meets_goal(median: Sequence[float]) -> bool:
    return all(len(median) >= n and median[n - 1] >= fraction for n, fraction in GOAL.items())


def curves_table(curves: dict[str, list[list[float]]], trials: int) -> str:
    """Markdown: per strategy, the median fraction of the best found after n trials."""
    columns = [n for n in CHECKPOINTS if n <= trials]
    lines = ["| strategy | runs | " + " | ".join(f"{n} trials" for n in columns) + " | goal |",
             "|---|---|" + "---|" * len(columns) + "---|"]
    for name, runs in curves.items():
        median = median_curve(runs, trials)
        cells = " | ".join(f"{median[n - 1]:.3f}" for n in columns)
        goal = "meets" if meets_goal(median) else "misses"
        lines.append(f"| {name} | {len(runs)} | {cells} | {goal} |")
    return "\n".join(lines)


def stops_table(curves: dict[str, list[list[float]]]) -> str:
    """Markdown: per strategy, how many configs its studies measured before their stopping
    rules ended them, and the fraction of the best they ended with (a strategy without rules
    measures its `--trials`)."""
    lines = ["| strategy | runs | configs measured: median | max | final fraction: geomean "
             "| min |", "|---|---|---|---|---|---|"]
    for name, runs in curves.items():
        lengths, finals = [len(c) for c in runs], [c[-1] for c in runs]
        lines.append(f"| {name} | {len(runs)} | {statistics.median(lengths):g} | "
                     f"{max(lengths)} | {geomean(finals):.3f} | {min(finals):.3f} |")
    return "\n".join(lines)


def model_pick_ratios(recording: Recording) -> list[tuple[ShapeRecording, float, float]]:
    """Per recorded shape: (its recording, the best TF/s, the model's first pick's TF/s)."""
    rows = []
    for shape_recording in recording.shapes:
        (pick,) = model_ranking(shape_recording, recording.device, k=1)
        picked = shape_recording.tflops[config_signature(pick)]
        rows.append((shape_recording, shape_recording.best, picked))
    return rows


def model_pick_among(shape: Shape, measured: Sequence[tuple[dict, float]],
                     spec: DeviceSpec) -> float:
    """Measured best / measured time of the config the model predicts fastest among the
    measured ones: the choice the runtime's nearest fallback makes among a few configs, so
    what a study's trials (whole space, non-exhaustive) say of the model's ranking."""
    best = min(ms for _, ms in measured)
    _, picked_ms = measured[fastest_of(shape, [config for config, _ in measured], spec)]
    return best / picked_ms


def geomean(values: Sequence[float]) -> float:
    """Geometric mean, a config that failed (0 TF/s) counting as a tiny positive ratio."""
    return statistics.geometric_mean(max(v, 1e-9) for v in values)


def model_quality_table(recording: Recording) -> str:
    """Markdown: per shape, the model's first pick against the recorded best, and the
    geometric mean of that ratio (the model-alone goal is >= 0.90)."""
    lines = ["| shape | best TF/s | model's pick TF/s | ratio |", "|---|---|---|---|"]
    rows = model_pick_ratios(recording)
    for shape_recording, best, picked in rows:
        lines.append(f"| {shape_recording.shape} | {best:.1f} | {picked:.1f} | "
                     f"{picked / best:.3f} |")
    ratio = geomean([picked / best for _, best, picked in rows])
    lines.append(f"\ngeomean model pick / best: {ratio:.3f} over {len(rows)} shapes")
    return "\n".join(lines)


def plot(curves: dict[str, list[list[float]]], trials: int, path: Path, title: str) -> None:
    """The median curves as a PNG (needs matplotlib: pip install 'gemm-tuner[plot]')."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ReplayError("--plot needs matplotlib: pip install 'gemm-tuner[plot]'") from None
    figure, axes = plt.subplots(figsize=(8, 5))
    for name, runs in curves.items():
        axes.plot(range(1, trials + 1), median_curve(runs, trials), label=name)
    for n, fraction in GOAL.items():
        axes.plot([n], [fraction], "k+", markersize=12)
    axes.set(xlabel="configs measured", ylabel="median fraction of the exhaustive best",
             title=title, ylim=(0.5, 1.005))
    axes.grid(alpha=0.3)
    axes.legend(loc="lower right")
    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)
