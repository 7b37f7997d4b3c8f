"""The gluon variant (kernels/gluon_mm.py): its refusals, shared memory and model term on any
machine, and, marked `gpu`, the compiled kernel on Hopper.

Triton's interpreter cannot run Gluon, so on CPU-only machines (tests/conftest.py switches the
interpreter on) the variant refuses every call; the CPU tests below step past that refusal and
the device check (conftest's `on_hopper`) to check the rest of `unsupported`. On the GPU machine the
kernel runs against a float64 reference with NaN-poisoned outputs, as in
tests/test_tma_persistent.py, whose launch_error these tests share (and tests/test_gpu.py's
way of forcing the dispatcher's config).
"""
import dataclasses
import gzip
import json
import math
from pathlib import Path

import pytest
import torch

from tests.test_tma_persistent import launch_error
from tuner.dtypes import DTYPES, TF32_TOLERANCE
from tuner.execution.measure import random_gemm
from tuner.export.flaggems_ops import NO_EXPAND_OP
from tuner.kernels import KERNELS, gluon_mm, kernel_variants
from tuner.kernels._launch import INTERPRETED
from tuner.kernels.calls import meta_gemm
from tuner.kernels.gluon_mm import GLUON
from tuner.model import predict as model
from tuner.model.named_devices import named_spec
from tuner.search.replay_report import model_pick_among
from tuner.shapes import LAYOUTS, Shape
from tuner.space import builtin_spaces

# 128×256 on two warp groups: the large-shape tile; 64×64 on one: many tiles per program.
WIDE = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_stages": 3,
        "num_warps": 8, "BLOCK_N_TAIL": 0, "SWAP_AB": 0, "WARP_SPECIALIZE": 0}
NARROW = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 4, "num_stages": 4,
          "num_warps": 4, "BLOCK_N_TAIL": 0, "SWAP_AB": 0, "WARP_SPECIALIZE": 0}
# Tiles 144 and 96 wide: a second wgmma of 16 (32) columns beside BLOCK_N's.
TAILED = {**WIDE, "BLOCK_N": 128, "BLOCK_N_TAIL": 16, "num_stages": 4}
# Transposed tiles (out^T = b^T a^T): 80 rows of the output by 128 columns, cuBLAS's tile at
# 400x3072x768; 64 by 64 with a producer warp.
SWAPPED = {**WIDE, "BLOCK_N": 64, "BLOCK_N_TAIL": 16, "num_stages": 4, "SWAP_AB": 1}
CONFIGS = {"wide": WIDE, "wide-ws": {**WIDE, "WARP_SPECIALIZE": 1}, "narrow": NARROW,
           "narrow-ws": {**NARROW, "WARP_SPECIALIZE": 1}, "tailed": TAILED,
           "narrow-tailed-ws": {**NARROW, "BLOCK_N_TAIL": 32, "WARP_SPECIALIZE": 1},
           "swapped": SWAPPED, "narrow-swapped-ws": {**NARROW, "SWAP_AB": 1,
                                                     "WARP_SPECIALIZE": 1}}


def test_imports_and_is_registered_in_mm_and_its_space():
    assert KERNELS["mm"].variant["gluon"] is GLUON
    assert "gluon" in builtin_spaces(kernel_variants())["mm"].variant_params
    assert GLUON.tma_fed and GLUON.program_per_sm


@pytest.mark.skipif(not INTERPRETED, reason="the interpreter is on only without a GPU")
def test_the_interpreter_cannot_run_gluon():
    gemm = meta_gemm(Shape(256, 256, 256, "bf16", "nt"))
    assert GLUON.unsupported(gemm, WIDE) == "Gluon kernels do not run in Triton's interpreter"
    config = {"variant": "gluon", "pad": 0, **WIDE}
    assert KERNELS["mm"].feasible(config, gemm, 232448) == \
        "Gluon kernels do not run in Triton's interpreter"


@pytest.mark.parametrize("arch, named", [(80, "sm_80"), (100, "sm_100"), (None, "no CUDA GPU")])
def test_refuses_every_target_but_hopper(on_hopper, monkeypatch, arch, named):
    monkeypatch.setattr(gluon_mm, "target_arch", lambda device: arch)
    reason = GLUON.unsupported(meta_gemm(Shape(256, 256, 256, "bf16", "nt")), WIDE)
    assert reason == f"gluon: a Hopper (sm_90) kernel, and the target is {named}"


def test_refuses_tritons_it_was_not_compiled_with(on_hopper, monkeypatch):
    gemm = meta_gemm(Shape(256, 256, 256, "bf16", "nt"))
    monkeypatch.setattr(gluon_mm, "_TRITON_VERSION", (3, 7))
    assert "compiled only with triton 3.6 and 3.9" in GLUON.unsupported(gemm, WIDE)
    monkeypatch.setattr(gluon_mm, "_IMPORT_ERROR", "cannot import name 'tma'")
    assert "has no Gluon Hopper API (cannot import name 'tma')" in GLUON.unsupported(gemm, WIDE)


