"""The epilogue every tensor-core variant applies to its fp32 accumulator before storing.

fp8 GEMMs carry per-tensor scales (out = scale_a * scale_b * (a @ b)), and `tuner.linear`
adds a bias per output column. Doing both on the accumulator, in fp32, costs nothing next to
the main loop and saves a pass over the output.
"""
import triton
import triton.language as tl


@triton.jit
def apply_epilogue(acc, cols, N, bias_ptr, scale_a_ptr, scale_b_ptr,
                   HAS_BIAS: tl.constexpr, SCALED: tl.constexpr):
    """acc (BLOCK_M×BLOCK_N fp32) scaled, then plus bias[cols] (columns past N get 0)."""
    if SCALED:
        acc = acc * (tl.load(scale_a_ptr) * tl.load(scale_b_ptr))
    if HAS_BIAS:
        bias = tl.load(bias_ptr + cols, mask=cols < N, other=0.0)
        acc = acc + bias.to(tl.float32)[None, :]
    return acc
