"""Search strategies replayed on recorded timings: which one finds the best config soonest.

Measuring costs GPU time, so strategies are compared offline. A `Recording` holds, per shape,
the TFLOP/s of every feasible config of the shape's study space, measured once on a GPU
(`tune run --exhaustive`), with 0 for configs that failed. Replaying a strategy runs a real
Optuna study of it whose objective is a lookup in that table, with the tuner's own rules: the
same conditional space (SearchSpace.suggest), infeasible configs told as worth 0 without
counting, the same warm start from the analytical model, and the same number of configs in
flight (answered oldest first, as a steady stream of compiles would). The result of one
replay is its curve: the fraction of the shape's best TF/s found after each measured config.

A recording travels as gzipped JSON, small enough to commit, so a CI test can replay the
committed one without a GPU or a database.
"""
from __future__ import annotations

import gzip
import io
import json
import math
import random
import statistics
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import optuna
from optuna.trial import TrialState

from tuner.devices import DeviceInfo
from tuner.errors import UserError
from tuner.formats.files import write_bytes_atomic
from tuner.kernels import KERNELS, kernel_variants
from tuner.kernels.calls import meta_gemm
from tuner.objective import CallTime
from tuner.search.budget import (
    DEFAULT_PATIENCE,
    DEFAULT_POLISH,
    REFERENCE_PATIENCE,
    REFERENCE_POLISH,
)
from tuner.search.samplers import make_sampler
from tuner.search.stopping import descent_order, descent_start, search_stop
from tuner.search.study import ASKS_PER_TRIAL
from tuner.search.warmstart import library_configs, merged, model_bound
from tuner.shapes import Shape, checked_shape
from tuner.space import SearchSpace, config_signature, parse_space
from tuner.statuses import TrialStatus
from tuner.textfiles import clipped, parsed_yaml, quoted, read_user_file

# The largest recording read, packed or unpacked: one of a dozen shapes' exhaustive studies
# is under 1 MiB.
MAX_RECORDING_BYTES = 64 << 20


class ReplayError(UserError, ValueError):
    """A recording that cannot be read or replayed; the message names it."""


@dataclass(frozen=True)
class ShapeRecording:
    """Every feasible config of one study space on one shape, with its measured TFLOP/s."""
    shape: Shape
    kernel: str
    space: SearchSpace  # the study's own space (only the pads that change the shape)
    tflops: dict[tuple, float]  # config signature -> TF/s; 0 for a config that failed

    @property
    def best(self) -> float:
        return max(self.tflops.values())


@dataclass(frozen=True)
class Recording:
    device: DeviceInfo
    shapes: tuple[ShapeRecording, ...]

    def save(self, path: str | Path) -> None:
        doc = {"device": asdict(self.device), "shapes": [
            {"shape": [r.shape.M, r.shape.N, r.shape.K, r.shape.dtype, r.shape.layout],
             "kernel": r.kernel, "space": r.space.to_yaml(),
             "configs": [[dict(sig), tf] for sig, tf in r.tflops.items()]}
            for r in self.shapes]}
        write_bytes_atomic(path, gzip.compress(json.dumps(doc).encode(), mtime=0))

    @classmethod
    def load(cls, path: str | Path) -> Recording:
        """The recording at `path`; ReplayError naming the file and what is wrong where it is
        not one (a recording's gzip is read to at most MAX_RECORDING_BYTES, unpacked)."""
        try:
            data = read_user_file(path, "recording", MAX_RECORDING_BYTES, ReplayError)
            with gzip.GzipFile(fileobj=io.BytesIO(data)) as unpacked:
                text = unpacked.read(MAX_RECORDING_BYTES + 1)
        except (OSError, EOFError, zlib.error) as e:
            raise ReplayError(f"{path}: not a gemm-tuner recording ({clipped(str(e))})") from None
        if len(text) > MAX_RECORDING_BYTES:
            raise ReplayError(f"{path}: not a gemm-tuner recording (unpacks to more than "
                              f"{MAX_RECORDING_BYTES >> 20} MiB)")
        try:
            doc = json.loads(text)
            return cls(_device(doc["device"]), tuple(
                _shape_recording(r, f"{path}: shape {quoted(r.get('shape'))}")
                for r in doc["shapes"]))
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, KeyError, TypeError,
                AttributeError, ValueError) as e:
            if isinstance(e, UserError):
                raise
            problem = (f"no field {e}" if isinstance(e, KeyError)
                       else clipped(str(e) or type(e).__name__, 120))
            raise ReplayError(f"{path}: not a gemm-tuner recording ({problem})") from None


