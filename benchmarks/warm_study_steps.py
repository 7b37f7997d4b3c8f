"""Seconds of each device step a warm study takes (issue 40: warm studies in under a second).

    python benchmarks/warm_study_steps.py [--backend gpu] ["96x6144x4096 bf16 nt" ...]

A warm study (a near key's winner confirmed) asks its device worker for: the shape's inputs
and float64 reference with its first trial (the cuBLAS config, measured in full), the near
winner's trial (a short measure, then the full one), and, where the finalists' trials leave
the winner open, a side-by-side re-timing; before issue 40's cuts, also a separate cuBLAS
baseline. Each is timed here on its own, through the executor `tune run` uses, with the
cuBLAS config standing in for every config, so that the steps' share of a study's wall (and
what is left for the database and the compile pool) can be read off. Then what a tile (the
model's top config for the shape) costs beyond cuBLAS: its compile, then the same from
Triton's cache in a worker process that never compiled and again in that one, and its
first trial in the device worker (Triton loading the kernel), then a second.
`benchmarks/tune_speed.py` prints the phases of real warm studies.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CUBLAS = {"variant": "cublas", "pad": 0}
DEFAULT_SHAPES = ("96x6144x4096 bf16 nt", "400x4096x14336 bf16 nt", "16x4096x4096 bf16 nt")


def clocked(label: str, step, *args, **kwargs) -> None:
    """Print how long step(*args, **kwargs) took."""
    start = time.perf_counter()
    step(*args, **kwargs)
    print(f"  {label:40s} {time.perf_counter() - start:6.3f} s")


def model_tile(executor, shape) -> dict:
    """The model's top Triton config for the shape in the built-in space."""
    from tuner.kernels import KERNELS
    from tuner.model.predict import device_spec
    from tuner.search.warmstart import model_configs
    from tuner.tuning import load_spaces

    info, kernel = executor.device_info(), KERNELS["mm"]
    picks = model_configs(kernel, load_spaces()["mm"], shape, device_spec(info),
                          info.smem_per_block)
    return next(c for c in picks if not kernel.calls_library(c))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shapes", nargs="*", default=DEFAULT_SHAPES)
    parser.add_argument("--backend", choices=("gpu", "interpret"), default="gpu")
    args = parser.parse_args()

    from tuner.execution.measure import compile_task
    from tuner.execution.workers import Worker
    from tuner.shapes import Shape
    from tuner.tuning import Workers

    workers = Workers(args.backend, 2, 120.0, (0,) if args.backend == "gpu" else None)
    executor = workers.executor(workers.check())
    try:
        shapes = [Shape.from_label(label) for label in args.shapes]
        executor.measure(0, shapes[0], 1, "mm", CUBLAS)  # the worker's one-time start-up
        for shape in shapes:
            print(shape)
            clocked("compile (a compile worker's round trip)",
                    lambda *task: executor.submit_compile(*task).result(), shape, "mm", CUBLAS)
            on_shape = (0, shape, 0)  # slot, shape, seed
            clocked("first trial (inputs, reference, full)", executor.measure, *on_shape,
                    "mm", CUBLAS)
            clocked("a trial (full measures)", executor.measure, *on_shape, "mm", CUBLAS)
            clocked("a short measure", executor.measure, *on_shape, "mm", CUBLAS, short=True)
            clocked("separate baseline (no longer taken)", executor.baseline, *on_shape)
            for launch in ("eager", "graph"):
                clocked(f"re-timing 2 finalists, {launch}", executor.retime, *on_shape, "mm",
                        [CUBLAS, CUBLAS], launch)
            tile = model_tile(executor, shape)
            clocked("tile compile (into the cache)",
                    lambda *task: executor.submit_compile(*task).result(), shape, "mm", tile)
            fresh = Worker("fresh-compile", {"CUDA_VISIBLE_DEVICES": "0"},
                           preload=("tuner.execution.measure",))
            fresh.call(os.getpid, timeout=300)  # started, its imports done
            for worker in ("a fresh", "the same"):
                clocked(f"tile from the cache, {worker} worker", fresh.call, compile_task,
                        shape, "mm", tile, timeout=300)
            fresh.close()
            clocked("tile's first trial (kernel load, full)", executor.measure, *on_shape,
                    "mm", tile)
            clocked("tile's next trial (full measures)", executor.measure, *on_shape, "mm",
                    tile)
    finally:
        executor.close()


if __name__ == "__main__":
    main()
