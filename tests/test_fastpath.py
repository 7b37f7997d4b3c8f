"""The compiled front of `tuner.matmul` and `tuner.linear` (tuner/runtime/fastpath.cpp): a
repeated call of a remembered signature never enters Python; everything else does.

The build needs a C++ compiler, which CI and the GPU image have: these tests fail, not skip,
where it is missing, unless TUNE_FASTPATH=0 asks for the Python functions.
"""
import inspect
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

import tuner
from tuner.runtime import dispatch, fastpath

pytestmark = pytest.mark.skipif(os.environ.get("TUNE_FASTPATH") == "0",
                                reason="TUNE_FASTPATH=0: the Python functions are in front")


@pytest.fixture(autouse=True)
def cuBLAS_answers(monkeypatch):
    """No table: every key is answered `cublas`, which the compiled front runs itself."""
    monkeypatch.delenv("TUNE_CONFIG", raising=False)
    dispatch.clear_cache()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield
    dispatch.clear_cache()


def python_path_fails(monkeypatch):
    """From here on, any call that reaches the Python dispatcher raises."""
    def refuse(*args):
        raise AssertionError("the Python dispatcher was called")
    monkeypatch.setattr(dispatch, "_described", refuse)


def test_the_compiled_functions_are_in_front():
    front = tuner.matmul, tuner.linear
    assert fastpath._module is not None, "fastpath.cpp did not build"
    assert front == (fastpath._module.matmul, fastpath._module.linear)
    assert str(inspect.signature(tuner.linear)) == "(x, weight, bias=None, *, allow_tf32=False)"


def test_repeated_calls_never_enter_python(monkeypatch):
    a, b = torch.randn(4, 16), torch.randn(16, 6)
    x, weight, bias = torch.randn(3, 5, 16), torch.randn(8, 16), torch.randn(8)
    tuner.matmul(a, b), tuner.linear(x, weight, bias), tuner.linear(x[0], weight)
    out = torch.empty(4, 6)
    tuner.matmul(a, b, out)
    assert fastpath._module.size() == 4
    python_path_fails(monkeypatch)
    for seed in range(3):
        torch.manual_seed(seed)
        a, b, x = torch.randn(4, 16), torch.randn(16, 6), torch.randn(3, 5, 16)
        torch.testing.assert_close(tuner.matmul(a, b), a @ b)
        torch.testing.assert_close(tuner.linear(x, weight, bias), F.linear(x, weight, bias))
        torch.testing.assert_close(tuner.linear(x[0], weight), F.linear(x[0], weight))
        assert tuner.matmul(a, b, out=out) is out
        torch.testing.assert_close(out, a @ b)


@pytest.mark.parametrize("call", [
    lambda a, b: tuner.matmul(a, b.t().contiguous().t()),  # another stride
    lambda a, b: tuner.matmul(a.double(), b.double()),  # another dtype
    lambda a, b: tuner.matmul(torch.randn(65)[1:].view(4, 16), b),  # 4 bytes off
    lambda a, b: tuner.matmul(a.requires_grad_(), b),  # autograd to record
    lambda a, b: tuner.matmul(a, b, allow_tf32=True),
    lambda a, b: tuner.matmul(a, b=b),  # an argument by a name this path leaves to Python
], ids=["strides", "dtype", "alignment", "autograd", "allow_tf32", "keyword-b"])
def test_what_the_signature_does_not_match_goes_to_python(call, monkeypatch):
    a, b = torch.randn(4, 16), torch.randn(16, 6)
    tuner.matmul(a, b)
    python_path_fails(monkeypatch)
    with pytest.raises(AssertionError, match="Python dispatcher"):
        call(a, b)


