"""`tuner.matmul` and `tuner.linear`: GEMMs that launch the tuned Triton config for their shape.

The config comes from `tuner.runtime.get_tuned_config` (the table in $TUNE_CONFIG), or, with
TUNE_EXCLUDE=cublas[,variant...], get_tuned_config_without those variants; a single row or
column (M == 1 or N == 1) goes to the gemv kernel's table, everything else to mm's.
A tuned config whose variant cannot run this very call (a bucket-mate with unaligned strides
given a TMA config) falls back to cuBLAS (else the kernel's default config), with one warning
per key.

Both are torch operators (`torch.ops.tuner.mm`, `tuner.mm_out`, `tuner.linear`) with fake
implementations, so `torch.compile(fullgraph=True)` traces through them, and with autograd
formulas whose backward GEMMs go through the same dispatcher. Eager calls that need no
autograd skip the operator machinery and launch directly: host time decides decode shapes.
For the same reason a call key's Triton launches are recorded once and replayed for later
calls with the new operands' addresses (kernels/launches.py), skipping Triton's argument
binding and specialization; and a public call whose signature (every tensor's shape, strides,
dtype, device and alignment) was seen before skips validation too (`Repeated`): that
signature passed it already, and decides the launches. A key tuned to `cublas` goes straight
to the torch function the user would have called. `tuner.matmul` and `tuner.linear` put a
compiled front over this module's functions (tuner/runtime/fastpath.py): it serves repeated
calls from what `_remember` tells it, and hands every other call to them.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from triton.runtime.errors import OutOfResources

from tuner.dtypes import DTYPES, NAME_OF_TORCH_DTYPE
from tuner.kernels import kernel_for, launches
from tuner.kernels._launch import INTERPRETED
from tuner.kernels.base import Gemm, Kernel
from tuner.kernels.calls import runnable_config
from tuner.kernels.launches import Prepared, Repeated
from tuner.runtime import fastpath, lookup
from tuner.runtime.answer import CUBLAS_CONFIG, DEFAULT_CONFIGS
from tuner.runtime.exclude import excluded_variants
from tuner.runtime.lookup import get_tuned_config, get_tuned_config_without


@dataclass
class _Call:
    """What the dispatcher decided for one call key (`_call_key`), and how it launches."""
    kernel: Kernel
    config: Mapping
    # How later calls compute (kernels/launches.py); None until the first call ran.
    prepared: Prepared | None = None


_CALLS: dict[tuple, _Call] = {}
# The most call signatures remembered (plans, repeats, the routes of tuner.enable's hooks)
# before all are forgotten: a caller with ever new shapes (serving's every M, a fuzzer) then
# pays a fresh decision now and then, never memory without bound.
MAX_SIGNATURES = 16384


def _call_key(gemm: Gemm) -> tuple:
    """Everything that decides the config and the compiled kernels of a call: shapes,
    strides, dtype, device, the optional tensors, and each pointer's 16-byte alignment
    (Triton specializes on it, and TMA needs it)."""
    a, b, out, bias = gemm.a, gemm.b, gemm.out, gemm.bias
    aligned = tuple(t is None or t.data_ptr() % 16 == 0
                    for t in (a, b, out, bias, gemm.scale_a, gemm.scale_b))
    return (a.shape, b.shape, a.stride(), b.stride(), out.stride(), a.dtype, a.device,
            None if bias is None else bias.stride(), gemm.allow_tf32, aligned)


# The variants $TUNE_EXCLUDE leaves out, read on the first decision (None: not yet read).
_excluded: frozenset[str] | None = None


def _decide(gemm: Gemm) -> tuple[Kernel, Mapping]:
    global _excluded
    if _excluded is None:
        _excluded = excluded_variants()
    M, N, K = gemm.mnk
    kernel = kernel_for(M, N)
    key = dict(M=M, N=N, K=K, dtype=NAME_OF_TORCH_DTYPE[gemm.a.dtype],
               stride_am=gemm.a.stride(0), stride_bk=gemm.b.stride(0))
    tuned = get_tuned_config_without(_excluded, kernel.name, **key) if _excluded \
        else get_tuned_config(kernel.name, **key)
    config, reason = runnable_config(kernel, tuned, gemm)
    if reason:
        # The key cannot say everything the call does (a pointer off 16 bytes, a bucket-mate's
        # strides).
        config = _instead(kernel, tuned, gemm, reason)
    if gemm.a.device.type == "cpu" and not INTERPRETED and (
            kernel.variant[config["variant"]].library_calls is None):
        raise RuntimeError(
            f"gemm-tuner: the {kernel.name} config for {M}x{N}x{K} on CPU tensors is the Triton "
            f"kernel {config['variant']}, and Triton runs on the CPU only in its interpreter: "
            "set TRITON_INTERPRET=1 before importing tuner, or pass GPU tensors (a table whose "
            "answers are cublas runs on the CPU as it is)")
    return kernel, config


def _instead(kernel: Kernel, config: Mapping, gemm: Gemm, reason: str) -> Mapping:
    """What runs a call that `config` cannot, said once for the call key: cuBLAS where it
    may and can, the default config otherwise."""
    fallback = CUBLAS_CONFIG if (CUBLAS_CONFIG["variant"] not in _excluded and
                                 kernel.unsupported(CUBLAS_CONFIG, gemm) is None) \
        else DEFAULT_CONFIGS[kernel.name]
    M, N, K = gemm.mnk
    warnings.warn(f"gemm-tuner: tuned {kernel.name} config {dict(config)} cannot run "
                  f"{M}x{N}x{K} with strides {gemm.a.stride()}, {gemm.b.stride()} "
                  f"({reason}); using {fallback.source}", RuntimeWarning, stacklevel=5)
    return fallback


def _call(gemm: Gemm) -> _Call:
    key = _call_key(gemm)
    call = _CALLS.get(key)
    if call is None:
        _make_room()
        call = _CALLS[key] = _Call(*_decide(gemm))
    return call


def _make_room() -> None:
    """Forget every signature before one more is remembered where MAX_SIGNATURES are."""
    if max(len(_CALLS), len(_LINEAR_REPEATS) + len(_MATMUL_REPEATS),
           fastpath.routes_remembered()) >= MAX_SIGNATURES:
        _forget_calls()


def _forget_calls() -> None:
    """Forget every call's plan and how its repeats run (the compiled front's too); the
    tables stay loaded."""
    _CALLS.clear()
    _LINEAR_REPEATS.clear()
    _MATMUL_REPEATS.clear()
    fastpath.clear()


def clear_cache() -> None:
    """Forget the decided plans and the loaded tables, e.g. after $TUNE_CONFIG or the table
    file changed (tuner.runtime.clear_cache alone would leave this module's plans in place);
    $TUNE_EXCLUDE is read again on the next call."""
    global _excluded
    _excluded = None
    _forget_calls()
    lookup.clear_cache()


def plan(gemm: Gemm) -> tuple[Kernel, Mapping]:
    """The kernel and config the dispatcher launches for this call (M, N, K >= 1)."""
    call = _call(gemm)
    return call.kernel, call.config


def _compute(gemm: Gemm) -> _Call | None:
    """gemm.out = a @ b (scaled, plus bias) with the tuned config; shapes already checked.
    Returns the call's plan (None for an empty product or meta tensors: nothing launches).

    The first call of a key launches through Triton and records its launches; later calls
    re-issue them with their own operands' addresses (kernels/launches.prepare).
    """
    M, N, K = gemm.mnk
    if M == 0 or N == 0 or gemm.out.device.type == "meta":  # nothing to compute, as torch's
        return None
    if K == 0:
        gemm.out.copy_(torch.zeros_like(gemm.out) if gemm.bias is None
                       else gemm.bias.expand_as(gemm.out))
        return None
    call = _call(gemm)
    if call.prepared is not None:
        call.prepared(gemm)
        return call
    try:
        call.prepared = launches.prepare(call.kernel, call.config, gemm)
    except OutOfResources as e:
        # A fallback's config that the feasibility estimate let through and this device's
        # compiler refuses: it launched nothing, so the call is computed the other way.
        call.config = _instead(call.kernel, call.config, gemm, str(e))
        call.prepared = launches.prepare(call.kernel, call.config, gemm)
    return call


# -- validation -------------------------------------------------------------------------------
def _check_inputs(name: str, a: torch.Tensor, b: torch.Tensor, scale_a, scale_b) -> torch.dtype:
    """The output dtype of a @ b, after checking the dtypes, devices and scales the kernels
    accept (the caller checks shapes); errors name `name`."""
    dtype = DTYPES.get(NAME_OF_TORCH_DTYPE.get(a.dtype, ""))
    if dtype is None or b.dtype != a.dtype:
        raise TypeError(f"{name}: a and b must share one of {', '.join(DTYPES)}; got {a.dtype} "
                        f"and {b.dtype}")
    if a.device != b.device:
        raise ValueError(f"{name}: a is on {a.device}, b on {b.device}")
    if dtype.scaled != (scale_a is not None and scale_b is not None):
        raise ValueError(f"{name}: {dtype.name} inputs " + (
            "need scale_a and scale_b (one-element fp32 tensors)" if dtype.scaled
            else "take no scale_a/scale_b"))
    if dtype.scaled:
        for label, scale in (("scale_a", scale_a), ("scale_b", scale_b)):
            if scale.numel() != 1 or scale.dtype != torch.float32 or scale.device != a.device:
                raise ValueError(f"{name}: {label} must be a one-element fp32 tensor on "
                                 f"{a.device}, got {tuple(scale.shape)} {scale.dtype} on "
                                 f"{scale.device}")
    return dtype.out


def _rows(t: torch.Tensor) -> torch.Tensor:
    """`t` (..., K) as a matrix of its rows; reshape(-1, K) cannot tell the row count where
    K is 0 (a valid linear whose output is the bias alone)."""
    return t.reshape(math.prod(t.shape[:-1]), t.shape[-1])


def _check_tensors(name: str, required: dict, optional: dict) -> None:
    """TypeError naming the first argument that is not a tensor (an optional one may be
    None): lists and numpy arrays have none of the strides the dispatcher reads."""
    for label, value in (*required.items(), *optional.items()):
        if not isinstance(value, torch.Tensor) and (label in required or value is not None):
            expected = "a torch.Tensor" + ("" if label in required else " or None")
            raise TypeError(f"{name}: {label} must be {expected}, got "
                            f"{type(value).__name__}")


def _check_out_memory(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """ValueError where `out` has elements sharing memory (an expanded tensor: torch refuses
    it too) or shares memory with a or b: the kernels write tiles of out while still reading
    a and b, so either would give a wrong product without a word. Checked with the call's
    other checks, on the first call of a signature (later calls of it skip them)."""
    if torch._debug_has_internal_overlap(out) == 1:  # torch's own test for out= arguments
        raise ValueError(f"matmul: out has elements sharing memory (strides {out.stride()}); "
                         "pass one whose every element is its own")
    if out.device.type != "meta" and any(_overlap(out, t) for t in (a, b)):
        raise ValueError("matmul: out shares memory with a or b; pass an out of its own")


def _overlap(t: torch.Tensor, u: torch.Tensor) -> bool:
    """Whether the byte ranges two tensors' elements span meet."""
    if t.numel() == 0 or u.numel() == 0:
        return False
    (t0, t1), (u0, u1) = _span(t), _span(u)
    return t0 < u1 and u0 < t1


def _span(t: torch.Tensor) -> tuple[int, int]:
    """The first byte of a tensor's elements and the byte past its last."""
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


def _new_out(a: torch.Tensor, n: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty((a.shape[0], n), dtype=dtype, device=a.device)


# -- the torch operators ----------------------------------------------------------------------
def _matmul_new(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor | None,
                scale_b: torch.Tensor | None, allow_tf32: bool) -> torch.Tensor:
    out = _new_out(a, b.shape[1], DTYPES[NAME_OF_TORCH_DTYPE[a.dtype]].out)
    _compute(Gemm(a, b, out, None, scale_a, scale_b, allow_tf32))
    return out


_mm = torch.library.custom_op("tuner::mm", _matmul_new, mutates_args=())


@_mm.register_fake
def _(a, b, scale_a, scale_b, allow_tf32):
    return _new_out(a, b.shape[1], DTYPES[NAME_OF_TORCH_DTYPE[a.dtype]].out)


def _mm_setup(ctx, inputs, output):
    a, b, scale_a, _, ctx.allow_tf32 = inputs
    ctx.scaled = scale_a is not None
    ctx.save_for_backward(a, b)


def _mm_backward(ctx, grad):
    """d(a @ b): grad @ b^T and a^T @ grad, both through the dispatcher (native layouts)."""
    if ctx.scaled:
        raise RuntimeError("tuner.matmul: fp8 inputs have no backward")
    a, b = ctx.saved_tensors
    grad_a = _mm(grad, b.t(), None, None, ctx.allow_tf32) if ctx.needs_input_grad[0] else None
    grad_b = _mm(a.t(), grad, None, None, ctx.allow_tf32) if ctx.needs_input_grad[1] else None
    return grad_a, grad_b, None, None, None


_mm.register_autograd(_mm_backward, setup_context=_mm_setup)


@torch.library.custom_op("tuner::mm_out", mutates_args=("out",))
def _mm_out(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor,
            scale_a: torch.Tensor | None, scale_b: torch.Tensor | None,
            allow_tf32: bool) -> None:
    _compute(Gemm(a, b, out, None, scale_a, scale_b, allow_tf32))


def _linear_run(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                allow_tf32: bool) -> tuple[torch.Tensor, _Call | None, torch.Tensor]:
    """(output, the call's plan, the 2-D x it multiplied) of x @ weight^T + bias."""
    x2 = _rows(x)
    out = _new_out(x2, weight.shape[0], x.dtype)
    call = _compute(Gemm(x2, weight.t(), out, bias, allow_tf32=allow_tf32))
    return out.view(*x.shape[:-1], weight.shape[0]), call, x2


def _linear_new(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                allow_tf32: bool) -> torch.Tensor:
    return _linear_run(x, weight, bias, allow_tf32)[0]


_linear = torch.library.custom_op("tuner::linear", _linear_new, mutates_args=())


@_linear.register_fake
def _(x, weight, bias, allow_tf32):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _linear_setup(ctx, inputs, output):
    x, weight, bias, ctx.allow_tf32 = inputs
    ctx.has_bias = bias is not None
    ctx.save_for_backward(x, weight)


def _linear_backward(ctx, grad):
    """d(x @ W^T + bias): grad @ W, grad^T @ x and the column sums of grad."""
    x, weight = ctx.saved_tensors
    grad2 = _rows(grad)
    grad_x = grad_w = grad_bias = None
    if ctx.needs_input_grad[0]:
        grad_x = _mm(grad2, weight, None, None, ctx.allow_tf32).view(x.shape)
    if ctx.needs_input_grad[1]:
        grad_w = _mm(grad2.t(), _rows(x), None, None, ctx.allow_tf32)
    if ctx.has_bias and ctx.needs_input_grad[2]:
        grad_bias = grad2.sum(0)
    return grad_x, grad_w, grad_bias, None


_linear.register_autograd(_linear_backward, setup_context=_linear_setup)


# -- repeated calls ---------------------------------------------------------------------------
# Per public-call signature (`_described` of each argument): how later calls of it run
# (kernels.launches.Repeated: validation is skipped, the signature holds everything it checks
# and passed), or None where they take the full path (an empty product, an interpreted
# kernel, or an input reshape that copied). One dict per public function.
_LINEAR_REPEATS: dict[tuple, Repeated | None] = {}
_MATMUL_REPEATS: dict[tuple, Repeated | None] = {}


def _described(t: torch.Tensor | None) -> tuple | None:
    """What of an argument decides a call's checks and launches: its address only through
    the alignment Triton specializes on. Every repeated call computes this for each
    argument, so it reads as few attributes as that takes."""
    if t is None:
        return None
    return t.shape, t.stride(), t.dtype, t.device, t.data_ptr() & 15


def _matmul_signature(a, b, out, scale_a, scale_b, allow_tf32: bool) -> tuple:
    """The key of `tuner.matmul`'s repeats; AttributeError where an argument is no tensor."""
    return (_described(a), _described(b), _described(out), _described(scale_a),
            _described(scale_b), allow_tf32)


def _linear_signature(x, weight, bias, allow_tf32: bool) -> tuple:
    """The key of `tuner.linear`'s repeats; AttributeError where an argument is no tensor."""
    return _described(x), _described(weight), _described(bias), allow_tf32


def repeated_action(name: str, a: torch.Tensor, b: torch.Tensor,
                    bias: torch.Tensor | None = None, *, allow_tf32: bool,
                    result: torch.Tensor | None = None):
    """What later direct calls `tuner.<name>(a, b, bias)` ("matmul": no bias) of this
    signature run, as the first one noted (`_remember`), for results like `result`
    (Repeated.compiled_action): "torch" where the key is answered by cuBLAS (torch's own
    GEMM), (issue, result) for the replay of recorded launches, None where no call noted it
    yet or they take the Python path. The one answer to "does cuBLAS serve this call" that
    tuner.routing asks, so that the hooks of tuner.enable run torch's kernel themselves."""
    if name == "linear":
        repeat = _LINEAR_REPEATS.get(_linear_signature(a, b, bias, allow_tf32))
    else:
        repeat = _MATMUL_REPEATS.get(_matmul_signature(a, b, None, None, None, allow_tf32))
    return None if repeat is None else repeat.compiled_action(result)


def remember_route(op: str, args: tuple, action) -> None:
    """Later calls of aten `op` with the signature of `args` take `action`
    (fastpath.remember_route), within MAX_SIGNATURES."""
    _make_room()
    fastpath.remember_route(op, args, action)


def _remember(name: str, signature: tuple, call: _Call | None, out: torch.Tensor,
              same_addresses: bool, operands: tuple, allow_tf32: bool) -> None:
    """Note how later calls of `signature` (the public call `name` with these arguments, as
    (a, b, out, bias, scale_a, scale_b)) run (Prepared.repeated): a library variant's torch
    function, or the replay of the launches where the operands they read sit at the
    arguments' own addresses (`same_addresses`). The compiled front (fastpath) learns the
    same."""
    repeats = _LINEAR_REPEATS if name == "linear" else _MATMUL_REPEATS
    if signature in repeats:
        return
    _make_room()
    repeat = None if call is None else call.prepared.repeated(out)
    if repeat is not None and repeat.reads_recorded_views and not same_addresses:
        repeat = None
    repeats[signature] = repeat
    fastpath.remember(name, None if repeat is None else repeat.compiled_action(out), operands,
                      allow_tf32)


# -- the public functions ---------------------------------------------------------------------
def _records_grad(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None) -> bool:
    """True when autograd must record this call: grad mode, and an input that needs one."""
    return torch.is_grad_enabled() and (a.requires_grad or b.requires_grad
                                         or (c is not None and c.requires_grad))


def _direct(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None) -> bool:
    """True when the operator machinery adds nothing: eager, and no gradient to record."""
    return not torch.compiler.is_compiling() and not _records_grad(a, b, c)


def matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None, *,
           scale_a: torch.Tensor | None = None, scale_b: torch.Tensor | None = None,
           allow_tf32: bool = False) -> torch.Tensor:
    """a @ b for 2-D a (M×K) and b (K×N) of one dtype (fp16, bf16, fp32, fp8e4m3), any strides.

    fp32 inputs are multiplied in IEEE fp32 unless allow_tf32. fp8 (torch.float8_e4m3fn)
    inputs need per-tensor scales and give bf16: (scale_a * a) @ (scale_b * b). `out`, if
    given, must be M×N of the output dtype on the same device (no autograd then, as in torch).
    """
    signature = None
    if not torch.compiler.is_compiling():  # fake tensors while tracing have no addresses
        try:
            signature = _matmul_signature(a, b, out, scale_a, scale_b, allow_tf32)
        except AttributeError:  # not a tensor: checked below
            pass
        repeat = _MATMUL_REPEATS.get(signature)
        if repeat is not None and not _records_grad(a, b, out):
            return repeat.matmul(a, b, out, scale_a, scale_b)
    _check_tensors("matmul", {"a": a, "b": b},
                   {"out": out, "scale_a": scale_a, "scale_b": scale_b})
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul: expected a (M×K) and b (K×N), got {tuple(a.shape)} and "
                         f"{tuple(b.shape)}")
    out_dtype = _check_inputs("matmul", a, b, scale_a, scale_b)
    M, N = a.shape[0], b.shape[1]
    if out is not None and (out.shape != (M, N) or out.dtype != out_dtype
                            or out.device != a.device):
        raise ValueError(f"matmul: out must be {M}×{N} {out_dtype} on {a.device}, got "
                         f"{tuple(out.shape)} {out.dtype} on {out.device}")
    if out is not None:
        _check_out_memory(out, a, b)
    if not _direct(a, b, out):
        if out is None:
            return _mm(a, b, scale_a, scale_b, allow_tf32)
        _mm_out(a, b, out, scale_a, scale_b, allow_tf32)
        return out
    product = _new_out(a, N, out_dtype) if out is None else out
    call = _compute(Gemm(a, b, product, None, scale_a, scale_b, allow_tf32))
    _remember("matmul", signature, call, product, True, (a, b, out, None, scale_a, scale_b),
              allow_tf32)
    return product


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
           allow_tf32: bool = False) -> torch.Tensor:
    """x @ weight^T + bias, as torch.nn.functional.linear: x (..., K), weight (N×K), bias (N,).

    The weight is read in place through its transposed strides (no copy), and the bias is
    added in the kernel's epilogue.
    """
    signature = None
    if not torch.compiler.is_compiling():  # fake tensors while tracing have no addresses
        try:
            signature = _linear_signature(x, weight, bias, allow_tf32)
        except AttributeError:  # not a tensor: checked below
            pass
        repeat = _LINEAR_REPEATS.get(signature)
        if repeat is not None and not _records_grad(x, weight, bias):
            return repeat.linear(x, weight, bias)
    _check_tensors("linear", {"x": x, "weight": weight}, {"bias": bias})
    if x.dim() < 1 or weight.dim() != 2 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"linear: expected x (..., K) and weight (N×K), got {tuple(x.shape)} "
                         f"and {tuple(weight.shape)}")
    _check_inputs("linear", x, weight, None, None)
    if bias is not None and (bias.shape != (weight.shape[0],) or bias.dtype != x.dtype
                             or bias.device != x.device):
        raise ValueError(f"linear: bias must be ({weight.shape[0]},) {x.dtype} on {x.device}, "
                         f"got {tuple(bias.shape)} {bias.dtype} on {bias.device}")
    # The kernels' epilogue reads bias[cols]: an expanded or strided bias is read from a
    # contiguous copy, and such a call is never replayed (a replay would read the original).
    copied_bias = bias is not None and bias.shape[0] > 1 and bias.stride(0) != 1
    if copied_bias:
        bias = bias.contiguous()
    if not _direct(x, weight, bias):
        return _linear(x, weight, bias, allow_tf32)
    out, call, x2 = _linear_run(x, weight, bias, allow_tf32)
    if not copied_bias:
        # A replay reads x where the first call's launches read x2: the same only for a view.
        _remember("linear", signature, call, out, x2.data_ptr() == x.data_ptr(),
                  (x, weight, None, bias, None, None), allow_tf32)
    return out
