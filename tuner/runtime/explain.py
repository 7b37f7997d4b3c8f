"""`tune lookup`: what the runtime answers one GEMM, and why, as lines to print.

It asks the dispatcher's own question (the op by `kernel_for`, the row strides a call in that
layout has, the variants TUNE_EXCLUDE leaves out) through `get_tuned_config`, so the answer is
the one `tuner.matmul` would launch for a call the key describes; nothing is compiled and no
GPU is needed (the fallback's model may import torch and Triton).
"""
from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.bucketing.strategies import KEY_FIELDS
from tuner.runtime.exclude import excluded_variants
from tuner.runtime.lookup import ENV_VAR, get_tuned_config_without, table_at

if TYPE_CHECKING:
    from tuner.shapes import Shape

# What each policy step's answer means (tuner.runtime.policy, tuner.runtime.expand).
STEP_MEANINGS = {
    "table": "the table's entry for the key's bucket (or its alternate, the variant excluded)",
    "online": "the winner of timing candidates on this key's bucket once, from the online "
              "cache (TUNE_ONLINE=1)",
    "trusted": "the model's best config of a variant whose term is trusted for such keys "
               "(tuner.model.regimes: kreduce for a few outputs along a long K), predicted "
               "faster than cuBLAS; no tuned bucket near the key speaks for it",
    "nearest": "from the closest tuned buckets of this op and dtype, the model choosing",
    "model": "the model's pick among the table's configs (no entry of this dtype, or no "
             "neighbour can run the key)",
    "cublas": "torch's own GEMM: no tuned config near enough to trust, or the model "
              "predicts cuBLAS faster",
    "default": "the op's default config: nothing else can run the key",
    "expand-online": "the winner of timing the expand file's best candidates on this key",
    "expand-model": "the model's pick among the expand file's configs",
}


def explain(M: int, N: int, K: int, dtype: str, layout: str,
            table_path: str | None) -> list[str]:
    """What the runtime answers a call of M×N×K in `dtype` and `layout` (Shape's letters)
    from the file at `table_path` (None: $TUNE_CONFIG's, or none): the key, the config, the
    policy step that gave it and what that means, the bucket of the entry it came from, and
    the warning a call would give."""
    from tuner.kernels import kernel_for
    from tuner.shapes import Shape

    shape = Shape(M, N, K, dtype, layout)
    op = kernel_for(M, N).name
    excluded = excluded_variants()
    with warnings.catch_warnings(record=True) as caught:  # shown as a line of their own
        warnings.simplefilter("always")
        config = get_tuned_config_without(excluded, op, **shape.key(), path=table_path)
    where = table_path or os.environ.get(ENV_VAR)
    lines = [f"{op} {shape} (stride_am={shape.stride_am}, stride_bk={shape.stride_bk}) from "
             + (str(Path(where)) if where else f"no table (set {ENV_VAR} or --table)"),
             f"config: {dict(config)}",
             f"source: {config.source}: {STEP_MEANINGS.get(config.source, '')}".rstrip(": ")]
    if config.bucket is not None:
        lines.append("bucket: " + ", ".join(f"{field}={value}" for field, value
                                            in zip(KEY_FIELDS, config.bucket)))
    if config.source == "trusted":  # the model's figures are the whole reason: show them
        lines.append(_predictions(shape, config, table_at(table_path).device_name))
    if excluded:
        lines.append(f"excluded: {', '.join(sorted(excluded))} (TUNE_EXCLUDE)")
    lines += [f"warning: {warning.message}" for warning in caught]
    return lines


def _predictions(shape: Shape, config: Mapping, device_name: str | None) -> str:
    """The model's time for the config and for cuBLAS on the shape, for the table's device."""
    from tuner.model.named_devices import named_spec
    from tuner.model.predict import predicted_or_inf
    from tuner.runtime.answer import CUBLAS_CONFIG

    spec = named_spec(device_name)
    ours, cublas = (predicted_or_inf(shape, c, spec) * 1e3 for c in (config, CUBLAS_CONFIG))
    return f"model ({spec.name}): {ours:.1f} us, cuBLAS {cublas:.1f} us"
