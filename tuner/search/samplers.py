"""The search strategies a study can use, by name: an Optuna sampler built fresh per study.

Every parameter of our spaces is categorical and most depend on the variant drawn first, so
only samplers that handle categorical, conditional spaces are offered:
- `tpe`: independent TPE per parameter with the constant liar, so that configs in flight
  together spread out (the default);
- `tpe-multivariate`: TPE over the joint distribution (`multivariate`, with `group` to split
  the conditional space into its variants);
- `gp`: Optuna's Gaussian-process sampler;
- `random`: the baseline every other strategy must beat.
CMA-ES is left out: it models only numeric parameters, so on these spaces Optuna's
CmaEsSampler would draw every parameter from its random fallback, i.e. `random`.
`tune replay` compares them on recorded timings (tuner.search.replay).
"""
from __future__ import annotations

import warnings
from collections.abc import Callable

import optuna
from optuna.samplers import BaseSampler, GPSampler, RandomSampler, TPESampler


def _tpe(seed: int) -> BaseSampler:
    return TPESampler(seed=seed, constant_liar=True)


def _tpe_multivariate(seed: int) -> BaseSampler:
    with warnings.catch_warnings():  # multivariate and group are "experimental" in Optuna
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return TPESampler(seed=seed, constant_liar=True, multivariate=True, group=True)


def _gp(seed: int) -> BaseSampler:
    # Conditional parameters fall back to independent sampling: expected here, not news.
    return GPSampler(seed=seed, warn_independent_sampling=False)


def _random(seed: int) -> BaseSampler:
    return RandomSampler(seed=seed)


SAMPLERS: dict[str, Callable[[int], BaseSampler]] = {
    "tpe": _tpe, "tpe-multivariate": _tpe_multivariate, "gp": _gp, "random": _random}


def make_sampler(name: str, seed: int) -> BaseSampler:
    """A new sampler of the named strategy, seeded; ValueError names the choices."""
    try:
        return SAMPLERS[name](seed)
    except KeyError:
        raise ValueError(f"unknown sampler {name!r}: choose from "
                         f"{', '.join(SAMPLERS)}") from None
