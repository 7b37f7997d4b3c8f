"""The tma and persistent variants against a float64 reference, and their TMA checks.

On a CPU-only machine the kernels run in Triton's interpreter (tests/conftest.py), which
supports host tensor descriptors: shapes stay under 100 per dimension and blocks at 16..64.
Outputs are poisoned with NaN before each launch, so an element the kernel never writes
fails. TMA needs 16-byte row strides, so shapes here keep every dimension a stride is made of
a multiple of 8 (16 for fp8) unless a test is about the refusal. Tests marked `gpu` run the
compiled kernels on the GPU machine.
"""
import dataclasses
import itertools

import pytest
import torch

from tests.factories import slow_except
from tuner.dtypes import DTYPES, TF32_TOLERANCE
from tuner.execution.measure import random_gemm, reference, relative_error
from tuner.kernels import KERNELS, persistent, tma
from tuner.kernels.base import Gemm
from tuner.kernels.calls import meta_gemm
from tuner.kernels.persistent import PERSISTENT
from tuner.kernels.tma import TMA
from tuner.shapes import LAYOUTS, Shape

BLOCKS = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 2, "num_stages": 2,
          "num_warps": 4}
FLAGS = persistent.FLAGS
# Every combination of the persistent variant's 0/1 parameters.
FLAG_VALUES = [dict(zip(FLAGS, values)) for values in itertools.product((0, 1), repeat=3)]
CONFIGS = {"tma": BLOCKS, "persistent": {**BLOCKS, "WARP_SPECIALIZE": 0, "FLATTEN": 1,
                                         "EPILOGUE_SUBTILE": 1}}
VARIANTS = {"tma": TMA, "persistent": PERSISTENT}
# The dtypes with a stride alignment of 8 elements (fp8 needs 16: its own tests).
WIDE_DTYPES = ("fp16", "bf16", "fp32")


def poisoned_gemm(shape: Shape, device: str, bias: bool = False, **fields) -> Gemm:
    """A random GEMM of the shape with a NaN-filled output (and a random bias)."""
    gemm = random_gemm(shape, device, seed=shape.M * 7919 + shape.N * 31 + shape.K)
    gemm.out.fill_(float("nan"))
    if bias:
        fields["bias"] = torch.randn(shape.N, device=device).to(gemm.out.dtype)
    return dataclasses.replace(gemm, **fields)


def launch_error(variant, gemm: Gemm, config) -> float:
    """Relative error of the variant's output against the float64 reference."""
    assert variant.unsupported(gemm, config) is None
    variant.launch(gemm, config, False)
    return relative_error(gemm.out, reference(gemm))


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", VARIANTS)
def test_every_layout_matches_reference(name, layout, dtype, device):
    """M, N and K all end mid-block: TMA zero-fills the loads and clips the stores."""
    gemm = poisoned_gemm(Shape(40, 56, 72, dtype, layout), device)
    assert launch_error(VARIANTS[name], gemm, CONFIGS[name]) <= DTYPES[dtype].tolerance


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", VARIANTS)
def test_fp8_scales_go_through_the_epilogue(name, layout, device):
    gemm = poisoned_gemm(Shape(48, 80, 96, "fp8e4m3", layout), device)
    assert gemm.scale_a is not None
    assert launch_error(VARIANTS[name], gemm, CONFIGS[name]) <= DTYPES["fp8e4m3"].tolerance


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", VARIANTS)
def test_descriptors_built_by_the_kernel_compute_the_same(name, layout, device):
    """Either placement of the descriptors (kernels/tma.py), with a bias; in `nt` also a
    pointer-stored output (53 columns: TMA reads that layout's operands in any case)."""
    launch = {"tma": tma.launch, "persistent": persistent.launch}[name]
    for n in (56, 53) if layout == "nt" else (56,):
        gemm = poisoned_gemm(Shape(40, n, 72, "bf16", layout), device, bias=True)
        launch(gemm, CONFIGS[name], False, on_device=True)
        assert relative_error(gemm.out, reference(gemm)) <= DTYPES["bf16"].tolerance


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
@pytest.mark.parametrize("name", VARIANTS)
def test_unaligned_output_is_stored_through_pointers(name, dtype, device):
    """37×53×72 `nt`: A and B are TMA-aligned, but out's 53-element rows are not."""
    gemm = poisoned_gemm(Shape(37, 53, 72, dtype, "nt"), device, bias=True)
    assert tma.descriptor_problem("out", gemm.out) is not None
    assert launch_error(VARIANTS[name], gemm, CONFIGS[name]) <= DTYPES[dtype].tolerance


