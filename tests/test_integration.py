"""`tuner.enable` / `disable` / `enabled` and `tuner.patch` / `unpatch`: which calls reach the
dispatcher, that every other call goes to torch unchanged, and which calls enter Python.

The routing is tested on CPU (devices=("cpu",)); the kernels run in Triton's interpreter, as
in test_dispatch.py. Each dispatcher call is counted by a counting `tuner.fronts.front`, each
time a hook enters Python by `entries`, with the compiled hooks and with the Python ones a
machine without a compiler gets (`hooks`).
"""
import os
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tuner
from tests.factories import captured_and_replayed
from tuner import fronts, integration, routing, runtime
from tuner.runtime import dispatch, fastpath

CPU = ("cpu",)


@pytest.fixture(autouse=True)
def routing_off(triton_answers):
    """Our kernels answer (conftest's triton_answers); routing off after each test."""
    yield
    tuner.disable()


@pytest.fixture
def calls(monkeypatch) -> Counter:
    """How often the routing called tuner.matmul and tuner.linear (by name)."""
    counts = Counter()
    real = fronts.front

    def counting_front(name):
        function = real(name)

        def counted(*args, **kwargs):
            counts[name] += 1
            return function(*args, **kwargs)
        return counted

    monkeypatch.setattr(fronts, "front", counting_front)
    return counts


@pytest.fixture(params=["compiled", "python"])
def hooks(request, monkeypatch) -> str:
    """Which hooks `enable` installs: the compiled ones (tuner/runtime/fastpath.cpp) or the
    Python ones it falls back to where that cannot be built."""
    if request.param == "python":
        monkeypatch.setattr(fastpath, "install_hooks", lambda keys, routes: False)
    elif os.environ.get("TUNE_FASTPATH") == "0":
        pytest.skip("TUNE_FASTPATH=0: nothing compiled")
    return request.param


@pytest.fixture
def entries(hooks, monkeypatch) -> Counter:
    """How often the hooks entered Python, by aten op: the compiled hooks call tuner.routing
    for a call whose route they do not remember; a Python hook is Python for every call."""
    counts = Counter()
    if hooks == "python":
        real_hook = integration._python_hook

        def counting_hook(kept, route):
            hook = real_hook(kept, route)

            def counted(keyset, *args, **kwargs):
                counts[route.__name__] += 1
                return hook(keyset, *args, **kwargs)
            return counted
        monkeypatch.setattr(integration, "_python_hook", counting_hook)
        return counts
    def counting_route(op):
        route = getattr(routing.Routes, op)

        def counted(self, *args):
            counts[op] += 1
            return route(self, *args)
        return counted
    for op in integration.HOOKED_OPS:
        monkeypatch.setattr(routing.Routes, op, counting_route(op))
    return counts


@pytest.fixture
def cublas_answers(monkeypatch):
    """No table: every key the tuner takes is answered cuBLAS."""
    monkeypatch.setattr(dispatch, "get_tuned_config", runtime.get_tuned_config)
    dispatch.clear_cache()


def close(actual, expected):
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)


def test_linear_and_matmul_on_routed_devices_reach_the_dispatcher(calls):
    x2, x3, weight, bias = (torch.randn(5, 16), torch.randn(2, 3, 16), torch.randn(8, 16),
                            torch.randn(8))
    a, b = torch.randn(4, 6), torch.randn(6, 7)
    expected = [F.linear(x2, weight, bias), F.linear(x2, weight), F.linear(x3, weight, bias),
                F.linear(x3, weight), a @ b, torch.bmm(x3, weight.t().expand(2, 16, 8))]
    with tuner.enabled(CPU):
        actual = [F.linear(x2, weight, bias), F.linear(x2, weight), F.linear(x3, weight, bias),
                  F.linear(x3, weight), a @ b, torch.bmm(x3, weight.t().expand(2, 16, 8))]
    assert calls == {"linear": 2, "matmul": 4}
    for out, ref in zip(actual, expected):
        close(out, ref)


