"""Grouping the listed shapes into the studies to run: one per (kernel, bucketed key).

Shapes whose bucketed keys match share a config, so only one of them is tuned: the one with
the largest CSV weight (the first listed on a tie), since that is the one whose speed matters
most. The config then answers every M of its bucket, listed or not (serving's M varies call
to call), so a plan also names the bucket's fewest rows, where a tile tuned at the
representative wastes the most of its row tiles (tuner.search.study checks it there).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from tuner.bucketing.strategies import KEY_FIELDS, bucket_key, lowest_member
from tuner.shapes import Shape
from tuner.space import SearchSpace


@dataclass(frozen=True)
class KeyPlan:
    kernel: str
    key: dict  # bucketed key fields
    shape: Shape  # the representative that is timed
    members: tuple[Shape, ...]
    # The representative at the fewest rows its bucket holds that this kernel computes; None
    # where the bucket holds only the representative's M.
    low_end: Shape | None = None

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
                             tuple(members), _low_end(representative, spaces[kernel],
                                                      kernel_for)))
    return plans


def _low_end(shape: Shape, space: SearchSpace, kernel_for) -> Shape | None:
    """`shape` at the fewest rows of its M bucket that its kernel computes (M = 1 may be
    another kernel's: a bucket of 1-4 rows answers mm calls from 2), None if that is its M."""
    kernel = kernel_for(shape.M, shape.N).name
    m = lowest_member(shape.M, space.strategy["M"])
    while kernel_for(m, shape.N).name != kernel:
        m += 1
    return replace(shape, M=m) if m < shape.M else None
