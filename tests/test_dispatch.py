"""`tuner.matmul` and `tuner.linear` as users call them: results, validation, the tuned-config
fallback, autograd through the dispatcher, and torch.compile tracing the operators.

On a CPU-only machine the kernels run in Triton's interpreter, so shapes stay small.
"""
import gc
import re
import warnings

import pytest
import torch
import torch.nn.functional as F

import tuner
from tuner import runtime
from tuner.dtypes import DTYPES
from tuner.execution.measure import random_operands, relative_error
from tuner.formats.files import write_atomic
from tuner.kernels import launches
from tuner.kernels.cublas import TorchCalls
from tuner.runtime import dispatch
from tuner.shapes import LAYOUTS, Shape

pytestmark = pytest.mark.usefixtures("triton_answers")


def test_an_untuned_key_goes_to_torch_and_repeats_call_it_directly(monkeypatch):
    """With no table, the runtime answers cuBLAS: the first call runs the cublas variant,
    repeated calls go straight to torch's operators (kernels.cublas.TorchCalls)."""
    monkeypatch.undo()  # the real runtime answer, not the Triton-only one of `no_table`
    dispatch.clear_cache()
    x, weight, bias = torch.randn(3, 5, 16), torch.randn(8, 16), torch.randn(8)
    for _ in range(2):
        torch.testing.assert_close(tuner.linear(x, weight, bias), F.linear(x, weight, bias))
    a, b = torch.randn(4, 16), torch.randn(16, 6)
    for _ in range(2):
        torch.testing.assert_close(tuner.matmul(a, b), a @ b)
    assert [c.config["variant"] for c in dispatch._CALLS.values()] == ["cublas", "cublas"]
    (linear,) = dispatch._LINEAR_REPEATS.values()
    assert isinstance(linear, TorchCalls)


def test_cublas_repeats_keep_each_weights_transposed_view_only_while_it_is_right():
    """A 2-D linear's weight^T view is made once per weight and reused; it follows in-place
    updates, is remade when the weight's storage is swapped, goes with the weight, and is
    never kept for a weight that is a view or an x of more dimensions."""
    calls = TorchCalls()
    x, bias = torch.randn(4, 16), torch.randn(8)
    weight = torch.randn(8, 16)
    for b in (None, bias):
        torch.testing.assert_close(calls.linear(x, weight, b), F.linear(x, weight, b))
    (entry,) = calls._transposed.values()
    weight.mul_(2)  # in place: the kept view sees it
    torch.testing.assert_close(calls.linear(x, weight, None), F.linear(x, weight))
    assert calls._transposed[id(weight)] is entry
    weight.data = torch.randn(8, 16)  # new storage: a new view
    torch.testing.assert_close(calls.linear(x, weight, bias), F.linear(x, weight, bias))
    assert calls._transposed[id(weight)] is not entry
    del weight
    gc.collect()
    assert not calls._transposed

    rows = torch.randn(16, 16)
    torch.testing.assert_close(calls.linear(x, rows[:8], None), F.linear(x, rows[:8]))
    x3, weight = torch.randn(2, 4, 16), torch.randn(8, 16)
    torch.testing.assert_close(calls.linear(x3, weight, bias), F.linear(x3, weight, bias))
    assert not calls._transposed
    a, b = torch.randn(4, 16), torch.randn(16, 6)
    torch.testing.assert_close(calls.matmul(a, b, None, None, None), a @ b)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mnk", [(37, 53, 71), (1, 40, 33), (45, 1, 20), (5, 0, 3), (4, 6, 0)])
def test_matmul_matches_torch_in_every_layout(mnk, layout, device):
    a, b = random_operands(Shape(*mnk, "fp16", layout), device, seed=1)
    out = tuner.matmul(a, b)
    assert out.shape == (mnk[0], mnk[1]) and out.dtype == torch.float16
    if out.numel():
        assert relative_error(out, a.double() @ b.double()) <= DTYPES["fp16"].tolerance


def test_matmul_into_out_and_fp8_with_scales(device):
    a, b = random_operands(Shape(33, 40, 64, "fp8e4m3", "nt"), device, seed=2)
    scale_a, scale_b = (torch.tensor([s], device=device) for s in (0.5, 3.0))
    out = torch.full((33, 40), float("nan"), dtype=torch.bfloat16, device=device)
    assert tuner.matmul(a, b, out, scale_a=scale_a, scale_b=scale_b) is out
    ref = (a.double() * 0.5) @ (b.double() * 3.0)
    assert relative_error(out, ref) <= DTYPES["fp8e4m3"].tolerance


