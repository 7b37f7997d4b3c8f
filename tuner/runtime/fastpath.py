"""`tuner.matmul` and `tuner.linear` as users call them: compiled in front of the Python
dispatcher (fastpath.cpp).

A repeated call's Python (its signature, the lookup, the checks) costs more host time than
torch's own call of the same GEMM, and in eager PyTorch host time is what a decode call
costs. The compiled functions look a call's signature up in what the Python dispatcher
`remember`ed on its first call, and run the torch operator or the recorded launches; every
other call goes to the Python function, which validates, decides, warns and raises.
The hooks `tuner.enable` puts over aten mm, addmm and bmm live here too (`install_hooks`), for
the same reason: they serve a call whose route they remember (`remember_route`) without
entering Python, and hand every other call to tuner.routing.

Built once per source (its contents and its place: torch's build files name the source's
path, so two checkouts sharing one name would rebuild each other's), torch and Python version
by torch.utils.cpp_extension (its cache: $TORCH_EXTENSIONS_DIR or ~/.cache/torch_extensions),
when `tuner.matmul` or `tuner.linear` is first looked up, with one line on standard error
before a build (not before loading a cached one): tuning processes, which never call them,
build nothing. TUNE_FASTPATH=0, or a machine with no C++ compiler (one warning), leaves the
Python functions in front.
Under torch.compile, Dynamo traces the Python function in place of the compiled one.
"""
from __future__ import annotations

import hashlib
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from tuner.reporting import STDERR

SOURCE = Path(__file__).with_name("fastpath.cpp")
# The compiled module, once loaded (None: not loaded, disabled, or unbuildable).
_module = None
_loaded = False


def _load():
    """The compiled module, built if the cache lacks it; None where it is off or fails."""
    global _module, _loaded
    if _loaded:
        return _module
    _loaded = True
    if os.environ.get("TUNE_FASTPATH", "1") == "0":
        return None
    from torch.utils import cpp_extension
    source = SOURCE.read_bytes()
    version = f"{SOURCE.resolve()} {torch.__version__} {sys.version}".encode()
    name = "tuner_fastpath_" + hashlib.sha256(source + version).hexdigest()[:16]
    if not _built(cpp_extension, name):
        STDERR.note("gemm-tuner: building the compiled front of tuner.matmul/linear (once, "
                    "~1 min; TUNE_FASTPATH=0 skips it) ...")
    try:
        _module = cpp_extension.load(name=name, sources=[str(SOURCE)],
                                     extra_cflags=["-O2"], verbose=False)
    except Exception as error:  # no compiler, no ninja, a failed build: the Python path runs
        reason = (str(error).strip() or type(error).__name__).splitlines()[0]
        warnings.warn(f"gemm-tuner: could not build {SOURCE.name} ({reason}); tuner.matmul "
                      "and tuner.linear run in Python (TUNE_FASTPATH=0 skips the build)",
                      RuntimeWarning, stacklevel=3)
    return _module


def _built(cpp_extension, name: str) -> bool:
    """Whether torch's extension cache already holds the module `name` (loading it is then
    quick; building it takes about a minute, said once beforehand). Asked through
    cpp_extension's own build-folder rule; where that is missing, False (the line is said)."""
    try:
        folder = Path(cpp_extension._get_build_directory(name, verbose=False))
    except Exception:  # a torch without the private helper: say the line rather than not
        return False
    return any((folder / f"{name}{suffix}").exists() for suffix in (".so", ".pyd"))


def front(name: str, python_function: Callable) -> Callable:
    """What `tuner.<name>` is: the compiled function in front of `python_function`, or
    `python_function` itself where nothing is compiled."""
    module = _load()
    if module is None:
        return python_function
    module.install(name, python_function, torch.nn.Parameter)
    compiled = getattr(module, name)
    # Dynamo cannot trace a C function: under torch.compile it traces the Python one instead.
    from torch._dynamo import substitute_in_graph
    substitute_in_graph(compiled, skip_signature_check=True)(python_function)
    return compiled


def remember(name: str, action, operands: tuple, allow_tf32: bool) -> None:
    """Later calls of `tuner.<name>` with the signature of these arguments (as the operands
    a, b, out, bias, scale_a, scale_b: kernels.launches.operands_of's order, None where
    absent) take `action`: None (the Python function), "torch" (the operator torch's own call
    reaches) or (issue, output) (kernels.launches.Repeated.compiled_action)."""
    if _module is not None:
        _module.remember(name, action, operands, allow_tf32)


def clear() -> None:
    """Forget every remembered signature, the hooks' routes too."""
    if _module is not None:
        _module.clear()


# -- the hooks of tuner.enable ----------------------------------------------------------------
def install_hooks(keys: Sequence[str], routes) -> bool:
    """Put the compiled hooks over aten mm, addmm and bmm at each dispatch key of `keys`
    ("CPU", "CUDA"), in place of any installed before; a call whose route they do not
    remember goes to `routes.mm`, `.addmm` or `.bmm` (tuner.routing.Routes). False where
    nothing is compiled: the caller registers Python hooks instead."""
    module = _load()
    if module is None:
        return False
    module.install_hooks(tuple(keys), routes.mm, routes.addmm, routes.bmm)
    return True


def remove_hooks() -> None:
    """Give mm, addmm and bmm back to the kernels the hooks kept; forget their routes."""
    if _module is not None:
        _module.remove_hooks()


def remember_route(op: str, args: tuple, action) -> None:
    """Later calls of aten `op` ("mm", "addmm", "bmm") with the signature of `args` (its
    arguments as the hook passed them on) take `action`: "torch" (torch's kernel, which the
    hook kept) or (issue, result) (the replay of recorded launches into a new output like
    `result`: Repeated.compiled_action)."""
    if _module is not None:
        issue, example = (action, None) if action == "torch" else action
        _module.remember_route(op, args, issue, example)


def routes_remembered() -> int:
    """How many routes the hooks remember."""
    return 0 if _module is None else _module.routes_size()
