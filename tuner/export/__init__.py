"""Turning what the database (or a table file) chose into the files deployments read.

The schemas of those files are tuner.formats'; this package decides what goes in them, a
step a module:

- `picks`: which configs ship: one device's current winners under a launch mode, or the
  buckets `tune buckets` chose, each a `Pick` with its provenance and alternates;
- `flaggems_ops`: the FlagGems op each pick belongs to, and a Triton stand-in where FlagGems
  has none (cuBLAS);
- `cases`: what each tuned shape measured (`Tuned`), as the cases a narrowing weighs;
- `narrowing`: bounding one op's value lists to a product of at most N configs;
- `op_lists`: each FlagGems op's lists, bounded (`narrowing`) or the picks' union;
- `time_missing`: `--time-missing`, timing on the GPU what the narrowing only priced;
- `writers`: the files themselves, from the database or a table file (`tune export`).
"""
from __future__ import annotations

from tuner.errors import UserError


class ExportError(UserError, RuntimeError):
    """Nothing, or nothing unambiguous, to export."""
