"""The mm and gemv kernels against a float64 torch reference, and their `Kernel` metadata.

On a CPU-only machine the kernels run in Triton's interpreter (tests/conftest.py), which runs
every program in Python: shapes stay under 100 per dimension and blocks at 16..64. Outputs
are poisoned with NaN before each launch, so an element the kernel never writes fails.
"""
import dataclasses

import pytest
import torch

from tuner.dtypes import DTYPES, TF32_TOLERANCE
from tuner.execution import random_operands, relative_error
from tuner.kernels import KERNELS, gemv, kernel_for, matmul
from tuner.kernels._launch import needs_int64
from tuner.kernels.gemv import GEMV
from tuner.kernels.matmul import MM
from tuner.shapes import LAYOUTS, Shape

MM_CONFIG = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 2, "num_stages": 2,
             "num_warps": 4}
GEMV_CONFIG = {"BLOCK_M": 16, "BLOCK_K": 32, "num_stages": 2, "num_warps": 4}


def param_id(values: tuple[int, ...]) -> str:
    return "-".join(map(str, values))


def poisoned(rows: int, cols: int, like: torch.Tensor) -> torch.Tensor:
    return torch.full((rows, cols), float("nan"), dtype=like.dtype, device=like.device)


def launch_error(kernel, a, b, config, out=None, **launch_kwargs) -> float:
    """Relative Frobenius error of kernel's a @ b (into a NaN-poisoned out) against float64."""
    if out is None:
        out = poisoned(a.shape[0], b.shape[1], a)
    assert kernel.launch(a, b, out, config, **launch_kwargs) is None
    return relative_error(out, a.double() @ b.double())


def shape_error(kernel, shape: Shape, config, device, **launch_kwargs) -> float:
    a, b = random_operands(shape, device, seed=shape.M * 7919 + shape.N * 31 + shape.K)
    return launch_error(kernel, a, b, config, **launch_kwargs)


