"""The public functions given what a careless caller passes: each wrong argument is an error
naming it, valid edge cases answer as torch does, and an environment that cannot run the
answer says what to do in one line."""
import os
import warnings

import numpy as np
import pytest
import torch

import tuner
from tuner import runtime
from tuner.formats.files import write_atomic

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="CPU calls of Triton configs need the interpreter")

A, B = torch.randn(8, 16), torch.randn(16, 4)


@pytest.mark.parametrize("args, kwargs, words", [
    (([[1.0]], B), {}, "matmul: a must be a torch.Tensor, got list"),
    ((A, np.ones((16, 4), np.float32)), {}, "matmul: b must be a torch.Tensor, got ndarray"),
    ((None, B), {}, "matmul: a must be a torch.Tensor, got NoneType"),
    ((A, B, [0.0]), {}, "matmul: out must be a torch.Tensor or None, got list"),
    ((A, B), {"scale_a": 1.0}, "matmul: scale_a must be a torch.Tensor or None, got float"),
], ids=["list", "numpy", "none", "out", "scale"])
def test_matmul_names_an_argument_that_is_not_a_tensor(args, kwargs, words):
    with pytest.raises(TypeError, match=words):
        tuner.matmul(*args, **kwargs)


@pytest.mark.parametrize("args, words", [
    (([[1.0]], B.t()), "linear: x must be a torch.Tensor, got list"),
    ((A, None), "linear: weight must be a torch.Tensor, got NoneType"),
    ((A, B.t(), np.zeros(4)), "linear: bias must be a torch.Tensor or None, got ndarray"),
], ids=["x", "weight", "bias"])
def test_linear_names_an_argument_that_is_not_a_tensor(args, words):
    with pytest.raises(TypeError, match=words):
        tuner.linear(*args)


def test_a_tensor_call_after_a_refused_one_still_runs():
    with pytest.raises(TypeError):
        tuner.matmul(A.tolist(), B)
    torch.testing.assert_close(tuner.matmul(A, B), A @ B)


@pytest.mark.parametrize("bias", [None, torch.randn(7)], ids=["no-bias", "bias"])
def test_linear_with_k_zero_gives_the_bias_as_torch_does(bias):
    x, weight = torch.randn(3, 5, 0), torch.randn(7, 0)
    for _ in range(2):  # the first call, then the remembered one
        got = tuner.linear(x, weight, bias)
        assert torch.equal(got, torch.nn.functional.linear(x, weight, bias))


def test_matmul_with_k_zero_gives_zeros():
    assert torch.equal(tuner.matmul(torch.randn(4, 0), torch.randn(0, 6)), torch.zeros(4, 6))


def test_a_string_of_variants_to_leave_out_is_a_type_error():
    with pytest.raises(TypeError, match="variants must be a collection of variant names, e.g. "
                                        r"\('cublas',\), got 'cublas'"):
        runtime.get_tuned_config_without("cublas", "mm", M=64, N=64, K=64, dtype="bf16",
                                         stride_am=64, stride_bk=64)


@pytest.fixture
def triton_table(tmp_path, monkeypatch):
    """$TUNE_CONFIG: a table answering fp32 64x64x64 with a Triton config."""
    from tuner.runtime import dispatch

    key = {"M": 64, "N": 64, "K": 64, "stride_am": 64, "stride_bk": 64, "dtype": "fp32"}
    config = {"variant": "general", "pad": 0, "BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32,
              "GROUP_M": 1, "num_stages": 2, "num_warps": 4}
    write_atomic(tmp_path / "t.yaml", {"format": runtime.TABLE_FORMAT, "ops": {"mm": {
        "strategy": dict.fromkeys(key, "default"), "entries": [{"key": key, "config": config}]}}})
    monkeypatch.setenv("TUNE_CONFIG", str(tmp_path / "t.yaml"))
    dispatch.clear_cache()
    yield
    dispatch.clear_cache()


def test_cpu_tensors_with_a_triton_answer_and_no_interpreter_say_what_to_do(triton_table,
                                                                            monkeypatch):
    monkeypatch.setattr("tuner.runtime.dispatch.INTERPRETED", False)
    a = torch.randn(64, 64)
    with pytest.raises(RuntimeError, match="gemm-tuner: the mm config for 64x64x64 on CPU "
                                           "tensors is the Triton kernel general, and Triton "
                                           "runs on the CPU only in its interpreter: set "
                                           "TRITON_INTERPRET=1"):
        tuner.matmul(a, a)


def test_cpu_tensors_with_a_triton_answer_run_in_the_interpreter(triton_table):
    a = torch.randn(64, 64)
    torch.testing.assert_close(tuner.matmul(a, a), a @ a, atol=1e-3, rtol=1e-3)


@pytest.fixture
def online_expand(tmp_path, monkeypatch):
    import yaml

    doc = {"mm_general_tma": [{"config": None, "param_map": {
        "META": {"BLOCK_M": "block_m", "BLOCK_N": "block_n", "BLOCK_K": "block_k"},
        "num_stages": "stages", "num_warps": "warps"}, "block_m": [32], "block_n": [32],
        "block_k": [32], "stages": [2], "warps": [4]}, {"strategy": {}}]}
    path = tmp_path / "e.yaml"
    path.write_text("# device: NVIDIA H100 80GB HBM3\n" + yaml.safe_dump(doc))
    monkeypatch.setenv("TUNE_ONLINE", "1")
    monkeypatch.setenv("TUNE_ONLINE_CACHE", str(tmp_path / "cache.yaml"))
    runtime.clear_cache()
    yield path
    runtime.clear_cache()