@pytest.mark.parametrize("change", [{"BLOCK_M": 32}, {"num_warps": 2}])
def test_refuses_tiles_that_are_not_whole_warp_groups(on_hopper, change):
    reason = GLUON.unsupported(meta_gemm(Shape(256, 256, 256, "bf16", "nt")), {**WIDE, **change})
    assert "whole warp groups" in reason


def test_k_steps_hold_whole_wgmma_steps(on_hopper):
    """wgmma's K is 32 bytes: 16 bf16 elements, 32 fp8 ones."""
    narrow_k = {**WIDE, "BLOCK_K": 16}
    assert GLUON.unsupported(meta_gemm(Shape(256, 256, 256, "bf16", "nt")), narrow_k) is None
    assert "BLOCK_K a multiple of 32" in GLUON.unsupported(
        meta_gemm(Shape(256, 256, 256, "fp8e4m3", "nt")), narrow_k)


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp8e4m3", "fp32"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_dtypes_and_storage_orders(on_hopper, dtype, layout):
    """16-bit operands in every storage order; fp8 and tf32 K-major only (nt); IEEE fp32
    never."""
    gemm = meta_gemm(Shape(256, 256, 256, dtype, layout))
    reason = GLUON.unsupported(gemm, NARROW)
    if dtype == "fp32":
        assert "IEEE fp32 has no wgmma" in reason
        gemm = dataclasses.replace(gemm, allow_tf32=True)
        reason = GLUON.unsupported(gemm, NARROW)
    if DTYPES[dtype].torch.itemsize == 2 or layout == "nt":
        assert reason is None
    else:
        assert "operands K-major only" in reason


def test_refuses_what_tma_cannot_address(on_hopper):
    assert "A's stride of 71 elements" in GLUON.unsupported(
        meta_gemm(Shape(256, 256, 71, "fp16", "nn")), WIDE)
    # An output TMA cannot address is stored through pointers instead.
    assert GLUON.unsupported(meta_gemm(Shape(256, 253, 256, "fp16", "nt")), WIDE) is None


