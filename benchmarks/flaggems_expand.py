"""FlagGems itself consuming an expand YAML: how many configs its loader builds, what its
first call of each key costs (its runtime tuning over them), and how fast it then runs, for
our bounded export against FlagGems' shipped file, beside cuBLAS and our own dispatcher.

    # on the GPU machine, each file in a fresh process (FlagGems reads the file when imported)
    python benchmarks/flaggems_expand.py run --expand ours.yaml --label ours -o ours.json \
        --table benchmarks/results/vs-cublas/tuned-h100.yaml
    python benchmarks/flaggems_expand.py run --label default -o default.json
    # anywhere
    python benchmarks/flaggems_expand.py report ours.json default.json -o flaggems.md

`run` puts the file where FlagGems 5.x reads it (its package's mm_hopper_expand.yaml; the
shipped file is kept beside it and put back for `--label default`), sets USE_FLAGTUNE=1 and
fresh Triton and FlagGems caches (so every compile and every tuned key is paid for, as on a
new deployment), then per shape: the first `torch.mm` under `flag_gems.use_gems()` (wall
seconds: FlagGems benchmarks every config of the product for the key, compiling each),
the result against float64, and the steady state (triton.testing.do_bench, L2 flushed by it)
of FlagGems, cuBLAS and, with --table, `tuner.matmul` / `tuner.linear` as a user calls them.
Results go to the JSON after each shape, so a run cut short keeps what it measured.

FlagGems 5.0.2's wheel lacks utils/configs/general_ops_expand_configs.yaml, which its addmm,
bmm, baddbmm and mv modules read when imported with USE_FLAGTUNE=1 (the import fails without
it); `run` writes one config per op there if it is missing. Those ops are not measured here.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

EXPAND_IN_PACKAGE = Path("runtime/backend/_nvidia/hopper/mm_hopper_expand.yaml")
GENERAL_OPS_IN_PACKAGE = Path("utils/configs/general_ops_expand_configs.yaml")
# One config per op for the file the wheel lacks: (META names, key fields) per op.
_GENERAL_OPS = {"addmm": (("BLOCK_M", "BLOCK_N", "BLOCK_K"), ("M", "N", "K")),
                "baddbmm": (("BLOCK_M", "BLOCK_N", "BLOCK_K"), ("M", "N", "K")),
                "bmm": (("BLOCK_M", "BLOCK_N", "BLOCK_K"), ("M", "N", "K", "stride_am",
                                                           "stride_bk")),
                "mv": (("BLOCK_N", "BLOCK_M"), ("M", "N"))}
# shapes-dev rows of one Triton specialization (bf16, row-major operands, every size a
# multiple of 16), so that FlagGems compiles its product once and each key then pays its
# benchmarking: with its shipped 480-config file that compile alone takes minutes.
DEFAULT_ROWS = ("16x4096x4096 bf16 nn", "64x128256x4096 bf16 nn", "128x14336x4096 bf16 nn",
                "2048x4096x14336 bf16 nn", "4096x4096x4096 bf16 nn", "8192x8192x8192 bf16 nn")


class _Stopped(Exception):
    """SIGTERM (a `timeout` ran out) during a first call: its time so far is a lower bound."""


def _stop(signum, frame):
    raise _Stopped


def _installed_expand_file() -> Path:
    """FlagGems' own expand YAML, found without importing flag_gems (importing reads it)."""
    spec = importlib.util.find_spec("flag_gems")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("flaggems_expand: flag_gems is not installed")
    return Path(spec.submodule_search_locations[0]) / EXPAND_IN_PACKAGE


def _general_ops_file() -> str:
    """The YAML text of one config per op of _GENERAL_OPS (FlagGems' expand schema)."""
    import yaml

    doc = {}
    for op, (meta, key) in _GENERAL_OPS.items():
        space = {"param_map": {"META": {m: m.lower() for m in meta}, "num_stages": "stages",
                               "num_warps": "warps"},
                 **{m.lower(): [64 if m != "BLOCK_K" else 32] for m in meta},
                 "stages": [2], "warps": [4]}
        doc[op] = [space, {"strategy": {k: "align32" for k in key}}]
    return yaml.safe_dump(doc)


