"""The gluongemv variant (kernels/gluon_gemv.py): its refusals, place in mm and model term on
any machine, and, marked `gpu`, the compiled kernel against a float64 reference.

Triton's interpreter cannot run Gluon: on CPU-only machines the variant refuses every call,
and the CPU tests step past that refusal and the device check (conftest's `on_hopper`) to
check the rest of `unsupported`. Its replay through the dispatcher and its CUDA-graph capture are
tests/test_multigemv.py's, which runs them for every gemv-walk variant.
"""
import dataclasses

import pytest
import torch

from tests.test_multigemv import VARIANTS, model_picks, shape_error
from tuner.dtypes import DTYPES
from tuner.execution.measure import random_gemm, reference, relative_error
from tuner.kernels import KERNELS, gluon_mm, kernel_variants
from tuner.kernels._launch import INTERPRETED
from tuner.kernels.base import config_label
from tuner.kernels.calls import meta_gemm
from tuner.kernels.gluon_gemv import GLUONGEMV
from tuner.model.named_devices import named_spec
from tuner.model.predict import predict_ms
from tuner.search.replay_report import geomean
from tuner.shapes import Shape
from tuner.space import builtin_spaces

MM = KERNELS["mm"]
CONFIG = VARIANTS["gluongemv"][2]


def why(shape: Shape, **tunables) -> str | None:
    return GLUONGEMV.unsupported(meta_gemm(shape), {**CONFIG, **tunables})


def test_is_in_mm_and_its_space_unpadded_with_no_flaggems_op():
    assert MM.variant["gluongemv"] is GLUONGEMV
    assert "gluongemv" in builtin_spaces(kernel_variants())["mm"].variant_params
    config = {"variant": "gluongemv", "pad": 0, **CONFIG}
    assert config_label(config) == "gluongemv BM16 BK128 s2 w4"
    assert not GLUONGEMV.takes_pad
    assert "Gluon kernel" in GLUONGEMV.no_expand_op


@pytest.mark.skipif(not INTERPRETED, reason="the interpreter is on only without a GPU")
def test_the_interpreter_cannot_run_it():
    gemm = meta_gemm(Shape(8, 4096, 4096, "bf16", "nt"))
    assert MM.feasible({"variant": "gluongemv", "pad": 0, **CONFIG}, gemm, 232448) == \
        "Gluon kernels do not run in Triton's interpreter"


@pytest.mark.parametrize("arch, named", [(75, "sm_75"), (None, "no CUDA GPU")])
def test_refuses_targets_without_bf16_mma(on_hopper, monkeypatch, arch, named):
    monkeypatch.setattr(gluon_mm, "target_arch", lambda device: arch)
    assert why(Shape(8, 4096, 4096, "bf16", "nt")) == \
        f"gluongemv: mma.sync takes bf16 from sm_80, and the target is {named}"


def test_takes_a_k_contiguous_16_bit_matrix_either_way_round(on_hopper):
    """The few vectors as M (the weight of `linear`, stored N×K) or as N (A row-major)."""
    assert why(Shape(8, 4096, 4096, "bf16", "nt")) is None
    assert why(Shape(16, 1024, 14336, "fp16", "nt")) is None
    assert why(Shape(4096, 8, 4096, "bf16", "nn")) is None
    assert why(Shape(2, 50257, 768, "bf16", "nt")) is None