@pytest.mark.parametrize("tile, tiling", [
    ({"BLOCK_M": 128, "BLOCK_N": 256, "num_warps": 8}, (8, 256, 0)),
    ({"BLOCK_M": 64, "BLOCK_N": 256, "num_warps": 8}, (4, 128, 0)),
    ({"BLOCK_M": 256, "BLOCK_N": 128, "num_warps": 8}, (8, 128, 0)),
    ({"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 4}, (4, 128, 0)),
    ({"BLOCK_M": 64, "BLOCK_N": 16, "num_warps": 8}, (4, 8, 0)),
    ({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_N_TAIL": 16, "num_warps": 8}, (8, 128, 16)),
    ({"BLOCK_M": 64, "BLOCK_N": 256, "BLOCK_N_TAIL": 32, "num_warps": 8}, (4, 128, 16)),
])
def test_wgmma_tiling(tile, tiling):
    """Warps go down the rows first (a warp group per 64), then across the columns; the
    tail's columns are split as BLOCK_N's are."""
    assert gluon_mm.wgmma_tiling({"BLOCK_N_TAIL": 0, **tile}) == tiling


@pytest.mark.parametrize("change, words", [
    ({"BLOCK_N_TAIL": 128}, "BLOCK_N_TAIL must be narrower than BLOCK_N"),
    ({"BLOCK_M": 64, "BLOCK_N_TAIL": 8}, "share of BLOCK_N_TAIL a multiple of 8"),
])
def test_refuses_tails_wgmma_cannot_take(on_hopper, change, words):
    """A tail as wide as BLOCK_N is a wider BLOCK_N; 64 rows on 8 warps split the tail's
    columns over two warp groups, 4 each, under wgmma's 8."""
    gemm = meta_gemm(Shape(256, 256, 256, "bf16", "nt"))
    assert GLUON.unsupported(gemm, TAILED) is None
    assert words in GLUON.unsupported(gemm, {**TAILED, **change})


@pytest.mark.parametrize("dtype, config, reported", [
    # Triton 3.6 and 3.9 on sm_90 (TMA-stored output): ring + staged tile + barriers.
    ("bf16", WIDE, 213016),
    ("bf16", {**WIDE, "WARP_SPECIALIZE": 1}, 213164),
    ("bf16", {**NARROW, "BLOCK_N": 128}, 114720),
    ("fp8e4m3", WIDE, 139288),
    ("fp16", {**WIDE, "BLOCK_N": 128, "num_stages": 4, "num_warps": 4}, 163872),
    # 128×(128 + 16), 3 stages: the tail's ring slots and staged columns beside BLOCK_N's.
    ("bf16", {**TAILED, "num_stages": 3}, 141336),
])
def test_smem_estimate_bounds_what_triton_reported(dtype, config, reported):
    estimate = GLUON.smem_bytes(config, meta_gemm(Shape(4096, 4096, 4096, dtype, "nt")))
    assert reported <= estimate <= reported + 1024


def test_model_term():
    """Finite where the kernel runs; infinite where TMA cannot address an operand, wgmma
    cannot read its dtype in its storage order, or the tile is not whole warp groups. It is
    the persistent variant's flattened loop (kernels/gluon_cost.py)."""
    def predicted(shape, **change):
        return model.predict_ms(shape, {"variant": "gluon", "pad": 0, **WIDE, **change},
                                model.H100_SXM)

    big = Shape(8192, 8192, 8192, "bf16", "nt")
    assert 0 < predicted(big) < math.inf
    assert predicted(big, WARP_SPECIALIZE=1) <= predicted(big)
    persistent = {"variant": "persistent", "pad": 0, **WIDE, "FLATTEN": 1,
                  "EPILOGUE_SUBTILE": 0}
    assert predicted(big) == model.predict_ms(big, persistent, model.H100_SXM)
    assert predicted(Shape(8192, 8192, 8190, "bf16", "nn")) == math.inf  # A's rows unaligned
    assert predicted(Shape(8192, 8192, 8192, "fp8e4m3", "nn")) == math.inf
    fp32 = Shape(8192, 8192, 8192, "fp32", "nt")
    assert predicted(fp32) == math.inf  # IEEE fp32
    tf32 = {"variant": "gluon", "pad": 0, **WIDE, "BLOCK_N": 128, "BLOCK_K": 32}
    assert model.predict_ms(fp32, tf32, model.H100_SXM, allow_tf32=True) < math.inf
    assert predicted(big, BLOCK_M=32) == math.inf
    # A tail that fills the SMs in one wave: 129 tiles of 128×144 against 144 of 128×128.
    midsize = Shape(384, 6144, 4096, "bf16", "nt")
    assert predicted(midsize, BLOCK_N=128, BLOCK_N_TAIL=16) < predicted(midsize, BLOCK_N=128)


def test_without_a_producer_warp_a_short_wgmma_pays_for_issuing_the_copies():
    """The multiplying warps issue each step's copies themselves (three with a tail), which
    a 64-row tile's wgmma does not hide and a 128×256 one's does: the 64×(128 + 64) tile ranks
    behind its warp-specialized twin (an H200 timed it 4% slower at 4 warps, 27% at 8), the
    128×256 one level with it."""
    def predicted(shape, config, ws):
        return model.predict_ms(shape, {"variant": "gluon", "pad": 0, **config,
                                        "WARP_SPECIALIZE": ws}, named_spec("NVIDIA H200"))

    tailed = {**NARROW, "BLOCK_N": 128, "BLOCK_N_TAIL": 64, "num_stages": 6}
    mid = Shape(256, 6144, 4096, "bf16", "nt")
    assert predicted(mid, tailed, 0) > predicted(mid, tailed, 1)
    big = Shape(8192, 8192, 8192, "bf16", "nt")
    assert predicted(big, WIDE, 0) == predicted(big, WIDE, 1)


def test_the_model_picks_the_best_triton_tile_an_exhaustive_run_measured():
    """Every gluon config (tails, 4-7 stages, with and without the producer warp) and tma tile
    of a narrow space, timed on an H200 at three mid-size shapes (tests/data/README.md). Among
    the Triton tiles (what a TUNE_EXCLUDE=cublas study's warm start picks from), the model's
    pick is the measured best at each; without the copies' cost it picked at 256x6144x4096 a
    tile 4% slower, the same tile without its producer warp."""
    with gzip.open(Path(__file__).parent / "data" / "studies-h200-gluon-ws.json.gz", "rt") as f:
        doc = json.load(f)
    spec = named_spec(doc["device"])
    picks = [model_pick_among(Shape.from_label(study["shape"]),
                              [(config, ms) for config, ms in study["trials"]
                               if config["variant"] != "cublas"], spec)
             for study in doc["studies"]]
    assert len(picks) == 3 and min(picks) == 1.0


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_swapped_tile_is_modelled_as_the_transposed_product(layout):
    """out^T = b^T a^T: N×M, b's storage read as the first operand (its layout letter
    flipped), a's as the second."""
    flip = {"n": "t", "t": "n"}
    transposed_layout = flip[layout[1]] + flip[layout[0]]
    config = {"variant": "gluon", "pad": 0, **SWAPPED}
    swapped = model.predict_ms(Shape(400, 3072, 768, "fp16", layout), config, model.H100_SXM)
    plain = model.predict_ms(Shape(3072, 400, 768, "fp16", transposed_layout),
                             {**config, "SWAP_AB": 0}, model.H100_SXM)
    assert swapped == plain < math.inf


def test_output_tile():
    assert GLUON.output_tile(TAILED) == (128, 144)
    assert GLUON.output_tile(SWAPPED) == (80, 128)
    assert GLUON.smem_bytes(SWAPPED, meta_gemm(Shape(400, 3072, 768, "fp16", "nt"))) == \
        GLUON.smem_bytes({**SWAPPED, "SWAP_AB": 0}, meta_gemm(Shape(3072, 400, 768, "fp16", "nt")))


def test_flaggems_has_no_op_for_it():
    assert GLUON.no_expand_op and NO_EXPAND_OP["gluon"] == GLUON.no_expand_op


# -- on the GPU machine ---------------------------------------------------------------------
def seeded_gemm(shape: Shape, seed: int, bias: bool = False, **fields):
    """A random GEMM of the shape from `seed`, its output NaN-poisoned (and a random bias)."""
    gemm = random_gemm(shape, "cuda", seed=seed)
    gemm.out.fill_(float("nan"))
    if bias:
        fields["bias"] = torch.randn(shape.N, device="cuda").to(gemm.out.dtype)
    return dataclasses.replace(gemm, **fields)


# Each config in every layout: compiles dominate the GPU run, so fp16 (the bf16 binaries'
# twin) goes through the two configs that differ most, one per warp organisation.
LAYOUT_CASES = [(name, dtype) for name in CONFIGS for dtype in ("bf16", "fp16")
                if dtype == "bf16" or name in ("wide", "narrow-ws")]


@pytest.mark.gpu
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name, dtype", LAYOUT_CASES)
def test_gpu_every_layout_matches_reference(name, dtype, layout, seed):
    """M, N and K end mid-tile (zero-filled loads, clipped stores), with a bias; out's rows
    stay 16-byte aligned, so it is stored through TMA."""
    gemm = seeded_gemm(Shape(1000, 776, 1032, dtype, layout), seed, bias=True)
    assert launch_error(GLUON, gemm, CONFIGS[name]) <= DTYPES[dtype].tolerance


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["wide", "narrow-ws", "swapped"])
def test_gpu_fp8_and_tf32_k_major(name):
    fp8 = seeded_gemm(Shape(1000, 784, 1056, "fp8e4m3", "nt"), 1, bias=True)
    assert fp8.scale_a is not None
    assert launch_error(GLUON, fp8, CONFIGS[name]) <= DTYPES["fp8e4m3"].tolerance
    tf32 = seeded_gemm(Shape(1000, 776, 1032, "fp32", "nt"), 2, allow_tf32=True)
    config = {**CONFIGS[name], "BLOCK_N": 128, "BLOCK_K": 32}  # fp32 tiles: twice as wide
    assert launch_error(GLUON, tf32, config) <= TF32_TOLERANCE


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["wide", "narrow-ws", "swapped", "narrow-swapped-ws"])
def test_gpu_outputs_tma_cannot_address_go_through_pointers(name):
    """Rows of 777 bf16 elements are not 16-byte multiples; a column-major out has no unit
    stride along its rows."""
    unaligned = seeded_gemm(Shape(1000, 777, 1032, "bf16", "nt"), 3, bias=True)
    assert launch_error(GLUON, unaligned, CONFIGS[name]) <= DTYPES["bf16"].tolerance
    column_major = torch.full((520, 1000), float("nan"), dtype=torch.float16, device="cuda").t()
    gemm = seeded_gemm(Shape(1000, 520, 1032, "fp16", "tn"), 4, out=column_major)
    assert launch_error(GLUON, gemm, CONFIGS[name]) <= DTYPES["fp16"].tolerance


@pytest.mark.gpu
@pytest.mark.parametrize("k", [32, 64, 192])
@pytest.mark.parametrize("name", CONFIGS)
def test_gpu_loads_run_ahead_across_tiles(name, k):
    """K of one step or less (or three): the first loads span several tiles of a program;
    the 256 tiles of 64×64 come two or so to a program."""
    gemm = seeded_gemm(Shape(1024, 1024, k, "bf16", "tn"), k)
    assert launch_error(GLUON, gemm, CONFIGS[name]) <= DTYPES["bf16"].tolerance


@pytest.mark.gpu
def test_gpu_compile_on_meta_tensors_is_what_the_launch_runs():
    shape = Shape(1000, 776, 1032, "bf16", "tt")
    cache = gluon_mm._gluon_mm_kernel.device_caches[torch.cuda.current_device()][0]
    GLUON.launch(meta_gemm(shape), NARROW, True)
    compiled = len(cache)
    assert launch_error(GLUON, seeded_gemm(shape, 5), NARROW) <= DTYPES["bf16"].tolerance
    assert len(cache) == compiled
