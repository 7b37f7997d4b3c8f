"""Configs every new study tries first: the nearest tuned keys' winners, then the model's.

Tuning a shape next to known ones should converge in a few trials, because neighbouring
shapes (4096×4096×4096 and 4096×6144×4096) tend to share their best tiles. So a new study
enqueues (Optuna's enqueue_trial) the winning configs of the nearest tuned keys on the same
device, with the same kernel source and dtype, nearest first by distance in log M, N, K.
Only configs the study's space holds are kept: a winner from another space may have values
this one does not search. After them come the analytical model's top configs for the shape
(tuner.model.predict), so even the first shape ever tuned starts from plausible tiles rather than
from the sampler's random start-up trials. Before all of them comes each library variant the
space holds (cuBLAS): one config, the baseline every answer must beat, always measured.
"""
from __future__ import annotations

import math
import os
import threading
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

from tuner.db.models import Device, KernelVersion, Winner
from tuner.db.store import Store
from tuner.execution.executor import COMPILE_NICENESS
from tuner.execution.workers import TaskFailed, Worker, WorkerLost
from tuner.search.stopping import ModelBound, WarmConfirmation
from tuner.shapes import Shape
from tuner.space import SearchSpace, config_signature

NEAREST_WINNERS = 4  # how many neighbours' winners a study starts with
# How near (log2 distance over M, N, K) a tuned key must be for its winner to finish a study
# on its own (tuner.search.stopping's warm start confirmed): the next M of a doubling sweep,
# or a neighbour differing by up to 2x in one dimension.
NEAR_KEYS = 1.0
MODEL_TOP = 6  # how many of the model's picks follow them, each of another tile shape
RANKING_TIMEOUT_S = 600.0  # a ranking ahead taking longer is done again where it is asked
# Worker processes one ranking is split over: seconds of pure Python on one core, where the
# next study waits for it; a quarter of the cores (the compile workers share them), up to 4.
RANKING_PARTS = max(1, min(4, (os.cpu_count() or 1) // 4))


def tile_shape(config: Mapping) -> tuple:
    """What the model's picks must differ in: the variant and its output tile. The model's
    near-ties differ only in GROUP_M or stages, and measuring several of them teaches the
    sampler one thing; its errors are per tile shape (a 128×128 tile it ranks third may well
    beat the 128×256 it ranks first), so a warm start spans tile shapes."""
    return config["variant"], config.get("BLOCK_M"), config.get("BLOCK_N")


def log_distance(key: Mapping, shape: Shape) -> float:
    """How far a key (M, N, K) is from a shape: the distance between their log2 sizes."""
    return math.sqrt(sum(math.log2(max(key[f], 1) / max(getattr(shape, f), 1)) ** 2
                         for f in ("M", "N", "K")))


def in_space(config: Mapping, space: SearchSpace) -> bool:
    """True when the space can propose exactly this config."""
    names = space.variant_params.get(config.get("variant"))
    return (names is not None and set(config) == set(names)
            and all(config[n] in space.params[n] for n in names if n != "variant"))


def library_configs(kernel, space: SearchSpace) -> list[dict]:
    """The one config of each library variant (no parameters of its own) the space offers."""
    return [{"variant": v.name, "pad": 0} for v in kernel.variants
            if v.library_calls is not None and in_space({"variant": v.name, "pad": 0}, space)]


@dataclass(frozen=True)
class NearWinner:
    """A tuned key's winning config, the shape it won on and its device time there."""
    config: dict
    shape: Shape
    device_ms: float


def nearest_winners(store: Store, device: Device, kernel: KernelVersion, space: SearchSpace,
                    shape: Shape, count: int = NEAREST_WINNERS,
                    within: float = math.inf) -> list[NearWinner]:
    """The winners of the nearest tuned keys, nearest first, one per distinct config, at
    most `count`, of keys at most `within` away (log2 distance over M, N and K)."""
    candidates: list[tuple[float, Winner]] = [
        (log_distance(w.key, shape), w) for w in store.winners([device.id])
        if w.kernel.id == kernel.id and w.key["dtype"] == shape.dtype]
    near: list[NearWinner] = []
    for distance, winner in sorted(candidates, key=lambda pair: pair[0]):
        config = dict(winner.trial.params)
        if distance > within or len(near) == count:
            break
        if all(config != w.config for w in near) and in_space(config, space):
            near.append(NearWinner(config, winner.study.shape, winner.trial.p50_ms))
    return near


def nearest_winner_configs(store: Store, device: Device, kernel: KernelVersion,
                           space: SearchSpace, shape: Shape, count: int = NEAREST_WINNERS,
                           within: float = math.inf) -> list[dict]:
    """The configs of nearest_winners."""
    return [w.config for w in nearest_winners(store, device, kernel, space, shape, count,
                                              within)]


def warm_confirmation(near: list[NearWinner], shape: Shape, spec) -> WarmConfirmation:
    """The test a study starting from `near` ends by (tuner.search.stopping): how close to
    its key's roofline each ran there, and the roofline here."""
    from tuner.model.predict import roofline_ms

    return WarmConfirmation(
        {config_signature(w.config): roofline_ms(w.shape, spec) / w.device_ms for w in near},
        roofline_ms(shape, spec))


def model_configs(kernel, space: SearchSpace, shape: Shape, spec, smem_limit: int,
                  count: int = MODEL_TOP) -> list[dict]:
    """The model's best config of each of its `count` best tile shapes (none for variants it
    does not know). Scores the study's whole space, seconds for the built-in mm space: the
    pipeline asks for them through a ModelRanking, only for a study that starts."""
    return [config for _, config in _model_picks(kernel, space, shape, spec, smem_limit, count)]


def _model_picks(kernel, space: SearchSpace, shape: Shape, spec, smem_limit: int, count: int,
                 part: tuple[int, int] = (0, 1),
                 picks: list[tuple[int, dict]] | None = None) -> list[tuple[int, dict]]:
    """model_configs as (index in the study's space, config): of every part[1]-th config
    from the part[0]-th, or of the parts' `picks` merged (tuner.model.predict.rank_indexed)."""
    from tuner.kernels.calls import meta_gemm
    from tuner.model.predict import rank_indexed

    if picks is None:
        picks = space.for_call(meta_gemm(shape)).indexed_configs(part)
    return [(index, config) for _, index, config in rank_indexed(
        shape, picks, kernel, spec, smem_limit, k=count, distinct=tile_shape)]


def model_picks_task(kernel_name: str, space: SearchSpace, shape: Shape, spec,
                     smem_limit: int, count: int, part: tuple[int, int]
                     ) -> list[tuple[int, dict]]:
    """_model_picks of one part, in a ranking worker (ModelRanking)."""
    from tuner.kernels import KERNELS
    return _model_picks(KERNELS[kernel_name], space, shape, spec, smem_limit, count, part)


def model_bound(kernel, shape: Shape, spec, picks: list[dict]) -> ModelBound | None:
    """The model's bound for a study (tuner.search.stopping) from its ranked picks
    (model_configs: the first that is no library call is the model's fastest config of the
    space), or None where the model picked none."""
    from tuner.model.predict import predicted_or_inf

    library = kernel.library_variants
    tiles = [c for c in picks if not kernel.calls_library(c)]
    if not tiles:
        return None

    def predict(config) -> float:
        return predicted_or_inf(shape, config, spec)

    return ModelBound(predict, predict(tiles[0]), library)


class ModelRanking:
    """model_configs for one device, computed the first time a study asks and kept.

    Ranking costs seconds per shape, so `tune run` never ranks ahead of time: a key already
    tuned is skipped before anything asks, and a resumed run pays only for the studies it
    starts. The job may `prefetch` the next study's ranking while this one measures, so that
    the GPU does not wait for the model: in worker processes of its own (started with the
    first prefetch), since the ranking is seconds of pure Python that, on a thread of the
    job's process, would hold the interpreter's lock against the studies' steps. One shape
    is ranked at a time, split over `parts` workers (each ranks every parts-th config; their
    picks are merged here). The same (kernel, space, shape) asked again, by a retried or a
    second study of the key, gets the kept list. Safe to share between the device threads.
    """

    def __init__(self, spec, smem_limit: int, count: int = MODEL_TOP,
                 parts: int = RANKING_PARTS):
        self.spec, self.smem_limit, self.count = spec, smem_limit, count
        self._ranked: dict[tuple, Future] = {}
        self._lock = threading.Lock()
        # One thread ranks one shape at a time, through one thread per part.
        self._ahead = ThreadPoolExecutor(1, thread_name_prefix="model-ranking")
        self._parts = ThreadPoolExecutor(parts, thread_name_prefix="model-ranking-part")
        # As nice as the compile workers, for their reason: the device worker's host timings.
        self._workers = [Worker(f"model-ranking-{i}", preload=(__name__, "tuner.kernels"),
                                niceness=COMPILE_NICENESS) for i in range(parts)]

    def _rank_in_workers(self, kernel, space: SearchSpace, shape: Shape) -> list[dict]:
        parts = len(self._workers)
        calls = [self._parts.submit(worker.call, model_picks_task, kernel.name, space, shape,
                                    self.spec, self.smem_limit, self.count, (i, parts),
                                    timeout=RANKING_TIMEOUT_S)
                 for i, worker in enumerate(self._workers)]
        wait(calls)  # every part done before any fails this: close() may follow at once
        picks = [pick for call in calls for pick in call.result()]
        return [config for _, config in _model_picks(kernel, space, shape, self.spec,
                                                     self.smem_limit, self.count, picks=picks)]

    def _future(self, kernel, space: SearchSpace, shape: Shape, ahead: bool) -> Future:
        # The weight does not change the ranking; the rest of the shape and the space do.
        key = (kernel.name, kernel.source_hash, space.hash,
               shape.M, shape.N, shape.K, shape.dtype, shape.layout)
        with self._lock:
            kept = self._ranked.get(key)
            # Kept, unless a study asks for a ranking ahead still queued behind another
            # (one ranked for a study that then did without): cancelled, ranked here.
            if kept is not None and (ahead or not kept.cancel()):
                return kept
            if ahead:
                future = self._ahead.submit(self._rank_in_workers, kernel, space, shape)
            else:
                future = Future()
            self._ranked[key] = future
        if not ahead:  # ranked here, outside the lock: other keys need not wait for it
            self._rank_here(future, kernel, space, shape)
        return future

    def _rank_here(self, future: Future, kernel, space: SearchSpace, shape: Shape) -> None:
        try:
            future.set_result(model_configs(kernel, space, shape, self.spec,
                                            self.smem_limit, self.count))
        except BaseException as e:
            future.set_exception(e)

    def configs(self, kernel, space: SearchSpace, shape: Shape) -> list[dict]:
        """The model's picks for the shape: those ranked ahead (waited for where the workers
        rank them now), else ranked now; ranked here too where the ranking ahead failed (a
        worker lost; a bug fails here again, with its own traceback)."""
        try:
            picks = self._future(kernel, space, shape, ahead=False).result()
        except (TaskFailed, WorkerLost):
            picks = model_configs(kernel, space, shape, self.spec, self.smem_limit, self.count)
        return [dict(c) for c in picks]

    def prefetch(self, kernel, space: SearchSpace, shape: Shape) -> Future:
        """Start ranking a study that is to come, in the background: the future of its
        picks (raw: `configs` copies them), for what starts once they are known."""
        return self._future(kernel, space, shape, ahead=True)

    def _close_workers(self) -> None:
        for worker in self._workers:
            worker.close()
        self._parts.shutdown(wait=False)

    def close(self) -> None:
        """Stop ranking ahead: the rankings not started are cancelled, the one running is
        killed, and the workers are closed on the ranking thread, once the ranking running
        there has returned (closed here, a worker could be closed twice: here and by the
        call it killed)."""
        self._ahead.submit(self._close_workers)
        self._ahead.shutdown(wait=False, cancel_futures=False)
        with self._lock:
            for future in self._ranked.values():
                future.cancel()
        for worker in self._workers:
            worker.kill()

    def __len__(self) -> int:
        """How many rankings were asked for (what a resume should keep at its new studies)."""
        return len(self._ranked)


def merged(*sources: list[dict]) -> list[dict]:
    """The configs of every source in order, each once."""
    configs: list[dict] = []
    for source in sources:
        configs += [c for c in source if c not in configs]
    return configs