# (M, N, K): primes, ones in every position, K both a multiple of BLOCK_K (16) and not.
MM_SHAPES = [(37, 53, 71), (1, 40, 33), (45, 1, 20), (30, 29, 1), (64, 48, 64), (1, 1, 1)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mnk", MM_SHAPES, ids=param_id)
def test_mm_matches_reference(mnk, layout, dtype, device):
    shape = Shape(*mnk, dtype, layout)
    assert shape_error(MM, shape, MM_CONFIG, device) <= DTYPES[dtype].tolerance


@pytest.mark.parametrize("config", [
    # BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_stages, num_warps
    (16, 16, 16, 1, 1, 2),  # plain row-major tile order
    (16, 16, 16, 4, 3, 4),  # 7 tile rows: one full group of 4, one short group of 3
    (32, 16, 32, 2, 2, 4),  # BLOCK_K 32 divides K
    (16, 64, 32, 8, 4, 8),  # GROUP_M larger than the number of tile rows
    (64, 32, 64, 3, 2, 4),
], ids=param_id)
@pytest.mark.parametrize("dtype", DTYPES)
def test_mm_block_configs_and_tile_order(config, dtype, device):
    shape = Shape(97, 83, 96, dtype, "nt")
    assert shape_error(MM, shape, dict(zip(MM.params, config)), device) \
        <= DTYPES[dtype].tolerance


@pytest.mark.parametrize("dtype", DTYPES)
def test_mm_strided_views_in_and_out(dtype, device):
    """Row strides wider than the row (slices of padded storage) and a column-major out."""
    torch_dtype = DTYPES[dtype].torch
    a = torch.randn(41, 60, device=device).to(torch_dtype)[:, 3:38]  # (41, 35), row stride 60
    b = torch.randn(50, 70, device=device).to(torch_dtype)[5:40, :23]  # (35, 23), row stride 70
    out = poisoned(23, 41, a).t()
    assert launch_error(MM, a, b, MM_CONFIG, out=out) <= DTYPES[dtype].tolerance


def test_mm_int64_offsets_compute_the_same_product(monkeypatch, device):
    """Real int64-sized operands don't fit a test, so force the int64 path on small ones."""
    monkeypatch.setattr(matmul, "needs_int64", lambda *tensors: True)
    shape = Shape(37, 53, 71, "fp16", "tn")
    assert shape_error(MM, shape, MM_CONFIG, device) <= DTYPES["fp16"].tolerance


def test_mm_tf32_opt_in_stays_within_tf32_tolerance(device):
    shape = Shape(48, 40, 96, "fp32", "nn")
    assert shape_error(MM, shape, MM_CONFIG, device, allow_tf32=True) <= TF32_TOLERANCE


@pytest.mark.gpu
def test_mm_fp32_is_ieee_unless_tf32_is_allowed():
    shape = Shape(256, 256, 1024, "fp32", "nn")
    config = dict(zip(MM.params, (64, 64, 32, 4, 3, 4)))
    assert shape_error(MM, shape, config, "cuda") < 1e-5 < \
        shape_error(MM, shape, config, "cuda", allow_tf32=True)


# (M, K): primes, ones, K both a multiple of BLOCK_K (32) and not.
GEMV_SHAPES = [(37, 71), (1, 50), (45, 1), (1, 1), (64, 96), (97, 33)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mk", GEMV_SHAPES, ids=param_id)
def test_gemv_matches_reference(mk, layout, dtype, device):
    M, K = mk
    shape = Shape(M, 1, K, dtype, layout)
    assert shape_error(GEMV, shape, GEMV_CONFIG, device) <= DTYPES[dtype].tolerance


@pytest.mark.parametrize("config", [
    # BLOCK_M, BLOCK_K, num_stages, num_warps
    (16, 16, 1, 2), (32, 64, 2, 4), (64, 32, 3, 8), (16, 64, 4, 4),
], ids=param_id)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gemv_block_configs(config, dtype, device):
    shape = Shape(83, 1, 96, dtype, "tn")
    assert shape_error(GEMV, shape, dict(zip(GEMV.params, config)), device) \
        <= DTYPES[dtype].tolerance


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemv_strided_views_in_and_out(dtype, device):
    """Padded rows of A, an x with stride 3 along K, an out with stride 2 along M."""
    torch_dtype = DTYPES[dtype].torch
    a = torch.randn(40, 80, device=device).to(torch_dtype)[:, :53]
    x = torch.randn(53, 3, device=device).to(torch_dtype)[:, 1:2]
    out = poisoned(40, 2, a)[:, :1]
    # allow_tf32 is part of the common launcher signature; gemv has nothing for it to change.
    assert launch_error(GEMV, a, x, GEMV_CONFIG, out=out, allow_tf32=True) \
        <= DTYPES[dtype].tolerance


def test_gemv_int64_offsets_compute_the_same_product(monkeypatch, device):
    monkeypatch.setattr(gemv, "needs_int64", lambda *tensors: True)
    shape = Shape(45, 1, 71, "bf16", "tn")
    assert shape_error(GEMV, shape, GEMV_CONFIG, device) <= DTYPES["bf16"].tolerance


def test_needs_int64_when_an_offset_passes_int32():
    # 46341**2 - 1 is the first square's largest offset past 2**31 - 1; 46340**2 - 1 is not.
    assert needs_int64(torch.empty(46341, 46341, device="meta"))
    assert not needs_int64(torch.empty(46340, 46340, device="meta"))
    # Offsets, not element counts, decide: 6 elements whose rows lie 2**31 apart.
    assert needs_int64(torch.empty(3, 2**31, device="meta")[:, :2])
    assert not needs_int64(torch.empty(4, 4, device="meta"), torch.empty(2, 2, device="meta"))


def test_feasibility_rejects_configs_over_shared_memory():
    too_big = dict(zip(MM.params, (256, 256, 256, 8, 5, 8)))
    reason = MM.feasible(too_big, itemsize=2, smem_limit=232448)
    assert reason is not None and "shared memory" in reason
    assert MM.feasible(dict(zip(MM.params, (64, 64, 32, 8, 2, 4))), 2, 232448) is None


def test_smem_estimates_match_the_formulas():
    # The mm figure Triton reported on an H200 for 128x256x128, 3 stages, bf16.
    assert MM.smem_bytes(dict(zip(MM.params, (128, 256, 128, 8, 3, 8))), 2) == 294912
    assert GEMV.smem_bytes(dict(zip(GEMV.params, (64, 128, 2, 4))), 4) == 2 * (64 * 128 + 128) * 4


def test_kernel_registry_and_selection():
    assert KERNELS == {"mm": MM, "gemv": GEMV}
    assert MM.params == ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_stages", "num_warps")
    assert GEMV.params == ("BLOCK_M", "BLOCK_K", "num_stages", "num_warps")
    assert kernel_for(1) is GEMV
    assert kernel_for(5) is MM


def test_source_hash_follows_the_kernel_file(tmp_path):
    copy = tmp_path / "matmul.py"
    copy.write_bytes(MM.source_path.read_bytes())
    same = dataclasses.replace(MM, source_path=copy)
    assert len(MM.source_hash) == 16 and int(MM.source_hash, 16) >= 0
    assert same.source_hash == MM.source_hash

    copy.write_bytes(copy.read_bytes() + b"\n# edited\n")
    assert dataclasses.replace(MM, source_path=copy).source_hash != MM.source_hash