def _install(expand: Path | None) -> Path:
    """Put `expand` (None: the shipped file) where FlagGems reads it; return that path."""
    target = _installed_expand_file()
    general = target.parents[len(EXPAND_IN_PACKAGE.parts) - 1] / GENERAL_OPS_IN_PACKAGE
    if not general.exists():
        general.parent.mkdir(parents=True, exist_ok=True)
        general.write_text(_general_ops_file())
    shipped = target.with_suffix(".shipped.yaml")
    if not shipped.exists():
        shutil.copyfile(target, shipped)
    shutil.copyfile(expand or shipped, target)
    return target


def _config_counts(flag_gems_runtime, path: Path) -> dict[str, int]:
    """How many configs FlagGems' ConfigLoader builds from the file, per op it reads."""
    counts = {}
    for op in ("mm_general_tma", "gemv"):
        try:
            counts[op] = len(flag_gems_runtime.ops_get_configs(op, pre_hook=None,
                                                               yaml_path=str(path)))
        except Exception as error:  # an op the file lacks: FlagGems falls back to its own
            counts[op] = f"unread ({type(error).__name__})"
    return counts


def run(args) -> None:
    fresh = Path(tempfile.mkdtemp(prefix="flaggems-expand-"))
    os.environ.update(USE_FLAGTUNE="1", FLAGGEMS_CACHE_DIR=str(fresh / "flaggems"),
                      TRITON_CACHE_DIR=str(fresh / "triton"))
    if args.table:
        os.environ["TUNE_CONFIG"] = str(Path(args.table).resolve())
    path = _install(Path(args.expand).resolve() if args.expand else None)

    import flag_gems
    import torch
    import triton
    from flag_gems import runtime as flag_gems_runtime

    from tuner.shapes import load_shapes

    sys.path.insert(0, str(Path(__file__).parent))
    shapes = {str(s): s for s in load_shapes(args.shapes)}
    rows = [shapes[label] for label in args.rows]
    result = {"label": args.label, "device": torch.cuda.get_device_name(),
              "torch": torch.__version__, "triton": triton.__version__,
              "flag_gems": getattr(flag_gems, "__version__", "?"),
              "expand": args.expand or "FlagGems' shipped mm_hopper_expand.yaml",
              "config_counts": _config_counts(flag_gems_runtime, path), "shapes": []}
    print(json.dumps({k: v for k, v in result.items() if k != "shapes"}), flush=True)
    signal.signal(signal.SIGTERM, _stop)
    for shape in rows:
        try:
            result["shapes"].append(_shape_row(shape, args.table is not None))
        except _Stopped as stopped:
            result["shapes"].append({"shape": str(shape),
                                     "first_call_s_at_least": stopped.args[0]})
            Path(args.output).write_text(json.dumps(result, indent=1))
            raise SystemExit(f"stopped during the first call of {shape}") from None
        Path(args.output).write_text(json.dumps(result, indent=1))
        print(json.dumps(result["shapes"][-1]), flush=True)


def _shape_row(shape, with_tuner: bool) -> dict:
    """One shape: FlagGems' first call and steady state, cuBLAS's, and the tuner's."""
    import flag_gems
    import torch
    import triton
    from _as_called import user_calls

    from tuner.execution.measure import random_gemm, reference, relative_error

    gemm = random_gemm(shape, "cuda", seed=0)
    expected = reference(gemm)
    operands, torch_op, tuner_op = user_calls(shape.layout, False)
    call_args = operands(gemm)
    with flag_gems.use_gems():
        torch.cuda.synchronize()
        start = time.perf_counter()
        try:
            out = torch.mm(gemm.a, gemm.b)
            torch.cuda.synchronize()
        except _Stopped:
            raise _Stopped(time.perf_counter() - start) from None
        first_s = time.perf_counter() - start
        flag_ms = triton.testing.do_bench(lambda: torch.mm(gemm.a, gemm.b))
    row = {"shape": str(shape), "first_call_s": first_s,
           "rel_error": relative_error(out, expected),
           "flag_gems_tflops": shape.flops / flag_ms / 1e9,
           "cublas_tflops": shape.flops / triton.testing.do_bench(
               lambda: torch_op(*call_args)) / 1e9}
    if with_tuner:
        tuner_op(*call_args)  # the key's first call: compile and recording, not timed
        row["tuner_rel_error"] = relative_error(tuner_op(*call_args), expected)
        row["tuner_tflops"] = shape.flops / triton.testing.do_bench(
            lambda: tuner_op(*call_args)) / 1e9
    return row


