"""Where a model's graphed step goes, kernel by kernel: stock transformers against the same
model under tuner.enable(), without and with tuner.fuse, each captured in a CUDA graph
(benchmarks/model_e2e.py's model, cases and contenders).

    python benchmarks/step_kernels.py --out DIR --table TABLE [--rows 4]   # DIR/step_kernels.md

Per case and contender, torch's profiler over --steps replays of the captured step gives
each kernel's µs and launches per step, and splits the step into its GEMMs (cuBLAS's kernels
and the tuner's own) and the rest. The GEMM launches of one step are listed in order with
their median µs over the replays, so each projection can be set beside stock's. Step time
alone (model_e2e.py) says whether ours is faster; this says where, and how much of the step
the GEMMs could still give.
"""
from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import torch
from model_e2e import (
    BenchError,
    Step,
    add_model_arguments,
    all_cases,
    bench_model,
    check_transformers,
    contender,
    model_description,
    selected,
    versions,
)

from tuner.errors import UserError
from tuner.formats.files import check_writable, write_text_atomic

CONTENDERS = ("stock-graph", "ours-graph", "ours-fuse-graph")
# cuBLAS's GEMM and GEMV kernels (and its split-K reductions) by name.
CUBLAS_NAME_PARTS = ("nvjet", "gemm", "gemv", "cutlass", "splitKreduce")
TOP_KERNELS = 12


def our_kernel_names() -> frozenset[str]:
    """The names of the tuner's Triton and Gluon functions: what its launches are called."""
    from triton.runtime.jit import JITFunction

    import tuner.kernels
    names = set()
    for info in pkgutil.iter_modules(tuner.kernels.__path__):
        module = importlib.import_module(f"tuner.kernels.{info.name}")
        names.update(name for name, value in vars(module).items()
                     if isinstance(value, JITFunction))
    return frozenset(names)


def is_gemm(name: str, ours: frozenset[str]) -> bool:
    return name in ours or any(part in name for part in CUBLAS_NAME_PARTS)


def profiled_launches(run, steps: int) -> list[tuple[str, float]]:
    """(kernel name, µs) of every kernel launch in `steps` runs, in order."""
    from torch.profiler import ProfilerActivity, profile
    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            run()
        torch.cuda.synchronize()
    return [(event.name, event.device_time_total) for event in prof.events()
            if event.device_type == torch.autograd.DeviceType.CUDA]


def summary(launches: list[tuple[str, float]], steps: int, ours: frozenset[str]) -> dict:
    """Per step: every kernel's µs and launches, the GEMMs' and the rest's µs, and the GEMM
    launches of one step in order with their median µs over the steps."""
    per_kernel: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for name, us in launches:
        per_kernel[name][0] += 1
        per_kernel[name][1] += us
    gemms = [(name, us) for name, us in launches if is_gemm(name, ours)]
    if len(launches) % steps or len(gemms) % steps:
        raise BenchError(f"{len(launches)} launches over {steps} steps: not one graph per step")
    per_step = len(gemms) // steps
    in_order = [(gemms[i][0], statistics.median(gemms[s * per_step + i][1]
                                                for s in range(steps)))
                for i in range(per_step)]
    gemm_us = sum(us for _, us in gemms) / steps
    total_us = sum(us for _, us in launches) / steps
    kernels = sorted(((name, count / steps, us / steps) for name, (count, us)
                      in per_kernel.items()), key=lambda row: -row[2])
    return {"total_us": total_us, "gemm_us": gemm_us, "gemm_launches": per_step,
            "kernels": kernels, "gemms_in_order": in_order}


def case_markdown(label: str, summaries: dict[str, dict]) -> list[str]:
    lines = [f"## {label}", "", "| contender | kernels µs per step | GEMMs µs | GEMM launches "
             "| the rest µs |", "|---|---|---|---|---|"]
    for column, s in summaries.items():
        lines.append(f"| {column} | {s['total_us']:.1f} | {s['gemm_us']:.1f} | "
                     f"{s['gemm_launches']} | {s['total_us'] - s['gemm_us']:.1f} |")
    for column, s in summaries.items():
        lines += ["", f"{column}, its {TOP_KERNELS} largest kernels:", "",
                  "| kernel | µs per step | launches per step |", "|---|---|---|"]
        lines += [f"| `{name[:90]}` | {us:.1f} | {count:g} |"
                  for name, count, us in s["kernels"][:TOP_KERNELS]]
    for column, s in summaries.items():
        lines += ["", f"{column}, the GEMM launches of one step in order (median µs):", "",
                  "| # | kernel | µs |", "|---|---|---|"]
        lines += [f"| {i} | `{name[:60]}` | {us:.1f} |"
                  for i, (name, us) in enumerate(s["gemms_in_order"], 1)]
    return lines + [""]


def run(args) -> int:
    check_transformers()
    if not torch.cuda.is_available():
        raise BenchError("no CUDA GPU here: the profile is of CUDA kernels")
    if not Path(args.table).is_file():
        raise BenchError(f"--table {args.table}: no such file")
    out = Path(args.out) / "step_kernels.md"
    check_writable(out)
    os.environ["TUNE_CONFIG"] = args.table  # before the dispatcher's first lookup
    torch.set_grad_enabled(False)
    model = bench_model(args.layers, False, "cuda", args.seed)
    ours = our_kernel_names()
    cases = all_cases(args.prefix, tiny=False)
    lines = [f"# Where a graphed step goes, kernel by kernel — {torch.cuda.get_device_name()}",
             "", f"{model_description(args)}; table `{args.table}`; versions {versions()}; "
             f"torch's profiler over {args.steps} replays of each contender's graph "
             "(`benchmarks/step_kernels.py`).", ""]
    for index in selected(args.rows, len(cases)):
        case = cases[index]
        step = Step(model, case, args.seed + index, "cuda")
        summaries = {}
        for column in CONTENDERS:
            chosen = contender(column, model, step, "cuda")
            summaries[column] = summary(profiled_launches(chosen.run, args.steps), args.steps,
                                        ours)
        lines += case_markdown(case.label, summaries)
        write_text_atomic(out, "\n".join(lines))  # each case kept as it is done
    print("\n".join(lines))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for step_kernels.md")
    parser.add_argument("--table", required=True, help="table YAML from `tune export`")
    parser.add_argument("--rows", default="4", help="1-based cases, as model_e2e.py's "
                        "(1-2 prefill 1x2048, 8x512; 3-5 decode b1, b8, b32; default 4)")
    add_model_arguments(parser)
    parser.set_defaults(tiny=False)  # the full model only (model_description reads it)
    parser.add_argument("--steps", type=int, default=10, help="replays profiled per contender")
    try:
        return run(parser.parse_args(argv))
    except UserError as e:
        print(f"step_kernels: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
