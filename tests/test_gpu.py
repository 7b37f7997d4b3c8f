"""On a real GPU: the tuner's pipeline end to end, and kernels at sizes the interpreter can't run.

Marked `gpu`: skipped on CPU-only machines, run on the GPU machine with `pytest -m gpu`.
"""
import itertools

import pytest
import torch
import yaml
from click.testing import CliRunner

import tuner
from tuner import runtime
from tuner.cli import main
from tuner.dtypes import DTYPES
from tuner.execution.backends import gpu_backend
from tuner.execution.measure import random_gemm, random_operands, reference, relative_error
from tuner.kernels import KERNELS, kernel_for, kernel_variants
from tuner.kernels.base import config_label
from tuner.kernels.cublas import TorchCalls
from tuner.runtime import dispatch, fastpath
from tuner.shapes import Shape
from tuner.space import builtin_spaces

pytestmark = pytest.mark.gpu


def test_gpu_fingerprint_describes_this_device():
    info = gpu_backend(0).info
    props = torch.cuda.get_device_properties(0)
    assert info.name == props.name and info.sm_count == props.multi_processor_count
    assert info.compute_capability == f"{props.major}.{props.minor}"
    assert info.smem_per_block >= 48 * 1024


@pytest.mark.parametrize("shape", [Shape(4097, 4095, 4100, "bf16", "nn"),
                                   Shape(1000, 3000, 2000, "fp16", "nt"),
                                   Shape(257, 1, 8191, "fp32", "tn"),
                                   Shape(1, 6144, 4096, "bf16", "nt"),
                                   Shape(333, 555, 777, "fp32", "tt")])
def test_default_configs_correct_at_scale(shape):
    gemm = random_gemm(shape, "cuda", seed=7)
    gemm.out.fill_(float("nan"))
    kernel = kernel_for(shape.M, shape.N)
    kernel.launch(gemm, runtime.DEFAULT_CONFIGS[kernel.name])
    assert relative_error(gemm.out, reference(gemm)) <= DTYPES[shape.dtype].tolerance


