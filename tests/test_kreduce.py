"""The kreduce variant (tiny outputs, long K, on the CUDA cores) against a float64 torch
reference, its determinism, workspaces and config checks; on a GPU, at the sizes it is for,
replayed and captured in CUDA graphs.

On a CPU-only machine the kernels run in Triton's interpreter (tests/conftest.py): K stays
at a few thousand. Outputs are poisoned with NaN before each launch, so an element the last
program never writes fails.
"""
import dataclasses

import pytest
import torch

import tuner
from tests.factories import slow_except
from tuner.dtypes import DTYPES, TF32_TOLERANCE
from tuner.execution.measure import random_gemm, reference, relative_error
from tuner.kernels import KERNELS, kernel_for, kreduce
from tuner.kernels.base import Gemm, config_label
from tuner.kernels.calls import meta_gemm
from tuner.kernels.kreduce import KREDUCE, unsupported
from tuner.kernels.workspace import Workspace
from tuner.runtime import dispatch
from tuner.shapes import LAYOUTS, Shape

CONFIG = {"BLOCK_K": 32, "K_SLICES": 8, "num_stages": 2, "num_warps": 4}
SEEDS = (0, 1, 2)


@pytest.fixture(autouse=True)
def fresh_workspace(monkeypatch) -> Workspace:
    """A workspace cache of this test's own, so tests neither share buffers nor see others'."""
    workspace = Workspace()
    monkeypatch.setattr(kreduce, "WORKSPACE", workspace)
    return workspace


def config(**changes) -> dict:
    return {**CONFIG, **changes}


def launched(gemm: Gemm, tunables: dict) -> torch.Tensor:
    """The variant's product, into a NaN-poisoned out."""
    gemm.out.fill_(float("nan"))
    assert KREDUCE.launch(gemm, tunables, False) is None
    return gemm.out


def shape_error(shape: Shape, tunables: dict, device: str, seed: int = 0,
                **gemm_fields) -> float:
    gemm = dataclasses.replace(random_gemm(shape, device, seed=seed), **gemm_fields)
    assert unsupported(gemm, tunables) is None
    return relative_error(launched(gemm, tunables), reference(gemm))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_matches_reference(layout, dtype, seed, device):
    # K = 1000: 32 steps of 32 (the last ragged) over 8 slices; 3×5 outputs, both wrapped.
    shape = Shape(3, 5, 1000, dtype, layout)
    assert shape_error(shape, config(), device, seed) <= DTYPES[dtype].tolerance


ODD_SHAPES = [
    # M, N, K, BLOCK_K, K_SLICES
    (1, 1, 300, 32, 4),       # a single output
    (7, 5, 4096, 64, 16),     # neither side a power of two
    (4, 4, 1024, 256, 4),     # powers of two: nothing wraps; K a multiple of BLOCK_K
    (2, 3, 65537, 256, 64),   # one element of K past 256 steps
    (16, 16, 200, 16, 13),    # the largest output; slices that differ by a step
]


@pytest.mark.parametrize("odd", slow_except(ODD_SHAPES, *ODD_SHAPES[:3]),
                         ids=lambda v: "-".join(map(str, v)))
@pytest.mark.parametrize("layout", ("nn", "nt"))
def test_small_odd_shapes(odd, layout, device):
    m, n, k, block_k, slices = odd
    shape = Shape(m, n, k, "fp32", layout)
    tunables = config(BLOCK_K=block_k, K_SLICES=slices, num_warps=4 if m * n < 256 else 8)
    assert shape_error(shape, tunables, device) <= DTYPES["fp32"].tolerance


def test_runs_are_bit_identical(device):
    """The partials are summed in the code's order, whichever program arrives last."""
    gemm = random_gemm(Shape(5, 3, 2000, "bf16", "nn"), device, seed=4)
    first = launched(gemm, config()).clone()
    for _ in range(2):
        assert torch.equal(launched(gemm, config()), first)


