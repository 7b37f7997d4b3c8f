"""Test set-up shared by every test module.

Without a CUDA GPU the kernels run through Triton's interpreter, which must be switched on
before triton is first imported, so it happens here, at collection time. Tests marked `gpu`
are skipped on such machines and run on the GPU machine (`pytest -m gpu`).
"""
import os

import pytest
import torch

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    os.environ["TRITON_INTERPRET"] = "1"


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device() -> str:
    """Where kernel tests put their tensors: the GPU if there is one, else the interpreter's CPU."""
    return "cuda" if HAS_GPU else "cpu"


# The study world of test_search, shared with test_replay (a fixture found through conftest,
# so no test module imports another's fixture).
from tests.test_search import world  # noqa: E402, F401


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