# One config per variant, each run padded and unpadded where its operands allow.
VARIANT_CONFIGS = {
    "general": {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8,
                "num_stages": 3, "num_warps": 8},
    "splitk": {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "SPLIT_K": 4,
               "num_stages": 3, "num_warps": 4},
    "gemv": {"BLOCK_M": 64, "BLOCK_K": 128, "num_stages": 2, "num_warps": 4},
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
@pytest.mark.parametrize("variant", sorted({v.name for k in KERNELS.values()
                                            for v in k.variants}))
def test_every_variant_in_every_layout_and_dtype_at_scale(variant, layout, dtype):
    for mnk in ((1000, 3000, 2000), (509, 765, 1023), (1, 4096, 4096), (4096, 1, 2048)):
        shape = Shape(*mnk, dtype, layout)
        kernel = kernel_for(shape.M, shape.N)
        if variant not in kernel.variant:
            continue
        tunables = VARIANT_CONFIGS.get(variant) or VARIANT_CONFIGS["general"] | \
            {p: 0 for p in kernel.variant[variant].params if p not in VARIANT_CONFIGS["general"]}
        gemm = random_gemm(shape, "cuda", seed=11)
        for pad in (0, 64):
            config = {"variant": variant, "pad": pad, **tunables}
            if kernel.feasible(config, gemm, 232448):
                continue
            gemm.out.fill_(float("nan"))
            kernel.launch(gemm, config)
            error = relative_error(gemm.out, reference(gemm))
            assert error <= DTYPES[dtype].tolerance, (shape, config, error)


# The other parameters of a tile variant for the deep-pipeline check: each variant's switches
# off, but warp specialization both ways (it changes who waits on the loads).
DEEP_PIPELINE_DEFAULTS = {"GROUP_M": 8, "num_warps": 4, "SPLIT_K": 2, "FLATTEN": 0,
                          "EPILOGUE_SUBTILE": 0, "SK_FULL_WAVES": 0}


@pytest.mark.parametrize("dtype, layout", [("bf16", "nt"), ("fp16", "nn")])
def test_every_tile_variant_is_right_at_the_deep_pipelines_of_the_space(dtype, layout):
    """The built-in mm space offers pipelines past 5 stages (mid-size GEMMs that wait on
    their loads gain from them): every tile variant at each such depth that it accepts, 64-
    and 128-row tiles, on a shape ragged in every block dimension."""
    kernel = KERNELS["mm"]
    space = builtin_spaces(kernel_variants())["mm"]
    depths = [n for n in space.params["num_stages"] if n > 5]
    assert depths
    gemm_shape = Shape(1000, 776, 1032, dtype, layout)
    accepted = set()
    for variant in space.params["variant"]:
        params = kernel.variant[variant].params
        if "BLOCK_M" not in params:
            continue
        for block_m, stages, specialized in itertools.product((64, 128), depths, (0, 1)):
            if specialized and "WARP_SPECIALIZE" not in params:
                continue
            tunables = {**DEEP_PIPELINE_DEFAULTS, "BLOCK_M": block_m, "BLOCK_N": 128,
                        "BLOCK_K": 64, "num_stages": stages, "WARP_SPECIALIZE": specialized}
            config = {"variant": variant, "pad": 0, **{p: tunables[p] for p in params}}
            gemm = random_gemm(gemm_shape, "cuda", seed=stages)
            if kernel.feasible(config, gemm, 232448) is not None:
                continue
            gemm.out.fill_(float("nan"))
            kernel.launch(gemm, config)
            error = relative_error(gemm.out, reference(gemm))
            assert error <= DTYPES[dtype].tolerance, (config_label(config), error)
            accepted.add(variant)
    assert accepted >= {"general", "tma", "persistent", "streamk", "splitk", "gluon"}


def test_torch_compile_fullgraph_mlp_with_tuner_linear():
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(),
                              torch.nn.Linear(4096, 1024)).to("cuda", torch.bfloat16)

    def forward(x):
        h = torch.nn.functional.gelu(tuner.linear(x, mlp[0].weight, mlp[0].bias))
        return tuner.linear(h, mlp[2].weight, mlp[2].bias)

    compiled = torch.compile(forward, fullgraph=True)
    x = torch.randn(8, 128, 1024, device="cuda", dtype=torch.bfloat16)
    out = compiled(x)
    first, second = (layer.weight.double() for layer in (mlp[0], mlp[2]))
    hidden = torch.nn.functional.gelu(x.double() @ first.t() + mlp[0].bias.double())
    assert relative_error(out, hidden @ second.t() + mlp[2].bias.double()) <= 2e-2
    out.float().square().mean().backward()
    assert mlp[0].weight.grad is not None and torch.isfinite(mlp[0].weight.grad).all()


