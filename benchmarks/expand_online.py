"""Our runtime answering from an expand file with TUNE_ONLINE=1, against the exact table it
was exported from: per shape, what the first call costs (the online tuning of its bucket),
and the tuner's call afterwards, beside the same call answered by the table.

    # on the GPU machine: twice, the second start must time nothing
    python benchmarks/expand_online.py --expand mm_hopper_expand.yaml \
        --table benchmarks/results/vs-cublas/tuned-h100.yaml --cache online.yaml -o first.json
    python benchmarks/expand_online.py ... -o second.json

Each start reports `configs_timed` (tuner.runtime.online.stats()): the second start of the
same cache must report 0. Per shape: the expand answer's config and source, its first-call
wall seconds, and `tuner.matmul` / `tuner.linear` as a user calls them (triton.testing.do_bench),
first answered from the expand file (online), then, after the dispatcher's caches are
cleared, from the table; the ratio is table time / expand time (>= 0.97: within 3%).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

ROWS = ("16x4096x4096 bf16 nn", "64x128256x4096 bf16 nn", "128x14336x4096 bf16 nn",
        "2048x4096x14336 bf16 nn", "4096x4096x4096 bf16 nn", "1000x3000x2000 bf16 nn",
        "32x6144x4096 bf16 nt", "256x6144x4096 bf16 nt", "1x4096x4096 bf16 nt")


def _timed_calls(shapes, with_first_call: bool) -> list[dict]:
    import torch
    import triton
    from _as_called import user_calls

    from tuner.execution.measure import random_gemm, reference, relative_error
    from tuner.kernels import kernel_for
    from tuner.runtime import dispatch, get_tuned_config

    rows = []
    for shape in shapes:
        gemm = random_gemm(shape, "cuda", seed=0)
        operands, _, tuner_op = user_calls(shape.layout, False)
        args = operands(gemm)
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = tuner_op(*args)
        torch.cuda.synchronize()
        first_s = time.perf_counter() - start
        answer = get_tuned_config(kernel_for(shape.M, shape.N).name, **shape.key())
        row = {"shape": str(shape), "config": dict(dispatch.plan(gemm)[1]),
               "source": answer.source,
               "rel_error": relative_error(out, reference(gemm)),
               "ms": triton.testing.do_bench(lambda op=tuner_op, a=args: op(*a))}
        if with_first_call:
            row["first_call_s"] = first_s
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--expand", required=True)
    parser.add_argument("--table", required=True)
    parser.add_argument("--cache", required=True)
    parser.add_argument("--shapes", default=str(Path(__file__).parent / "shapes/shapes-dev.csv"))
    parser.add_argument("--rows", nargs="+", default=list(ROWS))
    parser.add_argument("-o", "--output", required=True)
    args = parser.parse_args()
    os.environ.update(TUNE_CONFIG=str(Path(args.expand).resolve()), TUNE_ONLINE="1",
                      TUNE_ONLINE_CACHE=str(Path(args.cache).resolve()))
    sys.path.insert(0, str(Path(__file__).parent))

    import torch

    from tuner.runtime import dispatch, online
    from tuner.shapes import load_shapes

    shapes = {str(s): s for s in load_shapes(args.shapes)}
    chosen = [shapes[label] for label in args.rows]
    start = time.perf_counter()
    expand_rows = _timed_calls(chosen, with_first_call=True)
    result = {"device": torch.cuda.get_device_name(), "expand": args.expand,
              "table": args.table, "online": online.stats(),
              "wall_s": time.perf_counter() - start}
    os.environ.pop("TUNE_ONLINE")
    os.environ["TUNE_CONFIG"] = str(Path(args.table).resolve())
    dispatch.clear_cache()
    table_rows = _timed_calls(chosen, with_first_call=False)
    for mine, exact in zip(expand_rows, table_rows):
        mine["table_config"], mine["table_ms"] = exact["config"], exact["ms"]
        mine["table_over_expand"] = exact["ms"] / mine["ms"]
    result["shapes"] = expand_rows
    ratios = [r["table_over_expand"] for r in expand_rows]
    result["geomean_table_over_expand"] = math.exp(statistics.fmean(map(math.log, ratios)))
    Path(args.output).write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