def _device(doc: dict) -> DeviceInfo:
    """The recording's device, each field of the type DeviceInfo holds."""
    device = DeviceInfo(**doc)
    for field in fields(DeviceInfo):
        value = getattr(device, field.name)
        expected = {"str": str, "int": int}.get(field.type, field.type)  # a string annotation
        if type(value) is not expected:
            raise TypeError(f"device {field.name} must be {expected.__name__}, got "
                            f"{quoted(value)}")
    return device


def _shape_recording(r: dict, source: str) -> ShapeRecording:
    """One shape's part of a recording, checked: a shape a model's GEMM can have, a kernel
    of this install, its study space, and per config a TF/s (>= 0; some > 0)."""
    if not isinstance(r["shape"], list) or len(r["shape"]) != 5:
        raise ValueError(f"shape must be [M, N, K, dtype, layout], got {quoted(r['shape'])}")
    shape = checked_shape(*r["shape"])
    if not isinstance(r["kernel"], str) or r["kernel"] not in KERNELS:
        raise ValueError(f"kernel {quoted(r['kernel'])} is not one of {', '.join(KERNELS)}")
    tflops = {}
    for config, value in r["configs"]:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not (
                math.isfinite(value) and value >= 0):
            raise ValueError(f"a config's TF/s must be a number >= 0, got {quoted(value)}")
        tflops[config_signature(config)] = value
    if not any(tflops.values()):
        raise ValueError(f"shape {shape}: no config measured")
    return ShapeRecording(shape, r["kernel"], _space(r["space"], source), tflops)


def _space(yaml_text: str, source: str) -> SearchSpace:
    """A study's space as a recording or the database stores it (SearchSpace.to_yaml)."""
    if not isinstance(yaml_text, str):
        raise ValueError(f"space must be YAML text, got {quoted(yaml_text)}")
    return parse_space(parsed_yaml(yaml_text, source, ReplayError), source, kernel_variants())


def recording_from_store(store, device) -> tuple[Recording, list[str]]:
    """The device's exhaustive studies as a recording, and a line per study left out because
    it did not measure every feasible config of its space."""
    shapes, skipped = [], []
    for study in store.finished_studies(device.id):
        shape = Shape(study.shape_M, study.shape_N, study.shape_K, study.dtype,
                      study.shape_layout)
        kernel, gemm = KERNELS[study.kernel.name], meta_gemm(shape)
        space = _space(study.space.yaml, f"study {study.id}").for_call(gemm)
        measured = {config_signature(t.params): (t.tflops if t.status == TrialStatus.OK else 0.0)
                    for t in study.trials if t.status != TrialStatus.INFEASIBLE}
        feasible = len(kernel.feasible_configs(space, gemm, device.smem_per_block))
        if len(measured) < feasible or not any(measured.values()):
            skipped.append(f"{shape}: {len(measured)} of {feasible} feasible configs measured")
            continue
        shapes.append(ShapeRecording(shape, kernel.name, space, measured))
    info = DeviceInfo(**{f.name: getattr(device, f.name) for f in fields(DeviceInfo)})
    return Recording(info, tuple(shapes)), skipped


# -- strategies ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Strategy:
    """A sampler (tuner.search.samplers), or None for the model's ranking alone, and whether the
    study first tries the model's top configs (as `tune run` does); and how the study ends
    (tuner.search.stopping): its patience, its polish steps and the model's bound."""
    name: str
    sampler: str | None
    model_warm_start: bool
    patience: int | None = None
    polish: int = 0
    model_bound: bool = False


# `tune run`'s defaults, today's and those before issue 40 (its reference), replayed beside
# the bare strategies.
TUNE_RUN = Strategy("tune-run", "tpe", True, DEFAULT_PATIENCE, DEFAULT_POLISH, True)
TUNE_RUN_BEFORE = Strategy("tune-run-before", "tpe", True, REFERENCE_PATIENCE,
                           REFERENCE_POLISH, False)

STRATEGIES = {s.name: s for s in (
    Strategy("random", "random", False),
    Strategy("tpe", "tpe", False),
    Strategy("tpe-multivariate", "tpe-multivariate", False),
    Strategy("gp", "gp", False),
    Strategy("model", None, True),
    Strategy("model+tpe", "tpe", True),
    Strategy("model+tpe-multivariate", "tpe-multivariate", True),
    Strategy("model+gp", "gp", True),
    TUNE_RUN,
    TUNE_RUN_BEFORE,
)}


