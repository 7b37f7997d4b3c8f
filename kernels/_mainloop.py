"""Triton code shared by the tile variants: the grouped tile order (general, tma, persistent),
the wrapped row and column indices of the pointer-based kernels (general, splitk, gemv), and
the main loop of general and splitk, which loads tiles of A and B through their strides and
multiplies them on tensor cores into an fp32 accumulator; general walks all of K, a split-K
program its slice."""
import triton
import triton.language as tl


@triton.jit
def wrapped_indices(first, wrap, BLOCK: tl.constexpr, HINT: tl.constexpr):
    """first + [0, BLOCK), wrapped around at `wrap` (_launch.wrap_point) onto loadable rows
    (columns), so loads along this dimension need no mask: what lanes past the operand's
    extent compute lands in output the store masks off. Where HINT (_launch.wrap_keeps_vectors)
    says the wrap point keeps vectors aligned, the indices are hinted contiguous, which lets
    the compiler vectorize loads along a unit stride."""
    indices = (first + tl.arange(0, BLOCK)) % wrap
    if HINT:
        indices = tl.max_contiguous(tl.multiple_of(indices, BLOCK), BLOCK)
    return indices


@triton.jit
def accumulate_k_steps(
    acc, a_ptr, b_ptr, rows, cols, K, first_step, end_step,
    stride_am, stride_ak, stride_bk, stride_bn,
    BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, DOT_UPCAST: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    """acc + A[rows, k] @ B[k, cols] for k in BLOCK_K steps [first_step, end_step).

    rows and cols must be valid indices; unless EVEN_K, the last step's columns past K are
    masked to zeros. DOT_UPCAST and INPUT_PRECISION come from _launch.dot_options.
    """
    ks = tl.arange(0, BLOCK_K)
    first_k = first_step * BLOCK_K
    a_ptrs = a_ptr + rows[:, None] * stride_am + (first_k + ks)[None, :] * stride_ak
    b_ptrs = b_ptr + (first_k + ks)[:, None] * stride_bk + cols[None, :] * stride_bn
    for k_step in range(first_step, end_step):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = K - k_step * BLOCK_K
            a = tl.load(a_ptrs, mask=ks[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=ks[:, None] < k_left, other=0.0)
        if DOT_UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc


@triton.jit
def grouped_tile(tile, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 GROUP_M: tl.constexpr):
    """(tile_m, tile_n) of the tile-th output tile in grouped order.

    Consecutive tiles fill a column of GROUP_M tiles before moving to the next tile column, so
    programs running at the same time reuse the same A rows and B columns from L2. GROUP_M == 1
    is plain row-major order.
    """
    tiles_per_group = GROUP_M * tl.cdiv(N, BLOCK_N)
    first_tile_m = (tile // tiles_per_group) * GROUP_M
    group_rows = min(tl.cdiv(M, BLOCK_M) - first_tile_m, GROUP_M)  # the last group may be short
    tile_m = first_tile_m + (tile % tiles_per_group) % group_rows
    tile_n = (tile % tiles_per_group) // group_rows
    return tile_m, tile_n
