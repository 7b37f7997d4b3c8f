"""Search spaces: the candidate values of each kernel parameter, and how keys are bucketed.

One YAML file per kernel ships in search_spaces/; `--space FILE` swaps in a user's own. The
`variant` list names the kernel variants to search; every other list holds the integer values
of one parameter, and a config of a variant draws only the parameters that variant reads (a
conditional space: SPLIT_K exists only for splitk configs). A file that does not fit raises
`SpaceError` with one line naming the file, the field and what was expected, before anything
runs.
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from tuner.bucketing.strategies import (
    KEY_FIELDS,
    STRATEGY_FORMS,
    BucketingError,
    StrategyModuleError,
    strategy_function,
)
from tuner.errors import UserError
from tuner.textfiles import BoundedLoader, decoded, parsed_yaml, quoted, read_user_file

if TYPE_CHECKING:
    from tuner.kernels.base import Gemm


def __getattr__(name: str):
    # KERNEL_PARAMS ("variant", "pad": the parameters of every kernel) lives with the kernels
    # (tuner.kernels.base); imported on first use, so that importing this module imports no
    # torch or Triton (the runtime imports it).
    if name == "KERNEL_PARAMS":
        from tuner.kernels.base import KERNEL_PARAMS
        value = globals()[name] = KERNEL_PARAMS  # later lookups skip this hook
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class SpaceError(UserError, ValueError):
    """A search-space YAML that cannot be used."""


# The largest search-space file read: a hand-written file of a few lists is a few KiB.
MAX_SPACE_BYTES = 1 << 20
# The fields a search-space file holds.
SPACE_FIELDS = ("kernel", "params", "strategy")


def config_signature(params: Mapping) -> tuple:
    """A config as a hashable value, the same whatever order its parameters come in."""
    return tuple(sorted(params.items()))


@dataclass(frozen=True)
class SearchSpace:
    kernel: str
    params: dict[str, tuple]  # "variant": names; every other parameter: integers
    strategy: dict[str, str]
    source: str  # where it came from, for messages
    # Per searched variant, the parameters its configs hold, in search order ("variant" first).
    variant_params: dict[str, tuple[str, ...]]

    @property
    def hash(self) -> str:
        """Identifies the space by content (not comments or formatting): same hash, same search."""
        canon = json.dumps({"kernel": self.kernel, "params": self.params,
                            "strategy": self.strategy}, sort_keys=True)
        return hashlib.sha256(canon.encode()).hexdigest()[:16]

    @property
    def size(self) -> int:
        """How many distinct configs the space holds, summed over its variants."""
        return sum(math.prod(len(self.params[p]) for p in params if p != "variant")
                   for params in self.variant_params.values())

    def without(self, variants: frozenset[str]) -> SearchSpace:
        """This space less `variants` and the parameters only they read ($TUNE_EXCLUDE: a
        deployment that never launches a variant gains nothing from measuring it); itself
        when it searches none of them. SpaceError when nothing is left to search."""
        kept = tuple(v for v in self.params["variant"] if v not in variants)
        if kept == self.params["variant"]:
            return self
        dropped = ", ".join(v for v in self.params["variant"] if v in variants)
        if not kept:
            raise SpaceError(f"{self.source}: excluding {dropped} leaves kernel {self.kernel} "
                             "no variant to search")
        read = {v: self.variant_params[v] for v in kept}
        used = {p for ps in read.values() for p in ps}
        params = {name: kept if name == "variant" else values
                  for name, values in self.params.items() if name in used}
        return dataclasses.replace(self, params=params, variant_params=read,
                                   source=f"{self.source} less {dropped}")

    def neighbours(self, config: Mapping) -> list[dict]:
        """The configs one step from `config` along one of its parameters (that parameter's
        next smaller or larger value in this space), the variant and every other parameter
        kept: what a coordinate-descent step tries."""
        steps = []
        for name in self.variant_params[config["variant"]][1:]:
            values = sorted(self.params[name])
            if config[name] in values:
                i = values.index(config[name])
                steps += [{**config, name: values[j]} for j in (i - 1, i + 1)
                          if 0 <= j < len(values)]
        return steps

    def configs(self):
        """Every config of the space, variant by variant (`size` of them), in a fixed order."""
        return (config for _, config in self.indexed_configs())

    def indexed_configs(self, part: tuple[int, int] = (0, 1)):
        """(index in that order, config) of every part[1]-th config from the part[0]-th: a
        part of the space for one of several processes (the model's ranking), each config
        built only in its own part."""
        start, step = part
        rows = ((variant, names[1:], values) for variant, names in self.variant_params.items()
                for values in itertools.product(*(self.params[n] for n in names[1:])))
        for index, (variant, names, values) in itertools.islice(enumerate(rows), start, None,
                                                                step):
            yield index, {"variant": variant, **dict(zip(names, values))}

    def narrowed(self, **values: Sequence) -> SearchSpace:
        """This space with some parameters limited to the given values (a study's own view:
        e.g. only the pads that change its shape), in the space's order."""
        params = dict(self.params)
        for name, keep in values.items():
            params[name] = tuple(v for v in self.params[name] if v in keep)
            if not params[name]:
                raise ValueError(f"narrowing {name} to {list(keep)} leaves no value")
        variant_params = {v: names for v, names in self.variant_params.items()
                          if v in params["variant"]}
        return dataclasses.replace(self, params=params, variant_params=variant_params)

    def for_call(self, gemm: Gemm) -> SearchSpace:
        """What a study of this call searches (and the model ranks for it): this space with
        only the pads that change the call's operands (0, no padding, always), since every
        config with another pad is infeasible (tuner.kernels.base.Kernel.feasible)."""
        from tuner.kernels.padding import pad_changes_nothing  # the kernels import Triton

        return self.narrowed(pad=tuple(p for p in self.params["pad"]
                                       if not p or not pad_changes_nothing(gemm, p)))

    def holds(self, config: Mapping) -> bool:
        """Whether every value of the config is one of this space's candidates."""
        return config.get("variant") in self.variant_params and all(
            config.get(name) in self.params[name]
            for name in self.variant_params[config["variant"]])

    def suggest(self, trial) -> dict:
        """Draw one config from an Optuna trial: the variant first, then only its parameters.

        Parameters shared by several variants (BLOCK_M) keep one name and one value list, so
        the sampler learns about them from every variant's trials.
        """
        variant = trial.suggest_categorical("variant", self.params["variant"])
        config = {"variant": variant}
        for name in self.variant_params[variant][1:]:
            config[name] = trial.suggest_categorical(name, self.params[name])
        return config

    def to_yaml(self) -> str:
        return yaml.safe_dump({"kernel": self.kernel,
                               "params": {k: list(v) for k, v in self.params.items()},
                               "strategy": self.strategy}, sort_keys=False)


def _fail(source: str, field: str, expected: str, got) -> SpaceError:
    return SpaceError(f"{source}: field {quoted(field)}: expected {expected}, got {quoted(got)}")


def _variant_names(source: str, values, known: Mapping[str, tuple[str, ...]]) -> tuple:
    if (not isinstance(values, list) or not values
            or not all(isinstance(v, str) and v in known for v in values)):
        raise _fail(source, "params.variant", f"a non-empty list of {', '.join(known)}", values)
    return tuple(dict.fromkeys(values))


def _power_of_two(low: int, high: int) -> Callable[[int], bool]:
    return lambda v: low <= v <= high and v & (v - 1) == 0


# What each known parameter's values may be, and the words saying so. tl.arange (and tl.dot,
# whose tile sides are BLOCK_M/N/K) takes only powers of two; Triton launches 1 to 32 warps
# (powers of two); a software pipeline has at least one stage; pad (kernels/padding.py) aligns
# operands to 16 bytes or more, so 0 (none) or a power of two of at least 8 elements. A
# parameter not listed here (a user's own kernel's) takes any non-negative integer.
PARAM_RULES: dict[str, tuple[Callable[[int], bool], str]] = {
    **{name: (_power_of_two(1, 4096), "powers of two from 1 to 4096 (tl.arange and tl.dot "
              "tile sides)") for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "ROWS")},
    "num_warps": (lambda v: v in (1, 2, 4, 8, 16, 32), "values among 1, 2, 4, 8, 16, 32"),
    "num_stages": (lambda v: 1 <= v <= 16, "integers from 1 to 16"),
    "GROUP_M": (lambda v: 1 <= v <= 4096, "integers from 1 to 4096"),
    "SPLIT_K": (lambda v: 1 <= v <= 1024, "integers from 1 to 1024"),
    "K_SLICES": (lambda v: 1 <= v <= 4096, "integers from 1 to 4096"),
    "pad": (lambda v: v == 0 or _power_of_two(8, 1024)(v),
            "0 (no padding) or powers of two from 8 to 1024"),
    "BLOCK_N_TAIL": (lambda v: v == 0 or _power_of_two(8, 256)(v),
                     "0 (no tail) or powers of two from 8 to 256 (a wgmma's width)"),
    **{name: (lambda v: v in (0, 1), "0 or 1")
       for name in ("WARP_SPECIALIZE", "FLATTEN", "EPILOGUE_SUBTILE", "SWAP_AB")},
}
ANY_COUNT = (lambda v: v >= 0, "non-negative integers")
# Parameters a variant took on after tables were written, each with the value that runs a
# config as the kernel ran before it: a table's config without one reads it
# (tuner.formats.table), so that a deployment's table keeps working across the upgrade.
LATER_PARAM_DEFAULTS: dict[str, int] = {
    "BLOCK_N_TAIL": 0,  # gluon, 2026-11-28: no tail
    "SWAP_AB": 0,  # gluon, 2026-11-28: the tile as it is, not transposed
}