@pytest.mark.parametrize("dtype", slow_except(DTYPES, "fp8e4m3"))  # bias and scales
def test_epilogue_bias_and_fp8_scales(dtype, device):
    """The last program applies the bias (and fp8's scales) once, after the sum."""
    shape = Shape(3, 6, 700, dtype, "nt")
    bias = torch.randn(shape.N, device=device).to(DTYPES[dtype].out)
    assert shape_error(shape, config(), device, bias=bias) <= DTYPES[dtype].tolerance


def test_strided_views_in_and_out(device):
    """Operands read in place at any strides (B's rows 12 bytes apart), into a column-major
    and a sliced out."""
    a = torch.randn(5, 900, device=device)[:, 3:803]  # (5, 800), row stride 900
    b = torch.randn(800, 3, device=device)[:, :2]  # (800, 2), row stride 3
    for out in (torch.empty(2, 5, device=device).t(), torch.empty(5, 7, device=device)[:, 4:6]):
        gemm = Gemm(a, b, out)
        assert relative_error(launched(gemm, config()), reference(gemm)) \
            <= DTYPES["fp32"].tolerance


@pytest.mark.slow
def test_tf32_opt_in_computes_in_ieee_fp32(device):
    """tf32 allowed: the CUDA cores multiply in IEEE fp32, as accurate as without it."""
    shape = Shape(4, 4, 900, "fp32", "nn")
    error = shape_error(shape, config(), device, allow_tf32=True)
    assert error <= DTYPES["fp32"].tolerance < TF32_TOLERANCE


@pytest.mark.slow
def test_int64_offsets_compute_the_same_product(monkeypatch, device):
    monkeypatch.setattr(kreduce, "needs_int64", lambda *tensors: True)
    assert shape_error(Shape(3, 2, 500, "fp16", "tn"), config(), device) \
        <= DTYPES["fp16"].tolerance


def test_workspace_is_reused_and_the_counter_left_at_zero(fresh_workspace, device):
    shape = Shape(2, 2, 600, "fp32", "nn")
    assert shape_error(shape, config(), device) <= DTYPES["fp32"].tolerance
    partials, arrivals = fresh_workspace.buffers.values()
    assert partials.shape == (CONFIG["K_SLICES"], 2, 2) and arrivals.tolist() == [0]
    assert shape_error(shape, config(), device, seed=1) <= DTYPES["fp32"].tolerance
    again = list(fresh_workspace.buffers.values())
    assert len(again) == 2 and again[0] is partials and again[1] is arrivals


def test_compile_only_on_meta_tensors_touches_no_buffers(fresh_workspace):
    gemm = meta_gemm(Shape(3, 5, 1000, "fp8e4m3", "nt"))
    bias = torch.empty(5, dtype=torch.bfloat16, device="meta")
    KREDUCE.launch(dataclasses.replace(gemm, bias=bias), config(), True)
    assert not fresh_workspace.buffers


def test_unsupported_outputs_registers_and_slices():
    assert unsupported(meta_gemm(Shape(16, 16, 4096, "bf16")), config()) is None
    assert unsupported(meta_gemm(Shape(17, 16, 4096, "bf16")), config()) == (
        "kreduce: 17×16 outputs (rounded up to 32×16) exceed 256: tensor-core tiles "
        "compute them")
    assert unsupported(meta_gemm(Shape(16, 16, 4096, "bf16")), config(BLOCK_K=128)) == (
        "registers: the accumulator alone needs 256 per thread, limit 127")
    assert unsupported(meta_gemm(Shape(2, 2, 100, "fp32")), config(K_SLICES=8)) == (
        "K_SLICES 8 > 4 BLOCK_K steps of K=100: some slices would get no work")


def test_registered_in_mm_and_gemv_without_pad():
    for kernel in (KERNELS["mm"], kernel_for(1, 2)):
        assert kernel.variant["kreduce"] is KREDUCE
        gemm = meta_gemm(Shape(1, 2, 65536, "fp32", "nn"))
        cfg = {"variant": "kreduce", "pad": 0, **config(BLOCK_K=256, K_SLICES=256)}
        assert kernel.feasible(cfg, gemm, 232448) is None
        assert kernel.feasible({**cfg, "pad": 16}, gemm, 232448) == "kreduce: takes no pad"
    assert config_label({"variant": "kreduce", "pad": 0, **CONFIG}) == "kreduce BK32 KS8 s2 w4"