@pytest.mark.parametrize("call", [
    lambda: torch.randn(3, 4, dtype=torch.float64) @ torch.randn(4, 5, dtype=torch.float64),
    lambda: torch.ones(3, 4, dtype=torch.int64) @ torch.ones(4, 5, dtype=torch.int64),
    lambda: torch.randn(2, 3, 4) @ torch.randn(2, 4, 5),  # separate GEMMs
    lambda: torch.randn(2, 2, 3, 4) @ torch.randn(2, 2, 4, 5),
    lambda: torch.randn(6, 4).view(2, 3, 4).transpose(0, 1) @ torch.randn(4, 5),  # no fold
    lambda: torch.addmm(torch.randn(3, 5), torch.randn(3, 4), torch.randn(4, 5)),
    lambda: torch.addmm(torch.randn(5), torch.randn(3, 4), torch.randn(4, 5), beta=2),
], ids=["fp64", "int64", "bmm", "4-D", "3-D-unfolded", "addmm-matrix", "addmm-beta"])
def test_calls_the_tuner_does_not_take_go_to_torch_unchanged(call, calls):
    torch.manual_seed(0)
    expected = call()
    torch.manual_seed(0)
    with tuner.enabled(CPU):
        actual = call()
    assert calls == {}
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)


def test_devices_not_routed_go_to_torch(calls):
    a, b = torch.randn(4, 6), torch.randn(6, 7)
    with tuner.enabled():  # CUDA only: these CPU tensors are not routed
        torch.testing.assert_close(a @ b, torch.mm(a, b), rtol=0, atol=0)
    assert calls == {}


def test_autograd_stays_torchs_and_its_gemms_are_routed_too(calls):
    x = torch.randn(5, 16, requires_grad=True)
    weight = torch.randn(8, 16, requires_grad=True)
    bias = torch.randn(8, requires_grad=True)
    grad = torch.randn(5, 8)
    F.linear(x, weight, bias).backward(grad)
    expected = [t.grad for t in (x, weight, bias)]
    for t in (x, weight, bias):
        t.grad = None
    with tuner.enabled(CPU):
        out = F.linear(x, weight, bias)
        assert out.grad_fn is not None
        out.backward(grad)
    assert calls == {"linear": 1, "matmul": 2}  # the forward, then grad @ W and grad^T @ x
    for actual, ref in zip((x.grad, weight.grad, bias.grad), expected):
        close(actual, ref)


def test_a_key_answered_by_cublas_reaches_torch_without_looping(cublas_answers, calls,
                                                                 hooks, entries):
    """The tuner runs the first call of the key; later calls go from the hook to torch's
    kernel, never through aten (and so the hook) a second time: the compiled hooks without
    entering Python, the Python ones once per call."""
    x, weight, bias = torch.randn(5, 16), torch.randn(8, 16), torch.randn(8)
    a, b = torch.randn(4, 16), torch.randn(16, 6)
    expected = F.linear(x, weight, bias), a @ b
    with tuner.enabled(CPU):
        for _ in range(3):  # the first call, then the repeated ones
            close(F.linear(x, weight, bias), expected[0])
            close(a @ b, expected[1])
    assert calls == {"linear": 1, "matmul": 1}
    assert entries == ({"addmm": 1, "mm": 1} if hooks == "compiled" else {"addmm": 3, "mm": 3})
    assert sorted(c.config["variant"] for c in dispatch._CALLS.values()) == ["cublas"] * 2


@pytest.mark.parametrize("call", [
    lambda: torch.randn(3, 4, dtype=torch.float64) @ torch.randn(4, 5, dtype=torch.float64),
    lambda: torch.addmm(torch.randn(3, 5), torch.randn(3, 4), torch.randn(4, 5)),
    lambda: torch.randn(2, 3, 4) @ torch.randn(2, 4, 5),
], ids=["mm-fp64", "addmm-matrix", "bmm"])
def test_a_call_not_taken_enters_python_once_per_signature(call, hooks, entries, calls):
    expected = []
    for seed in range(3):
        torch.manual_seed(seed)
        expected.append(call())
    with tuner.enabled(CPU):
        for seed in range(3):
            torch.manual_seed(seed)
            torch.testing.assert_close(call(), expected[seed], rtol=0, atol=0)
    assert sum(entries.values()) == (1 if hooks == "compiled" else 3)
    assert calls == {}


