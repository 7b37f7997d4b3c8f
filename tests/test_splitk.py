"""The splitk variant against a float64 torch reference, its workspaces and its config checks.

On a CPU-only machine the kernels run in Triton's interpreter (tests/conftest.py): shapes stay
under 100 per dimension and blocks at 16..32. Outputs are poisoned with NaN before each
launch, so an element the last split never writes fails.
"""
import dataclasses

import pytest
import torch
import triton

from tests.factories import slow_except
from tuner.dtypes import DTYPES, TF32_TOLERANCE
from tuner.execution.measure import random_gemm, reference, relative_error
from tuner.kernels import splitk
from tuner.kernels.base import Gemm
from tuner.kernels.calls import meta_gemm
from tuner.kernels.splitk import SPLITK, unsupported
from tuner.kernels.workspace import Workspace
from tuner.shapes import LAYOUTS, Shape

CONFIG = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "SPLIT_K": 4,
          "num_stages": 2, "num_warps": 4}


@pytest.fixture(autouse=True)
def fresh_workspace(monkeypatch) -> Workspace:
    """A workspace cache of this test's own, so tests neither share buffers nor see others'."""
    workspace = Workspace()
    monkeypatch.setattr(splitk, "WORKSPACE", workspace)
    return workspace


def param_id(values: tuple[int, ...]) -> str:
    return "-".join(map(str, values))


def config(**changes) -> dict:
    return {**CONFIG, **changes}


def poisoned(rows: int, cols: int, dtype: str, device: str) -> torch.Tensor:
    return torch.full((rows, cols), float("nan"), dtype=DTYPES[dtype].out, device=device)


def launch_error(gemm: Gemm, tunables: dict) -> float:
    """Relative Frobenius error of the variant's product (into a NaN-poisoned out)."""
    gemm.out.fill_(float("nan"))
    assert SPLITK.launch(gemm, tunables, False) is None
    return relative_error(gemm.out, reference(gemm))


def shape_error(shape: Shape, tunables: dict, device: str, seed: int = 0,
                **gemm_fields) -> float:
    gemm = random_gemm(shape, device, seed=seed + shape.M * 7919 + shape.N * 31 + shape.K)
    return launch_error(dataclasses.replace(gemm, **gemm_fields), tunables)


# One in the fast subset: each launch is 10 K steps in the interpreter.
@pytest.mark.parametrize("dtype", slow_except(DTYPES, "bf16"))
@pytest.mark.parametrize("layout", slow_except(LAYOUTS, "nt"))
def test_matches_reference_in_every_layout(layout, dtype, device):
    # K = 150: 10 steps of 16 (the last one ragged), split 2+3+2+3; not a multiple of 4*16.
    shape = Shape(37, 45, 150, dtype, layout)
    assert shape_error(shape, config(), device) <= DTYPES[dtype].tolerance


SPLITS = [
    # K, BLOCK_K, SPLIT_K
    (33, 16, 2),    # 3 steps: slices of 1 and 2; the last step holds one element of K
    (64, 32, 2),    # K a multiple of SPLIT_K * BLOCK_K: even slices, no K mask
    (150, 16, 8),   # 10 ragged steps over 8 splits: slices of 1 and 2
    (96, 16, 6),    # one step per split (SPLIT_K == steps, the largest valid)
    (512, 16, 32),  # the space's largest SPLIT_K
]


# The short K in the fast subset; the others are many more programs for the interpreter.
@pytest.mark.parametrize("k_block_split", slow_except(SPLITS, *SPLITS[:2]), ids=param_id)
def test_split_k_values(k_block_split, device):
    k, block_k, split_k = k_block_split
    tunables = config(BLOCK_K=block_k, SPLIT_K=split_k)
    assert unsupported(meta_gemm(Shape(29, 40, k, "fp32")), tunables) is None
    assert shape_error(Shape(29, 40, k, "fp32", "nt"), tunables, device) \
        <= DTYPES["fp32"].tolerance