def test_gpu_run_export_then_matmul_uses_the_winner(tmp_path, monkeypatch):
    (tmp_path / "shapes.csv").write_text("M,N,K,dtype,layout\n512,768,1024,bf16,nt\n"
                                         "96,1,2048,fp16,nn\n")
    db = f"sqlite:///{tmp_path / 'tune.db'}"
    cli = CliRunner()
    result = cli.invoke(main, ["run", "--shapes", str(tmp_path / "shapes.csv"), "--trials", "8",
                               "--db", db], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "tuned 2" in result.output
    table = tmp_path / "tuned.yaml"
    assert cli.invoke(main, ["export", "table", "-o", str(table), "--db", db]
                      ).exit_code == 0
    doc = yaml.safe_load(table.read_text())
    assert doc["device"]["name"] == torch.cuda.get_device_name(0)
    entry = doc["ops"]["mm"]["entries"][0]
    assert entry["tflops"] > 0 and entry["cublas_ms"] > 0

    dispatch.clear_cache()  # plans of earlier tests, and any table already loaded
    monkeypatch.setenv("TUNE_CONFIG", str(table))
    a, b = random_operands(Shape(512, 768, 1024, "bf16", "nt"), "cuda", seed=3)
    assert dict(runtime.get_tuned_config("mm", M=512, N=768, K=1024, dtype="bf16",
                                         stride_am=1024, stride_bk=1)) == entry["config"]
    assert relative_error(tuner.matmul(a, b), a.double() @ b.double()) <= 1e-2


def test_out_of_bounds_configs_are_recorded_and_the_run_goes_on(tmp_path):
    """Crash isolation: OOB=1 configs poison their worker's CUDA context; the run completes,
    records each as crashed with the CUDA error, and tunes the OOB=0 configs normally
    (measured, or screened by their short measure)."""
    import os
    import sqlite3
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    (tmp_path / "shapes.csv").write_text("M,N,K,dtype,layout\n256,192,320,fp16,nn\n")
    db = tmp_path / "tune.db"
    env = {**os.environ, "TUNE_KERNEL_MODULES": "tests.oob_kernel",
           "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run(
        [sys.executable, str(root / "cli.py"), "run", "--shapes", str(tmp_path / "shapes.csv"),
         "--space", str(root / "tests" / "oob_space.yaml"), "--trials", "8", "--batch", "4",
         "--jobs", "4", "--db", f"sqlite:///{db}"],
        cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with sqlite3.connect(db) as c:
        rows = c.execute("select params, status, reason from tuner_trials").fetchall()
        failures = c.execute("select count(*) from tuner_failures").fetchone()[0]
    statuses = {(yaml.safe_load(p)["OOB"], s) for p, s, _ in rows}
    # An OOB=0 config may also be screened: its short measure out of reach of the best.
    assert {s for oob, s in statuses if oob == 1} == {"crashed"}, rows
    assert "ok" in {s for oob, s in statuses if oob == 0} <= {"ok", "screened"}, rows
    crashed = [r for _, s, r in rows if s == "crashed"]
    assert all("illegal" in r or "cuda" in r.lower() for r in crashed), crashed
    assert failures == len(crashed)  # each remembered, so later runs skip them


TMA_TILE = {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_stages": 3,
            "num_warps": 4}
REPLAYED_CONFIGS = [
    {"variant": "gemv", "pad": 0, **VARIANT_CONFIGS["gemv"]},
    {"variant": "general", "pad": 0, **VARIANT_CONFIGS["general"]},
    {"variant": "splitk", "pad": 0, **VARIANT_CONFIGS["splitk"]},
    {"variant": "general", "pad": 64, **VARIANT_CONFIGS["general"]},  # one copy launch
    {"variant": "tma", "pad": 0, **TMA_TILE},
    {"variant": "tma", "pad": 64, **TMA_TILE},
    {"variant": "persistent", "pad": 0, **TMA_TILE, "WARP_SPECIALIZE": 0, "FLATTEN": 1,
     "EPILOGUE_SUBTILE": 1},
    # Descriptors built on the device (global scratch held by the replay): a warp-specialized
    # 128-row persistent tile. Gluon descriptors built on the host (re-based by the replay):
    # the gluon kernel, with and without its producer warp (and with a tail: 96-column tiles;
    # and transposed: 80 rows by 64 columns).
    {"variant": "persistent", "pad": 0, **TMA_TILE, "BLOCK_M": 128, "WARP_SPECIALIZE": 1,
     "FLATTEN": 0, "EPILOGUE_SUBTILE": 0},
    {"variant": "gluon", "pad": 0, **TMA_TILE, "BLOCK_N": 64, "num_stages": 4,
     "BLOCK_N_TAIL": 0, "SWAP_AB": 0, "WARP_SPECIALIZE": 0},
    {"variant": "gluon", "pad": 0, **TMA_TILE, "BLOCK_N": 64, "num_stages": 4,
     "BLOCK_N_TAIL": 32, "SWAP_AB": 0, "WARP_SPECIALIZE": 1},
    {"variant": "gluon", "pad": 0, **TMA_TILE, "BLOCK_N": 64, "num_stages": 4,
     "BLOCK_N_TAIL": 16, "SWAP_AB": 1, "WARP_SPECIALIZE": 0},
    # 96×384 in 64×128 tiles: 6 tiles of 16 steps streamed by 12 programs, half a tile each
    # (workspaces held by the replay), also padded.
    {"variant": "streamk", "pad": 0, **TMA_TILE, "num_stages": 3, "SK_FULL_WAVES": 0},
    {"variant": "streamk", "pad": 64, **TMA_TILE, "num_stages": 3, "SK_FULL_WAVES": 0},
]


def _forced(monkeypatch, config):
    monkeypatch.setattr(dispatch, "_decide", lambda gemm: (kernel_for(*gemm.mnk[:2]), config))
    dispatch.clear_cache()


@pytest.mark.parametrize("config", REPLAYED_CONFIGS, ids=config_label)
def test_replayed_calls_compute_their_own_operands(config, monkeypatch):
    """After a key's first call, later calls re-issue its recorded launches with their own
    operands' addresses (kernels/launches.py): each result must be its own product, for
    every variant, padded or not, and through both public calls."""
    _forced(monkeypatch, config)
    m = 1 if config["variant"] == "gemv" else 96
    k = 1000 if config["pad"] else 1024
    weight = torch.randn(384, k, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(384, device="cuda", dtype=torch.bfloat16)
    for seed in range(4):
        torch.manual_seed(seed)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        got = tuner.linear(x, weight, bias)
        want = x.double() @ weight.double().t() + bias.double()
        assert relative_error(got, want) <= DTYPES["bf16"].tolerance, seed
        got = tuner.matmul(x, weight.t())
        assert relative_error(got, x.double() @ weight.double().t()) <= 1e-2, seed
    assert all(call.prepared.replay is not None for call in dispatch._CALLS.values())
    repeats = (*dispatch._LINEAR_REPEATS.values(), *dispatch._MATMUL_REPEATS.values())
    assert len(repeats) == 2 and all(repeats)
    if fastpath._module is not None:  # TUNE_FASTPATH=0 leaves the Python functions in front
        assert fastpath._module.size() == 2  # the compiled front replayed both signatures
    dispatch.clear_cache()


@pytest.mark.parametrize("config", [c for c in REPLAYED_CONFIGS
                                    if c["variant"] in ("tma", "gluon") and not c["pad"]],
                         ids=config_label)
def test_replays_of_host_built_descriptors_call_the_c_launcher_itself(config, monkeypatch):
    """On Triton 3.6 a replay calls the C launcher with each descriptor encoded once per
    address (kernels/launches._Launch), gluon's descriptors as tma's: through Triton's own
    wrapper every call would encode them again. So gluon's extra host time per call against
    tma's (the host-overhead table) lies elsewhere."""
    import triton
    if not triton.__version__.startswith("3.6"):
        pytest.skip("the direct launch is Triton 3.6's launcher (kernels/launches.py)")
    _forced(monkeypatch, config)
    weight = torch.randn(384, 1024, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(96, 1024, device="cuda", dtype=torch.bfloat16)
    tuner.linear(x, weight)
    (call,) = dispatch._CALLS.values()
    assert all(launch.flat is not None for launch in call.prepared.replay.launches)
    dispatch.clear_cache()


@pytest.mark.parametrize("variant", ["tma", "general", "cublas"])
def test_fp8_calls_replay_or_go_to_torch(variant, monkeypatch):
    tiles = {"tma": TMA_TILE, "general": VARIANT_CONFIGS["general"], "cublas": {}}[variant]
    _forced(monkeypatch, {"variant": variant, "pad": 0, **tiles})
    scale_a, scale_b = (torch.tensor([v], device="cuda") for v in (0.5, 2.0))
    weight = torch.randn(512, 1024, device="cuda").to(torch.float8_e4m3fn)
    for seed in range(3):
        torch.manual_seed(seed)
        x = torch.randn(64, 1024, device="cuda").to(torch.float8_e4m3fn)
        got = tuner.matmul(x, weight.t(), scale_a=scale_a, scale_b=scale_b)
        assert got.dtype == torch.bfloat16
        want = x.double() @ weight.double().t()
        assert relative_error(got, want) <= DTYPES["fp8e4m3"].tolerance, seed
    dispatch.clear_cache()


@pytest.mark.parametrize("config", [REPLAYED_CONFIGS[i] for i in (1, 2, 3, 4, 6, 7, 8, 9, 10, 11)]
                         + [{"variant": "cublas", "pad": 0}], ids=config_label)
def test_cuda_graph_capture_replays_tuner_linear(config, monkeypatch):
    """Decode under CUDA graphs (vLLM, reduce-overhead): warm up, capture tuner.linear into a
    graph, then replay it on new inputs copied into the captured input buffer."""
    _forced(monkeypatch, config)
    k = 1000 if config["pad"] else 1024
    weight = torch.randn(384, k, device="cuda", dtype=torch.bfloat16)
    static_x = torch.randn(32, k, device="cuda", dtype=torch.bfloat16)
    tuner.linear(static_x, weight)  # first call: compiles and records, outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = tuner.linear(static_x, weight)
    for seed in range(3):
        torch.manual_seed(seed)
        static_x.copy_(torch.randn_like(static_x))
        static_out.fill_(float("nan"))
        graph.replay()
        want = static_x.double() @ weight.double().t()
        assert relative_error(static_out, want) <= DTYPES["bf16"].tolerance, seed
    dispatch.clear_cache()


def test_a_cublas_winner_is_dispatched_to_torch(tmp_path, monkeypatch):
    """A table whose entry is `cublas`: the dispatcher answers with torch's own call, and
    repeated calls go straight to torch's operators (the compiled front calls them)."""
    table = tmp_path / "t.yaml"
    strategy = dict.fromkeys(("M", "N", "K", "stride_am", "stride_bk", "dtype"), "default")
    table.write_text(yaml.safe_dump({"format": runtime.TABLE_FORMAT, "ops": {"mm": {
        "strategy": strategy, "entries": [{
            "key": {"M": 256, "N": 768, "K": 1024, "stride_am": 1024, "stride_bk": 1,
                    "dtype": "bf16"},
            "config": {"variant": "cublas", "pad": 0}}]}}}))
    monkeypatch.setenv("TUNE_CONFIG", str(table))
    dispatch.clear_cache()
    weight = torch.randn(768, 1024, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(768, device="cuda", dtype=torch.bfloat16)
    for seed in range(3):
        torch.manual_seed(seed)
        x = torch.randn(256, 1024, device="cuda", dtype=torch.bfloat16)
        got = tuner.linear(x, weight, bias)
        want = x.double() @ weight.double().t() + bias.double()
        assert relative_error(got, want) <= DTYPES["bf16"].tolerance
    (call,) = dispatch._CALLS.values()
    assert call.config["variant"] == "cublas" and call.config.source == "table"
    (repeat,) = dispatch._LINEAR_REPEATS.values()
    assert isinstance(repeat, TorchCalls) and repeat.compiled_action(got) == "torch"
    dispatch.clear_cache()


def test_the_fallback_refuses_a_neighbour_that_cannot_run_the_call(tmp_path, monkeypatch):
    """A key near a bucket tuned to a TMA tile, whose own A cannot be read through TMA (a
    transposed fp32 A with rows 12 bytes apart; on an H200 such a 2x2x65536 fp32 call fell to
    the default config at 370x cuBLAS): the answer must run the call, correctly, and be
    neither the TMA neighbour nor the default."""
    table = tmp_path / "t.yaml"
    strategy = dict.fromkeys(("M", "N", "K", "stride_am", "stride_bk", "dtype"), "default")
    tma = {"variant": "tma", "pad": 0, **TMA_TILE}
    table.write_text(yaml.safe_dump({"format": runtime.TABLE_FORMAT, "ops": {"mm": {
        "strategy": strategy, "entries": [{
            "key": {"M": 64, "N": 64, "K": 65536, "stride_am": 65536, "stride_bk": 64,
                    "dtype": "fp32"},
            "config": tma}]}}}))
    monkeypatch.setenv("TUNE_CONFIG", str(table))
    dispatch.clear_cache()
    a = torch.randn(65537, 3, device="cuda")[:, :2].t()  # 2x65537, rows 3 elements apart
    b = torch.randn(65537, 2, device="cuda")
    for _ in range(2):
        out = tuner.matmul(a, b)
        assert relative_error(out, a.double() @ b.double()) <= DTYPES["fp32"].tolerance
    (call,) = dispatch._CALLS.values()
    assert call.config["variant"] != "tma" and call.config.source != "default"
    dispatch.clear_cache()
