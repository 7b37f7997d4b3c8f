"""Compiles happen on meta tensors; they must have the shapes, strides and dtypes of the
tensors that are then timed, or Triton would build a different specialization."""
import pytest

from tuner.dtypes import DTYPES
from tuner.execution.measure import random_gemm
from tuner.kernels.calls import meta_gemm
from tuner.shapes import LAYOUTS, Shape


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_meta_gemm_matches_the_timed_gemm(layout, dtype):
    shape = Shape(5, 7, 9, dtype, layout)
    real, meta = random_gemm(shape, "cpu", seed=0), meta_gemm(shape)
    for name in ("a", "b", "out", "scale_a", "scale_b"):
        r, m = getattr(real, name), getattr(meta, name)
        if r is None:
            assert m is None and not DTYPES[dtype].scaled
            continue
        assert (m.shape, m.stride(), m.dtype) == (r.shape, r.stride(), r.dtype), name
        assert m.device.type == "meta"
    assert (real.a.stride(0), real.b.stride(0)) == (shape.stride_am, shape.stride_bk)
    assert real.out.shape == (5, 7) and real.out.is_contiguous()
    assert real.out.dtype == DTYPES[dtype].out
