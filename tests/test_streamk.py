"""The streamk variant against a float64 reference, its schedule, workspaces, config checks
and model term; on the GPU machine, its results bit for bit (and split-K's) across runs.

On a CPU-only machine the kernel runs in Triton's interpreter (tests/conftest.py) with 3
programs (persistent.INTERPRETER_PROGRAMS), one after another: shapes stay under 100 per
dimension and blocks at 16..32, chosen so that the 3 programs run every kind of schedule
(SCHEDULES). Outputs are poisoned with NaN before each launch, so an element no program
stores fails. TMA needs 16-byte row strides: dimensions that strides are made of are
multiples of 8 (16 for fp8).
"""
import dataclasses

import pytest
import torch
import triton

from tests.factories import slow_except
from tests.test_tma_persistent import launch_error, poisoned_gemm
from tuner.dtypes import DTYPES, TF32_TOLERANCE
from tuner.execution.measure import random_gemm, reference, relative_error
from tuner.export.flaggems_ops import NO_EXPAND_OP
from tuner.kernels import KERNELS, persistent, streamk
from tuner.kernels.base import TILE_PARAMS, config_label
from tuner.kernels.calls import meta_gemm
from tuner.kernels.splitk import SPLITK
from tuner.kernels.streamk import STREAMK, Schedule, launch_schedule, schedule
from tuner.kernels.workspace import Workspace
from tuner.model import predict as model
from tuner.shapes import LAYOUTS, Shape

BLOCKS = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2, "num_stages": 2,
          "num_warps": 4, "SK_FULL_WAVES": 0}
WIDE_DTYPES = ("fp16", "bf16", "fp32")  # strides aligned at 8 elements (fp8: 16)

# (M, N, K), SK_FULL_WAVES, and the schedule the interpreter's 3 programs run: 16×16 tiles of
# 16-step K, S = k_steps. Ranges are [p·I // Q, (p+1)·I // Q) of I = sk_tiles·S.
SCHEDULES = {
    # 6 tiles: two whole waves, nothing streamed.
    "all-whole-tiles": ((48, 32, 48), 0, Schedule(3, 6, 0, 0, 3)),
    # 5 tiles: 3 whole, 2 streamed over ranges of 2 steps: [0,2) [2,4) [4,6), so each tile
    # has 2 contributors and program 1 holds a part of both (slots 0 and 1).
    "tiles-split-in-two": ((80, 16, 48), 0, Schedule(3, 3, 2, 3, 3)),
    # 4 tiles: 3 whole, 1 streamed of 5 steps by 2 programs (MAX_PARTS): [0,2) [2,5), both
    # ranges shorter than a tile (each program's one part in slot 0).
    "ranges-shorter-than-a-tile": ((64, 16, 80), 0, Schedule(3, 3, 1, 2, 5)),
    # 1 streamed tile of 2 steps: only 2 programs take part (no range may be empty).
    "fewer-steps-than-programs": ((64, 16, 32), 0, Schedule(3, 3, 1, 2, 2)),
    # 5 tiles, all streamed (SK_FULL_WAVES=1), ranges of 5 steps: [0,5) [5,10) [10,15),
    # so ranges hold whole tiles (stored directly), before and between parts.
    "whole-tiles-inside-ranges": ((80, 16, 48), 1, Schedule(3, 0, 5, 3, 3)),
    # 2 tiles for 3 programs: everything streamed, [0,3) [3,6) [6,10).
    "fewer-tiles-than-programs": ((32, 16, 80), 0, Schedule(3, 0, 2, 3, 5)),
    # Ragged M, N and K (4.5 × 1.5 tiles, 2.5 steps): 10 tiles, 9 whole, 1 streamed by 2
    # programs; the last step's K is half padding.
    "ragged": ((72, 24, 40), 0, Schedule(3, 9, 1, 2, 3)),
}


@pytest.fixture(autouse=True)
def fresh_workspace(monkeypatch) -> Workspace:
    """A workspace cache of this test's own, so tests neither share buffers nor see others'."""
    workspace = Workspace()
    monkeypatch.setattr(streamk, "WORKSPACE", workspace)
    return workspace