def allowed_value(name: str, value: object) -> bool:
    """Whether `value` is one parameter `name` may take: an integer (not a bool) its rule in
    PARAM_RULES allows. The one check of a parameter's value, for a search space's lists, a
    table's configs (tuner.formats.table) and an expand file's lists (tuner.formats.flaggems)."""
    allowed, _ = PARAM_RULES.get(name, ANY_COUNT)
    return isinstance(value, int) and not isinstance(value, bool) and allowed(value)


def allowed_words(name: str) -> str:
    """What parameter `name` may take, in words ("powers of two from 1 to 4096 ...")."""
    return PARAM_RULES.get(name, ANY_COUNT)[1]


def _int_values(source: str, name: str, values) -> tuple[int, ...]:
    expected = f"a non-empty list of {allowed_words(name)}"
    if not isinstance(values, list) or not values:
        raise _fail(source, f"params.{name}", expected, values)
    for v in values:
        if not allowed_value(name, v):
            raise SpaceError(f"{source}: field {quoted(f'params.{name}')}: expected "
                             f"{expected}, got {quoted(v)} in {quoted(values)}")
    return tuple(dict.fromkeys(values))


def parse_space(doc, source: str,
                kernel_variants: Mapping[str, Mapping[str, tuple[str, ...]]]) -> SearchSpace:
    """Validate a loaded YAML document against the known kernels' variants and parameters.

    kernel_variants: kernel name -> variant name -> the parameters a config of it holds.
    """
    if not isinstance(doc, dict):
        raise _fail(source, "<top level>", "a mapping with kernel, params, strategy", doc)
    unknown = next((name for name in doc if name not in SPACE_FIELDS), None)
    if unknown is not None:
        raise _fail(source, unknown, f"only the fields {', '.join(SPACE_FIELDS)}", unknown)
    kernel = doc.get("kernel")
    if not isinstance(kernel, str) or kernel not in kernel_variants:
        raise _fail(source, "kernel", f"one of {', '.join(kernel_variants)}", kernel)
    known = kernel_variants[kernel]

    params = doc.get("params")
    if not isinstance(params, dict):
        raise _fail(source, "params", "a mapping of variant and parameters to value lists",
                    params)
    variants = _variant_names(source, params.get("variant"), known)
    read = {v: known[v] for v in variants}
    wanted = tuple(dict.fromkeys(p for ps in read.values() for p in ps))
    for name in params:
        if name not in wanted:
            raise _fail(source, f"params.{name}",
                        f"a parameter of variants {', '.join(variants)} ({', '.join(wanted)})",
                        name)
    checked: dict[str, tuple] = {"variant": variants}
    for name in wanted:
        if name != "variant":
            checked[name] = _int_values(source, name, params.get(name))

    strategy = doc.get("strategy")
    if not isinstance(strategy, dict):
        raise _fail(source, "strategy", f"a mapping of {', '.join(KEY_FIELDS)} to a strategy",
                    strategy)
    for name in strategy:
        if name not in KEY_FIELDS:
            raise _fail(source, f"strategy.{name}", f"one of {', '.join(KEY_FIELDS)}", name)
    for name in KEY_FIELDS:
        value = strategy.get(name)
        if name == "dtype" and value != "default":
            raise _fail(source, "strategy.dtype", "one of default", value)
        try:
            strategy_function(value)
        except StrategyModuleError as e:
            raise SpaceError(f"{source}: field 'strategy.{name}': {e}") from None
        except BucketingError:
            raise _fail(source, f"strategy.{name}", f"one of {STRATEGY_FORMS}", value) from None
    return SearchSpace(kernel, checked, {f: strategy[f] for f in KEY_FIELDS}, source, read)