def model_ranking(recording: ShapeRecording, device: DeviceInfo, k: int) -> list[dict]:
    """The analytical model's k best configs of the recorded space, best first."""
    from tuner.model.predict import device_spec, rank_configs

    return [config for _, config in rank_configs(
        recording.shape, recording.space, KERNELS[recording.kernel], device_spec(device),
        device.smem_per_block, k=k)]


def replay(recording: ShapeRecording, strategy: Strategy, seed: int, trials: int,
           in_flight: int, warm_start: Sequence[dict] = (),
           device: DeviceInfo | None = None, noise: float = 0.0) -> list[float]:
    """Fraction of the recording's best found after each measured config: up to `trials`
    from the sampler, fewer where the strategy's stopping rules end it sooner, then its
    polish steps.

    `warm_start` holds the configs a study tries first (the model's picks); a model-only
    strategy measures them alone, in order. A study first measures the library calls
    (cuBLAS) the recording holds, as `tune run` does; `device` (the recording's) gives the
    model's bound its spec. `noise` is the relative spread of a measurement (`Noise`): the
    study sees noisy times, the curve the recorded ones of the configs it measured.
    """
    if strategy.sampler is None:
        values = [recording.tflops[config_signature(c)] for c in warm_start[:trials]]
        return _fractions(values, recording.best)
    study = optuna.create_study(direction="maximize",
                                sampler=make_sampler(strategy.sampler, seed))
    kernel = KERNELS[recording.kernel]
    first = merged(library_configs(kernel, recording.space),
                   list(warm_start) if strategy.model_warm_start else [])
    for config in first:
        study.enqueue_trial(config, skip_if_exists=False)
    bound = None
    if strategy.model_bound and device is not None:
        from tuner.model.predict import device_spec
        bound = model_bound(kernel, recording.shape, device_spec(device), list(warm_start))
    seen = Noise(recording, noise, seed)
    flying: deque[tuple[optuna.trial.Trial, tuple]] = deque()
    warm = {config_signature(c) for c in first}
    unasked = set(warm)
    asks = 0

    def opening() -> bool:
        """The warm start is asked and still partly in flight: the sampler waits for it."""
        return not unasked and any(s in warm for _, s in flying)

    def stop():
        return search_stop(seen.calls, seen.device_ms(), strategy.patience, bound)

    while len(seen.order) < trials:
        while (len(flying) < in_flight and len(seen.order) + len(flying) < trials
               and asks < trials * ASKS_PER_TRIAL and stop() is None
               and not (strategy.model_bound and opening())):
            trial = study.ask()
            asks += 1
            signature = config_signature(recording.space.suggest(trial))
            unasked.discard(signature)
            if signature in seen.tflops:
                study.tell(trial, seen.tflops[signature])
            elif any(signature == s for _, s in flying):
                study.tell(trial, state=TrialState.FAIL)
            elif signature not in recording.tflops:  # infeasible: worth nothing, costs nothing
                study.tell(trial, 0.0)
            else:
                flying.append((trial, signature))
        if not flying or ((why := stop()) is not None
                          and (why.drops_in_flight or strategy.model_bound)):
            break
        trial, signature = flying.popleft()
        study.tell(trial, seen.measure(signature))
    _polish(recording, seen, strategy.polish, bound.predict if bound else None)
    return _fractions([recording.tflops[s] for s in seen.order], recording.best)


class Noise:
    """What a replayed study sees of the recording: each measured config's recorded TF/s
    off by a seeded log-normal factor of relative spread `spread`, and that spread in its
    p20-p80 as an honest timing reports it (none at 0: the recorded medians are taken as
    exact, and the stopping rules' noise floor applies)."""

    Z80 = 0.8416  # the standard normal's 80th percentile

    def __init__(self, recording: ShapeRecording, spread: float, seed: int):
        self.recording, self.spread = recording, spread
        self.random = random.Random(seed)
        self.tflops: dict[tuple, float] = {}  # as seen, per config measured
        self.order: list[tuple] = []  # the configs measured, in order
        self.calls: list[CallTime | None] = []  # as `tuner.search.stopping.stalled` takes them

    def measure(self, signature: tuple) -> float:
        """The TF/s the study sees of one more config (0: it failed)."""
        value = self.recording.tflops[signature]
        if value > 0 and self.spread:
            value *= math.exp(self.random.gauss(0.0, self.spread))
        self.tflops[signature] = value
        self.order.append(signature)
        ms = self.recording.shape.flops / value / 1e9 if value > 0 else None
        side = math.exp(self.Z80 * self.spread)
        self.calls.append(None if ms is None else CallTime(ms / side, ms, ms * side))
        return value

    def device_ms(self) -> list[tuple[dict, float]]:
        """(config, device ms) of the configs that ran, for the model's bound."""
        return [(dict(sig), call.p50_ms) for sig, call in zip(self.order, self.calls) if call]