def config(**changes) -> dict:
    return {**BLOCKS, **changes}


@pytest.mark.parametrize("name", SCHEDULES)
def test_every_kind_of_schedule_matches_reference(name, device):
    mnk, full_waves, expected = SCHEDULES[name]
    gemm = poisoned_gemm(Shape(*mnk, "bf16", "nt"), device, bias=True)
    tunables = config(SK_FULL_WAVES=full_waves)
    if device == "cpu":
        assert launch_schedule(gemm, tunables) == expected
    assert launch_error(STREAMK, gemm, tunables) <= DTYPES["bf16"].tolerance


def test_a_tile_summed_from_three_programs(monkeypatch, device):
    """With 5 programs, 8 tiles of 5 steps: 5 whole, 3 streamed over [0,3) [3,6) [6,9)
    [9,12) [12,15), so tile 1 (steps 5..9) is summed from programs 1, 2 and 3, the middle
    one's range inside it. (On the GPU the SM count decides; the interpreter's is a
    constant.)"""
    monkeypatch.setattr(persistent, "INTERPRETER_PROGRAMS", 5)
    gemm = poisoned_gemm(Shape(64, 32, 80, "fp16", "tn"), device, bias=True)
    if device == "cpu":
        assert launch_schedule(gemm, config()) == Schedule(5, 5, 3, 5, 5)
    assert launch_error(STREAMK, gemm, config()) <= DTYPES["fp16"].tolerance


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_matches_reference(layout, dtype, device):
    """10 tiles of 16×32: 9 whole, 1 split in two; 3 steps of 32, the last ragged."""
    gemm = poisoned_gemm(Shape(72, 56, 72, dtype, layout), device)
    tunables = config(BLOCK_N=32, BLOCK_K=32)
    assert launch_error(STREAMK, gemm, tunables) <= DTYPES[dtype].tolerance


@pytest.mark.parametrize("layout", slow_except(("nt", "tn"), "nt"))
def test_fp8_scales_go_through_the_epilogue_once(layout, device):
    """20 tiles: 18 whole, 2 split in two; the scales apply to the sum, not to each part."""
    gemm = poisoned_gemm(Shape(64, 80, 96, "fp8e4m3", layout), device)
    assert gemm.scale_a is not None
    assert launch_error(STREAMK, gemm, config()) <= DTYPES["fp8e4m3"].tolerance


def test_unaligned_output_is_stored_through_pointers(device):
    """20×53: out's rows are not 16-byte multiples; 8 tiles, 2 streamed, with a bias."""
    gemm = poisoned_gemm(Shape(20, 53, 72, "fp16", "nt"), device, bias=True)
    assert launch_error(STREAMK, gemm, config()) <= DTYPES["fp16"].tolerance


def test_column_major_output(device):
    gemm = poisoned_gemm(Shape(32, 32, 64, "fp16", "tn"), device)
    out = torch.full((32, 32), float("nan"), dtype=torch.float16, device=device).t()
    gemm = dataclasses.replace(gemm, out=out)
    assert launch_error(STREAMK, gemm, config()) <= DTYPES["fp16"].tolerance


def test_fp32_is_ieee_and_tf32_an_opt_in(device):
    shape = Shape(32, 32, 96, "fp32", "nn")  # 4 tiles: 3 whole, 1 split in two
    assert launch_error(STREAMK, poisoned_gemm(shape, device), config()) <= 1e-5
    tf32 = poisoned_gemm(shape, device, allow_tf32=True)
    assert launch_error(STREAMK, tf32, config()) <= TF32_TOLERANCE


def test_two_runs_give_the_same_bytes(device):
    gemm = poisoned_gemm(Shape(64, 16, 80, "bf16", "nt"), device)
    STREAMK.launch(gemm, config(), False)
    first = gemm.out.clone()
    gemm.out.fill_(float("nan"))
    STREAMK.launch(gemm, config(), False)
    assert torch.equal(first.view(torch.uint8), gemm.out.view(torch.uint8))


