"""How right the tuner's feasibility check is: its verdicts against real compiles and launches.

    python benchmarks/constraint_accuracy.py [--per-group 12] [--workers 14] [--timeout-s 60]

`Kernel.feasible` rejects configs before compiling them: shared memory over the device
limit (an estimate per variant) or an fp32 accumulator over 255 registers per thread. A
wrong rejection hides a config that might have won; a wrong acceptance costs a compile that
fails. Per shape (one per dtype, aligned so that every variant applies) and variant, this
samples configs of search_spaces/mm.yaml in three groups: accepted, rejected for shared
memory, rejected for registers (a third as many: spilling configs compile for minutes).
Half of each group is the nearest to the shared-memory limit (where an estimate can be
wrong), half random. Each config is compiled and launched
once on random operands in a supervised worker (a hung compile or a crash costs only that
config), and the launch reports Triton's own shared memory, registers and spills.

Prints a Markdown table: per variant and group, how many ran, failed (and why) or timed
out, and the estimate's error against Triton's shared memory where both exist.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone

import torch
import triton

from tuner.execution.measure import random_gemm
from tuner.execution.workers import TaskFailed, Worker, WorkerLost
from tuner.formats.files import write_text_atomic
from tuner.kernels import KERNELS, kernel_variants, launches
from tuner.kernels.calls import meta_gemm
from tuner.shapes import Shape
from tuner.space import builtin_spaces

# One shape per element size (fp16 compiles as bf16 does), aligned for every variant.
SHAPES = [Shape(4096, 4096, 4096, "bf16", "nn"), Shape(2048, 2048, 2048, "fp32", "nn"),
          Shape(1024, 4096, 4096, "fp8e4m3", "nt")]
GROUPS = ("accepted", "shared memory", "registers")


def launch_task(shape: Shape, config: dict) -> dict:
    """Runs in a worker: compile and launch `config` once; Triton's figures for its kernels
    (the largest shared memory and register count among them, total spills)."""
    kernel = KERNELS["mm"]
    gemm = random_gemm(shape, "cuda", seed=0)
    with launches.recording() as recorded:
        kernel.launch(gemm, config)
    torch.cuda.synchronize()
    compiled = [launch[0] for launch in recorded]
    return {"smem": max(c.metadata.shared for c in compiled),
            "regs": max(c.n_regs for c in compiled),
            "spills": sum(c.n_spills for c in compiled)}


def sample(shape: Shape, per_group: int, smem_limit: int, rng: random.Random) -> list[tuple]:
    """(variant, group, estimated smem, config) for each sampled config of the shape."""
    kernel, gemm = KERNELS["mm"], meta_gemm(shape)
    mm_space = builtin_spaces(kernel_variants())["mm"]
    space = mm_space.for_call(gemm)
    pools = defaultdict(list)
    for config in space.configs():
        if config["pad"]:
            continue  # aligned shapes: padding changes nothing (rejected before compiling)
        reason = kernel.feasible(config, gemm, smem_limit)
        group = "accepted" if reason is None else reason.split(":")[0]
        if group in GROUPS:  # not the variant's own refusals (TMA alignment, split counts)
            pools[config["variant"], group].append(config)
    picked = []
    for (variant, group), configs in sorted(pools.items()):
        count = per_group // 3 if group == "registers" else per_group
        estimated = [(kernel.smem_bytes(c, gemm), c) for c in configs]
        by_margin = sorted(estimated, key=lambda pair: abs(pair[0] - smem_limit))
        nearest, rest = by_margin[:count // 2], by_margin[count // 2:]
        chosen = nearest + rng.sample(rest, min(len(rest), count - len(nearest)))
        picked += [(variant, group, estimate, c) for estimate, c in chosen]
    return picked


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-group", type=int, default=12)
    parser.add_argument("--workers", type=int, default=14)
    parser.add_argument("--timeout-s", type=float, default=60.0)
    parser.add_argument("--jsonl", help="also write one JSON line per config here")
    args = parser.parse_args(argv)
    props = torch.cuda.get_device_properties(0)
    smem_limit = props.shared_memory_per_block_optin
    rng = random.Random(0)
    tasks = [(shape, *picked) for shape in SHAPES
             for picked in sample(shape, args.per_group, smem_limit, rng)]
    print(f"{len(tasks)} configs over {len(SHAPES)} shapes", file=sys.stderr)

    workers = [Worker(f"accuracy-{i}", preload=("tuner.kernels",)) for i in range(args.workers)]
    for worker in workers:
        worker.start()
    free = list(workers)

    def run(task) -> tuple:
        shape, variant, group, estimate, config = task
        worker = free.pop()
        try:
            return task, worker.call(launch_task, shape, config, timeout=args.timeout_s)
        except TaskFailed as e:
            return task, {"error": str(e)}
        except WorkerLost as e:
            return task, {"error": f"worker lost: {e}"}
        finally:
            free.append(worker)

    results = []
    with ThreadPoolExecutor(args.workers) as pool:
        for i, result in enumerate(pool.map(run, tasks), 1):
            results.append(result)
            if i % 50 == 0:
                print(f"{i}/{len(tasks)}", file=sys.stderr)
    for worker in workers:
        worker.close()
    if args.jsonl:
        write_text_atomic(args.jsonl, "".join(
            json.dumps({"shape": str(shape), "group": group, "estimate": estimate,
                        "config": config, **outcome}) + "\n"
            for (shape, _variant, group, estimate, config), outcome in results))

    print(f"# feasibility check vs real compiles — {props.name}, torch {torch.__version__}, "
          f"triton {triton.__version__}, {datetime.now(timezone.utc):%Y-%m-%d}\n")
    print(f"shapes: {', '.join(map(str, SHAPES))}; shared memory limit {smem_limit} bytes; "
          f"{args.per_group} configs per (shape, variant, group), a third of that rejected for "
          f"registers: half nearest the limit, half random; timeout {args.timeout_s:g} s per "
          "compile and launch\n")
    print("| variant | check said | configs | ran | failed | smem est/actual (median, max) | "
          "failures |")
    print("|---|---|---|---|---|---|---|")
    table = defaultdict(list)
    for (_shape, variant, group, estimate, _config), outcome in results:
        table[variant, group].append((estimate, outcome))
    totals = Counter()
    for (variant, group), rows in sorted(table.items()):
        ran = [(e, o) for e, o in rows if "error" not in o]
        errors = Counter(o["error"].split(":")[0] for _, o in rows if "error" in o)
        ratios = [e / o["smem"] for e, o in ran if o["smem"]]
        ratio = (f"{statistics.median(ratios):.2f}, {max(ratios, key=lambda r: abs(r - 1)):.2f}"
                 if ratios else "-")
        failures = ", ".join(f"{n}× {kind}" for kind, n in errors.most_common()) or "-"
        print(f"| {variant} | {group} | {len(rows)} | {len(ran)} | {len(rows) - len(ran)} | "
              f"{ratio} | {failures} |")
        totals[group, "ran"] += len(ran)
        totals[group, "all"] += len(rows)
    print()
    print(f"accepted and failed: {totals['accepted', 'all'] - totals['accepted', 'ran']} of "
          f"{totals['accepted', 'all']}; rejected but ran: shared memory "
          f"{totals['shared memory', 'ran']} of {totals['shared memory', 'all']}, registers "
          f"{totals['registers', 'ran']} of {totals['registers', 'all']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
