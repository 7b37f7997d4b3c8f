"""Grouping the listed shapes into the studies to run: one per (kernel, bucketed key).

Shapes whose bucketed keys match share a config, so only one of them is tuned: the one with
the largest CSV weight (the first listed on a tie), since that is the one whose speed matters
most.
"""
from __future__ import annotations

from dataclasses import dataclass

from tuner.bucketing.strategies import KEY_FIELDS, bucket_key
from tuner.shapes import Shape
from tuner.space import SearchSpace


@dataclass(frozen=True)
class KeyPlan:
    kernel: str
    key: dict  # bucketed key fields
    shape: Shape  # the representative that is timed
    members: tuple[Shape, ...]

    @property
    def label(self) -> str:
        return f"{self.kernel} {self.shape}"


def plan_studies(shapes: list[Shape], spaces: dict[str, SearchSpace],
                 kernel_for) -> list[KeyPlan]:
    groups: dict[tuple, list[Shape]] = {}
    for shape in shapes:
        kernel = kernel_for(shape.M, shape.N).name
        bucket = bucket_key(shape.key(), spaces[kernel].strategy)
        groups.setdefault((kernel, bucket), []).append(shape)
    plans = []
    for (kernel, bucket), members in groups.items():
        representative = max(members, key=lambda s: s.weight)  # max keeps the first on ties
        plans.append(KeyPlan(kernel, dict(zip(KEY_FIELDS, bucket)), representative,
                             tuple(members)))
    return plans