def ask(path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return runtime.get_tuned_config("mm", M=64, N=64, K=64, dtype="bf16", stride_am=64,
                                        stride_bk=64, path=path)


def test_online_tuning_without_a_gpu_or_the_interpreter_is_one_line(online_expand,
                                                                     monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="TUNE_ONLINE=1 times candidates on this process's "
                                           "GPU, and torch sees none"):
        ask(online_expand)
    assert sorted(p.name for p in online_expand.parent.iterdir()) == ["e.yaml"]


@pytest.mark.parametrize("value", ["abc", "0", "-3", "1e3"])
def test_a_bad_online_top_k_names_the_variable(online_expand, monkeypatch, value):
    monkeypatch.setenv("TUNE_ONLINE_TOP_K", value)
    with pytest.raises(ValueError, match=f"TUNE_ONLINE_TOP_K='{value}': expected a positive "
                                         "integer"):
        ask(online_expand)


def _own(shape):
    return torch.randn(*shape)


@pytest.mark.parametrize("make, words", [
    (lambda: (lambda x: (x, _own((64, 64)), x))(_own((64, 64))),
     "matmul: out shares memory with a or b"),
    (lambda: (lambda y: (_own((64, 64)), y, y))(_own((64, 64))),
     "matmul: out shares memory with a or b"),
    (lambda: (lambda buf: (buf[:64], _own((64, 64)), buf[32:96]))(_own((128, 64))),
     "matmul: out shares memory with a or b"),
    (lambda: (_own((64, 64)), _own((64, 64)), torch.empty(1, 64).expand(64, 64)),
     r"matmul: out has elements sharing memory \(strides \(0, 1\)\)"),
], ids=["out-is-a", "out-is-b", "out-overlaps-a", "out-expanded"])
def test_an_out_sharing_memory_is_refused_not_computed_wrong(triton_table, make, words):
    a, b, out = make()
    with pytest.raises(ValueError, match=words):
        tuner.matmul(a, b, out=out)


def test_an_out_beside_its_inputs_in_one_buffer_is_fine(triton_table):
    buf, b = torch.randn(128, 64), torch.randn(64, 64)
    expected = buf[:64] @ b
    tuner.matmul(buf[:64], b, out=buf[64:])
    torch.testing.assert_close(buf[64:], expected, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("path, words", [(5, r"got 5 \(int\)"), (["t.yaml"], r"got \[.t.yaml.\]")],
                         ids=["int", "list"])
def test_a_path_that_is_no_path_is_a_type_error_naming_it(path, words):
    with pytest.raises(TypeError, match=f"gemm-tuner: path must be a table file's path .*{words}"):
        runtime.get_tuned_config("mm", M=64, N=64, K=64, dtype="bf16", stride_am=64,
                                 stride_bk=64, path=path)


@pytest.mark.parametrize("variants, words", [(["cublass"], "cublass"), ([1], "1")],
                         ids=["typo", "int"])
def test_unknown_variants_to_leave_out_are_named(variants, words):
    with pytest.raises(ValueError, match=f"get_tuned_config_without names unknown variant\\(s\\) "
                                         f"{words}; known: cublas, gemv, general"):
        runtime.get_tuned_config_without(variants, "mm", M=64, N=64, K=64, dtype="bf16",
                                         stride_am=64, stride_bk=64)


def test_an_online_cache_that_cannot_be_written_is_refused_at_load(online_expand, monkeypatch):
    from tuner.errors import UserError

    monkeypatch.setenv("TUNE_ONLINE_CACHE", str(online_expand.parent))  # a folder
    with pytest.raises(UserError, match=r"gemm-tuner online cache \(\$TUNE_ONLINE_CACHE, else "
                                        r"beside the table or expand file\): cannot write .*: "
                                        "it is a folder"):
        ask(online_expand)
    assert sorted(p.name for p in online_expand.parent.iterdir()) == ["e.yaml"]


@pytest.mark.parametrize("bias", [lambda: torch.randn(1).expand(64), lambda: torch.randn(128)[::2]],
                         ids=["expanded", "strided"])
def test_a_bias_that_is_not_contiguous_is_added_as_torch_adds_it(triton_table, monkeypatch,
                                                                 bias):
    monkeypatch.setenv("TUNE_EXCLUDE", "cublas")  # a Triton kernel's epilogue adds the bias
    x, weight = torch.randn(64, 64), torch.randn(64, 64)
    for _ in range(2):  # the first call, then a later one of the same signature
        b = bias()
        torch.testing.assert_close(tuner.linear(x, weight, b),
                                   torch.nn.functional.linear(x, weight, b),
                                   atol=1e-3, rtol=1e-3)


def test_meta_tensors_give_a_meta_result_as_torch_does(triton_table):
    a = torch.empty(64, 64, device="meta")
    for _ in range(2):
        assert tuner.matmul(a, a).shape == (64, 64) and tuner.matmul(a, a).is_meta
        assert tuner.linear(a, a, torch.empty(64, device="meta")).is_meta
