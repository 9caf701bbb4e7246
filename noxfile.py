"""Sessions: tests, bench, leaderboard, profile, docs, gpu. Virtualenvs are reused between runs."""

import os

import nox

nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["tests"]
PYTHON = "3.11"


def _install(session: nox.Session, extras: str = "") -> None:
    # Editable install: dependencies (and their pins) come from pyproject.toml only.
    session.install("-e", f".[{extras}]" if extras else ".")


# prvr.<folder> (pyproject.toml package-dir); mypy checks every file of them, with no error (issue 57)
PACKAGE_DIRS = ("harness", "methods", "datasets")


def _typecheck(session: nox.Session) -> None:
    """mypy over the whole package, seen as `prvr`: a folder of links prvr/<folder> -> <folder>."""
    root = os.path.abspath(os.path.dirname(__file__))
    tree = os.path.join(session.virtualenv.location, "typecheck")
    os.makedirs(os.path.join(tree, "prvr"), exist_ok=True)
    for folder in PACKAGE_DIRS:
        link = os.path.join(tree, "prvr", folder)
        if not os.path.islink(link):
            os.symlink(os.path.join(root, folder), link)
    with session.chdir(tree):
        session.run("mypy", "--config-file", os.path.join(root, "pyproject.toml"),
                    *(os.path.join("prvr", folder) for folder in PACKAGE_DIRS))


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The type check of the package, then the test suite (CI runs exactly this). Ray is
    installed with it, so that the local-Ray test of `--executor ray` runs here and in CI."""
    _install(session, "test,ray")
    _typecheck(session)
    session.run("pytest", "-n", str(_workers()), "--dist", "loadfile", *session.posargs)


def _workers() -> int:
    """pytest-xdist workers of `nox -s tests`: one a core this process may run on (its affinity,
    which a container or `taskset` narrows), at most 4: each worker imports torch and makes its own
    cache of the tests' worlds, so more than 4 buy little and cost memory. `--dist loadfile` keeps a
    file's tests in one worker, in their order, with their module fixtures made once. `nox -s tests
    -- -n 0` runs the suite in one process (the last -n given wins), e.g. under a debugger."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(4, cores))


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Train and evaluate methods; arguments go to `prvr-bench bench`."""
    _install(session, "text")  # the text-side detector (relations=sbert) of the xml-pr recipes
    session.run("prvr-bench", "bench", *session.posargs)


@nox.session(python=PYTHON)
def leaderboard(session: nox.Session) -> None:
    """Rebuild results/leaderboard.{csv,md} from the stored run records."""
    _install(session)
    session.run("prvr-bench", "leaderboard", *session.posargs)


@nox.session(python=PYTHON)
def profile(session: nox.Session) -> None:
    """Params, FLOPs, runtime per query, throughput: results/profile.{md,csv}; arguments go to `prvr-bench profile`."""
    _install(session)
    session.run("prvr-bench", "profile", *session.posargs)


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """Build the manual strictly (mkdocs.yml) into .nox/docs/site; `nox -s docs -- serve` serves it."""
    # The docs extra only: the site needs neither the package nor its dependencies.
    session.install(*nox.project.load_toml("pyproject.toml")["project"]["optional-dependencies"]["docs"])
    site = os.path.join(session.virtualenv.location, "site")
    session.run("mkdocs", *(session.posargs or ["build", "--strict", "--site-dir", site]))


@nox.session(python=PYTHON)
def gpu(session: nox.Session) -> None:
    """Every GPU check in one run, 136-177 s on an H200 (docs/gpu.md): the CUDA
    tests, an epoch of every method, evaluate, kill and resume, the evaluator at TVR shape,
    precision and determinism costs, the profile's device rows; results/gpu/gpu-check.md.
    Arguments go to `prvr-bench gpu-check`."""
    _install(session, "test")
    session.run("prvr-bench", "gpu-check", *session.posargs)
