"""gemm-tuner: autotunes Triton GEMM kernels and remembers what it learns.

`tuner.matmul` and `tuner.linear` launch the tuned config for each call; `tuner.record`
lists the GEMMs a workload runs as a shapes CSV (tuner.recording); `tuner.enable` /
`disable` / `enabled` route a model's GEMMs through them and `tuner.patch` / `unpatch` swap
its nn.Linear forwards for them (tuner.integration); `tuner.fuse` / `unfuse` answer sibling
linears (attention's q, k and v) with one GEMM (tuner.fusion). All are imported lazily, so that
`import tuner` (and the CLI) stays light and does not import triton before the CLI has
decided whether Triton's interpreter is wanted; the first lookup of `matmul` or `linear`
builds or loads the compiled front of tuner/runtime/fastpath.py.
"""


def __getattr__(name):
    if name in ("matmul", "linear"):
        from tuner import fronts
        value = fronts.front(name)
    elif name == "record":
        from tuner.recording import record as value
    elif name in ("enable", "disable", "enabled", "patch", "unpatch"):
        from tuner import integration
        value = getattr(integration, name)
    elif name in ("fuse", "unfuse"):
        from tuner import fusion
        value = getattr(fusion, name)
    else:
        raise AttributeError(f"module 'tuner' has no attribute {name!r}")
    globals()[name] = value  # later lookups skip this hook
    return value