@pytest.mark.parametrize("name", VARIANTS)
def test_column_major_output(name, device):
    gemm = poisoned_gemm(Shape(40, 48, 64, "fp16", "tn"), device)
    out = torch.full((48, 40), float("nan"), dtype=torch.float16, device=device).t()
    gemm = dataclasses.replace(gemm, out=out)
    assert launch_error(VARIANTS[name], gemm, CONFIGS[name]) <= DTYPES["fp16"].tolerance


@pytest.mark.parametrize("subtile", (0, 1))
@pytest.mark.parametrize("layout", ("nn", "tt"))
@pytest.mark.parametrize("name", VARIANTS)
def test_bias(name, layout, subtile, device):
    """Each output half of a subtiled store adds its own columns of the bias."""
    gemm = poisoned_gemm(Shape(40, 56, 72, "bf16", layout), device, bias=True)
    config = {**CONFIGS[name], "EPILOGUE_SUBTILE": subtile} if name == "persistent" \
        else CONFIGS[name]
    assert launch_error(VARIANTS[name], gemm, config) <= DTYPES["bf16"].tolerance


@pytest.mark.parametrize("name", VARIANTS)
def test_tf32_opt_in_stays_within_tf32_tolerance(name, device):
    gemm = poisoned_gemm(Shape(48, 40, 96, "fp32", "nt"), device, allow_tf32=True)
    assert launch_error(VARIANTS[name], gemm, CONFIGS[name]) <= TF32_TOLERANCE


# In the fast subset warp specialization (25 tiles in the interpreter are slow; FLATTEN and
# EPILOGUE_SUBTILE are in CONFIGS, which the tests above run); every combination in CI.
@pytest.mark.parametrize("flags", slow_except(FLAG_VALUES, dict(zip(FLAGS, (1, 0, 1)))),
                         ids=lambda f: "-".join(map(str, f.values())))
@pytest.mark.parametrize("dtype", slow_except(WIDE_DTYPES, "fp16"))
def test_persistent_flags_with_many_tiles_per_program(flags, dtype, device):
    """72×80 in 16×16 tiles is 25 tiles, 8 or 9 per program on the interpreter's 3; GROUP_M=2
    over 5 tile rows leaves a short last group."""
    shape = Shape(72, 80, 48, dtype, "tn")
    gemm = poisoned_gemm(shape, device, bias=True)
    config = {**BLOCKS, "BLOCK_N": 16, "BLOCK_K": 16, **flags}
    if device == "cpu":
        assert persistent.num_sms(gemm.a.device) == persistent.INTERPRETER_PROGRAMS == 3
    if flags["WARP_SPECIALIZE"] and (flags["FLATTEN"] or config["num_warps"] != 4):
        # Triton would build the plain loop: a duplicate of WARP_SPECIALIZE=0, refused.
        assert "WARP_SPECIALIZE takes effect only" in PERSISTENT.unsupported(gemm, config)
        return
    if flags["WARP_SPECIALIZE"] and not gemm.tensor_cores:
        assert "several times slower" in PERSISTENT.unsupported(gemm, config)
        return
    assert launch_error(PERSISTENT, gemm, config) <= DTYPES[dtype].tolerance


@pytest.mark.slow  # the flags test above has a short last group in the fast subset
@pytest.mark.parametrize("group_m", (1, 3, 8))
def test_persistent_tile_orders(group_m, device):
    gemm = poisoned_gemm(Shape(88, 64, 40, "fp16", "nn"), device)
    config = {**CONFIGS["persistent"], "BLOCK_N": 16, "GROUP_M": group_m}
    assert launch_error(PERSISTENT, gemm, config) <= DTYPES["fp16"].tolerance


