"""Compiles happen on meta tensors; they must have the shapes, strides and dtype of the tensors
that are then timed, or Triton would build a different specialization."""
import pytest

from tuner.execution import meta_operands, random_operands
from tuner.shapes import LAYOUTS, Shape


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_meta_operands_match_the_timed_operands(layout, dtype):
    shape = Shape(5, 7, 9, dtype, layout)
    a, b = random_operands(shape, "cpu", seed=0)
    meta_a, meta_b, meta_out = meta_operands(shape)
    for real, meta in ((a, meta_a), (b, meta_b)):
        assert (meta.shape, meta.stride(), meta.dtype) == (real.shape, real.stride(), real.dtype)
        assert meta.device.type == "meta"
    assert (a.stride(0), b.stride(0)) == (shape.stride_am, shape.stride_bk)
    assert meta_out.shape == (5, 7) and meta_out.is_contiguous()