@pytest.mark.parametrize("call, message", [
    (lambda a, b: tuner.matmul(a, b.t()), "expected a (M×K) and b (K×N)"),
    (lambda a, b: tuner.matmul(a, b.double()), "must share one of"),
    (lambda a, b: tuner.matmul(a, b, torch.empty(3, 3)), "out must be 8×6"),
    (lambda a, b: tuner.matmul(a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)),
     "need scale_a and scale_b"),
    (lambda a, b: tuner.matmul(a, b, scale_a=torch.ones(1), scale_b=torch.ones(1)),
     "take no scale_a/scale_b"),
    (lambda a, b: tuner.linear(a, b), "expected x (..., K) and weight (N×K)"),
    (lambda a, b: tuner.linear(a, b.t(), torch.ones(5)), "bias must be (6,)"),
])
def test_bad_calls_are_one_clear_error(call, message):
    a, b = torch.randn(8, 4), torch.randn(4, 6)
    with pytest.raises((ValueError, TypeError), match=re.escape(message)):
        call(a, b)


def test_linear_fuses_bias_and_keeps_batch_dims(device):
    x = torch.randn(2, 3, 40, device=device, dtype=torch.bfloat16)
    weight = torch.randn(24, 40, device=device, dtype=torch.bfloat16)
    bias = torch.randn(24, device=device, dtype=torch.bfloat16)
    out = tuner.linear(x, weight, bias)
    assert out.shape == (2, 3, 24)
    ref = x.double() @ weight.double().t() + bias.double()
    assert relative_error(out, ref) <= DTYPES["bf16"].tolerance


def test_autograd_goes_through_the_dispatcher(device, monkeypatch):
    calls = []
    compute = dispatch._compute
    monkeypatch.setattr(dispatch, "_compute", lambda gemm: (calls.append(gemm.mnk),
                                                            compute(gemm))[1])
    x = torch.randn(6, 20, device=device, requires_grad=True)
    weight = torch.randn(12, 20, device=device, requires_grad=True)
    bias = torch.randn(12, device=device, requires_grad=True)
    (tuner.linear(x, weight, bias) ** 2).sum().backward()
    grads = [t.grad.clone() for t in (x, weight, bias)]
    for t in (x, weight, bias):
        t.grad = None
    (F.linear(x, weight, bias) ** 2).sum().backward()
    for ours, theirs in zip(grads, (x.grad, weight.grad, bias.grad)):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
    # forward, then grad_x = grad @ W (6×20 from 6×12) and grad_W = grad^T @ x (12×20 from 6)
    assert calls == [(6, 12, 20), (6, 20, 12), (12, 20, 6)]

    a = torch.randn(7, 9, device=device, requires_grad=True)
    b = torch.randn(9, 5, device=device, requires_grad=True)
    tuner.matmul(a, b).sum().backward()
    torch.testing.assert_close(a.grad, torch.ones(7, 5, device=device) @ b.detach().t())
    torch.testing.assert_close(b.grad, a.detach().t() @ torch.ones(7, 5, device=device))


@pytest.mark.slow
def test_torch_compile_fullgraph_traces_the_operators(device):
    """aot_eager traces through the fake implementations and runs the real kernels (the GPU
    test compiles the same model with inductor)."""
    mlp = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.GELU(), torch.nn.Linear(48, 16))
    mlp = mlp.to(device)

    def forward(x):
        h = F.gelu(tuner.linear(x, mlp[0].weight, mlp[0].bias))
        return tuner.linear(h, mlp[2].weight, mlp[2].bias)

    compiled = torch.compile(forward, fullgraph=True, backend="aot_eager")
    x = torch.randn(4, 32, device=device)
    torch.testing.assert_close(compiled(x), mlp(x), rtol=1e-4, atol=1e-4)
    compiled(x).sum().backward()  # and its backward, through the autograd formulas
    assert mlp[0].weight.grad is not None


def test_fake_implementations_give_the_right_metadata():
    with torch._subclasses.fake_tensor.FakeTensorMode():
        a, b = torch.empty(8, 4, dtype=torch.float8_e4m3fn), torch.empty(4, 6,
                                                                         dtype=torch.float8_e4m3fn)
        out = torch.ops.tuner.mm(a, b, torch.ones(1), torch.ones(1), False)
        assert out.shape == (8, 6) and out.dtype == torch.bfloat16
        y = torch.ops.tuner.linear(torch.empty(2, 3, 4), torch.empty(5, 4), None, False)
        assert y.shape == (2, 3, 5)