# -- on a GPU: the sizes it is for ----------------------------------------------------------
GPU_SHAPES = [(2, 2, 65536, "fp32"), (4, 4, 131072, "bf16"), (8, 16, 32768, "fp16"),
              (1, 1, 65536, "bf16"), (2, 3, 65537, "fp32"), (7, 5, 4096, "fp16"),
              (3, 2, 8191, "fp8e4m3")]
GPU_CONFIG = {"BLOCK_K": 128, "K_SLICES": 128, "num_stages": 2, "num_warps": 4}


def _gpu_config(m: int, n: int, k: int) -> dict:
    """GPU_CONFIG with no more slices than BLOCK_K steps, and 8 warps for 128 outputs."""
    return {**GPU_CONFIG, "K_SLICES": min(128, -(-k // 128)),
            "num_warps": 8 if m * n > 64 else 4}


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mnk_dtype", GPU_SHAPES, ids=lambda v: "-".join(map(str, v)))
def test_gpu_correct_over_seeds_and_bit_identical(mnk_dtype, layout):
    """Against float64 over seeds; then 10 runs on the same inputs, byte for byte."""
    *mnk, dtype = mnk_dtype
    tunables = _gpu_config(*mnk)
    for seed in SEEDS:
        assert shape_error(Shape(*mnk, dtype, layout), tunables, "cuda", seed) \
            <= DTYPES[dtype].tolerance
    gemm = random_gemm(Shape(*mnk, dtype, layout), "cuda", seed=9)
    first = launched(gemm, tunables).clone()
    for _ in range(10):
        assert torch.equal(launched(gemm, tunables), first)


def _forced(monkeypatch, config: dict) -> None:
    monkeypatch.setattr(dispatch, "_decide", lambda gemm: (kernel_for(*gemm.mnk[:2]), config))
    dispatch.clear_cache()


@pytest.mark.gpu
@pytest.mark.parametrize("m, n", [(2, 2), (1, 3)])  # the mm and gemv kernels
def test_gpu_replayed_calls_compute_their_own_operands(m, n, monkeypatch):
    """After a key's first call, later calls re-issue its recorded launch (workspace and
    counter held by the replay) with their own operands' addresses."""
    _forced(monkeypatch, {"variant": "kreduce", "pad": 0, **GPU_CONFIG})
    weight = torch.randn(n, 65536, device="cuda")
    bias = torch.randn(n, device="cuda")
    for seed in range(4):
        torch.manual_seed(seed)
        x = torch.randn(m, 65536, device="cuda")
        got = tuner.linear(x, weight, bias)
        want = x.double() @ weight.double().t() + bias.double()
        assert relative_error(got, want) <= DTYPES["fp32"].tolerance, seed
        got = tuner.matmul(x, weight.t())
        assert relative_error(got, x.double() @ weight.double().t()) \
            <= DTYPES["fp32"].tolerance, seed
    assert all(call.prepared.replay is not None for call in dispatch._CALLS.values())
    dispatch.clear_cache()


@pytest.mark.gpu
def test_gpu_cuda_graph_capture_replays(monkeypatch):
    """Captured into a CUDA graph, replayed on new inputs: each replay sums its own partials
    (the counter is back at zero after every run) and is bit-identical for the same input."""
    _forced(monkeypatch, {"variant": "kreduce", "pad": 0, **GPU_CONFIG})
    a = torch.randn(2, 65536, device="cuda")
    b = torch.randn(65536, 2, device="cuda")  # rows 8 bytes apart
    tuner.matmul(a, b)  # first call: compiles and records, outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = tuner.matmul(a, b)
    for seed in range(3):
        torch.manual_seed(seed)
        a.copy_(torch.randn_like(a))
        out.fill_(float("nan"))
        graph.replay()
        first = out.clone()
        assert relative_error(out, a.double() @ b.double()) <= DTYPES["fp32"].tolerance, seed
        graph.replay()
        assert torch.equal(out, first)
    dispatch.clear_cache()
