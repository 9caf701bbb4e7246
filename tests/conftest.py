import pytest
import torch

from prvr.harness import progress


@pytest.fixture(autouse=True, scope="session")
def _quiet_and_cached(tmp_path_factory):
    """No progress bars; one shared dataset cache per test session (never the user's)."""
    progress.set_enabled(False)
    # The tests' tensors are tiny: one intra-op thread avoids thread start-up on every op
    # (on a busy 2-core machine, 2 threads made sim-tiny steps up to 40x slower).
    torch.set_num_threads(1)
    mp = pytest.MonkeyPatch()
    mp.setenv("PRVR_CACHE", str(tmp_path_factory.mktemp("cache")))
    yield
    mp.undo()


@pytest.fixture
def tiny_cfg():
    from prvr.harness.config import resolve

    def make(method="baseline", seed=0, overrides=()):
        return resolve(method, "sim-tiny", seed, list(overrides))

    return make