def _polish(recording: ShapeRecording, seen: Noise, polish: int,
            predict: Callable[[Mapping], float] | None) -> None:
    """The polish steps of a study (tuner.search.study): rounds of the unmeasured neighbours
    of the config the descent starts from (as seen), in the descent's order, while it moves
    and steps are left."""
    library = KERNELS[recording.kernel].library_variants
    done = 0
    while done < polish:
        by_time = sorted(((dict(s), 1.0 / v) for s, v in seen.tflops.items() if v > 0),
                         key=lambda pair: pair[1])
        if not by_time:
            break
        start = descent_start(by_time, library)
        steps = map(config_signature, descent_order(recording.space.neighbours(start), predict))
        steps = [s for s in steps if s in recording.tflops and s not in seen.tflops]
        if not steps:
            break
        for signature in steps[:polish - done]:
            seen.measure(signature)
            done += 1


def _fractions(values: Iterable[float], best: float) -> list[float]:
    found, curve = 0.0, []
    for value in values:
        found = max(found, value)
        curve.append(found / best)
    return curve


def median_curve(curves: Sequence[Sequence[float]], trials: int) -> list[float]:
    """Per trial count 1..trials, the median over runs of the fraction found by then (a run
    that stopped early, having measured its whole space, keeps its last value)."""
    return [statistics.median(c[min(n, len(c)) - 1] for c in curves)
            for n in range(1, trials + 1)]


# -- comparing strategies --------------------------------------------------------------------
def _replay_task(args) -> tuple[str, list[float]]:
    recording, strategy, seed, trials, in_flight, picks, device, noise = args
    return strategy.name, replay(recording, strategy, seed, trials, in_flight, picks, device,
                                 noise)


def compare(recording: Recording, strategies: Sequence[Strategy], seeds: int, trials: int,
            in_flight: int, jobs: int, noise: float = 0.0) -> dict[str, list[list[float]]]:
    """Per strategy, the curves of every (shape, seed) replay: a model-only strategy is
    deterministic and replays once per shape, measuring the model's ranking in order; a
    sampler after the model's warm start first measures what `tune run` enqueues (the best of
    the model's top tile shapes), seeing each measure with `noise` (replay). Replays run in
    `jobs` processes."""
    from concurrent.futures import ProcessPoolExecutor

    from tuner.model.predict import device_spec
    from tuner.search.warmstart import model_configs

    spec = device_spec(recording.device)
    tasks = []
    for r in recording.shapes:
        ranking = model_ranking(r, recording.device, k=trials)
        warm_start = model_configs(KERNELS[r.kernel], r.space, r.shape, spec,
                                   recording.device.smem_per_block)
        tasks += [(r, s, seed, trials, in_flight, ranking if s.sampler is None else warm_start,
                   recording.device, noise)
                  for s in strategies for seed in range(seeds if s.sampler else 1)]
    curves: dict[str, list[list[float]]] = {s.name: [] for s in strategies}
    with ProcessPoolExecutor(max(1, jobs)) as pool:
        for name, curve in pool.map(_replay_task, tasks, chunksize=4):
            curves[name].append(curve)
    return curves


def with_library(recording: ShapeRecording, ratio: float) -> ShapeRecording:
    """The recording with each library variant of its kernel (cuBLAS) added to its space,
    measured at `ratio` times the recorded best TF/s: what the search does where cuBLAS wins
    (ratio > 1) or loses, for recordings taken without it."""
    kernel = KERNELS[recording.kernel]
    space, tflops = recording.space, dict(recording.tflops)
    for name in sorted(kernel.library_variants - set(space.variant_params)):
        space = replace(space, params={**space.params,
                                       "variant": (*space.params["variant"], name)},
                        variant_params={**space.variant_params, name: ("variant", "pad")})
        tflops[config_signature({"variant": name, "pad": 0})] = recording.best * ratio
    return ShapeRecording(recording.shape, recording.kernel, space, tflops)
