"""gemm-tuner: autotunes Triton GEMM kernels and remembers what it learns.

`tuner.matmul` and `tuner.linear` launch the tuned config for each call. They are imported
lazily, so that `import tuner` (and the CLI) stays light and does not import triton before
the CLI has decided whether Triton's interpreter is wanted; their first lookup builds or loads
the compiled front of tuner/runtime/fastpath.py.
"""


def __getattr__(name):
    if name in ("matmul", "linear"):
        from tuner.runtime import dispatch, fastpath
        # later lookups skip this hook
        value = globals()[name] = fastpath.front(name, getattr(dispatch, name))
        return value
    raise AttributeError(f"module 'tuner' has no attribute {name!r}")
