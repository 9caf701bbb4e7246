import pytest

from prvr.harness import progress


@pytest.fixture(autouse=True, scope="session")
def _quiet_and_cached(tmp_path_factory):
    """No progress bars; one shared dataset cache per test session (never the user's)."""
    progress.set_enabled(False)
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
