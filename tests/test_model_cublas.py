"""The analytical model's cuBLAS term (kernels/cublas_cost.py, through tuner.model.predict): the
yardstick the runtime's fallback holds tuned candidates to. CPU only."""
import pytest

from tuner.kernels.cublas_cost import (
    CUBLAS_DRAM_FRACTION,
    CUBLAS_FEW_OUTPUTS_BYTES_PER_S,
    CUBLAS_MATMUL_FRACTION,
    CUBLAS_UNALIGNED_SLOWDOWN,
)
from tuner.model import predict as model
from tuner.model.tiles import LAUNCH_S, LOAD_LATENCY_S
from tuner.shapes import Shape

H200 = model.H200_SXM
CUBLAS = {"variant": "cublas", "pad": 0}
FIXED_MS = (LOAD_LATENCY_S + LAUNCH_S) * 1e3


def test_a_large_aligned_gemm_runs_at_cublas_sustained_share_of_the_peak():
    shape = Shape(8192, 8192, 8192, "bf16")
    rate = H200.fp16_tflops * 1e12 * CUBLAS_MATMUL_FRACTION
    assert model.predict_ms(shape, CUBLAS, H200) == pytest.approx(
        shape.flops / rate * 1e3 + FIXED_MS)


def test_a_single_row_is_bound_by_its_bytes():
    shape = Shape(1, 28672, 4096, "bf16", "nt")
    nbytes = (28672 * 4096 + 4096 + 28672) * 2
    bandwidth = H200.dram_tbps * 1e12 * CUBLAS_DRAM_FRACTION
    assert model.predict_ms(shape, CUBLAS, H200) == pytest.approx(
        nbytes / bandwidth * 1e3 + FIXED_MS)


def test_unaligned_strides_slow_cublas_compute_down():
    aligned, unaligned = Shape(4096, 4096, 4096, "bf16"), Shape(4097, 4095, 4100, "bf16")
    ratio = ((model.predict_ms(unaligned, CUBLAS, H200) - FIXED_MS)
             / (model.predict_ms(aligned, CUBLAS, H200) - FIXED_MS))
    assert ratio == pytest.approx(CUBLAS_UNALIGNED_SLOWDOWN * unaligned.flops
                                  / aligned.flops)


def test_tf32_is_faster_than_ieee_fp32():
    shape = Shape(4096, 4096, 4096, "fp32")
    ieee = model.predict_ms(shape, CUBLAS, H200)
    assert model.predict_ms(shape, CUBLAS, H200, allow_tf32=True) < ieee / 4


# cuBLAS through torch on one H200 (the vs_cublas benchmark): TF/s.
MEASURED_TFLOPS = [
    (Shape(8192, 8192, 8192, "bf16"), 688.8),
    (Shape(4096, 4096, 4096, "bf16"), 741.8),
    (Shape(16, 4096, 4096, "bf16"), 43.8),
    (Shape(4097, 4095, 4100, "bf16"), 146.6),
    (Shape(1, 28672, 4096, "bf16", "nt"), 3.3),
    (Shape(256, 6144, 4096, "bf16", "nt"), 463.4),
    (Shape(77, 768, 768, "fp16"), 26.1),
    (Shape(2048, 2048, 2048, "fp32"), 49.8),
]


@pytest.mark.parametrize("shape, tflops", MEASURED_TFLOPS, ids=str)
def test_the_estimate_stays_near_the_measured_time(shape, tflops):
    """A roofline errs towards cuBLAS where it sees no wave quantization (256x6144x4096:
    0.73x), never far either way."""
    measured_ms = shape.flops / (tflops * 1e12) * 1e3
    assert 0.7 < model.predict_ms(shape, CUBLAS, H200) / measured_ms < 1.2


@pytest.mark.parametrize("label", ["2x2x65536 fp32 nn", "4x4x131072 bf16 nn",
                                   "3x5x65537 bf16 tn"])
def test_a_few_outputs_read_their_operands_at_cublas_slow_rate(label):
    """cuBLAS's kernels for a handful of outputs walk K in few programs: their bytes at
    CUBLAS_FEW_OUTPUTS_BYTES_PER_S, far below the bandwidth."""
    shape = Shape.from_label(label)
    nbytes = (shape.M * shape.K + shape.K * shape.N + shape.M * shape.N) * 2
    nbytes *= 2 if shape.dtype == "fp32" else 1
    assert model.predict_ms(shape, CUBLAS, H200) == pytest.approx(
        nbytes / CUBLAS_FEW_OUTPUTS_BYTES_PER_S * 1e3 + FIXED_MS)


@pytest.mark.parametrize("label", ["8x16x32768 fp16 nn", "1x2x65536 fp32 nn"])
def test_more_outputs_or_a_single_row_keep_the_roofline(label):
    shape = Shape.from_label(label)
    nbytes = (shape.M * shape.K + shape.K * shape.N + shape.M * shape.N)
    nbytes *= 4 if shape.dtype == "fp32" else 2
    bandwidth = H200.dram_tbps * 1e12 * CUBLAS_DRAM_FRACTION
    assert model.predict_ms(shape, CUBLAS, H200) == pytest.approx(
        nbytes / bandwidth * 1e3 + FIXED_MS)