@pytest.mark.parametrize("name", VARIANTS)
def test_unsupported_names_what_tma_cannot_address(name):
    def reason(gemm: Gemm) -> str | None:
        return VARIANTS[name].unsupported(gemm, CONFIGS[name])

    def reason_for(a: torch.Tensor, b: torch.Tensor) -> str | None:
        return reason(Gemm(a, b, torch.empty(a.shape[0], b.shape[1], dtype=a.dtype)))

    # K=71 fp16: A's rows are 142 bytes apart; in `tt`, A's are not but B's (stored N×K) are.
    unaligned_k = reason(meta_gemm(Shape(32, 48, 71, "fp16", "nn")))
    assert "A's stride of 71 elements (142 bytes)" in unaligned_k
    assert "B's stride" in reason(meta_gemm(Shape(32, 48, 71, "fp16", "tt")))
    # fp32 needs K a multiple of 4, fp16 of 8, fp8 of 16.
    assert reason(meta_gemm(Shape(32, 48, 68, "fp32", "nn"))) is None
    assert reason(meta_gemm(Shape(32, 48, 68, "fp16", "nn"))) is not None
    assert reason(meta_gemm(Shape(32, 48, 72, "fp8e4m3", "nn"))) is not None

    storage = torch.randn(32, 64, dtype=torch.float16)
    b = torch.randn(32, 16, dtype=torch.float16)
    assert "no unit stride" in reason_for(storage[:, ::2], b)
    assert "not 16-byte aligned" in reason_for(storage[:, 1:33], b)
    assert reason_for(storage[:, 8:40], b) is None  # 16 bytes in: aligned
    # The output never rules TMA out: an unaligned one is stored through pointers.
    assert reason(meta_gemm(Shape(32, 53, 72, "fp16", "nt"))) is None


def test_persistent_refuses_every_config_when_tl_range_lacks_an_option(monkeypatch):
    monkeypatch.setattr(persistent, "_MISSING_RANGE_OPTIONS", ("warp_specialize",))
    gemm = meta_gemm(Shape(64, 64, 64, "fp16", "nn"))
    for flags in FLAG_VALUES:
        reason = PERSISTENT.unsupported(gemm, {**BLOCKS, **flags})
        assert reason is not None and "warp_specialize=" in reason


WARP_SPECIALIZED = {**BLOCKS, "BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 4,
                    "WARP_SPECIALIZE": 1, "FLATTEN": 0, "EPILOGUE_SUBTILE": 0}


def test_persistent_refuses_warp_specialized_tiles_that_do_not_compile(monkeypatch):
    gemm = meta_gemm(Shape(256, 256, 256, "bf16", "nt"))
    assert PERSISTENT.unsupported(gemm, WARP_SPECIALIZED) is None
    assert PERSISTENT.unsupported(gemm, {**WARP_SPECIALIZED, "BLOCK_M": 256}) is None
    narrow_wide = {**WARP_SPECIALIZED, "BLOCK_M": 64, "BLOCK_N": 256}
    assert "64×256" in PERSISTENT.unsupported(gemm, narrow_wide)
    subtiled = {**WARP_SPECIALIZED, "EPILOGUE_SUBTILE": 1}
    monkeypatch.setattr(persistent, "_TRITON_VERSION", (3, 6))
    assert "EPILOGUE_SUBTILE" in PERSISTENT.unsupported(gemm, subtiled)
    assert PERSISTENT.unsupported(gemm, {**subtiled, "BLOCK_M": 64}) is None
    monkeypatch.setattr(persistent, "_TRITON_VERSION", (3, 9))
    assert PERSISTENT.unsupported(gemm, subtiled) is None


def test_persistent_refuses_deep_warp_specialized_tensor_core_tiles():
    """From 5 stages on, 128- and 256-row warp-specialized wgmma tiles read wrong on an H100
    (triton 3.6); 64-row tiles are right at every depth."""
    deepest_safe = {**WARP_SPECIALIZED, "num_stages": persistent.WS_MAX_SAFE_STAGES}
    deeper = {**deepest_safe, "num_stages": persistent.WS_MAX_SAFE_STAGES + 1}
    for dtype in ("bf16", "fp16", "fp8e4m3"):
        gemm = meta_gemm(Shape(256, 256, 256, dtype, "nt"))
        assert PERSISTENT.unsupported(gemm, deepest_safe) is None
        for block_m in (128, 256):
            reason = PERSISTENT.unsupported(gemm, {**deeper, "BLOCK_M": block_m})
            assert "wrong results" in reason, (dtype, block_m)
        assert PERSISTENT.unsupported(gemm, {**deeper, "BLOCK_M": 64}) is None


def test_persistent_refuses_warp_specialized_cuda_core_loops():
    """Every study that tried one measured a warp-specialized IEEE fp32 tile 3-70x slower than
    the best (tests/data/studies-h*.json.gz); with TF32 allowed it runs on tensor cores."""
    ieee = meta_gemm(Shape(256, 256, 256, "fp32", "nt"))
    assert "slower" in PERSISTENT.unsupported(ieee, {**WARP_SPECIALIZED, "BLOCK_M": 64})
    assert PERSISTENT.unsupported(ieee, {**WARP_SPECIALIZED, "WARP_SPECIALIZE": 0}) is None
    tf32 = dataclasses.replace(ieee, allow_tf32=True)
    assert PERSISTENT.unsupported(tf32, {**WARP_SPECIALIZED, "BLOCK_M": 64}) is None


