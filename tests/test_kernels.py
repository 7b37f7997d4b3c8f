"""The general and gemv variants against a float64 torch reference, and the `Kernel` layer:
variants, padding, feasibility, metadata.

On a CPU-only machine the kernels run in Triton's interpreter (tests/conftest.py), which runs
every program in Python: shapes stay under 100 per dimension and blocks at 16..64. Outputs
are poisoned with NaN before each launch, so an element the kernel never writes fails.
"""
import dataclasses

import pytest
import torch

from tests.factories import slow_except
from tuner.dtypes import DTYPES, TF32_TOLERANCE
from tuner.execution.measure import random_gemm, reference, relative_error
from tuner.kernels import KERNELS, gemv, general, kernel_for
from tuner.kernels._launch import needs_int64, wrap_point
from tuner.kernels.base import Gemm, config_label
from tuner.kernels.calls import meta_gemm
from tuner.kernels.gemv import GEMV
from tuner.kernels.general import GENERAL
from tuner.kernels.padding import padded_operands
from tuner.kernels.workspace import Workspace
from tuner.shapes import LAYOUTS, Shape

MM = KERNELS["mm"]
MM_CONFIG = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 2, "num_stages": 2,
             "num_warps": 4}
GEMV_CONFIG = {"BLOCK_M": 16, "BLOCK_K": 32, "num_stages": 2, "num_warps": 4}


def param_id(values: tuple[int, ...]) -> str:
    return "-".join(map(str, values))


def poisoned(rows: int, cols: int, dtype: str, device) -> torch.Tensor:
    """An output for `dtype` inputs, all NaN."""
    return torch.full((rows, cols), float("nan"), dtype=DTYPES[dtype].out, device=device)


def launch_error(variant, gemm: Gemm, tunables) -> float:
    """Relative Frobenius error of the variant's product (into a NaN-poisoned out)."""
    gemm.out.fill_(float("nan"))
    assert variant.launch(gemm, tunables, False) is None
    return relative_error(gemm.out, reference(gemm))


def shape_error(variant, shape: Shape, tunables, device, **gemm_fields) -> float:
    gemm = random_gemm(shape, device, seed=shape.M * 7919 + shape.N * 31 + shape.K)
    return launch_error(variant, dataclasses.replace(gemm, **gemm_fields), tunables)


