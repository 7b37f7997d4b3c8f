"""Whether a config can run a raw key: the kernel's own verdict on the key's GEMM as meta
tensors. A fallback may answer a key only with configs that pass (a TMA-fed config on
unaligned strides cannot, its padded twin may); the table's own entry needs no verdict, the
dispatcher checks the call itself."""
from __future__ import annotations

from collections.abc import Callable, Mapping


def layout(M: int, N: int, K: int, stride_am: int, stride_bk: int) -> str:
    """Shape.layout from a call's strides, inverting Shape.stride_am and stride_bk: an operand
    whose leading stride is not its row length is read transposed."""
    return ("n" if stride_am == K else "t") + ("n" if stride_bk == N else "t")


def shape_of(key: Mapping):
    """The key's Shape (the model's input)."""
    from tuner.shapes import Shape

    sizes = (key["M"], key["N"], key["K"])
    return Shape(*sizes, key["dtype"], layout(*sizes, key["stride_am"], key["stride_bk"]))


def installed_variants() -> dict[str, dict[str, tuple[str, ...]]] | None:
    """Per op, per variant, the parameters a config of it holds, of the installed kernels
    (what a table's entries are checked against as it loads); None when the kernels cannot
    be imported."""
    try:
        from tuner.kernels import kernel_variants
    except ImportError:
        return None
    return kernel_variants()


def runnability(op: str) -> Callable[[Mapping], Callable[[Mapping], bool]] | None:
    """A function giving, for a raw key, whether the op's kernel can run a config on it: the
    kernel's own verdict (Kernel.unsupported) on the key's GEMM as meta tensors (key_gemm).
    None when the kernels cannot be imported: every config then counts as runnable."""
    try:
        from tuner.kernels import KERNELS
    except ImportError:
        return None
    kernel = KERNELS.get(op)
    if kernel is None:
        return None

    def on(key: Mapping) -> Callable[[Mapping], bool]:
        gemm = key_gemm(key)
        return lambda config: (config["variant"] in kernel.variant
                               and kernel.unsupported(config, gemm) is None)

    return on


def key_gemm(key: Mapping):
    """The key's GEMM on meta tensors, A and B with the key's own row strides. The key holds
    no pointer, so the pointers count as 16-byte aligned (a meta tensor's is 0); the
    dispatcher checks the call itself. `layout` reads a row stride that is neither 1 nor the
    row's length (a slice of a wider matrix) as a transposed operand; here it is kept."""
    from tuner.kernels.calls import meta_gemm

    gemm = meta_gemm(shape_of(key))
    return gemm.with_operands(_row_strided(gemm.a, key["stride_am"]),
                              _row_strided(gemm.b, key["stride_bk"]), gemm.out)


def _row_strided(operand, stride: int):
    """The operand as laid out by `layout`, or row-major with `stride` between its rows where
    the stride is neither 1 (a transposed operand) nor what `layout` gave it."""
    import torch

    if stride == 1 or operand.stride(0) == stride:
        return operand
    return torch.empty_strided(operand.shape, (stride, 1), dtype=operand.dtype, device="meta")
