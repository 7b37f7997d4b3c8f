"""fp32 partial results summed in a fixed order, shared by the variants that split K among
programs (splitk, kreduce).

Each program stores its partial output in its own slice of an fp32 workspace; the last
program to arrive at a counter (put back to zero for the next call) sums the slices, in the
code's order whichever program that is, so results are bit-identical run to run. Atomic adds
into one shared slice would save the workspace traffic, but on an H100 (triton 3.6) their sums
read wrong now and then, so none touch the output.
"""
import triton
import triton.language as tl

# The fix-up's register budget: fp32 partials it loads at once (16 KiB over 4 warps).
SUM_ELEMENTS = 4096


def slices_summed_at_once(tile_elements: int, slices: int) -> int:
    """How many slices of `tile_elements` partials the fix-up loads at once: the largest power
    of two up to `slices` within SUM_ELEMENTS (a power of two, as tl.arange needs)."""
    fit = max(1, SUM_ELEMENTS // tile_elements)
    return 1 << (min(fit, slices).bit_length() - 1)


@triton.jit
def arrives_last(counter_ptr, ARRIVALS: tl.constexpr):
    """Count this program's arrival; True for the last of ARRIVALS, which also puts the
    counter back to zero.

    Every thread's partial is in memory before the program's arrival counts (the barrier,
    then the counter's release), and the last program reads the slices after its acquire:
    the pattern of CUDA's split-K semaphores."""
    tl.debug_barrier()
    last = tl.atomic_add(counter_ptr, 1, sem="acq_rel") == ARRIVALS - 1
    if last:
        tl.store(counter_ptr, 0)
    return last


@triton.jit
def summed_slices(slice_ptrs, in_bounds, slice_stride, SLICES: tl.constexpr,
                  SUM_SLICES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The sum over s in [0, SLICES) of the BLOCK_M×BLOCK_N partials at slice_ptrs +
    s * slice_stride (in_bounds: the elements that exist; others count 0).

    SUM_SLICES slices at a time, loaded together (slices_summed_at_once): one slice after
    another is a chain of SLICES dependent L2 reads, which is all a tiny tile's fix-up does.
    The loads bypass L1, as other SMs wrote the slices."""
    slices = tl.arange(0, SUM_SLICES)
    chunk_ptrs = slice_ptrs[None, :, :] + (slices * slice_stride)[:, None, None]
    total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for first in range(0, SLICES, SUM_SLICES):
        present = in_bounds[None, :, :] & (first + slices < SLICES)[:, None, None]
        partials = tl.load(chunk_ptrs + first * slice_stride, mask=present, other=0.0,
                           cache_modifier=".cg")
        total += tl.sum(partials, axis=0)
    return total
