"""The `persistent` variant: TMA GEMM with one long-lived program per SM.

The grid is min(number of SMs, number of tiles); program p computes tiles p, p + NUM_SMS,
p + 2·NUM_SMS, ... in the grouped order of the tma variant. Launch and per-program set-up
are paid once per SM rather than once per tile, and the compiler can overlap one tile's
epilogue with the next tile's loads. Operands are read, and the output written, exactly as
in kernels/tma.py (descriptors, transposed storage, pointer fallback for the output), whose
helpers and `unsupported` check this variant reuses.

Three 0/1 parameters expose the options Triton offers for this loop:
  WARP_SPECIALIZE  tl.range(warp_specialize=): split the loop into producer (TMA) and
                   consumer (MMA) warp groups.
  FLATTEN          tl.range(flatten=): fuse the tile and K loops into one loop that the
                   software pipeliner can keep full across tile boundaries.
  EPILOGUE_SUBTILE store each tile as two BLOCK_M×BLOCK_N/2 halves, halving the shared
                   memory staged for the output store (room for another pipeline stage).
Triton 3.6 and 3.9 both have all three. The tile loop always passes both tl.range options,
so a Triton whose tl.range lacks one could compile no config of this kernel: `unsupported`
then refuses every call, naming what is missing, rather than running configs that ask for a
feature without it.

Compiling for Hopper (sm_90) with Triton 3.6 and 3.9 shows:
- warp specialization takes effect only with num_warps=4 and FLATTEN=0 (other configs build
  the plain loop, a duplicate);
- it then runs 12 warps: a load partition and two warp groups of MMA warps (WS_MMA_WARPS)
  beside the default group, so a 128×256 tile's accumulator fits where 4 warps could not;
- with the descriptors built on the device, as the kernel does where it warp-specializes,
  128- and 256-row tiles compile (host-built ones could not: triton #11587); 64×256 tiles
  do not, nor, on Triton 3.6, EPILOGUE_SUBTILE with 128 rows or more;
- 128- and 256-row warp-specialized tiles on tensor cores compute wrong results from 5
  stages on (WS_MAX_SAFE_STAGES);
- on the CUDA cores (IEEE fp32) a warp-specialized loop runs 3-70x slower than the same
  tile without: 1.3-28 ms against 0.34-0.50 ms at 2048x2048x2048 in every H100 and H200
  study that tried one (benchmarks/data/studies-*.json.gz), trials better not spent.
`unsupported` refuses those before anything compiles.

NUM_SMS is a runtime argument Triton does not specialize on, so a compile on meta tensors
builds the binary a launch on the device runs. Off CUDA (the interpreter, meta tensors) it is
INTERPRETER_PROGRAMS, small, so the interpreter runs several tiles per program.
"""
from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from pathlib import Path

import torch
import triton
import triton.language as tl

from tuner.kernels import persistent_cost, tma
from tuner.kernels._launch import tile_count
from tuner.kernels._mainloop import grouped_tile
from tuner.kernels.base import Gemm, Variant
from tuner.kernels.launches import start
from tuner.kernels.mma import TileOperands, pipeline_smem_bytes, uses_wgmma
from tuner.kernels.tma import operand_descriptor, output_descriptor, store_tile, tile_product
from tuner.model.tiles import FP32_BYTES, WS_MMA_WARPS

INTERPRETER_PROGRAMS = 3
FLAGS = ("WARP_SPECIALIZE", "FLATTEN", "EPILOGUE_SUBTILE")  # the 0/1 parameters
# The tl.range options the tile loop passes (WARP_SPECIALIZE, FLATTEN).
_RANGE_OPTIONS = ("warp_specialize", "flatten")
_MISSING_RANGE_OPTIONS = tuple(option for option in _RANGE_OPTIONS
                               if option not in inspect.signature(tl.range).parameters)
_TRITON_VERSION = tuple(int(part) for part in triton.__version__.split(".")[:2])
# Warp-specialized wgmma tiles of 128 or 256 rows read wrong (NaN: outputs left unwritten)
# from 5 stages on with triton 3.6 on an H100, in nearly every 16- and 8-bit config checked;
# 64-row tiles and IEEE fp32 are right at every depth (issue 37's note of 2026-11-27). Newer
# Tritons are refused alike until measured.
WS_MAX_SAFE_STAGES = 4


