"""Each variant owns what the rest of the tuner knows of it (kernels/base.py `Variant`): its
term in the analytical model, its FlagGems op, its parameters' short names. CPU only: nothing
is compiled or run."""
import math
from dataclasses import replace

import pytest

from tuner.export import flaggems_ops, writers
from tuner.export.op_lists import union_ops
from tuner.export.picks import Pick
from tuner.formats import flaggems
from tuner.kernels import KERNELS, kernel_variants
from tuner.kernels.base import Kernel, config_label
from tuner.kernels.general import GENERAL
from tuner.model import predict as model
from tuner.shapes import Shape
from tuner.space import builtin_spaces

SPACES = builtin_spaces(kernel_variants())
REGISTERED = sorted({(kernel.name, v.name) for kernel in KERNELS.values() for v in kernel.variants})
TILE = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_stages": 3,
        "num_warps": 4}


@pytest.fixture
def with_variant(monkeypatch):
    """Registers a variant in the mm kernel for one test (the model's view of the registry
    is rebuilt before and after)."""
    def register(variant):
        kernel = KERNELS["mm"]
        monkeypatch.setitem(KERNELS, "mm", Kernel("mm", (*kernel.variants, variant),
                                                  kernel.shared_sources))
        model._variants.cache_clear()
        return variant
    yield register
    model._variants.cache_clear()


@pytest.mark.parametrize("kernel, variant", REGISTERED)
def test_every_registered_variant_has_a_model_term(kernel, variant):
    assert KERNELS[kernel].variant[variant].model_seconds is not None, (
        f"{kernel}/{variant} has no term in the analytical model (Variant.model_seconds)")


@pytest.mark.parametrize("kernel, variant", REGISTERED)
def test_the_model_predicts_every_variant_of_the_builtin_spaces(kernel, variant):
    space = SPACES.get(kernel)
    if space is None or variant not in space.variant_params:
        pytest.skip(f"{variant} is not in the built-in {kernel} space")
    shape = Shape(1, 4096, 4096, "bf16") if kernel == "gemv" else Shape(512, 1024, 2048, "bf16")
    # A variant's first configs may be tiles it cannot run (gluon's wgmma takes no 16-row
    # tile), predicted infinite: some config must be predicted finite.
    predicted = (model.predict_ms(shape, c, model.H100_SXM)
                 for c in space.narrowed(variant=(variant,)).configs())
    assert 0 < next((ms for ms in predicted if ms < math.inf), 0)


def test_a_variant_without_a_term_has_no_prediction(with_variant):
    with_variant(replace(GENERAL, name="mine", model_seconds=None))
    config = {"variant": "mine", "pad": 0, **TILE}
    shape = Shape(512, 512, 512, "bf16")
    with pytest.raises(ValueError, match="no performance model for variant 'mine'"):
        model.predict_ms(shape, config, model.H100_SXM)
    assert model.predicted_or_inf(shape, config, model.H100_SXM) == math.inf


def test_the_model_takes_a_variants_term_from_the_variant(with_variant):
    def flat(ops, config, smem_bytes, spec):
        assert smem_bytes() == GENERAL.smem_bytes(
            {p: config[p] for p in GENERAL.params}, ops)
        return 1e-3 * config["BLOCK_M"]

    with_variant(replace(GENERAL, name="mine", model_seconds=flat))
    assert model.predict_ms(Shape(512, 512, 512, "bf16"), {"variant": "mine", "pad": 0, **TILE},
                            model.H100_SXM) == pytest.approx(64.0)


def _pick(variant: str) -> Pick:
    return Pick("mm", {"M": 512}, {"variant": variant, "pad": 0, **TILE},
                       SPACES["mm"].strategy, {})


def _expand_document(picks: list[Pick]) -> dict:
    return flaggems.expand_document(union_ops(picks), for_both_readers=False)


def test_the_flaggems_op_comes_from_the_variant(with_variant):
    with_variant(replace(GENERAL, name="mine", expand_op="mm_mine"))
    assert "mm_mine" in _expand_document([_pick("mine")])
    assert flaggems_ops.EXPAND_OP_NAMES["mine"] == "mm_mine"
    assert flaggems_ops.EXPAND_OP_NAMES["general"] == GENERAL.expand_op == "mm_general_tma"


def test_a_variant_without_an_op_keeps_its_own_name(with_variant):
    with_variant(replace(GENERAL, name="mine", expand_op=None))
    assert list(_expand_document([_pick("mine")])) == ["mm_mine"]


def test_a_variant_flaggems_has_no_op_for_is_left_out_with_its_reason(with_variant):
    with_variant(replace(GENERAL, name="mine", expand_op=None, no_expand_op="a thing of mine"))
    text = writers.expand_text([_pick("mine"), _pick("general")])
    assert text.startswith("# left out: mm M=512, won by mine (a thing of mine): ")
    assert "mm_general_tma" in text and "mm_mine" not in text
    assert flaggems_ops.NO_EXPAND_OP["mine"] == "a thing of mine"


def test_labels_use_the_variants_short_names(with_variant):
    with_variant(replace(GENERAL, name="mine", params=(*GENERAL.params, "DEPTH"),
                         short_names={"BLOCK_M": "rows", "DEPTH": "d"}))
    config = {"variant": "mine", "pad": 0, **TILE, "DEPTH": 2}
    assert config_label(config) == "mine rows64 BLOCK_N64 BLOCK_K32 GROUP_M8 num_stages3 " \
                                   "num_warps4 d2"
