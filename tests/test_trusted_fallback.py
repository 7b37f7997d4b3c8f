"""The runtime's `trusted` step: a never-tuned key of a few outputs along a long K gets the
model's best kreduce config where the model predicts it faster than cuBLAS (the regimes of
tuner.model.regimes), with no table or a table that says nothing near the key; tuned buckets
near it, exclusions and every other shape keep their answers. CPU only (the model and the
kernels' feasibility checks, nothing launched)."""
import warnings

import pytest

from tests.test_runtime import GENERAL, LOG_M, key, lookup, write_table
from tuner import runtime
from tuner.kernels import KERNELS, kernel_variants
from tuner.kernels.calls import meta_gemm
from tuner.model import predict as model
from tuner.model.regimes import trusted_variants
from tuner.runtime.explain import explain
from tuner.shapes import Shape
from tuner.space import builtin_spaces

TINY = key(2, N=2, K=65536, dtype="fp32")  # 2x2x65536 fp32 nn
KREDUCE = {"variant": "kreduce", "pad": 0, "BLOCK_K": 32, "K_SLICES": 256, "num_stages": 2,
           "num_warps": 4}


@pytest.fixture(autouse=True)
def fresh_tables(monkeypatch):
    monkeypatch.delenv(runtime.ENV_VAR, raising=False)
    monkeypatch.delenv("TUNE_EXCLUDE", raising=False)
    runtime.clear_cache()
    yield
    runtime.clear_cache()


def no_table(op="mm", **raw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # no table: cuBLAS answers warn
        return runtime.get_tuned_config(op, **raw)


@pytest.mark.parametrize("M, N, K", [(2, 2, 65536), (4, 4, 131072), (3, 5, 65537),
                                     (2, 8, 32768)])
def test_the_regime_is_a_few_outputs_along_a_long_k(M, N, K):
    assert trusted_variants(M, N, K) == ("kreduce",)
    assert trusted_variants(M, N, K, frozenset({"kreduce"})) == ()


@pytest.mark.parametrize("M, N, K", [(1, 2, 65536), (2, 1, 65536), (4, 8, 65536),
                                     (8, 16, 32768), (2, 2, 16384), (64, 64, 4096)])
def test_outside_the_regime_no_variant_is_trusted(M, N, K):
    assert trusted_variants(M, N, K) == ()


@pytest.mark.parametrize("layout", ["nn", "nt", "tn"])
def test_with_no_table_a_tiny_output_long_k_key_gets_kreduce(layout):
    raw = Shape(2, 2, 65536, "fp32", layout).key()
    config = no_table(**raw)
    assert config["variant"] == "kreduce" and config.source == "trusted"
    assert config.bucket is None and no_table(**raw) is config
    assert KERNELS["mm"].feasible(config, meta_gemm(Shape(2, 2, 65536, "fp32", layout)),
                                  model.H100_SXM.smem_per_block) is None


def test_a_table_of_unrelated_entries_leaves_the_key_to_kreduce(tmp_path):
    """bf16 buckets, and an fp32 one ten octaves off: none says anything of 2×2 outputs."""
    path = write_table(tmp_path / "t.yaml", [(key(512), GENERAL), (key(4096), GENERAL),
                                             (key(2048, N=2048, K=2048, dtype="fp32"),
                                              GENERAL)])
    config = lookup(path, **TINY)
    assert config["variant"] == "kreduce" and config.source == "trusted"


def test_a_nearby_kreduce_entry_answers_through_nearest(tmp_path):
    """A tuned kreduce bucket near the key: its measured config, not the model's guess."""
    path = write_table(tmp_path / "t.yaml", [(key(2, N=2, K=131072, dtype="fp32"), KREDUCE),
                                             (key(512), GENERAL)], LOG_M)
    config = lookup(path, **TINY)
    assert dict(config) == KREDUCE and config.source == "nearest"


def test_a_nearby_bucket_tuned_in_the_regime_to_cublas_keeps_cublas(tmp_path):
    """Where tuning measured cuBLAS fastest on a few outputs near the key, the model's trust
    in kreduce yields to that measurement."""
    path = write_table(tmp_path / "t.yaml", [(key(4, N=4, K=131072, dtype="fp32"),
                                              dict(runtime.CUBLAS_CONFIG))], LOG_M)
    config = lookup(path, **TINY)
    assert config["variant"] == "cublas" and config.source == "nearest"


@pytest.mark.parametrize("label", ["64x64x4096 bf16 nn", "8x16x32768 fp16 nn",
                                   "2x2x4096 fp32 nn", "4x8x65536 bf16 nn",
                                   "4096x4096x4096 bf16 nt"])
def test_other_shapes_keep_cublas_with_no_table(label):
    shape = Shape.from_label(label)
    assert no_table(**shape.key()) is runtime.CUBLAS_CONFIG


def test_a_single_row_keeps_cublas_its_gemv_kernels_serve_it():
    assert no_table("gemv", **Shape(1, 2, 65536, "fp32").key()) is runtime.CUBLAS_CONFIG


def test_excluding_kreduce_answers_cublas():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        config = runtime.get_tuned_config_without(("kreduce",), "mm", **TINY)
    assert config is runtime.CUBLAS_CONFIG


def test_lookup_explains_the_trusted_pick_and_honours_TUNE_EXCLUDE(monkeypatch):
    lines = explain(2, 2, 65536, "fp32", "nn", None)
    assert lines[1].startswith("config: {'variant': 'kreduce'")
    assert lines[2].startswith("source: trusted: the model's best config of a variant")
    ours, cublas = (float(part.split()[-2]) for part in lines[3].split(": ", 1)[1].split(", "))
    assert lines[3].startswith("model (H100 SXM): ") and ours < cublas
    monkeypatch.setenv("TUNE_EXCLUDE", "kreduce")
    runtime.clear_cache()
    lines = explain(2, 2, 65536, "fp32", "nn", None)
    assert lines[2].startswith("source: cublas") and "excluded: kreduce (TUNE_EXCLUDE)" in lines


@pytest.mark.slow  # ranks the whole gemv space (about a second)
def test_the_model_ranks_kreduce_first_of_the_triton_variants_for_one_row_of_two():
    """1×2×65536 fp32: the gemv variant walks the two rows in one program (measured two orders
    of magnitude behind cuBLAS); kreduce spreads K over the SMs, split-K pays 16×16 tiles."""
    shape = Shape(1, 2, 65536, "fp32")
    space = builtin_spaces(kernel_variants())["gemv"].for_call(meta_gemm(shape))
    ranked = model.rank_configs(shape, space, KERNELS["gemv"], model.H200_SXM,
                                distinct=lambda config: config["variant"])
    order = [config["variant"] for _, config in ranked if config["variant"] != "cublas"]
    assert order[0] == "kreduce" and order.index("gemv") > order.index("splitk")