def test_a_warp_specialized_tile_holds_its_accumulator_on_its_mma_warps():
    """128×256 on num_warps=4 would need 256 accumulator registers a thread; warp-specialized,
    Triton multiplies on two warp groups of its own (168 registers reported, no spills)."""
    kernel = KERNELS["mm"]
    gemm = meta_gemm(Shape(4096, 4096, 4096, "bf16", "nt"))
    tall = {"variant": "persistent", "pad": 0, **WARP_SPECIALIZED, "BLOCK_N": 256}
    assert kernel.feasible(tall, gemm, 232448) is None
    assert "registers" in kernel.feasible({**tall, "WARP_SPECIALIZE": 0}, gemm, 232448)


def test_installed_triton_has_every_persistent_option():
    assert persistent._MISSING_RANGE_OPTIONS == ()


def test_params():
    assert TMA.params == ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_stages", "num_warps")
    assert PERSISTENT.params == (*TMA.params, "WARP_SPECIALIZE", "FLATTEN", "EPILOGUE_SUBTILE")


def test_num_sms_off_cuda_is_small():
    assert persistent.num_sms(torch.device("meta")) == persistent.INTERPRETER_PROGRAMS


def test_smem_estimates_match_what_triton_reported():
    """Triton 3.6 and 3.9 on sm_90, 3 stages: the buffers, plus an allowance for barriers."""
    fp16, fp8, fp32 = (meta_gemm(Shape(256, 256, 256, dtype, "nt"))
                       for dtype in ("fp16", "fp8e4m3", "fp32"))
    barriers = tma.BARRIER_SMEM_BYTES
    big = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_stages": 3,
           "num_warps": 8}
    flags = dict.fromkeys(FLAGS, 0)
    # reported 98328: the store reuses the pipeline
    assert TMA.smem_bytes(big, fp16) == 98304 + barriers
    assert PERSISTENT.smem_bytes({**big, **flags}, fp16) == 131072 + barriers  # 131096
    subtiled = {**big, **flags, "EPILOGUE_SUBTILE": 1}
    assert PERSISTENT.smem_bytes(subtiled, fp16) == 114688 + barriers  # 114712
    warp_specialized = {**big, **flags, "BLOCK_M": 64, "num_warps": 4, "WARP_SPECIALIZE": 1}
    assert PERSISTENT.smem_bytes(warp_specialized, fp16) == 106496 + barriers  # 106848
    # 128 rows and more: the staged output is not double-buffered (reported 213464).
    tall = {**warp_specialized, "BLOCK_M": 128, "BLOCK_N": 256}
    assert PERSISTENT.smem_bytes(tall, fp16) == 147456 + 65536 + barriers
    # fp8 inputs: 1-byte tiles, a 2-byte (bf16) output.
    assert PERSISTENT.smem_bytes({**big, **flags}, fp8) == 3 * 16384 + 128 * 128 * 2 + barriers
    # IEEE fp32 on the CUDA cores: 2 of 3 stages buffered, and the staged output on top
    # (reported 180232 for 128x256x32 with 2 stages: 49152 + 131072 + 8).
    assert TMA.smem_bytes({**big, "BLOCK_N": 256, "BLOCK_K": 32, "num_stages": 2}, fp32) == \
        180224 + barriers
    # A flattened, subtiled IEEE tile splits its accumulator through shared memory (reported
    # 245784 for 128x128x64, 4 stages, 8 warps, nn, over the H100's 232448: 196608 + the
    # staged half 32768 + 16384 + 24).
    fp32_nn = meta_gemm(Shape(2048, 2048, 2048, "fp32", "nn"))
    split = {**big, **flags, "num_stages": 4, "FLATTEN": 1, "EPILOGUE_SUBTILE": 1}
    assert PERSISTENT.smem_bytes(split, fp32_nn) == 245760 + barriers
    assert PERSISTENT.smem_bytes(split, meta_gemm(Shape(2048, 2048, 2048, "bf16", "nn"))) == (
        4 * 16384 * 2 + 128 * 64 * 2 + barriers)


# -- on the GPU machine ---------------------------------------------------------------------
GPU_CONFIG = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_stages": 3,
              "num_warps": 8}
GPU_CONFIGS = {"tma": GPU_CONFIG,
               **{f"persistent-{'-'.join(map(str, f.values()))}": {**GPU_CONFIG, **f}
                  for f in FLAG_VALUES if not f["WARP_SPECIALIZE"]}}