def test_the_hooks_remember_routes_up_to_the_bound(calls, hooks, monkeypatch):
    """Calls the tuner does not take, each of a new shape, leave at most MAX_SIGNATURES
    routes remembered, and still run torch's kernel."""
    if hooks == "python":
        pytest.skip("the Python hooks remember nothing")
    monkeypatch.setattr(dispatch, "MAX_SIGNATURES", 4)
    b = torch.randn(16, 6, dtype=torch.float64)
    tuner.enable(CPU)
    for m in range(1, 12):
        a = torch.randn(m, 16, dtype=torch.float64)
        assert torch.equal(a @ b, torch.mm(a, b))
        assert fastpath._module.routes_size() <= 4
    assert calls == {}


def test_remembered_routes_are_forgotten_with_the_plans_and_on_enable(
        cublas_answers, calls, hooks, entries, monkeypatch):
    """A new table or $TUNE_EXCLUDE (dispatch.clear_cache), enabling or disabling, and a TF32
    switch (part of an fp32 call's signature) each send the next call to Python again."""
    if hooks == "python":
        pytest.skip("the Python hooks remember nothing")
    a, b = torch.randn(4, 16), torch.randn(16, 6)
    expected = torch.mm(a.double(), b.double()).float()
    tuner.enable(CPU)
    a @ b, a @ b
    assert entries == {"mm": 1} and fastpath._module.routes_size() == 1
    dispatch.clear_cache()
    assert fastpath._module.routes_size() == 0
    a @ b, a @ b
    assert entries == {"mm": 2}
    tuner.disable()
    tuner.enable(CPU)
    a @ b, a @ b
    assert entries == {"mm": 3}
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", True)
    a @ b
    assert entries == {"mm": 4}
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    a @ b
    assert entries == {"mm": 4} and calls == {"matmul": 3}
    monkeypatch.setenv("TUNE_EXCLUDE", "cublas")  # Triton answers, run by the interpreter:
    dispatch.clear_cache()  # nothing to replay, so each call goes to the tuner
    for _ in range(2):
        close(a @ b, expected)
    assert entries == {"mm": 6} and calls == {"matmul": 5}


def test_a_remembered_replay_runs_the_launches_into_a_new_output(hooks, entries):
    """What the compiled hooks do for a key answered by a Triton config (on a GPU, where its
    launches are recorded): issue(a, b, out, bias, None, None) into a new output, this
    thread's GEMMs going to torch meanwhile. Here the launches are a stand-in."""
    if hooks == "python":
        pytest.skip("the Python hooks remember nothing")
    issued = []

    def issue(a, b, out, bias, scale_a, scale_b):
        issued.append((a, b, bias, scale_a, scale_b))
        out.copy_(torch.addmm(bias, a, b) if bias is not None else a @ b)  # not routed again

    a, b, c = torch.randn(4, 16), torch.randn(16, 6), torch.randn(6)
    a2, b2, c2 = torch.randn_like(a), torch.randn_like(b), torch.randn_like(c)
    expected = a2 @ b2, torch.addmm(c2, a2, b2)
    tuner.enable(CPU)
    fastpath.remember_route("mm", (a, b), (issue, torch.empty(4, 6)))
    fastpath.remember_route("addmm", (c, a, b, 1, 1), (issue, torch.empty(4, 6)))
    close(a2 @ b2, expected[0])
    close(torch.addmm(c2, a2, b2), expected[1])
    assert [[t is u for t, u in zip(args, want)] for args, want in zip(issued, [
        (a2, b2, None, None, None), (a2, b2, c2, None, None)])] == [[True] * 5] * 2
    assert entries == {}


def test_an_error_raised_in_python_reaches_the_caller(hooks, monkeypatch):
    def refuse(self, a, b):
        raise ValueError("no route today")
    monkeypatch.setattr(routing.Routes, "mm", refuse)
    with tuner.enabled(CPU), pytest.raises(ValueError, match="no route today"):
        torch.randn(4, 6) @ torch.randn(6, 7)