@triton.jit(do_not_specialize=["NUM_SMS"])
def _persistent_kernel(
    a, b, out, M, N, K, stride_cm, stride_cn,  # as in tma.py
    bias_ptr, scale_a_ptr, scale_b_ptr, stride_a, stride_b,
    NUM_SMS,  # programs in the grid; the stride of each program's tile loop
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr, FLATTEN: tl.constexpr, EPILOGUE_SUBTILE: tl.constexpr,
    A_T: tl.constexpr, B_T: tl.constexpr, OUT_DESC: tl.constexpr,  # as in tma.py
    DESC_ON_DEVICE: tl.constexpr,
    DOT_UPCAST: tl.constexpr, INPUT_PRECISION: tl.constexpr,  # _launch.dot_options
    HAS_BIAS: tl.constexpr, SCALED: tl.constexpr,  # epilogue (_epilogue.py)
):
    a_desc = operand_descriptor(a, M, K, stride_a, BLOCK_M, BLOCK_K, A_T, DESC_ON_DEVICE)
    b_desc = operand_descriptor(b, K, N, stride_b, BLOCK_K, BLOCK_N, B_T, DESC_ON_DEVICE)
    STORED_N: tl.constexpr = BLOCK_N // 2 if EPILOGUE_SUBTILE else BLOCK_N
    out = output_descriptor(out, M, N, stride_cm, BLOCK_M, STORED_N, OUT_DESC, DESC_ON_DEVICE)
    num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    k_steps = tl.cdiv(K, BLOCK_K)
    # The store derives its tile from a counter of its own rather than reusing the loads'
    # tile_m/tile_n, as Triton's persistent-matmul tutorial does to keep values out of both
    # the prologue and the epilogue of the K loop (which its pipeliner mishandles).
    store_tile_id = tl.program_id(0) - NUM_SMS
    for tile in tl.range(tl.program_id(0), num_tiles, NUM_SMS,
                         flatten=FLATTEN, warp_specialize=WARP_SPECIALIZE):
        tile_m, tile_n = grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = tile_product(a_desc, b_desc, tile_m * BLOCK_M, tile_n * BLOCK_N, 0, k_steps,
                           BLOCK_M, BLOCK_N, BLOCK_K, A_T, B_T, DOT_UPCAST, INPUT_PRECISION)

        store_tile_id += NUM_SMS
        tile_m, tile_n = grouped_tile(store_tile_id, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        off_m = tile_m * BLOCK_M
        off_n = tile_n * BLOCK_N
        if EPILOGUE_SUBTILE:
            halves = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
            left, right = tl.split(halves)
            store_tile(out, left, off_m, off_n, M, N, stride_cm, stride_cn,
                       bias_ptr, scale_a_ptr, scale_b_ptr, BLOCK_M, STORED_N, OUT_DESC,
                       HAS_BIAS, SCALED)
            store_tile(out, right, off_m, off_n + STORED_N, M, N, stride_cm, stride_cn,
                       bias_ptr, scale_a_ptr, scale_b_ptr, BLOCK_M, STORED_N, OUT_DESC,
                       HAS_BIAS, SCALED)
        else:
            store_tile(out, acc, off_m, off_n, M, N, stride_cm, stride_cn,
                       bias_ptr, scale_a_ptr, scale_b_ptr, BLOCK_M, BLOCK_N, OUT_DESC,
                       HAS_BIAS, SCALED)


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def num_sms(device: torch.device) -> int:
    """How many programs may run at once: the SM count on CUDA, else INTERPRETER_PROGRAMS."""
    return _sm_count(device) if device.type == "cuda" else INTERPRETER_PROGRAMS


def unsupported(gemm: Gemm, tunables: Mapping[str, int]) -> str | None:
    """The tma variant's operand checks, after the installed Triton's tl.range options (the
    tile loop passes both, so without one no config compiles, whatever it asks for) and after
    the warp-specialized configs that build the plain loop (duplicates), fail to compile,
    compute wrong results or run several times slower (see the module docstring)."""
    if _MISSING_RANGE_OPTIONS:
        missing = ", ".join(f"{option}=" for option in _MISSING_RANGE_OPTIONS)
        return (f"triton {triton.__version__}: tl.range has no {missing}, which the persistent "
                "tile loop passes (WARP_SPECIALIZE / FLATTEN)")
    if tunables["WARP_SPECIALIZE"]:
        if tunables["num_warps"] != 4 or tunables["FLATTEN"]:
            return "WARP_SPECIALIZE takes effect only with num_warps=4 and FLATTEN=0 on Hopper"
        if tunables["BLOCK_M"] == 64 and tunables["BLOCK_N"] == 256:
            return "WARP_SPECIALIZE with a 64×256 tile does not compile on Hopper"
        if (tunables["EPILOGUE_SUBTILE"] and tunables["BLOCK_M"] >= 128
                and _TRITON_VERSION < (3, 9)):
            return (f"WARP_SPECIALIZE with EPILOGUE_SUBTILE and BLOCK_M >= 128 does not compile "
                    f"on Hopper with triton {triton.__version__}")
        if not gemm.tensor_cores:
            return "WARP_SPECIALIZE on the CUDA cores (IEEE fp32) runs several times slower"
        if tunables["BLOCK_M"] >= 128 and tunables["num_stages"] > WS_MAX_SAFE_STAGES:
            return (f"WARP_SPECIALIZE with BLOCK_M >= 128 and more than {WS_MAX_SAFE_STAGES} "
                    "stages computes wrong results on Hopper (triton 3.6)")
    return tma.unsupported(gemm, tunables)


def accumulator_warps(tunables: Mapping[str, int]) -> int:
    """The warps holding a tile's accumulator: the MMA warps of a warp-specialized loop."""
    return WS_MMA_WARPS if tunables["WARP_SPECIALIZE"] else tunables["num_warps"]


def _stored_block_n(tunables: Mapping[str, int]) -> int:
    """Columns of one output store: half the tile under EPILOGUE_SUBTILE."""
    return tunables["BLOCK_N"] // (2 if tunables["EPILOGUE_SUBTILE"] else 1)


def launch(gemm: Gemm, tunables: Mapping[str, int], compile_only: bool,
           on_device: bool | None = None) -> None:
    """on_device: the kernel builds its descriptors; by default where it warp-specializes,
    which host-built ones cannot serve (kernels/tma.py weighs the two)."""
    M, N, _ = gemm.mnk
    programs = num_sms(gemm.a.device)
    tiles = tile_count(M, N, tunables)
    if on_device is None:
        on_device = bool(tunables["WARP_SPECIALIZE"])
    args = tma.descriptor_args(gemm, tunables, _stored_block_n(tunables), on_device)
    flags = {p: bool(tunables[p]) for p in FLAGS}  # tl.range's options are bools
    # tunables: BLOCK_M/N/K and GROUP_M constexprs; num_stages and num_warps options
    start(_persistent_kernel, (min(programs, tiles),), (),
          {**args, "NUM_SMS": programs, **tunables, **flags}, compile_only)


# The most bytes per warp of that scratch (_split_scratch_bytes).
SPLIT_SCRATCH_PER_WARP = 2048


def _split_scratch_bytes(tunables: Mapping[str, int], operands: TileOperands) -> int:
    """The shared memory an IEEE fp32 tile's accumulator passes through where the flattened
    loop splits it for a subtiled store: up to the whole fp32 tile, and at most 2 KB a warp.
    Triton 3.6 reported it on sm_90 for every such tile of tests/data's records (2-16 KB);
    without it a 128×128×64 tile of 4 stages and 8 warps was estimated at 230400 bytes and
    failed to compile at 245784, over the H100's 232448. 0 on tensor cores, whose
    underestimate stays far below the limit."""
    if operands.tensor_cores or not (tunables["FLATTEN"] and tunables["EPILOGUE_SUBTILE"]):
        return 0
    return min(tunables["BLOCK_M"] * tunables["BLOCK_N"] * FP32_BYTES,
               tunables["num_warps"] * SPLIT_SCRATCH_PER_WARP)


def smem_bytes(tunables: Mapping[str, int], operands: TileOperands) -> int:
    """The pipeline's buffers plus the staged output, which cannot reuse them here: the next
    tile's loads are in flight while a tile is stored. A warp-specialized wgmma loop over
    64-row tiles double-buffers the staged output (one over taller tiles does not; nor do
    Blackwell or mma.sync tiles). Triton 3.6 and 3.9 report, for bf16, 3 stages on sm_90:
    131096 bytes for 128×128×64 (98304 + 32768 + barriers), 114712 subtiled, 106848 for a
    warp-specialized 64×128×64 (73728 + 2 × 16384 + barriers) and 213464 for a
    warp-specialized 128×256×64 (147456 + 65536 + barriers). Against Triton's figures
    (benchmarks/constraint_accuracy.py) it refuses a few configs that fit and accepts none
    that do not; it underestimates small FLATTEN + EPILOGUE_SUBTILE tiles by up to half, far
    below the limit; on the CUDA cores (IEEE fp32) that scratch is counted
    (_split_scratch_bytes), as it can tip a tile over the limit."""
    staged = tma.staging_smem_bytes(tunables, operands.itemsize, _stored_block_n(tunables))
    double_buffered = (tunables["WARP_SPECIALIZE"] and tunables["BLOCK_M"] < 128
                       and uses_wgmma(tunables["BLOCK_M"], tunables["num_warps"],
                                      operands.tensor_cores))
    copies = 2 if double_buffered else 1
    return (pipeline_smem_bytes(tunables, operands) + copies * staged
            + _split_scratch_bytes(tunables, operands) + tma.BARRIER_SMEM_BYTES)


PERSISTENT = Variant(
    name="persistent",
    params=(*tma.TMA.params, *FLAGS),
    launch=launch,
    smem_bytes=smem_bytes,
    source_path=Path(__file__),
    unsupported=unsupported,
    short_names={**tma.TMA.short_names, "WARP_SPECIALIZE": "ws", "FLATTEN": "flat",
                 "EPILOGUE_SUBTILE": "subtile"},
    expand_op="mm_general_tma",  # see GENERAL
    tma_fed=True,
    program_per_sm=True,
    accumulator_warps=accumulator_warps,
    model_seconds=persistent_cost.seconds,
)
