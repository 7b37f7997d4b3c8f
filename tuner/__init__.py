"""gemm-tuner: autotunes Triton GEMM kernels and remembers what it learns.

`tuner.matmul` launches the tuned config for each call. It is imported lazily, so that
`import tuner` (and the CLI) stays light and does not import triton before the CLI has
decided whether Triton's interpreter is wanted.
"""


def __getattr__(name):
    if name == "matmul":
        from tuner.dispatch import matmul
        return matmul
    raise AttributeError(f"module 'tuner' has no attribute {name!r}")