def test_enable_disable_and_enabled_nest(calls):
    a, b = torch.randn(4, 6), torch.randn(6, 7)
    tuner.enable(CPU)
    a @ b
    with tuner.enabled(CPU):
        a @ b
    a @ b  # still enabled: the block restored what was before it
    tuner.disable()
    tuner.disable()  # twice is fine
    a @ b
    with tuner.enabled(CPU):
        a @ b
    a @ b
    assert calls == {"matmul": 4}
    with pytest.raises(ValueError, match="devices must name some of cuda, cpu"):
        tuner.enable(("tpu",))


class OwnForward(nn.Linear):
    def forward(self, input):
        return super().forward(input) * 2


def test_patch_switches_each_linear_over_and_unpatch_restores_exactly(calls):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4, bias=False),
                          OwnForward(4, 4))
    hooked = nn.Linear(4, 4)
    hooked.forward = lambda input: input  # e.g. accelerate's hook: not ours to replace
    model.append(hooked)
    x = torch.randn(2, 3, 16)
    expected = model(x)
    with tuner.patch(model, devices=CPU) as patched:
        assert patched.modules == [model[0], model[2]]
        close(model(x), expected)
        assert calls == {"linear": 2}
        with torch.no_grad():
            model.double()(x.double())  # fp64: F.linear
        assert calls == {"linear": 2}
        model.float()
    assert ["forward" in vars(m) for m in model] == [False, False, False, False, True]
    tuner.patch(model)
    close(model(x), expected)  # default devices: CPU inputs take F.linear
    assert calls == {"linear": 2}
    tuner.unpatch(model)
    assert ["forward" in vars(m) for m in model] == [False, False, False, False, True]


@pytest.mark.slow
def test_a_patched_model_compiles_without_a_graph_break(calls):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4))
    x = torch.randn(5, 16)
    expected = model(x)
    integration.patch(model, devices=CPU)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    close(compiled(x), expected)


def _mlp_and_input(seed: int):
    """A bf16 two-layer MLP on the GPU and a batch of (batch, tokens, features) inputs."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 256, bias=False))
    return model.to("cuda", torch.bfloat16), torch.randn(4, 24, 256, device="cuda",
                                                        dtype=torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("seed", [0, 1])
def test_an_enabled_or_patched_model_on_the_gpu_matches_stock(calls, seed):
    """On CUDA, with Triton answers: enabled and patched forwards agree with torch's within
    bf16 tolerance, gradients under enable with torch's, and an enabled forward captured in a
    CUDA graph replays what it computes eagerly."""
    model, x = _mlp_and_input(seed)
    stock = model(x)
    with tuner.enabled():
        routed = model(x)
    assert calls["linear"] + calls["matmul"] >= 2
    torch.testing.assert_close(routed, stock, rtol=2e-2, atol=2e-2)
    with tuner.patch(model):
        patched = model(x)
    torch.testing.assert_close(patched, stock, rtol=2e-2, atol=2e-2)

    x.requires_grad_(True)
    model(x).float().square().mean().backward()
    expected = [x.grad.clone()] + [p.grad.clone() for p in model.parameters()]
    x.grad = None
    model.zero_grad()
    with tuner.enabled():
        model(x).float().square().mean().backward()
    for got, want in zip([x.grad] + [p.grad for p in model.parameters()], expected):
        torch.testing.assert_close(got, want, rtol=5e-2, atol=5e-2)

    x = x.detach()
    with tuner.enabled(), torch.no_grad():
        eager = model(x)
        captured = captured_and_replayed(lambda: model(x))
    torch.testing.assert_close(captured, eager, rtol=0, atol=0)


@pytest.mark.gpu
def test_repeated_gpu_calls_are_served_by_the_compiled_hooks_alone(hooks, entries):
    """On CUDA, with Triton answers: once each signature's first call ran, a forward replays
    the recorded launches from the hooks without tuner.routing, and computes the same."""
    if hooks == "python":
        pytest.skip("the Python hooks remember nothing")
    model, x = _mlp_and_input(0)
    with tuner.enabled(), torch.no_grad():
        first = model(x)
        entered = sum(entries.values())
        again = model(x)
    assert entered >= 2 and sum(entries.values()) == entered
    assert fastpath._module.routes_size() == 0  # leaving the block forgot them
    torch.testing.assert_close(again, first, rtol=0, atol=0)
