"""The Triton kernels the tuner tunes: operations (`Kernel`) made of variants (`Variant`).

`mm` is the general GEMM; `gemv` serves the GEMMs with a single row or column (M == 1 or
N == 1), where the matrix-vector kernel competes with the tile kernels. The two never share a
bucketed key, so a gemv config is never applied to a shape it cannot compute. KERNELS maps
the names stored in the database and exported tables to them.
"""
import importlib
import os
from pathlib import Path

from tuner.errors import UserError
from tuner.kernels.base import KERNELS, Kernel
from tuner.kernels.cublas import CUBLAS
from tuner.kernels.gemv import GEMV, MMAGEMV, MULTIGEMV
from tuner.kernels.general import GENERAL
from tuner.kernels.gluon_gemv import GLUONGEMV
from tuner.kernels.gluon_mm import GLUON
from tuner.kernels.kreduce import KREDUCE
from tuner.kernels.persistent import PERSISTENT
from tuner.kernels.splitk import SPLITK
from tuner.kernels.streamk import STREAMK
from tuner.kernels.tma import TMA
from tuner.textfiles import clipped, quoted

_HERE = Path(__file__).parent
_SHARED = tuple(_HERE / name for name in ("_launch.py", "_epilogue.py", "_mainloop.py",
                                          "_partials.py", "padding.py", "workspace.py",
                                          "launches.py"))

# The registry (the dict lives in kernels/base.py, which labels configs by it). A new variant
# is listed here, in each kernel that offers it.
KERNELS.update({
    "mm": Kernel("mm", (GENERAL, TMA, PERSISTENT, STREAMK, SPLITK, KREDUCE, MULTIGEMV, MMAGEMV,
                        GLUONGEMV, GLUON, CUBLAS), _SHARED),
    "gemv": Kernel("gemv", (GEMV, GENERAL, SPLITK, KREDUCE, CUBLAS), _SHARED),
})

# Kernels from elsewhere: TUNE_KERNEL_MODULES=pkg.mod,... names modules that each define
# KERNEL, registered under KERNEL.name (replacing a built-in of that name). Worker processes
# inherit the variable, so they resolve names the same way as the tuner.
KERNEL_MODULES_ENV_VAR = "TUNE_KERNEL_MODULES"


class KernelModuleError(UserError):
    """A module $TUNE_KERNEL_MODULES lists that cannot be imported or defines no KERNEL."""


def _kernel_of(name: str) -> Kernel:
    """The KERNEL the module `name` defines; KernelModuleError saying what is wrong."""
    where = f"${KERNEL_MODULES_ENV_VAR}: kernel module {quoted(name)}"
    try:
        module = importlib.import_module(name)
    except Exception as e:  # a missing module, or one failing as it imports
        raise KernelModuleError(f"{where} cannot be imported ({type(e).__name__}: "
                                f"{clipped(str(e), 200)})") from None
    kernel = getattr(module, "KERNEL", None)
    if not isinstance(kernel, Kernel):
        raise KernelModuleError(f"{where} must define KERNEL, a tuner.kernels.base.Kernel; "
                                f"got {quoted(kernel)}")
    return kernel


for _name in filter(None, (m.strip() for m in
                           os.environ.get(KERNEL_MODULES_ENV_VAR, "").split(","))):
    _kernel = _kernel_of(_name)
    KERNELS[_kernel.name] = _kernel


def kernel_variants() -> dict[str, dict[str, tuple[str, ...]]]:
    """Per kernel, per variant, the parameters a config holds: what parse_space checks a
    search-space file against."""
    return {name: kernel.variant_params for name, kernel in KERNELS.items()}


def source_hashes() -> dict[str, str]:
    """Per kernel, the hash of its source today: winners measured with other source are
    stale (tuner.export.picks.current_only), and exports record it."""
    return {name: kernel.source_hash for name, kernel in KERNELS.items()}


def kernel_for(m: int, n: int) -> Kernel:
    """The kernel that computes an M×N GEMM: gemv for a single row or column, else mm."""
    return KERNELS["gemv" if m == 1 or n == 1 else "mm"]