def gpu_variant(config_name: str):
    return TMA if config_name == "tma" else PERSISTENT


def gpu_config(config_name: str, dtype: str) -> dict:
    """fp32 tiles are twice as wide: a smaller BLOCK_K keeps them within shared memory."""
    config = GPU_CONFIGS[config_name]
    return {**config, "BLOCK_K": 32} if dtype == "fp32" else config


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("config_name", GPU_CONFIGS)
def test_gpu_matches_reference(config_name, layout, dtype):
    gemm = poisoned_gemm(Shape(512, 384, 1024, dtype, layout), "cuda", bias=True)
    error = launch_error(gpu_variant(config_name), gemm, gpu_config(config_name, dtype))
    assert error <= DTYPES[dtype].tolerance


@pytest.mark.gpu
@pytest.mark.parametrize("name", VARIANTS)
def test_gpu_ragged_shape_with_pointer_store(name):
    gemm = poisoned_gemm(Shape(1000, 777, 1032, "bf16", "nt"), "cuda", bias=True)
    config = {**GPU_CONFIG, **(dict.fromkeys(FLAGS, 0) if name == "persistent" else {})}
    assert launch_error(VARIANTS[name], gemm, config) <= DTYPES["bf16"].tolerance


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("tile", [(64, 128), (128, 128), (128, 256), (256, 128)],
                         ids=lambda t: f"{t[0]}x{t[1]}")
def test_gpu_warp_specialized_persistent_matches_reference(tile, layout):
    """The configs Hopper really warp-specializes (num_warps=4, FLATTEN=0), 128 and 256 rows
    included, on shapes ragged in every block dimension (and TMA-aligned) with a bias."""
    config = {**WARP_SPECIALIZED, "BLOCK_M": tile[0], "BLOCK_N": tile[1]}
    for seed in range(3):
        shape = Shape(1000 + 8 * seed, 776, 1032, "bf16", layout)
        gemm = poisoned_gemm(shape, "cuda", bias=True)
        assert launch_error(PERSISTENT, gemm, config) <= DTYPES["bf16"].tolerance, seed


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp8e4m3"])
def test_gpu_warp_specialized_depths_the_variant_accepts_are_right(dtype):
    """Every depth `unsupported` lets through, at the tile heights where deeper ones read wrong
    (WS_MAX_SAFE_STAGES), on a ragged shape; 64-row tiles as deep as shared memory allows."""
    gemm_shape = Shape(1000, 768, 1040, dtype, "nt")
    kernel = KERNELS["mm"]
    accepted = 0
    for block_m, stages in itertools.product((64, 128, 256), range(2, 9)):
        config = {"variant": "persistent", "pad": 0, **WARP_SPECIALIZED, "BLOCK_M": block_m,
                  "num_stages": stages}
        gemm = poisoned_gemm(gemm_shape, "cuda")
        if kernel.feasible(config, gemm, 232448) is not None:
            continue
        accepted += 1
        kernel.launch(gemm, config)
        error = relative_error(gemm.out, reference(gemm))
        assert error <= DTYPES[dtype].tolerance, (block_m, stages)
    assert accepted >= 10


@pytest.mark.gpu
def test_gpu_fp32_is_ieee_unless_tf32_is_allowed():
    config = gpu_config("tma", "fp32")
    shape = Shape(256, 256, 1024, "fp32", "nn")
    assert launch_error(TMA, poisoned_gemm(shape, "cuda"), config) < 1e-5 < \
        launch_error(TMA, poisoned_gemm(shape, "cuda", allow_tf32=True), config)


def _kernel_of(config_name: str):
    return tma._tma_kernel if config_name == "tma" else persistent._persistent_kernel


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("config_name", ("tma", "persistent-0-1-1"))
def test_gpu_compile_on_meta_tensors_is_what_the_launch_runs(config_name, layout):
    """A compile on meta tensors (as in a compile worker) builds the binary the real launch
    then finds, so the launch compiles nothing more."""
    shape = Shape(512, 384, 1024, "fp16", layout)
    variant, config = gpu_variant(config_name), gpu_config(config_name, "fp16")
    cache = _kernel_of(config_name).device_caches[torch.cuda.current_device()][0]
    variant.launch(meta_gemm(shape), config, True)
    compiled = len(cache)
    gemm = poisoned_gemm(shape, "cuda")
    assert launch_error(variant, gemm, config) <= DTYPES["fp16"].tolerance
    assert len(cache) == compiled
