import functools

import pytest
import torch

from prvr.harness.base import progress
from prvr.harness.base.devices import DEVICE_ENV
from prvr.methods.relations.sbert import missing_text_extra

TEXT_MISSING = missing_text_extra()  # the `text` extra (in `test`): absent where only `pip install -e .` ran


def pytest_report_header(config):
    cuda = f"CUDA tests run on {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else \
        "CUDA tests skipped (no CUDA device)"
    return f"training device of the tests: cpu ({DEVICE_ENV}=cpu), except those marked cuda; {cuda}"


def pytest_collection_modifyitems(config, items):
    no_cuda = pytest.mark.skip(reason="needs a CUDA device")
    no_text = pytest.mark.skip(reason=f"the SBERT detector {TEXT_MISSING}")
    for item in items:
        if "cuda" in item.keywords and not torch.cuda.is_available():
            item.add_marker(no_cuda)
        if TEXT_MISSING and "detects" in item.keywords and _detects_with_sbert(item):
            item.add_marker(no_text)


def _detects_with_sbert(item) -> bool:
    """A test (marked `detects`) parametrised by a method whose detector is sbert, or by the sbert
    detector."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    return params.get("detector") == "sbert" or params.get("method") in _sbert_methods()


@functools.cache
def _sbert_methods() -> frozenset[str]:
    from prvr.harness.engine.config import resolve
    from prvr.harness.base.registry import METHODS

    return frozenset(m for m in METHODS.names() if resolve(m, "sim-tiny", 0, []).relations.name == "sbert")


@pytest.fixture
def on_cuda(monkeypatch):
    """A test marked `cuda` trains where `auto` now means the GPU."""
    monkeypatch.setenv(DEVICE_ENV, "cuda")
    return torch.device("cuda")


@pytest.fixture(autouse=True, scope="session")
def _quiet_and_cached(tmp_path_factory):
    """No progress bars; one shared dataset cache per test session (never the user's)."""
    progress.set_enabled(False)
    # The tests' tensors are tiny: one intra-op thread avoids thread start-up on every op
    # (on a busy 2-core machine, 2 threads made sim-tiny steps up to 40x slower).
    torch.set_num_threads(1)
    mp = pytest.MonkeyPatch()
    mp.setenv("PRVR_CACHE", str(tmp_path_factory.mktemp("cache")))
    # Every test trains on the CPU unless it says otherwise (the `cuda` marker): the figures the
    # tests compare are exact on a CPU, and a machine with a GPU must pass the same suite.
    # `train.device=auto` reads this, and so do the `prvr-bench run` processes tests start.
    mp.setenv(DEVICE_ENV, "cpu")
    yield
    mp.undo()


@pytest.fixture
def tiny_cfg():
    from prvr.harness.engine.config import resolve

    def make(method="baseline", seed=0, overrides=()):
        return resolve(method, "sim-tiny", seed, list(overrides))

    return make
