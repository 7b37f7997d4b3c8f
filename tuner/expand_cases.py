"""What each tuned shape measured, as the cases an expand narrowing weighs (tuner.expand).

A `Tuned` is one tuned shape: its own winner and that winner's kernel time, and every other
config of the same expand op it was timed with (its study's trials, `tune buckets`' cross
timings, or a table entry's alternates). `case_for` makes the narrowing's `Case` of it: a
config's time is the measured one where there is one, else the analytical model's prediction
(tuner.model.predict.predict_ms) scaled by the shape's measured winner over the model's
prediction for that winner, and never below the winner's own time (its study found nothing
faster; the model is trusted for how much slower a config is, not for beating a
measurement): no GPU timing here. A config the kernel's feasibility check
refuses for the shape (shared memory, registers) never answers it.

Times are kernel (device) times, p50_ms: what FlagGems' autotuner compares configs by.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tuner.expand import Case
from tuner.shapes import Shape

MODEL_NOTE = ("times a tuned shape has no measurement of are the analytical model's "
              "(tuner.model.predict.predict_ms) scaled to that shape's measured winner, and "
              "never below it")


@dataclass(frozen=True)
class Tuned:
    shape: Shape
    kernel: str  # the kernel the winner's study tuned (tuner.kernels.KERNELS)
    winner: dict  # the full config: variant, pad and the variant's parameters
    winner_ms: float
    measured: tuple = ()  # (config, ms) of other configs of the same op on this shape
    weight: float = 1.0


def projected(params: Sequence[str], config: Mapping) -> tuple:
    """A config's values in `params` order, None for a parameter it has not."""
    return tuple(config.get(p) for p in params)


def case_for(params: Sequence[str], tuned: Tuned, spec) -> Case:
    """The narrowing's case of a tuned shape, its times measured or model-filled (spec: the
    tuner.model.predict.DeviceSpec of the device it was tuned on)."""
    from tuner.model.predict import predicted_or_inf

    params = tuple(params)
    own = tuple(p in tuned.winner for p in params)

    def key(values: tuple) -> tuple:  # the parameters the winner's variant has not are free
        return tuple(v if mine else None for v, mine in zip(values, own))

    measured: dict[tuple, float] = {}
    for config, ms in tuned.measured:
        if ms and ms > 0:  # the op's variants alike: FlagGems runs its own path for them
            k = key(projected(params, config))
            measured[k] = min(measured.get(k, math.inf), ms)
    winner = projected(params, tuned.winner)
    measured[key(winner)] = tuned.winner_ms
    predicted_winner = predicted_or_inf(tuned.shape, tuned.winner, spec)
    scale = (tuned.winner_ms / predicted_winner
             if 0 < predicted_winner < math.inf else None)
    feasible = _feasibility(tuned, spec)

    def time(values: tuple) -> float:
        k = key(values)
        if k in measured:
            return measured[k]
        if scale is None:
            return math.inf
        config = {**tuned.winner, **{p: v for p, v, mine in zip(params, values, own) if mine}}
        if not feasible(config):
            return math.inf
        # never faster than the winner: the shape's study measured that as the best it found
        return max(predicted_or_inf(tuned.shape, config, spec) * scale, tuned.winner_ms)

    return Case(str(tuned.shape), winner, tuned.winner_ms, time, tuned.weight,
                lambda values: key(values) in measured)


def _feasibility(tuned: Tuned, spec):
    """config -> whether the tuned kernel may run it on the shape (always, for a kernel not
    registered here)."""
    from tuner.kernels import KERNELS

    kernel = KERNELS.get(tuned.kernel)
    if kernel is None:
        return lambda config: True
    from tuner.kernels.calls import meta_gemm

    gemm = meta_gemm(tuned.shape)
    return lambda config: kernel.feasible(config, gemm, spec.smem_per_block) is None


def device_spec_of(device: Mapping):
    """The model's DeviceSpec for an export's device block (tuner.export.device_block, or a
    table file's `device`)."""
    from tuner.devices import DeviceInfo
    from tuner.model.predict import device_spec

    return device_spec(DeviceInfo(
        str(device.get("name", "")), str(device.get("compute_capability", "none")),
        int(device.get("sm_count") or 0), int(device.get("smem_per_block") or 0),
        str(device.get("driver", "")), str(device.get("cuda", "")),
        str(device.get("torch", "")), str(device.get("triton", ""))))
