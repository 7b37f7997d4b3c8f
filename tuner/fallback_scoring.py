"""The runtime's answers scored against timings of the configs its fallback weighs.

The timings (what benchmarks/fallback_pool.py's `measure` writes) hold, per never-tuned shape,
each config of the pool the nearest fallback chooses from, timed side by side on a GPU. Asking
the runtime again, with today's code and constants, and finding its answer among them scores
a change to the fallback's rules without a GPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tuner.runtime import CUBLAS
from tuner.shapes import Shape
from tuner.space import config_signature
from tuner.statuses import TrialStatus
from tuner.validate import RuntimePick, runtime_pick


@dataclass(frozen=True)
class Answer:
    """The runtime's answer to one timed shape: its pick, the pick's timing in the pool (None:
    outside it), cuBLAS's, the pool's fastest on device, and the closest neighbour's config."""
    shape: str
    pick: RuntimePick
    timed: dict | None
    cublas: dict
    best: dict
    closest: dict

    def ratio(self, figure: str, entry: dict | None = None) -> float | None:
        """cuBLAS's time / the entry's (default: the answer's) by `figure` (device_ms or
        loop_ms); None for an answer outside the pool."""
        entry = self.timed if entry is None else entry
        return None if entry is None else self.cublas[figure] / entry[figure]


def answers(timings: dict, table: Path) -> list[Answer]:
    """Ask the runtime (today's code, `table`) for each timed shape of `timings`, and find its
    answer among them."""
    found = []
    for row in timings["rows"]:
        pool = [entry for entry in row["pool"] if entry["status"] == TrialStatus.OK]
        pick = runtime_pick(table, Shape.from_label(row["shape"]))
        timed = next((entry for entry in pool if config_signature(entry["config"])
                      == config_signature(pick.config)), None)
        found.append(Answer(row["shape"], pick, timed,
                            next(e for e in pool if e["config"]["variant"] == CUBLAS),
                            min(pool, key=lambda entry: entry["device_ms"]),
                            row["pool"][0]["config"]))
    return found
