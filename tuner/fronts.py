"""`tuner.matmul` and `tuner.linear` as users call them, built once per process: the compiled
front of tuner/runtime/fastpath.py over the Python dispatcher. The package's lazy attributes
and the model switch-over (tuner.integration) both take them from here."""
from __future__ import annotations

import functools
from collections.abc import Callable


@functools.cache
def front(name: str) -> Callable:
    """`tuner.<name>` for "matmul" or "linear"; the first call builds or loads the front."""
    from tuner.runtime import dispatch, fastpath
    return fastpath.front(name, getattr(dispatch, name))
