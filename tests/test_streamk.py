"""The streamk variant against a float64 torch reference, its split tiles and its workspace.

On a CPU-only machine the kernels run in Triton's interpreter (tests/conftest.py), where the
grid has persistent.INTERPRETER_PROGRAMS (3) programs, so small shapes already split tiles
between programs. `split_tiles` recomputes, in Python, which tiles a launch splits, so each
test states which of the two store paths (whole tiles stored directly, split tiles summed
through the workspace) it exercises. Outputs are poisoned with NaN before each launch.
"""
import dataclasses

import pytest
import torch

from tuner.dtypes import DTYPES, TF32_TOLERANCE
from tuner.execution import meta_gemm, random_gemm, reference, relative_error
from tuner.kernels import streamk
from tuner.kernels._launch import cdiv
from tuner.kernels.base import Gemm
from tuner.kernels.persistent import INTERPRETER_PROGRAMS
from tuner.kernels.streamk import STREAMK, unsupported
from tuner.kernels.workspace import Workspace
from tuner.shapes import LAYOUTS, Shape

CONFIG = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 2, "num_stages": 2,
          "num_warps": 4}


@pytest.fixture(autouse=True)
def fresh_workspace(monkeypatch) -> Workspace:
    """A workspace cache of this test's own, so tests neither share buffers nor see others'."""
    workspace = Workspace()
    monkeypatch.setattr(streamk, "WORKSPACE", workspace)
    return workspace


def split_tiles(shape: Shape, tunables: dict, programs: int) -> list[int]:
    """Tiles whose K steps fall in more than one program's range, computed independently of
    the kernel: program p owns global steps [p*total//programs, (p+1)*total//programs)."""
    tiles = cdiv(shape.M, tunables["BLOCK_M"]) * cdiv(shape.N, tunables["BLOCK_N"])
    steps = cdiv(shape.K, tunables["BLOCK_K"])
    programs = min(programs, tiles * steps)
    starts = {p * tiles * steps // programs for p in range(programs)}
    return [t for t in range(tiles) if any(t * steps < s < (t + 1) * steps for s in starts)]


def shape_error(shape: Shape, tunables: dict, device: str, seed: int = 0,
                **gemm_fields) -> float:
    """Relative Frobenius error of the variant's product (into a NaN-poisoned out)."""
    gemm = random_gemm(shape, device, seed=seed + shape.M * 7919 + shape.N * 31 + shape.K)
    gemm = dataclasses.replace(gemm, **gemm_fields)
    gemm.out.fill_(float("nan"))
    assert STREAMK.launch(gemm, tunables, False) is None
    return relative_error(gemm.out, reference(gemm))


def config(**changes) -> dict:
    return {**CONFIG, **changes}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_matches_reference_in_every_layout(layout, dtype, device):
    # 2x2 tiles of 10 steps (the last ragged) over 3 programs of 13-14 steps: tiles 0 and 3
    # are whole in one program, tiles 1 and 2 split.
    shape = Shape(37, 45, 150, dtype, layout)
    assert split_tiles(shape, CONFIG, INTERPRETER_PROGRAMS) == [1, 2]
    assert shape_error(shape, config(), device) <= DTYPES[dtype].tolerance


@pytest.mark.parametrize("mnk_block_split", [
    # M, N, K, BLOCK_M, BLOCK_N, BLOCK_K, the split tiles
    (40, 64, 64, 16, 32, 32, []),       # 6 tiles of 2 steps over 3 programs: none split
    (17, 17, 33, 16, 16, 16, [1, 2]),   # 4 tiles of 3 steps, the last step of K ragged
    (20, 60, 300, 32, 32, 16, [0, 1]),  # 2 tiles for 3 programs: every tile split
    (1, 30, 100, 16, 16, 32, [0, 1]),   # a single row
], ids=lambda v: "-".join(map(str, v)))
def test_whole_and_split_tiles(mnk_block_split, device):
    M, N, K, block_m, block_n, block_k, split = mnk_block_split
    tunables = config(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
    shape = Shape(M, N, K, "fp32", "nt")
    assert split_tiles(shape, tunables, INTERPRETER_PROGRAMS) == split
    assert unsupported(meta_gemm(shape), tunables) is None
    assert shape_error(shape, tunables, device) <= DTYPES["fp32"].tolerance


@pytest.mark.parametrize("dtype", DTYPES)
def test_epilogue_bias_and_fp8_scales_on_whole_and_split_tiles(dtype, device):
    """Whole tiles apply the epilogue in the main kernel, split ones in the finishing kernel,
    once, after the sum: a bias added per share would count once per program."""
    shape = Shape(37, 45, 150, dtype, "nt")
    bias = torch.randn(shape.N, device=device).to(DTYPES[dtype].out)
    assert shape_error(shape, config(), device, bias=bias) <= DTYPES[dtype].tolerance


def test_strided_views_in_and_out(device):
    """Row strides wider than the row for A and B, and a column-major out."""
    a = torch.randn(41, 60, device=device)[:, 3:38]  # (41, 35), row stride 60
    b = torch.randn(50, 70, device=device)[5:40, :23]  # (35, 23), row stride 70
    out = torch.full((23, 41), float("nan"), device=device).t()
    gemm = Gemm(a, b, out)
    STREAMK.launch(gemm, config(), False)
    assert relative_error(out, reference(gemm)) <= DTYPES["fp32"].tolerance


def test_int64_offsets_compute_the_same_product(monkeypatch, device):
    """Real int64-sized operands don't fit a test, so force the int64 path on small ones."""
    monkeypatch.setattr(streamk, "needs_int64", lambda *tensors: True)
    assert shape_error(Shape(37, 53, 71, "bf16", "tn"), config(), device) \
        <= DTYPES["bf16"].tolerance


def test_tf32_opt_in_stays_within_tf32_tolerance(device):
    shape = Shape(48, 40, 96, "fp32", "nn")
    assert shape_error(shape, config(), device, allow_tf32=True) <= TF32_TOLERANCE


def test_the_workspace_is_zero_again_after_every_call(fresh_workspace, device):
    """Split tiles add into the workspace, which no host memset clears: the finishing
    kernel must leave it zero for the next call of the shape (and for a replay)."""
    shape = Shape(37, 45, 150, "fp32", "nt")
    for seed in (0, 1):
        assert shape_error(shape, config(), device, seed=seed) <= DTYPES["fp32"].tolerance
        (buffer,) = fresh_workspace.buffers.values()
        assert buffer.shape == (shape.M, shape.N) and not buffer.any()


def test_compile_only_on_meta_tensors_touches_no_buffers(fresh_workspace):
    gemm = meta_gemm(Shape(37, 45, 150, "fp8e4m3", "nt"))
    bias = torch.empty(45, dtype=torch.bfloat16, device="meta")
    STREAMK.launch(dataclasses.replace(gemm, bias=bias), config(), True)
    assert not fresh_workspace.buffers


def test_unsupported_when_k_fits_one_step():
    assert unsupported(meta_gemm(Shape(64, 64, 33, "fp16")), config(BLOCK_K=32)) is None
    assert unsupported(meta_gemm(Shape(64, 64, 32, "fp16")), config(BLOCK_K=32)) == \
        "stream-K needs more than one BLOCK_K step: K=32, BLOCK_K=32"


def test_replayable_and_tile_params():
    assert STREAMK.params == ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_stages",
                              "num_warps")
    assert STREAMK.replayable(CONFIG)  # no host work: the workspace cleans itself
