"""Search spaces: the candidate values of each kernel parameter, and how keys are bucketed.

One YAML file per kernel ships in search_spaces/; `--space FILE` swaps in a user's own. A file
that does not fit raises `SpaceError` with one line naming the file, the field and what was
expected, before anything runs.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import yaml

from tuner.bucketing import KEY_FIELDS, STRATEGIES


class SpaceError(ValueError):
    """A search-space YAML that cannot be used."""


@dataclass(frozen=True)
class SearchSpace:
    kernel: str
    params: dict[str, tuple[int, ...]]
    strategy: dict[str, str]
    source: str  # where it came from, for messages

    @property
    def hash(self) -> str:
        """Identifies the space by content (not comments or formatting): same hash, same search."""
        canon = json.dumps({"kernel": self.kernel, "params": self.params,
                            "strategy": self.strategy}, sort_keys=True)
        return hashlib.sha256(canon.encode()).hexdigest()[:16]

    @property
    def size(self) -> int:
        n = 1
        for values in self.params.values():
            n *= len(values)
        return n

    def to_yaml(self) -> str:
        return yaml.safe_dump({"kernel": self.kernel,
                               "params": {k: list(v) for k, v in self.params.items()},
                               "strategy": self.strategy}, sort_keys=False)


def _fail(source: str, field: str, expected: str, got) -> SpaceError:
    return SpaceError(f"{source}: field '{field}': expected {expected}, got {got!r}")


def parse_space(doc, source: str, kernel_params: dict[str, tuple[str, ...]]) -> SearchSpace:
    """Validate a loaded YAML document against the known kernels' parameter names."""
    if not isinstance(doc, dict):
        raise _fail(source, "<top level>", "a mapping with kernel, params, strategy", doc)
    kernel = doc.get("kernel")
    if kernel not in kernel_params:
        raise _fail(source, "kernel", f"one of {', '.join(kernel_params)}", kernel)
    wanted = kernel_params[kernel]

    params = doc.get("params")
    if not isinstance(params, dict):
        raise _fail(source, "params", f"a mapping of {', '.join(wanted)} to value lists", params)
    for name in params:
        if name not in wanted:
            raise _fail(source, f"params.{name}", f"a parameter of {kernel} ({', '.join(wanted)})",
                        name)
    checked: dict[str, tuple[int, ...]] = {}
    for name in wanted:
        values = params.get(name)
        if (not isinstance(values, list) or not values
                or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                           for v in values)):
            raise _fail(source, f"params.{name}", "a non-empty list of non-negative integers",
                        values)
        checked[name] = tuple(dict.fromkeys(values))

    strategy = doc.get("strategy")
    if not isinstance(strategy, dict):
        raise _fail(source, "strategy", f"a mapping of {', '.join(KEY_FIELDS)} to a strategy",
                    strategy)
    for name in strategy:
        if name not in KEY_FIELDS:
            raise _fail(source, f"strategy.{name}", f"one of {', '.join(KEY_FIELDS)}", name)
    for name in KEY_FIELDS:
        value = strategy.get(name)
        allowed = ["default"] if name == "dtype" else list(STRATEGIES)
        if value not in allowed:
            raise _fail(source, f"strategy.{name}", f"one of {', '.join(allowed)}", value)
    return SearchSpace(kernel, checked, {f: strategy[f] for f in KEY_FIELDS}, source)


def load_space(path: str | Path, kernel_params: dict[str, tuple[str, ...]]) -> SearchSpace:
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as e:
        raise SpaceError(f"{path}: cannot read search space ({e.strerror})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        raise SpaceError(f"{path}{where}: not valid YAML ({getattr(e, 'problem', e)})") from None
    return parse_space(doc, str(path), kernel_params)


def builtin_spaces(kernel_params: dict[str, tuple[str, ...]],
                   skip: frozenset[str] = frozenset()) -> dict[str, SearchSpace]:
    """The spaces shipped in tuner.search_spaces (one KERNEL.yaml per kernel), except those
    in `skip` (kernels the user gave a space of their own for, perhaps with other params)."""
    spaces = {}
    for entry in resources.files("tuner.search_spaces").iterdir():
        if entry.name.endswith(".yaml") and entry.name[:-5] not in skip:
            space = parse_space(yaml.safe_load(entry.read_text()), f"search_spaces/{entry.name}",
                                kernel_params)
            spaces[space.kernel] = space
    return spaces