# (M, N, K): primes, ones in every position, K both a multiple of BLOCK_K (16) and not.
MM_SHAPES = [(37, 53, 71), (1, 40, 33), (45, 1, 20), (30, 29, 1), (64, 48, 64), (1, 1, 1)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mnk", MM_SHAPES, ids=param_id)
def test_general_matches_reference(mnk, layout, dtype, device):
    shape = Shape(*mnk, dtype, layout)
    assert shape_error(GENERAL, shape, MM_CONFIG, device) <= DTYPES[dtype].tolerance


BLOCK_CONFIGS = [
    # BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_stages, num_warps
    (16, 16, 16, 1, 1, 2),  # plain row-major tile order
    (16, 16, 16, 4, 3, 4),  # 7 tile rows: one full group of 4, one short group of 3
    (32, 16, 32, 2, 2, 4),  # BLOCK_K 32 divides K
    (16, 64, 32, 8, 4, 8),  # GROUP_M larger than the number of tile rows
    (64, 32, 64, 3, 2, 4),
]


# The wide tiles in the fast subset: the narrow ones are many programs for the interpreter.
@pytest.mark.parametrize("config", slow_except(BLOCK_CONFIGS, *BLOCK_CONFIGS[3:]), ids=param_id)
# bf16 in the fast subset; the other dtypes' tile orders are the same code (slow: interpreted).
@pytest.mark.parametrize("dtype", slow_except(DTYPES, "bf16"))
def test_general_block_configs_and_tile_order(config, dtype, device):
    shape = Shape(97, 83, 96, dtype, "nt")
    assert shape_error(GENERAL, shape, dict(zip(GENERAL.params, config)), device) \
        <= DTYPES[dtype].tolerance


@pytest.mark.parametrize("dtype", DTYPES)
def test_general_strided_views_in_and_out(dtype, device):
    """Row strides wider than the row (slices of padded storage) and a column-major out."""
    torch_dtype = DTYPES[dtype].torch
    a = torch.randn(41, 60, device=device).to(torch_dtype)[:, 3:38]  # (41, 35), row stride 60
    b = torch.randn(50, 70, device=device).to(torch_dtype)[5:40, :23]  # (35, 23), row stride 70
    out = poisoned(23, 41, dtype, device).t()
    assert launch_error(GENERAL, Gemm(a, b, out), MM_CONFIG) <= DTYPES[dtype].tolerance


def test_general_int64_offsets_compute_the_same_product(monkeypatch, device):
    """Real int64-sized operands don't fit a test, so force the int64 path on small ones."""
    monkeypatch.setattr(general, "needs_int64", lambda *tensors: True)
    shape = Shape(37, 53, 71, "fp16", "tn")
    assert shape_error(GENERAL, shape, MM_CONFIG, device) <= DTYPES["fp16"].tolerance


def test_general_tf32_opt_in_stays_within_tf32_tolerance(device):
    shape = Shape(48, 40, 96, "fp32", "nn")
    assert shape_error(GENERAL, shape, MM_CONFIG, device, allow_tf32=True) <= TF32_TOLERANCE


@pytest.mark.parametrize("layout", slow_except(LAYOUTS, "nt"))  # 6 launches each
def test_general_and_gemv_bias_and_fp8_scales_in_the_epilogue(layout, device):
    for shape, variant, tunables in ((Shape(37, 53, 64, "fp8e4m3", layout), GENERAL, MM_CONFIG),
                                     (Shape(1, 53, 64, "fp8e4m3", layout), GEMV, GEMV_CONFIG),
                                     (Shape(45, 1, 40, "fp8e4m3", layout), GEMV, GEMV_CONFIG)):
        bias = torch.randn(shape.N, device=device).to(torch.bfloat16)
        assert shape_error(variant, shape, tunables, device) <= DTYPES["fp8e4m3"].tolerance
        assert shape_error(variant, shape, tunables, device, bias=bias) \
            <= DTYPES["fp8e4m3"].tolerance


@pytest.mark.gpu
def test_general_fp32_is_ieee_unless_tf32_is_allowed():
    shape = Shape(256, 256, 1024, "fp32", "nn")
    config = dict(zip(GENERAL.params, (64, 64, 32, 4, 3, 4)))
    assert shape_error(GENERAL, shape, config, "cuda") < 1e-5 < \
        shape_error(GENERAL, shape, config, "cuda", allow_tf32=True)


# (M, N, K) with N == 1 or M == 1 (the transposed product): primes, ones, K both a multiple
# of BLOCK_K (32) and not.
GEMV_SHAPES = [(37, 1, 71), (1, 1, 50), (45, 1, 1), (64, 1, 96), (97, 1, 33), (1, 37, 71),
               (1, 64, 96), (1, 45, 1)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mnk", GEMV_SHAPES, ids=param_id)
def test_gemv_matches_reference(mnk, layout, dtype, device):
    shape = Shape(*mnk, dtype, layout)
    assert shape_error(GEMV, shape, GEMV_CONFIG, device) <= DTYPES[dtype].tolerance


@pytest.mark.parametrize("config", [
    # BLOCK_M, BLOCK_K, num_stages, num_warps
    (16, 16, 1, 2), (32, 64, 2, 4), (64, 32, 3, 8), (16, 64, 4, 4), (4, 512, 2, 4),
    (8, 128, 1, 2),
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
    out = poisoned(40, 2, dtype, device)[:, :1]
    # allow_tf32 is part of every call; gemv has no tensor cores for it to change.
    assert launch_error(GEMV, Gemm(a, x, out, allow_tf32=True), GEMV_CONFIG) \
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


def mm_config(variant="general", pad=0, **tunables):
    return {"variant": variant, "pad": pad, **(tunables or MM_CONFIG)}


def test_feasibility_rejects_configs_over_shared_memory():
    gemm = meta_gemm(Shape(512, 512, 512, "bf16", "nn"))
    too_big = mm_config(**dict(zip(GENERAL.params, (256, 256, 256, 8, 5, 8))))
    reason = MM.feasible(too_big, gemm, smem_limit=232448)
    assert reason is not None and "shared memory" in reason
    assert MM.feasible(mm_config(**dict(zip(GENERAL.params, (64, 64, 32, 8, 2, 4)))), gemm,
                       232448) is None


def test_feasibility_rejects_an_accumulator_beyond_the_registers_of_its_threads():
    gemm = meta_gemm(Shape(512, 512, 512, "bf16", "nn"))
    # 128×256 fp32 over 2 warps: 512 registers per thread; over 8 warps: 128.
    spilling = mm_config(**dict(zip(GENERAL.params, (128, 256, 64, 8, 2, 2))))
    assert "accumulator alone needs 512" in MM.feasible(spilling, gemm, 232448)
    assert MM.feasible(mm_config(**dict(zip(GENERAL.params, (128, 256, 64, 8, 2, 8)))), gemm,
                       232448) is None


def test_feasibility_rejects_tiles_narrower_than_a_tensor_core_mma():
    """gemv.yaml offers BLOCK_M 4 and 8 for the gemv variant; its tile variants cannot use them."""
    gemm = meta_gemm(Shape(1, 4096, 4096, "bf16", "nt"))
    narrow = {"variant": "general", "pad": 0, **dict(zip(GENERAL.params, (8, 64, 64, 1, 2, 4)))}
    assert "must be >= 16" in KERNELS["gemv"].feasible(narrow, gemm, 232448)
    assert KERNELS["gemv"].feasible({**narrow, "BLOCK_M": 16}, gemm, 232448) is None


def test_feasibility_rejects_a_pad_that_changes_nothing_and_a_variant_that_cannot_run():
    aligned, ragged = (meta_gemm(Shape(64, 64, k, "fp16", "nn")) for k in (64, 63))
    assert "already aligned" in MM.feasible(mm_config(pad=16), aligned, 232448)
    assert MM.feasible(mm_config(pad=16), ragged, 232448) is None
    # Padding only aligns K and the strides: a ragged M alone leaves the operands as they are.
    ragged_m = meta_gemm(Shape(63, 64, 64, "fp16", "nn"))
    assert "already aligned" in MM.feasible(mm_config(pad=16), ragged_m, 232448)
    assert "takes no pad" in MM.feasible({"variant": "cublas", "pad": 16}, ragged, 232448)
    assert MM.feasible({"variant": "cublas", "pad": 0}, ragged, 232448) is None
    gemv_kernel = KERNELS["gemv"]
    gemv_config = {"variant": "gemv", "pad": 0, **GEMV_CONFIG}
    assert "M == 1 or N == 1" in gemv_kernel.feasible(gemv_config, ragged, 232448)
    assert gemv_kernel.feasible(gemv_config, meta_gemm(Shape(1, 63, 64, "fp16", "nn")),
                                232448) is None


@pytest.mark.slow  # 6 launches each; tests/test_dispatch.py runs a padded config quickly
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pad", (8, 16, 64))
def test_padded_runs_match_reference_and_reuse_clean_buffers(pad, layout, device, monkeypatch):
    """Two shapes that pad to the same sizes, run alternately: each must keep zero K margins
    (a shared buffer would carry one shape's K columns into the other's product)."""
    monkeypatch.setattr("tuner.kernels.padding.WORKSPACE", Workspace(2**30))
    bias = torch.randn(53, device=device).to(torch.float16)
    for k in (71, 70, 71):
        gemm = random_gemm(Shape(37, 53, k, "fp16", layout), device, seed=k)
        for with_bias in (None, bias):
            gemm = dataclasses.replace(gemm, bias=with_bias)
            gemm.out.fill_(float("nan"))
            MM.launch(gemm, mm_config(pad=pad))
            assert relative_error(gemm.out, reference(gemm)) <= DTYPES["fp16"].tolerance


def test_workspace_evicts_least_recently_used_buffers_past_its_bound():
    space = Workspace(limit_bytes=3 * 4096)
    first = space.get(("x", 1), (1024,), torch.float32, torch.device("cpu"))
    space.get(("x", 2), (1024,), torch.float32, torch.device("cpu"))
    assert space.get(("x", 1), (1024,), torch.float32, torch.device("cpu")) is first
    space.get(("x", 3), (1024,), torch.float32, torch.device("cpu"))
    space.get(("x", 4), (1024,), torch.float32, torch.device("cpu"))  # evicts ("x", 2)
    assert space.bytes == 3 * 4096 and len(space.buffers) == 3
    assert space.get(("x", 1), (1024,), torch.float32, torch.device("cpu")) is first
    huge = space.get(("x", 5), (8192,), torch.float32, torch.device("cpu"))
    assert huge.abs().sum() == 0 and len(space.buffers) == 3  # served, not cached


def test_workspace_bound_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("TUNE_WORKSPACE_MB", "2")
    assert Workspace().limit_bytes == 2 * 2**20
    for raw in ("lots", "nan", "inf", "-1", "1e400"):
        monkeypatch.setenv("TUNE_WORKSPACE_MB", raw)
        with pytest.raises(ValueError, match=f"TUNE_WORKSPACE_MB='{raw}': expected a finite, "
                                             "non-negative number of megabytes"):
            Workspace()


def test_smem_estimates_match_the_formulas():
    bf16, fp32 = (meta_gemm(Shape(512, 512, 512, dtype, "nn")) for dtype in ("bf16", "fp32"))
    # Figures Triton reported on an H200 for 3 stages, bf16: 128x256x128 on wgmma keeps all
    # 3 stages, 16x256x128 on mma.sync (5 stages) keeps 4.
    assert MM.smem_bytes(mm_config(**dict(zip(GENERAL.params, (128, 256, 128, 8, 3, 8)))),
                         bf16) == 294912
    assert MM.smem_bytes(mm_config(**dict(zip(GENERAL.params, (16, 256, 128, 1, 5, 2)))),
                         bf16) == 278528
    assert GEMV.smem_bytes(dict(zip(GEMV.params, (64, 128, 2, 4))), fp32) == \
        2 * (64 * 128 + 128) * 4


def test_kernel_registry_variants_and_selection():
    assert set(KERNELS) == {"mm", "gemv"}
    assert MM.variant["general"] is GENERAL and KERNELS["gemv"].variant["gemv"] is GEMV
    assert MM.variant_params["general"] == ("variant", "pad", "BLOCK_M", "BLOCK_N", "BLOCK_K",
                                            "GROUP_M", "num_stages", "num_warps")
    assert KERNELS["gemv"].variant_params["gemv"] == ("variant", "pad", "BLOCK_M", "BLOCK_K",
                                                      "num_stages", "num_warps")
    assert kernel_for(7, 1) is kernel_for(1, 7) is KERNELS["gemv"]
    assert kernel_for(5, 5) is MM


def test_config_label_names_variant_tiles_and_pad():
    assert config_label(mm_config(pad=64)) == "general BM16 BN32 BK16 G2 s2 w4 pad64"
    assert config_label(mm_config()) == "general BM16 BN32 BK16 G2 s2 w4"


def test_source_hash_follows_every_variant_file(tmp_path):
    copy = tmp_path / "general.py"
    copy.write_bytes(GENERAL.source_path.read_bytes())
    same = dataclasses.replace(MM, variants=(dataclasses.replace(GENERAL, source_path=copy),))
    assert len(MM.source_hash) == 16 and int(MM.source_hash, 16) >= 0
    assert same.source_hash == dataclasses.replace(MM, variants=(GENERAL,)).source_hash

    copy.write_bytes(copy.read_bytes() + b"\n# edited\n")
    edited = dataclasses.replace(MM, variants=(dataclasses.replace(GENERAL, source_path=copy),))
    assert edited.source_hash != same.source_hash


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_cublas_variant_computes_through_torch_with_bias(layout, device):
    bias = torch.randn(24, device=device)
    gemm = dataclasses.replace(random_gemm(Shape(9, 24, 40, "fp32", layout), device, seed=3),
                               bias=bias)
    gemm.out.fill_(float("nan"))
    MM.launch(gemm, {"variant": "cublas", "pad": 0})
    assert relative_error(gemm.out, reference(gemm)) <= DTYPES["fp32"].tolerance
    assert not MM.replayable({"variant": "cublas", "pad": 0})  # a torch call, not Triton's


def test_the_cublas_variant_refuses_fp8_that_torch_scaled_mm_refuses():
    """torch._scaled_mm takes row-major A times column-major B (the `nt` layout), K and N
    multiples of 16: any other fp8 call is one the variant cannot run."""
    cublas = {"variant": "cublas", "pad": 0}
    assert MM.unsupported(cublas, meta_gemm(Shape(1000, 3008, 2000, "fp8e4m3", "nt"))) is None
    for m, n, k, layout in ((1000, 3000, 2000, "nt"), (1000, 3008, 2008, "nt"),
                            (1000, 3008, 2000, "nn"), (1, 4096, 4096, "tt")):
        shape = Shape(m, n, k, "fp8e4m3", layout)
        assert "torch._scaled_mm" in MM.unsupported(cublas, meta_gemm(shape))


def test_padded_operands_let_the_tile_kernels_wrap_at_an_aligned_point():
    """A padded buffer's zero margin reaches the next multiple of 16 rows/columns, so the
    wrap moves there and the contiguity hints hold; an operand read in place, or a pad-8
    buffer that stops short of it, wraps at M / N itself."""
    padded = padded_operands(meta_gemm(Shape(37, 53, 71, "fp16", "nn")), 64, allocate=False)
    assert (padded.a_buffer_rows, padded.b_buffer_cols) == (64, 64)
    assert wrap_point(37, padded.a_buffer_rows) == 48
    assert wrap_point(53, padded.b_buffer_cols) == 64
    assert wrap_point(53, None) == 53 and wrap_point(53, 56) == 53
    aligned_a = padded_operands(meta_gemm(Shape(37, 53, 64, "fp16", "nn")), 16, allocate=False)
    assert (aligned_a.a_buffer_rows, aligned_a.b_buffer_cols) == (None, 64)