@pytest.mark.slow
def test_the_fix_up_adds_several_slices_per_step(device):
    """Slices go in chunks of a power of two within SUM_ELEMENTS, the last one masked where
    SPLIT_K is not a multiple: 32×32 tiles add 4 at a time (8 splits: two chunks), 16×16 tiles
    8 of 6 (one chunk, two slices masked off)."""
    assert splitk.sum_splits(config(BLOCK_M=32, BLOCK_N=32, SPLIT_K=8)) == 4
    assert splitk.sum_splits(config(BLOCK_M=16, BLOCK_N=16, SPLIT_K=6)) == 4
    assert splitk.sum_splits(config(BLOCK_M=128, BLOCK_N=128, SPLIT_K=16)) == 1
    for tile, split_k in ((32, 8), (16, 6)):
        tunables = config(BLOCK_M=tile, BLOCK_N=tile, SPLIT_K=split_k)
        assert shape_error(Shape(40, 36, 200, "fp32", "nn"), tunables, device) \
            <= DTYPES["fp32"].tolerance


@pytest.mark.parametrize("mnk", [(1, 40, 33), (45, 1, 70), (1, 1, 40), (16, 32, 64)],
                         ids=param_id)
def test_edge_shapes(mnk, device):
    """A single row or column, and a tile-aligned shape where no lane wraps."""
    shape = Shape(*mnk, "fp16", "tn")
    assert shape_error(shape, config(SPLIT_K=2), device) \
        <= DTYPES["fp16"].tolerance


@pytest.mark.parametrize("dtype", slow_except(DTYPES, "fp8e4m3"))  # bias and scales
def test_epilogue_bias_and_fp8_scales(dtype, device):
    """The last split applies the bias (and fp8's scales) once, after summing every split: a
    bias added per split would count SPLIT_K times."""
    shape = Shape(21, 50, 90, dtype, "nt")
    bias = torch.randn(shape.N, device=device).to(DTYPES[dtype].out)
    assert shape_error(shape, config(), device, bias=bias) \
        <= DTYPES[dtype].tolerance


@pytest.mark.slow  # tests/test_kernels.py tries strided views in the fast subset
@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_views_in_and_out(dtype, device):
    """Row strides wider than the row for A and B, a column-major out and a sliced out."""
    torch_dtype = DTYPES[dtype].torch
    a = torch.randn(41, 60, device=device).to(torch_dtype)[:, 3:38]  # (41, 35), row stride 60
    b = torch.randn(50, 70, device=device).to(torch_dtype)[5:40, :23]  # (35, 23), row stride 70
    for out in (poisoned(23, 41, dtype, device).t(), poisoned(41, 30, dtype, device)[:, 4:27]):
        assert launch_error(Gemm(a, b, out), config()) <= DTYPES[dtype].tolerance


@pytest.mark.slow
def test_int64_offsets_compute_the_same_product(monkeypatch, device):
    """Real int64-sized operands don't fit a test, so force the int64 path on small ones."""
    monkeypatch.setattr(splitk, "needs_int64", lambda *tensors: True)
    shape = Shape(37, 53, 71, "bf16", "tn")
    assert shape_error(shape, config(), device) <= DTYPES["bf16"].tolerance


@pytest.mark.slow
def test_tf32_opt_in_stays_within_tf32_tolerance(device):
    shape = Shape(48, 40, 96, "fp32", "nn")
    assert shape_error(shape, config(), device, allow_tf32=True) <= TF32_TOLERANCE