def test_subclasses_and_dispatch_modes_go_to_python(monkeypatch):
    from torch.utils._python_dispatch import TorchDispatchMode

    class Traced(torch.Tensor):
        pass

    class Passing(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    a, b = torch.randn(4, 16), torch.randn(16, 6)
    tuner.matmul(a, b)
    python_path_fails(monkeypatch)
    with pytest.raises(AssertionError, match="Python dispatcher"):
        tuner.matmul(a.as_subclass(Traced), b)
    with Passing(), pytest.raises(AssertionError, match="Python dispatcher"):
        tuner.matmul(a, b)


def test_errors_are_the_python_functions_own():
    a = torch.randn(4, 16)
    with pytest.raises(ValueError, match=r"matmul: expected a \(M×K\) and b \(K×N\)"):
        tuner.matmul(a, a)
    with pytest.raises(TypeError, match="unexpected keyword"):
        tuner.linear(a, a, bogus=1)
    with pytest.raises(TypeError, match="multiple values"):
        tuner.linear(a, a, None, bias=None)


def test_a_replayed_signature_fills_a_new_output_through_its_issue_function():
    """A Replay action: the compiled front allocates an output like the example and hands
    issue(a, b, out, bias, scale_a, scale_b) every operand; an error inside comes back."""
    seen = []

    def issue(a, b, out, bias, scale_a, scale_b):
        seen.append((a, b, bias, scale_a, scale_b))
        if a.shape[0] == 0:
            raise RuntimeError("launch failed")
        out.copy_(a @ b)

    a, b, bias = torch.randn(4, 16), torch.randn(16, 6), torch.randn(6)
    operands = (a, b, None, None, None, None)
    assert fastpath._module.remember("matmul", (issue, torch.empty(4, 6)), operands, False)
    assert not fastpath._module.remember("matmul", None, operands, False)  # kept the first
    got = tuner.matmul(a, b)
    torch.testing.assert_close(got, a @ b)
    assert seen[-1][0] is a and seen[-1][1] is b and seen[-1][2:] == (None, None, None)
    weight = torch.randn(6, 16)
    fastpath._module.remember("linear", (issue, torch.empty(4, 6)),
                              (a, weight.t(), None, bias, None, None), False)
    tuner.linear(a, weight.t(), bias)
    assert seen[-1][2] is bias
    empty, e_b = torch.empty(0, 16), torch.randn(16, 6)
    fastpath._module.remember("matmul", (issue, torch.empty(0, 6)),
                              (empty, e_b, None, None, None, None), False)
    with pytest.raises(RuntimeError, match="launch failed"):
        tuner.matmul(empty, e_b)


def test_clear_cache_forgets_the_compiled_signatures():
    tuner.matmul(torch.randn(4, 16), torch.randn(16, 6))
    assert fastpath._module.size() == 1
    dispatch.clear_cache()
    assert fastpath._module.size() == 0


def test_ever_new_shapes_are_remembered_up_to_the_bound(monkeypatch):
    """A caller whose every call has a new shape (serving's every M, a fuzzer) keeps at most
    MAX_SIGNATURES plans and compiled signatures: past it, all are forgotten and decided
    again, and the answers stay right."""
    monkeypatch.setattr(dispatch, "MAX_SIGNATURES", 4)
    b = torch.randn(16, 6)
    for m in range(1, 12):
        a = torch.randn(m, 16)
        torch.testing.assert_close(tuner.matmul(a, b), a @ b)
        assert len(dispatch._CALLS) <= 4 and fastpath._module.size() <= 4
    assert len(dispatch._MATMUL_REPEATS) <= 4


def test_torch_compile_traces_the_python_function():
    weight = torch.randn(8, 16)
    compiled = torch.compile(lambda x: tuner.linear(x, weight).relu(), fullgraph=True,
                             backend="aot_eager")
    x = torch.randn(4, 16)
    torch.testing.assert_close(compiled(x), F.linear(x, weight).relu())


@pytest.mark.slow
@pytest.mark.parametrize("setting, front", [("0", "python"), ("1", "compiled")])
def test_tune_fastpath_chooses_the_front(setting, front):
    check = ("import tuner, types\n"
             "print('python' if isinstance(tuner.matmul, types.FunctionType) else 'compiled')")
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                          env={**os.environ, "TUNE_FASTPATH": setting}, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [front]


def test_a_failed_build_warns_once_and_leaves_python_in_front(monkeypatch):
    from torch.utils import cpp_extension

    def broken(**kwargs):
        raise RuntimeError("Error building extension 'x'\nlong log")
    monkeypatch.setattr(cpp_extension, "load", broken)
    monkeypatch.setattr(fastpath, "_loaded", False)
    monkeypatch.setattr(fastpath, "_module", None)
    with pytest.warns(RuntimeWarning, match=r"could not build fastpath.cpp \(Error building "
                                            r"extension 'x'\); tuner.matmul and tuner.linear "
                                            r"run in Python"):
        assert fastpath.front("matmul", dispatch.matmul) is dispatch.matmul


def test_a_build_says_so_once_beforehand_and_a_cached_load_says_nothing(
        monkeypatch, tmp_path, capsys):
    from torch.utils import cpp_extension

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    built = []

    def build(name, **kwargs):  # stands for the build: leaves the module where torch would
        (tmp_path / name / f"{name}.so").write_text("")
        built.append(name)
        raise RuntimeError("stub")  # the Python functions stay in front
    monkeypatch.setattr(cpp_extension, "load", build)
    for _ in range(2):
        monkeypatch.setattr(fastpath, "_loaded", False)
        monkeypatch.setattr(fastpath, "_module", None)
        with pytest.warns(RuntimeWarning, match="stub"):
            fastpath.front("matmul", dispatch.matmul)
    assert len(built) == 2  # the second load found the first's module in the cache
    said = capsys.readouterr().err.splitlines()
    assert said == ["gemm-tuner: building the compiled front of tuner.matmul/linear (once, "
                    "~1 min; TUNE_FASTPATH=0 skips it) ..."]
