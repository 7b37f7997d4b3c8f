"""Test set-up shared by every test module.

Without a CUDA GPU the kernels run through Triton's interpreter, which must be switched on
before triton is first imported, so it happens here, at collection time. Tests marked `gpu`
are skipped on such machines and run on the GPU machine (`pytest -m gpu`).

The fast subset (`-m "not slow and not gpu"`) is the loop run while working, so it stays
under a minute on two cores; CI runs every test. Besides the tests marked `slow` one by one
(whole runs, subprocesses, anything over a few tenths of a second of CPU), two rules keep it
there: a kernel test (one that asks for `device`) runs in the fast subset only the few
parameter sets that try each parameter value once, the rest of its product is marked slow;
and a Hypothesis property tries a tenth of its examples (tests.factories.examples, or a
profile loaded here for those that keep Hypothesis' default).
"""
import os

import pytest
import torch
from hypothesis import settings

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    os.environ["TRITON_INTERPRET"] = "1"


def pytest_configure(config):
    # Read by tests.factories.examples when the test modules are imported, which is later.
    from tests import factories
    factories.FAST_SUBSET = "not slow" in config.option.markexpr
    if factories.FAST_SUBSET:  # properties without a count of their own try a tenth too
        settings.register_profile("fast-subset", max_examples=settings().max_examples // 10)
        settings.load_profile("fast-subset")


def pytest_collection_modifyitems(config, items):
    # Runs before pytest's own -m selection (conftest hooks come first), which so sees the
    # slow marks added here.
    mark_kernel_products_slow_beyond_each_value_once(items)
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def mark_kernel_products_slow_beyond_each_value_once(items) -> None:
    """Of each parametrized kernel test (it asks for `device`: its launches run in the
    interpreter, at a tenth of a second or more each), keep in the fast subset a few
    parameter sets that together try every value of every parameter, chosen greedily in
    collection order; mark the rest slow. A layout, dtype or shape that breaks alone still
    fails the fast subset; the combinations run in CI."""
    products: dict[tuple, list] = {}
    for item in items:
        if ("device" in getattr(item, "fixturenames", ()) and hasattr(item, "callspec")
                and "slow" not in item.keywords and "gpu" not in item.keywords):
            products.setdefault((item.path, item.originalname), []).append(item)
    for members in products.values():
        values = {item: {(name, repr(value)) for name, value in item.callspec.params.items()}
                  for item in members}
        untried = set().union(*values.values())
        while untried:
            chosen = max(values, key=lambda item: len(values[item] & untried))
            untried -= values.pop(chosen)
        for item in values:  # those not chosen
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def device() -> str:
    """Where kernel tests put their tensors: the GPU if there is one, else the interpreter's CPU.
    A parametrized test that asks for it runs a sample of its product in the fast subset."""
    return "cuda" if HAS_GPU else "cpu"


# The study world of test_search, shared with test_replay (a fixture found through conftest,
# so no test module imports another's fixture).
from tests.test_search import world  # noqa: E402, F401


@pytest.fixture
def on_hopper(monkeypatch):
    """The Gluon variants (gluon, gluongemv) as they see a compiled kernel's target: not the
    interpreter, an sm_90 GPU; so CPU tests reach the rest of their `unsupported`."""
    from tuner.kernels import gluon_mm
    monkeypatch.setattr(gluon_mm, "INTERPRETED", False)
    monkeypatch.setattr(gluon_mm, "target_arch", lambda device: gluon_mm.HOPPER_ARCH)


@pytest.fixture
def shapes_dir(tmp_path, monkeypatch):
    """The working folder of a CLI test: it holds only s.csv, one shape, and TUNE_DB is unset."""
    from tests.factories import ONE_SHAPE
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TUNE_DB", raising=False)
    (tmp_path / "s.csv").write_text(ONE_SHAPE)
    return tmp_path


@pytest.fixture
def triton_answers(monkeypatch):
    """No $TUNE_CONFIG, and the dispatcher asks for the runtime's best Triton answer (cuBLAS
    left out, so calls exercise our kernels): every untuned key gets the kernel's default
    config (warnings silenced)."""
    import warnings

    from tuner import runtime
    from tuner.runtime import dispatch
    monkeypatch.delenv("TUNE_CONFIG", raising=False)
    monkeypatch.setattr(dispatch, "get_tuned_config", lambda op, **key:
                        runtime.get_tuned_config_without(("cublas",), op, **key))
    dispatch.clear_cache()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield
    dispatch.clear_cache()