@pytest.mark.slow
def test_workspace_is_reused_and_stays_right(fresh_workspace, device):
    """A second call of the same shape reuses the buffers: the arrival counters are back at
    zero after every call, and the partials are overwritten whole."""
    shape = Shape(30, 40, 100, "fp32", "nt")
    tunables = config()
    assert shape_error(shape, tunables, device) <= DTYPES["fp32"].tolerance
    partials, arrivals = fresh_workspace.buffers.values()
    assert partials.shape == (tunables["SPLIT_K"], shape.M, shape.N)
    assert arrivals.shape == (2 * 2,) and not arrivals.any()  # 2×2 tiles of 16×32

    assert shape_error(shape, tunables, device, seed=1) <= DTYPES["fp32"].tolerance
    again = list(fresh_workspace.buffers.values())
    assert len(again) == 2 and again[0] is partials and again[1] is arrivals


def test_compile_only_on_meta_tensors_touches_no_buffers(fresh_workspace):
    """The tuner compiles on meta tensors in CPU workers: the launcher must run there whole
    (meta workspace and counters) and keep no buffer."""
    gemm = meta_gemm(Shape(37, 45, 150, "fp8e4m3", "nt"))
    bias = torch.empty(45, dtype=torch.bfloat16, device="meta")
    SPLITK.launch(dataclasses.replace(gemm, bias=bias), config(), True)
    assert not fresh_workspace.buffers


def test_more_splits_than_k_steps_are_rejected():
    gemm = meta_gemm(Shape(64, 64, 100, "fp16"))  # 7 steps of 16, 4 of 32
    assert unsupported(gemm, config(BLOCK_K=16, SPLIT_K=4)) is None
    assert unsupported(gemm, config(BLOCK_K=32, SPLIT_K=4)) is None
    assert unsupported(gemm, config(BLOCK_K=32, SPLIT_K=8)) == \
        "SPLIT_K 8 > 4 BLOCK_K steps of K=100: some splits would get no work"


def test_unsupported_when_k_fits_one_step():
    tunables = config(BLOCK_K=16, SPLIT_K=2)
    assert unsupported(meta_gemm(Shape(64, 64, 17, "fp16")), tunables) is None
    assert unsupported(meta_gemm(Shape(64, 64, 16, "fp16")), tunables) == \
        "split-K needs K > 16, not 16"


def test_params_and_smem_estimate():
    assert SPLITK.params == ("BLOCK_M", "BLOCK_N", "BLOCK_K", "SPLIT_K", "num_stages",
                             "num_warps")
    tunables = dict(zip(SPLITK.params, (64, 128, 64, 8, 3, 4)))
    fp16 = meta_gemm(Shape(512, 512, 512, "fp16", "nn"))
    assert SPLITK.smem_bytes(tunables, fp16) == 3 * (64 * 64 + 64 * 128) * 2  # wgmma: 3 stages
    assert SPLITK.smem_bytes({**tunables, "num_warps": 2}, fp16) == 2 * (64 * 64 + 64 * 128) * 2


GPU_CONFIG = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "SPLIT_K": 16,
              "num_stages": 3, "num_warps": 4}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_gpu_correct_at_split_k_sizes(layout, dtype):
    shape = Shape(64, 512, 8192, dtype, layout)
    assert shape_error(shape, GPU_CONFIG, "cuda") <= DTYPES[dtype].tolerance


@pytest.mark.gpu
def test_gpu_compile_only_builds_what_the_launch_runs(monkeypatch):
    """compile_only on meta tensors compiles the kernels; the real launch then compiles
    nothing (same specializations), which is what lets the tuner compile elsewhere."""
    compiled = []
    monkeypatch.setattr(triton.knobs.runtime, "jit_cache_hook",
                        lambda **hook: compiled.append(hook["fn"].name))
    # A shape and launch options no other test uses, so nothing is cached before.
    shape = Shape(48, 520, 4100, "bf16", "tn")
    tunables = {**GPU_CONFIG, "num_warps": 2}
    SPLITK.launch(meta_gemm(shape), tunables, True)
    assert compiled == ["_splitk_kernel"]

    compiled.clear()
    assert shape_error(shape, tunables, "cuda") <= DTYPES["bf16"].tolerance
    assert compiled == []
