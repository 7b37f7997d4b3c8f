"""The next studies' first configs, compiled while this study measures.

Each study's first configs (tuner.search.warmstart) would start compiling only when it
opens, and the device would wait for the compile pool at every study's start. So once the
job knows a study to come and its first configs, it compiles a few of them ahead, on compile
workers the running studies leave idle (tuner.execution.executor.IdleWorkers). That only
warms Triton's on-disk cache: the study still compiles every config it measures, then a
cache hit, so a compile ahead that failed, was cancelled or lost its worker changes nothing.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future

from tuner.execution.executor import Executor
from tuner.kernels.calls import meta_gemm
from tuner.search.planning import KeyPlan
from tuner.space import SearchSpace, config_signature

# How many of a study's first configs are compiled ahead: what a warm study measures (its
# near keys' winners) or the head of a cold one's, while the pool is left to the rest.
AHEAD_CONFIGS = 4


class CompilesAhead:
    """Compiles ahead for the studies to come, at most AHEAD_CONFIGS per key, each config
    once; cancelled by `close` (the job's end). Safe to share between the device threads
    and the ranking's callbacks."""

    def __init__(self, executor: Executor, smem_limit: int):
        self.executor, self.smem_limit = executor, smem_limit
        self._started: dict[str, set[tuple]] = {}  # per plan label, the configs submitted
        self._futures: list[Future] = []
        self._closed = False
        self._lock = threading.Lock()

    def compile(self, plan: KeyPlan, kernel, space: SearchSpace, configs: list[dict]) -> None:
        """Compile the first of `configs` the plan's study could measure (no library call,
        held by its space for the shape, feasible there), within the key's AHEAD_CONFIGS.
        Nothing on the interpreter, which compiles nothing."""
        if self.executor.options.backend != "gpu":
            return
        gemm = meta_gemm(plan.shape)
        study_space = space.for_call(gemm)
        with self._lock:
            started = self._started.setdefault(plan.label, set())
            for config in configs:
                signature = config_signature(config)
                if self._closed or len(started) >= AHEAD_CONFIGS:
                    return
                if (signature in started or kernel.calls_library(config)
                        or not study_space.holds(config)
                        or kernel.feasible(config, gemm, self.smem_limit) is not None):
                    continue
                started.add(signature)
                self._futures = [f for f in self._futures if not f.done()]
                self._futures.append(self.executor.submit_compile(plan.shape, kernel.name,
                                                                  config, ahead=True))

    def compile_ranked(self, plan: KeyPlan, kernel, space: SearchSpace,
                       ranking: Future) -> None:
        """Compile the model's picks for the plan once `ranking` (ModelRanking.prefetch)
        has them, without waiting for it here; nothing where it failed."""
        def ranked(future: Future) -> None:
            if not future.cancelled() and future.exception() is None:
                self.compile(plan, kernel, space, future.result())
        ranking.add_done_callback(ranked)

    def close(self) -> None:
        """Cancel the compiles ahead not started; start no more."""
        with self._lock:
            self._closed = True
            for future in self._futures:
                future.cancel()
            self._futures.clear()