def test_workspaces_are_reused_and_counters_left_at_zero(fresh_workspace, device):
    """A second call of the shape reuses both buffers: every split tile's finishing program
    put its counter back to zero, and the partials are overwritten before they are read."""
    shape = Shape(80, 16, 48, "fp32", "nt")  # tiles-split-in-two
    assert launch_error(STREAMK, poisoned_gemm(shape, device), config()) <= 1e-5
    partials, arrivals = fresh_workspace.buffers.values()
    assert partials.shape == (3, streamk.PARTIAL_SLOTS, 16, 16)
    assert arrivals.shape == (2,) and not arrivals.any()

    gemm = random_gemm(shape, device, seed=1)
    gemm.out.fill_(float("nan"))
    assert launch_error(STREAMK, gemm, config()) <= 1e-5
    assert list(fresh_workspace.buffers.values()) == [partials, arrivals]
    assert not arrivals.any()


def test_compile_only_on_meta_tensors_touches_no_buffers(fresh_workspace):
    gemm = meta_gemm(Shape(72, 24, 48, "fp8e4m3", "nt"))
    STREAMK.launch(gemm, config(), True)
    assert not fresh_workspace.buffers


# -- the schedule ----------------------------------------------------------------------------
def _ranges(plan: Schedule) -> list[range]:
    """The stream-K programs' ranges of iterations, as the kernel cuts them."""
    iterations = plan.sk_tiles * plan.k_steps
    return [range(p * iterations // plan.sk_programs, (p + 1) * iterations // plan.sk_programs)
            for p in range(plan.sk_programs)]


@pytest.mark.parametrize("full_waves", (0, 1))
def test_schedule_invariants_the_kernel_relies_on(full_waves):
    """Over many tile counts, K steps and SM counts: every program the same whole tiles; no
    empty range (so a tile's contributors are the programs owner(first)..owner(last), which
    the owner formula finds); at most two parts of tiles per range (its two slots), and at
    most MAX_PARTS programs per tile."""
    for tiles in range(1, 40):
        for k_steps in range(1, 9):
            for sms in range(1, 9):
                plan = schedule(tiles, k_steps, sms, full_waves)
                assert plan.dp_tiles % plan.programs == 0
                assert plan.dp_tiles + plan.sk_tiles == tiles
                ranges = _ranges(plan)
                assert all(ranges) and sum(map(len, ranges)) == plan.sk_tiles * plan.k_steps
                for p, owned in enumerate(ranges):
                    # the kernel's _iteration_owner, for every iteration of the range
                    iterations = plan.sk_tiles * plan.k_steps
                    assert {((i + 1) * plan.sk_programs - 1) // iterations for i in owned} == {p}
                    segments = {i // k_steps: [] for i in owned}
                    for i in owned:
                        segments[i // k_steps].append(i)
                    parts = [s for s in segments.values() if len(s) < k_steps]
                    assert len(parts) <= 2
                for tile in range(plan.sk_tiles):  # contributors: at most MAX_PARTS
                    steps = range(tile * k_steps, (tile + 1) * k_steps)
                    assert sum(bool(set(steps) & set(r)) for r in ranges) <= streamk.MAX_PARTS


def test_schedule_streams_the_partial_wave_and_the_full_waves_asked_for():
    # 1536×1536 in 128×256 tiles: 72 tiles for 132 SMs, all streamed.
    assert schedule(72, 192, 132, 0) == Schedule(132, 0, 72, 132, 192)
    # 3000×4608 in 128×256 tiles: 432 tiles, 3 whole waves and 36 streamed, by 72 programs
    # (MAX_PARTS); or 2 whole waves and 168 streamed by all.
    assert schedule(432, 56, 132, 0) == Schedule(132, 396, 36, 72, 56)
    assert schedule(432, 56, 132, 1) == Schedule(132, 264, 168, 132, 56)
    # Whole waves: nothing streamed, or one wave of whole ranges (the persistent schedule).
    assert schedule(264, 64, 132, 0) == Schedule(132, 264, 0, 0, 64)
    assert schedule(264, 64, 132, 1) == Schedule(132, 132, 132, 132, 64)


# -- config checks ---------------------------------------------------------------------------
def test_one_k_step_is_refused_as_the_persistent_schedule():
    assert "one BLOCK_K=64 step" in STREAMK.unsupported(
        meta_gemm(Shape(512, 512, 64, "bf16")), config(BLOCK_K=64))
    assert STREAMK.unsupported(meta_gemm(Shape(512, 512, 72, "bf16")), config(BLOCK_K=64)) \
        is None


def test_what_tma_cannot_address_is_refused():
    reason = STREAMK.unsupported(meta_gemm(Shape(32, 48, 71, "fp16", "nn")), config())
    assert "A's stride of 71 elements" in reason


def test_feasibility_of_the_large_tiles():
    mm, limit = KERNELS["mm"], model.H100_SXM.smem_per_block
    wide = {"variant": "streamk", "pad": 0, "BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64,
            "GROUP_M": 8, "num_stages": 3, "num_warps": 8, "SK_FULL_WAVES": 0}
    assert mm.feasible(wide, meta_gemm(Shape(1536, 1536, 12288, "bf16", "nt")), limit) is None
    assert "shared memory" in mm.feasible(
        dict(wide, num_stages=4), meta_gemm(Shape(1536, 1536, 12288, "bf16", "nt")), limit)
    assert "registers" in mm.feasible(
        dict(wide, num_warps=4), meta_gemm(Shape(1536, 1536, 12288, "bf16", "nt")), limit)


# What Triton 3.6 and 3.9 report for the kernel on sm_90 (the larger of the two where they
# differ): dtype, layout, (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps), bytes.
TRITON_SMEM = [
    ("bf16", "nt", (128, 256, 64, 3, 8), 213016), ("bf16", "nt", (128, 128, 64, 4, 8), 163872),
    ("bf16", "nt", (64, 256, 64, 3, 4), 155672), ("bf16", "nt", (32, 64, 64, 3, 2), 28688),
    ("bf16", "nt", (16, 32, 32, 2, 4), 4104), ("fp8e4m3", "nt", (128, 256, 64, 3, 8), 196608),
    ("fp8e4m3", "nt", (64, 256, 64, 3, 4), 98304),
    ("fp8e4m3", "nt", (256, 128, 64, 3, 8), 139288),
    ("fp32", "nt", (64, 128, 64, 4, 4), 213016), ("fp32", "nt", (16, 32, 32, 2, 4), 12296),
    ("fp32", "nt", (32, 64, 64, 3, 2), 73744), ("fp32", "nt", (128, 128, 32, 2, 4), 114696),
    ("fp32", "tn", (128, 64, 32, 3, 8), 98336), ("fp32", "tt", (64, 128, 64, 4, 4), 213048),
    ("fp32", "nn", (64, 128, 64, 4, 4), 180248),
]


@pytest.mark.parametrize("dtype, layout, tile, reported", TRITON_SMEM, ids=str)
def test_smem_estimate_bounds_what_triton_reported(dtype, layout, tile, reported):
    tunables = dict(zip(("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_stages", "num_warps"), tile),
                    GROUP_M=8, SK_FULL_WAVES=0)
    estimate = STREAMK.smem_bytes(tunables, meta_gemm(Shape(1536, 1536, 4096, dtype, layout)))
    assert reported <= estimate < 1.5 * reported


def test_registered_in_mm_only_with_its_names():
    assert KERNELS["mm"].variant["streamk"] is STREAMK
    assert "streamk" not in KERNELS["gemv"].variant
    assert STREAMK.params == (*TILE_PARAMS, "SK_FULL_WAVES")
    assert config_label({"variant": "streamk", "pad": 0, **config()}) == \
        "streamk BM16 BN16 BK16 G2 s2 w4 skw0"
    assert "stream-K" in NO_EXPAND_OP["streamk"]
    assert STREAMK.tma_fed and STREAMK.program_per_sm


# -- the model term --------------------------------------------------------------------------
WIDE_TILE = {"pad": 0, "BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8,
             "num_stages": 3, "num_warps": 8}
PERSISTENT = {"variant": "persistent", **WIDE_TILE, "WARP_SPECIALIZE": 0, "FLATTEN": 0,
              "EPILOGUE_SUBTILE": 0}


def _streamk(full_waves: int) -> dict:
    return {"variant": "streamk", **WIDE_TILE, "SK_FULL_WAVES": full_waves}


@pytest.mark.parametrize("mnk", [(1536, 1536, 12288), (1280, 3584, 4096)], ids=str)
def test_the_model_prefers_stream_k_where_waves_are_quantized(mnk):
    """On an H100, 1536×1536×12288 (72 tiles of 128×256 for 132 SMs) ran 121 µs with the
    persistent 128×256 tile and 106 µs streaming the 12 tiles of 128×128 left over by a
    wave; 1280×3584×4096 (140 tiles), 93 and 82 µs."""
    shape = Shape(*mnk, "bf16", "nt")
    streamed = dict(_streamk(0), BLOCK_N=128, num_stages=4)
    assert 0 < model.predict_ms(shape, streamed, model.H100_SXM) < \
        model.predict_ms(shape, PERSISTENT, model.H100_SXM)


@pytest.mark.parametrize("mnk", [(1536, 1536, 12288), (4096, 4096, 4096)], ids=str)
def test_the_model_charges_streaming_for_the_l2_reuse_it_loses(mnk):
    """On an H100, streaming all 72 tiles of 128×256 of 1536×1536×12288 ran 165 µs, the
    persistent kernel 121; streaming 116 of the 512 of 4096³ ran 234, persistent 195:
    programs staggered along K no longer share the blocks of A and B in L2."""
    shape = Shape(*mnk, "bf16", "nt")
    assert model.predict_ms(shape, _streamk(0), model.H100_SXM) >= \
        model.predict_ms(shape, PERSISTENT, model.H100_SXM)


@pytest.mark.parametrize("full_waves", (0, 1))
def test_the_model_finds_no_gain_in_full_waves(full_waves):
    """1536×2816 is 132 tiles of 128×256: stream-K changes nothing but adds nothing either."""
    shape = Shape(1536, 2816, 4096, "bf16", "nt")
    whole = model.predict_ms(shape, PERSISTENT, model.H100_SXM)
    assert model.predict_ms(shape, _streamk(full_waves), model.H100_SXM) == \
        pytest.approx(whole)


def test_the_model_never_predicts_streaming_slower_than_whole_tiles():
    """66 tiles of 2 K steps for 132 SMs: streamed, every program takes one step and every
    tile is two parts to write and read back; 132 whole tiles of the same 2 steps would take
    no longer. The term then gives the whole tiles' time (kernels/streamk_cost.py says why)."""
    shape = Shape(688, 656, 48, "fp16", "nn")  # 11 × 6 tiles of 64×128, 2 steps of 32
    tile = {"pad": 0, "BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 1,
            "num_stages": 2, "num_warps": 2}
    streamed = model.predict_ms(shape, {"variant": "streamk", **tile, "SK_FULL_WAVES": 0},
                                model.H100_SXM)
    whole = model.predict_ms(shape, dict(PERSISTENT, **tile), model.H100_SXM)
    assert streamed == pytest.approx(whole)


def test_the_model_cannot_run_unaligned_operands():
    unaligned = Shape(4097, 4095, 4100, "bf16")
    assert model.predict_ms(unaligned, _streamk(0), model.H100_SXM) == float("inf")
    assert model.predict_ms(unaligned, dict(_streamk(0), pad=64), model.H100_SXM) \
        < float("inf")


# -- on the GPU machine ----------------------------------------------------------------------
GPU_CONFIG = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_stages": 3,
              "num_warps": 8, "SK_FULL_WAVES": 0}
WIDE_GPU_CONFIG = {**GPU_CONFIG, "BLOCK_N": 256}


def gpu_config(dtype: str, **changes) -> dict:
    """fp32 tiles are twice as wide: a smaller BLOCK_K keeps them within shared memory."""
    return {**GPU_CONFIG, **({"BLOCK_K": 32} if dtype == "fp32" else {}), **changes}


@pytest.mark.gpu
@pytest.mark.parametrize("full_waves", (0, 1))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_gpu_matches_reference(layout, dtype, full_waves):
    """1536×1536 in 128×128 tiles: 144 tiles on 132 SMs; 12 streamed by 24 programs, or all
    144 by 132."""
    tunables = gpu_config(dtype, SK_FULL_WAVES=full_waves)
    for seed in range(3):
        gemm = random_gemm(Shape(1536, 1536, 2048, dtype, layout), "cuda", seed=seed)
        gemm.out.fill_(float("nan"))
        gemm = dataclasses.replace(gemm, bias=torch.randn(1536, device="cuda").to(
            gemm.out.dtype))
        assert launch_error(STREAMK, gemm, tunables) <= DTYPES[dtype].tolerance, seed


@pytest.mark.gpu
def test_gpu_ragged_shape_with_pointer_store():
    gemm = poisoned_gemm(Shape(1000, 777, 1032, "bf16", "nt"), "cuda", bias=True)
    assert launch_error(STREAMK, gemm, GPU_CONFIG) <= DTYPES["bf16"].tolerance


def _same_bytes_every_run(variant, tunables, shape: Shape, runs: int = 10) -> None:
    gemm = random_gemm(shape, "cuda", seed=5)
    variant.launch(gemm, tunables, False)
    first = gemm.out.clone()
    for run in range(runs - 1):
        gemm.out.fill_(float("nan"))
        variant.launch(gemm, tunables, False)
        assert torch.equal(gemm.out.view(torch.uint8), first.view(torch.uint8)), run
    assert relative_error(first, reference(gemm)) <= DTYPES[shape.dtype].tolerance


@pytest.mark.gpu
@pytest.mark.parametrize("mnk, full_waves", [((1536, 1536, 12288), 0), ((3000, 4608, 3584), 1)],
                         ids=str)
def test_gpu_stream_k_is_bit_identical_run_to_run(mnk, full_waves):
    """72 tiles of 128×256 streamed over 132 programs, each tile summed from the parts of 2
    or 3 of them; 432 tiles, 168 streamed. Which program finishes a tile varies from run to
    run; the sum does not."""
    shape = Shape(*mnk, "bf16", "nt")
    tunables = {**WIDE_GPU_CONFIG, "SK_FULL_WAVES": full_waves}
    plan = launch_schedule(random_gemm(shape, "cuda", seed=0), tunables)
    assert plan.sk_tiles % plan.sk_programs  # ranges end mid-tile: tiles are summed from parts
    _same_bytes_every_run(STREAMK, tunables, shape)


@pytest.mark.gpu
def test_gpu_split_k_is_bit_identical_run_to_run():
    tunables = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "SPLIT_K": 16, "num_stages": 3,
                "num_warps": 4}
    _same_bytes_every_run(SPLITK, tunables, Shape(64, 512, 8192, "bf16", "nt"))


@pytest.mark.gpu
def test_gpu_compile_on_meta_tensors_is_what_the_launch_runs(monkeypatch):
    """Off CUDA the schedule has 3 programs, on the GPU one per SM: runtime arguments Triton
    does not specialize on, so the compile worker's binary is the launch's."""
    compiled = []
    monkeypatch.setattr(triton.knobs.runtime, "jit_cache_hook",
                        lambda **hook: compiled.append(hook["fn"].name))
    shape = Shape(528, 400, 1040, "fp16", "tn")  # used by no other test
    STREAMK.launch(meta_gemm(shape), GPU_CONFIG, True)
    assert compiled == ["_streamk_kernel"]
    compiled.clear()
    gemm = poisoned_gemm(shape, "cuda")
    assert launch_error(STREAMK, gemm, GPU_CONFIG) <= DTYPES["fp16"].tolerance
    assert compiled == []