def _geomean(values) -> float:
    values = list(values)
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else math.nan


def report(args) -> None:
    ours, default = (json.loads(Path(p).read_text()) for p in (args.ours, args.default))
    by_shape = {row["shape"]: row for row in default["shapes"]}
    cut = [row for row in default["shapes"] if "first_call_s_at_least" in row]
    cut_line = "".join(f" {row['shape']}: the default file's first call was stopped after "
                       f"{row['first_call_s_at_least']:.0f} s (a lower bound)." for row in cut)
    lines = [f"# FlagGems consuming our bounded expand file vs its shipped one — "
             f"{ours['device']}, torch {ours['torch']}, triton {ours['triton']}, "
             f"flag_gems {ours['flag_gems']}", "",
             f"ours: {ours['expand']}; FlagGems' loader builds {ours['config_counts']}. "
             f"default: {default['expand']}; {default['config_counts']}.", "",
             "First call: wall seconds of FlagGems' first `torch.mm` of the key under "
             "`use_gems()` with USE_FLAGTUNE=1 and empty Triton and FlagGems caches (its "
             "runtime tuning: every config compiled and timed). Steady state: "
             "triton.testing.do_bench, TFLOP/s. tuner: `tuner.matmul` / `tuner.linear` with "
             "the exported table, as a user calls it.", "",
             "| shape | first call s ours | first call s default | FlagGems TFLOP/s ours | "
             "FlagGems TFLOP/s default | ours / default | cuBLAS TFLOP/s | tuner TFLOP/s | "
             "rel. error ours / default |", "|---|---|---|---|---|---|---|---|---|"]
    first_ratios, speed_ratios = [], []
    for row in ours["shapes"]:
        other = by_shape.get(row["shape"])
        if other is None or "first_call_s" not in other or "first_call_s" not in row:
            continue
        first_ratios.append(other["first_call_s"] / row["first_call_s"])
        speed_ratios.append(row["flag_gems_tflops"] / other["flag_gems_tflops"])
        lines.append(
            f"| {row['shape']} | {row['first_call_s']:.2f} | {other['first_call_s']:.2f} | "
            f"{row['flag_gems_tflops']:.1f} | {other['flag_gems_tflops']:.1f} | "
            f"{speed_ratios[-1]:.3f} | {row['cublas_tflops']:.1f} | "
            f"{row.get('tuner_tflops', math.nan):.1f} | "
            f"{row['rel_error']:.1e} / {other['rel_error']:.1e} |")
    lines += ["", f"first call default/ours: geomean {_geomean(first_ratios):.1f}x, min "
              f"{min(first_ratios, default=math.nan):.1f}x over {len(first_ratios)} shapes",
              f"steady state ours/default: geomean {_geomean(speed_ratios):.3f}, min "
              f"{min(speed_ratios, default=math.nan):.3f} over {len(speed_ratios)} shapes"]
    if cut_line:
        lines.insert(-2, cut_line.strip())
    text = "\n".join(lines) + "\n"
    Path(args.output).write_text(text) if args.output else None
    print(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser("run", help="time FlagGems with one expand file")
    run_parser.add_argument("--expand", help="the expand YAML to install (default: FlagGems')")
    run_parser.add_argument("--label", required=True)
    run_parser.add_argument("--shapes", default=str(Path(__file__).parent
                                                    / "shapes/shapes-dev.csv"))
    run_parser.add_argument("--rows", nargs="+", default=list(DEFAULT_ROWS),
                            help="shape labels of the CSV, as `16x4096x4096 bf16 nn`")
    run_parser.add_argument("--table", help="our exported table: also time tuner's call")
    run_parser.add_argument("-o", "--output", required=True)
    run_parser.set_defaults(handler=run)
    report_parser = commands.add_parser("report", help="the side-by-side table")
    report_parser.add_argument("ours")
    report_parser.add_argument("default")
    report_parser.add_argument("-o", "--output")
    report_parser.set_defaults(handler=report)
    args = parser.parse_args()
    args.handler(args)


if __name__ == "__main__":
    main()