def test_refuses_what_it_is_not_for(on_hopper):
    """One vector (gemv's) and more than 16, other dtypes, a matrix whose K is strided, tiles
    and steps the MMA layout cannot split, a third stage, and registers past a thread's."""
    assert why(Shape(1, 4096, 4096, "bf16", "nt")) == \
        "gluongemv needs M or N from 2 to 16, not 1×4096"
    assert why(Shape(17, 4096, 4096, "bf16", "nt")) == \
        "gluongemv needs M or N from 2 to 16, not 17×4096"
    assert "16-bit operands only" in why(Shape(8, 4096, 4096, "fp32", "nt"))
    assert "16-bit operands only" in why(Shape(8, 4096, 4096, "fp8e4m3", "nt"))
    assert "K-contiguous" in why(Shape(8, 4096, 4096, "bf16", "nn"))
    assert "K-contiguous" in why(Shape(8, 4096, 4100 - 2, "bf16", "nt"))  # rows off 16 bytes
    assert why(Shape(8, 4096, 4096, "bf16", "nt"), BLOCK_K=16) == \
        "gluongemv: BLOCK_K must be a multiple of 32 (4 threads of 8 K elements)"
    assert "num_stages 2 at most" in why(Shape(8, 4096, 4096, "bf16", "nt"), num_stages=3)
    assert "a whole K step" in why(Shape(8, 4096, 256, "bf16", "nt"), num_warps=8)
    assert why(Shape(8, 4096, 256, "bf16", "nt"), num_warps=8, num_stages=1) is None
    assert "registers" in why(Shape(8, 4096, 4096, "bf16", "nt"), BLOCK_M=256, BLOCK_K=256)


def test_the_model_ranks_configs_by_the_bytes_their_warps_keep_in_flight():
    """Loads straight to registers wait for DRAM's latency: half the bytes in flight, a
    slower stream, until a config keeps enough in flight to stand on the DRAM bound, where
    the read-bound configs of the other variants stand too."""
    spec = named_spec("NVIDIA H100 80GB HBM3")
    shape = Shape(8, 4096, 4096, "bf16", "nt")

    def ms(variant="gluongemv", **change):
        return predict_ms(shape, {"variant": variant, "pad": 0, **CONFIG, **change}, spec)
    assert ms(num_warps=2, num_stages=1) > ms(num_warps=2) > ms()  # 2, 4 and 8 KiB a warp
    assert ms() == ms(num_warps=8, BLOCK_K=64)  # the same bytes in flight
    assert ms() == ms("mmagemv", BLOCK_K=256, num_stages=8, num_warps=2)  # the DRAM bound


def test_the_model_picks_among_the_configs_an_exhaustive_run_measured():
    """8 H100 studies of all 60 gluongemv configs of a probe space and cuBLAS at decode
    batch 6-8 (tests/data/README.md): the model's pick reaches 0.975 of
    the best (geomean; min 0.964). With the DRAM bound alone every config ties and the pick
    falls to the least shared memory, the fewest warps: 0.465 (min 0.177)."""
    ratios = model_picks("studies-h100-gluongemv.json.gz")
    assert len(ratios) == 8 and geomean(ratios) >= 0.97 and min(ratios) >= 0.95


# -- on a GPU ---------------------------------------------------------------------------------

# (M, N, K, dtype, layout): the vectors as M (a weight stored N×K) and as N; 2-16 of them
# (padded to 8 and 16); K a whole number of steps and not (GPT-2's 768, 4104); rows past a
# whole program (4099, 50257).
GPU_CASES = [(8, 4096, 4096, "bf16", "nt"), (6, 6144, 4096, "fp16", "nt"),
             (16, 1024, 14336, "bf16", "nt"), (4096, 8, 4096, "bf16", "nn"),
             (4096, 12, 4096, "bf16", "nt"), (5, 4099, 4104, "bf16", "nt"),
             (2, 50257, 768, "fp16", "nt")]


@pytest.mark.gpu
@pytest.mark.parametrize("stages", (1, 2))
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: "-".join(map(str, c)))
def test_gpu_correct_over_seeds(case, stages):
    for seed in range(3):
        assert shape_error(Shape(*case), {**CONFIG, "num_stages": stages}, "cuda", seed,
                           variant=GLUONGEMV) <= DTYPES[case[3]].tolerance


@pytest.mark.gpu
@pytest.mark.parametrize("mnk", [(6, 4096, 4096), (4096, 6, 4096)], ids=("rows", "columns"))
def test_gpu_bias_runs_along_n_either_way_round(mnk):
    shape = Shape(*mnk, "bf16", "nt")
    gemm = dataclasses.replace(random_gemm(shape, "cuda", seed=0),
                               bias=torch.randn(shape.N, device="cuda", dtype=torch.bfloat16))
    gemm.out.fill_(float("nan"))
    GLUONGEMV.launch(gemm, CONFIG, False)
    assert relative_error(gemm.out, reference(gemm)) <= DTYPES["bf16"].tolerance