def test_a_tuned_config_that_cannot_run_falls_back_to_cublas(tmp_path, monkeypatch, device):
    """A split-K config tuned for a bucket that also holds a shape with too few K steps for
    its splits must not be launched there. cuBLAS runs it, with one warning for the key."""
    table = tmp_path / "t.yaml"
    strategy = {"M": "log", "N": "default", "K": "default", "stride_am": "default",
                "stride_bk": "default", "dtype": "default"}
    write_atomic(table, {"format": runtime.TABLE_FORMAT, "ops": {"mm": {
        "strategy": strategy, "entries": [{
            "key": {"M": 2, "N": 24, "K": 32, "stride_am": 32, "stride_bk": 24,
                    "dtype": "fp32"},
            "config": {"variant": "splitk", "pad": 0, "BLOCK_M": 16, "BLOCK_N": 16,
                       "BLOCK_K": 16, "SPLIT_K": 8, "num_stages": 2,
                       "num_warps": 4}}]}}})
    monkeypatch.setenv("TUNE_CONFIG", str(table))
    a, b = torch.randn(2, 32, device=device), torch.randn(32, 24, device=device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = tuner.matmul(a, b)  # SPLIT_K 8 > 2 steps of 16 in K=32: not this config
        tuner.matmul(a, b)
    assert relative_error(out, a.double() @ b.double()) <= DTYPES["fp32"].tolerance
    fallbacks = [str(w.message) for w in caught if "cannot run" in str(w.message)]
    assert len(fallbacks) == 1 and "some splits would get no work" in fallbacks[0]
    assert fallbacks[0].endswith("using cublas")
    assert dispatch.plan(dispatch.Gemm(a, b, out))[1]["variant"] == "cublas"


def test_a_config_the_compiler_refuses_falls_back_to_cublas(tmp_path, monkeypatch, device):
    """A fallback's config can pass the feasibility estimate and still exceed the device's
    shared memory when Triton compiles it (OutOfResources, before anything launches): the
    call is computed by cuBLAS instead, with one warning for the key."""
    from triton.runtime.errors import OutOfResources

    table = tmp_path / "t.yaml"
    write_atomic(table, {"format": runtime.TABLE_FORMAT, "ops": {"mm": {
        "strategy": dict.fromkeys(("M", "N", "K", "stride_am", "stride_bk", "dtype"),
                                  "default"),
        "entries": [{"key": {"M": 32, "N": 32, "K": 32, "stride_am": 32, "stride_bk": 32,
                             "dtype": "fp32"},
                     "config": {"variant": "general", "pad": 0, "BLOCK_M": 16, "BLOCK_N": 16,
                                "BLOCK_K": 16, "GROUP_M": 1, "num_stages": 2,
                                "num_warps": 4}}]}}})
    monkeypatch.setenv("TUNE_CONFIG", str(table))
    prepare = launches.prepare

    def refusing(kernel, config, gemm):
        if config["variant"] != "cublas":
            raise OutOfResources(245784, 232448, "shared memory")
        return prepare(kernel, config, gemm)

    monkeypatch.setattr(launches, "prepare", refusing)
    a, b = torch.randn(32, 32, device=device), torch.randn(32, 32, device=device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = tuner.matmul(a, b)
        again = tuner.matmul(a, b)
    for result in (out, again):
        assert relative_error(result, a.double() @ b.double()) <= DTYPES["fp32"].tolerance
    fallbacks = [str(w.message) for w in caught if "cannot run" in str(w.message)]
    assert len(fallbacks) == 1 and "shared memory, Required: 245784" in fallbacks[0]
    assert fallbacks[0].endswith("using cublas")
    assert dispatch.plan(dispatch.Gemm(a, b, out))[1]["variant"] == "cublas"


def test_a_padded_config_runs_unpadded_on_an_aligned_bucket_mate(tmp_path, monkeypatch,
                                                                  device):
    """align32 puts 64×64×61 and 64×64×64 in one bucket; the padded config tuned for the
    first must not copy operands for the second, which is aligned already."""
    table = tmp_path / "t.yaml"
    strategy = dict.fromkeys(("M", "N", "K", "stride_am", "stride_bk"), "align32") | {
        "dtype": "default"}
    write_atomic(table, {"format": runtime.TABLE_FORMAT, "ops": {"mm": {
        "strategy": strategy, "entries": [{
            "key": {"M": 64, "N": 64, "K": 64, "stride_am": 64, "stride_bk": 64,
                    "dtype": "fp16"},
            "config": {"variant": "general", "pad": 16, "BLOCK_M": 16, "BLOCK_N": 32,
                       "BLOCK_K": 16, "GROUP_M": 2, "num_stages": 2, "num_warps": 4}}]}}})
    monkeypatch.setenv("TUNE_CONFIG", str(table))
    for k, pad in ((61, 16), (64, 0)):
        a, b = random_operands(Shape(64, 64, k, "fp16", "nn"), device, seed=k)
        out = tuner.matmul(a, b)
        assert relative_error(out, a.double() @ b.double()) <= DTYPES["fp16"].tolerance
        _, config = dispatch.plan(dispatch.Gemm(a, b, out))
        assert config["pad"] == pad


class TorchReplay:
    """Stands in for a kernels.launches.Replay (the interpreter compiles nothing to replay):
    computes out = a @ b (+ bias) with torch from the operands it is handed, and logs them."""

    def __init__(self, log: list):
        self.log = log

    def __call__(self, operands):
        a, b, out, bias, _, _ = operands
        self.log.append(operands)
        b = b.t() if b.shape[0] == out.shape[-1] and a.shape[-1] != b.shape[0] else b
        product = a.reshape(-1, a.shape[-1]).double() @ b.double()
        out.copy_((product if bias is None else product + bias.double()).view(out.shape))

    def issue(self, *operands):
        self(operands)


@pytest.fixture
def torch_replays(monkeypatch) -> list:
    """Every call key gets a TorchReplay; returns the log of the operands replays were given."""
    log = []
    monkeypatch.setattr(launches.Replay, "of", classmethod(lambda cls, recorded, ops:
                                                           TorchReplay(log)))
    return log


def counting_compute(monkeypatch) -> list:
    calls = []
    compute = dispatch._compute
    monkeypatch.setattr(dispatch, "_compute", lambda gemm: (calls.append(gemm.mnk),
                                                            compute(gemm))[1])
    return calls


def test_a_repeated_signature_skips_validation_and_replays_its_own_operands(
        torch_replays, monkeypatch):
    """The second call of a signature goes straight to the replay, with its own tensors:
    neither the checks nor the dispatcher's plan lookup run again."""
    computed = counting_compute(monkeypatch)
    weight, bias = torch.randn(24, 40), torch.randn(24)
    for seed in range(3):
        x = torch.randn(2, 3, 40, generator=torch.Generator().manual_seed(seed))
        out = tuner.linear(x, weight, bias)
        assert out.shape == (2, 3, 24)
        torch.testing.assert_close(out, F.linear(x, weight, bias))
    assert computed == [(6, 24, 40)]
    assert [ops[0] is not None and ops[1] is weight and ops[3] is bias
            for ops in torch_replays] == [True, True]

    a, b, out = torch.randn(5, 7), torch.randn(7, 3), torch.empty(5, 3)
    for _ in range(2):
        assert tuner.matmul(a, b, out) is out
        torch.testing.assert_close(out, a @ b)
    assert computed == [(6, 24, 40), (5, 3, 7)]
    assert all(given is mine for given, mine in zip(torch_replays[-1], (a, b, out)))


def test_what_changes_the_signature_or_forbids_a_replay(torch_replays, monkeypatch):
    computed = counting_compute(monkeypatch)
    weight = torch.randn(8, 16)
    storage = torch.randn(40)
    tuner.linear(storage[:16], weight)
    tuner.linear(storage[1:17], weight)  # 4 bytes further: not 16-byte aligned
    assert len(computed) == 2 and not torch_replays
    tuner.linear(storage[:16].half(), weight.half())  # another dtype
    assert len(computed) == 3

    # A transposed 3-D x reshapes by copying: a replay must read the copy, not x, so every
    # call takes the full path (which replays the launches on the copy).
    x = torch.randn(4, 3, 16).transpose(0, 1)
    for _ in range(2):
        torch.testing.assert_close(tuner.linear(x, weight), F.linear(x, weight))
    assert len(computed) == 5
    ((copy, *_),) = torch_replays
    assert copy.shape == (12, 16) and copy.data_ptr() != x.data_ptr()

    # A call that autograd must record goes through the operator, signature seen or not.
    x = torch.randn(3, 16)
    tuner.linear(x, weight)
    weight.requires_grad_(True)
    tuner.linear(x, weight).sum().backward()
    assert weight.grad is not None and len(computed) == 8  # forward, grad_w (grad_x unused)

    # So does an `out` that requires grad, though a plain one of its signature replays.
    a, b, out = torch.randn(5, 16), torch.randn(16, 3), torch.empty(5, 3)
    tuner.matmul(a, b, out)
    operator_calls = []
    monkeypatch.setattr(dispatch, "_mm_out", lambda *args: operator_calls.append(args))
    tuner.matmul(a, b, out.requires_grad_(True))
    assert len(operator_calls) == 1