class _UniqueKeyLoader(BoundedLoader):
    """The bounded YAML loader, refusing a mapping that names a key twice (PyYAML keeps the
    last silently: `num_warps` listed twice would search only the second list)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                twice = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: the base class says so
                break
            if twice:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {quoted(key)} given twice", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def load_space(path: str | Path,
               kernel_variants: Mapping[str, Mapping[str, tuple[str, ...]]]) -> SearchSpace:
    path = Path(path)
    try:
        data = read_user_file(path, "search space", MAX_SPACE_BYTES, SpaceError)
    except OSError as e:
        raise SpaceError(f"{path}: cannot read search space ({e.strerror})") from None
    text = decoded(data, str(path), SpaceError)
    doc = parsed_yaml(text, str(path), SpaceError, loader=_UniqueKeyLoader)
    return parse_space(doc, str(path), kernel_variants)


def builtin_spaces(kernel_variants: Mapping[str, Mapping[str, tuple[str, ...]]],
                   skip: frozenset[str] = frozenset()) -> dict[str, SearchSpace]:
    """The spaces shipped in tuner.search_spaces (one KERNEL.yaml per kernel), except those
    in `skip` (kernels the user gave a space of their own for, perhaps with other params)."""
    spaces = {}
    for entry in resources.files("tuner.search_spaces").iterdir():
        if entry.name.endswith(".yaml") and entry.name[:-5] not in skip:
            space = parse_space(yaml.safe_load(entry.read_text()), f"search_spaces/{entry.name}",
                                kernel_variants)
            spaces[space.kernel] = space
    return spaces
