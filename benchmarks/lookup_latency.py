"""Host cost of `tuner.runtime.get_tuned_config` per call, on a hit, from a 24-row table.

    python benchmarks/lookup_latency.py

Runs on any machine (no GPU): builds a table YAML in a temporary folder, warms the memo with one
call per key, then times many calls cycling over the keys and prints the median of repeats.
"""
from __future__ import annotations

import statistics
import sys
import tempfile
import timeit
from pathlib import Path

from tuner.bucketing.strategies import KEY_FIELDS
from tuner.formats.files import write_atomic
from tuner.runtime import TABLE_FORMAT, get_tuned_config

STRATEGY = dict.fromkeys(KEY_FIELDS, "align32") | {"dtype": "default"}
CONFIG = {"variant": "general", "pad": 0, "BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64,
          "GROUP_M": 8, "num_stages": 3, "num_warps": 8}


def main() -> int:
    keys = [dict(M=m, N=n, K=4096, stride_am=4096, stride_bk=n, dtype="bf16")
            for m in (1, 16, 32, 64, 128, 256) for n in (4096, 6144, 14336, 28672)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tuned.yaml"
        write_atomic(path, {"format": TABLE_FORMAT, "ops": {"mm": {
            "strategy": STRATEGY, "entries": [{"key": k, "config": CONFIG} for k in keys]}}})
        calls = [(k["M"], k["N"], k["K"], k["dtype"], k["stride_am"], k["stride_bk"])
                 for k in keys]
        for M, N, K, dtype, sam, sbk in calls:
            assert get_tuned_config("mm", M=M, N=N, K=K, dtype=dtype, stride_am=sam,
                                    stride_bk=sbk, path=path) == CONFIG

        def loop():
            for M, N, K, dtype, sam, sbk in calls:
                get_tuned_config("mm", M=M, N=N, K=K, dtype=dtype, stride_am=sam,
                                 stride_bk=sbk, path=path)

        number = 2000
        runs = timeit.repeat(loop, number=number, repeat=15)
        per_call_ns = [t / (number * len(calls)) * 1e9 for t in runs]
    print(f"get_tuned_config hit: median {statistics.median(per_call_ns):.0f} ns/call, "
          f"min {min(per_call_ns):.0f}, max {max(per_call_ns):.0f} "
          f"({len(runs)} repeats x {number * len(calls)} calls, Python {sys.version.split()[0]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
