"""Sessions: tests, bench, leaderboard, profile, docs, gpu. Virtualenvs are reused between runs."""

import os

import nox

nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["tests"]
PYTHON = "3.11"


def _install(session: nox.Session, extras: str = "") -> None:
    # Editable install: dependencies (and their pins) come from pyproject.toml only.
    session.install("-e", f".[{extras}]" if extras else ".")


# The files mypy checks with no error (issue 37): the contract between the harness and its parts,
# the registries typed with it, the objectives, the methods' recipes, the backbones done so far
# with their shared blocks, and the relation detectors.
TYPED = (
    "harness/base/contract.py", "harness/base/batches.py", "harness/base/registry.py", "methods/objectives",
    "methods/arl.py", "methods/baseline.py", "methods/gmmformer.py", "methods/gmmformer2.py", "methods/msl.py",
    "methods/xml.py", "methods/ral.py",
    "methods/backbones/api.py", "methods/backbones/baseline.py", "methods/backbones/gmmformer.py",
    "methods/backbones/gmmformer2.py", "methods/backbones/ral.py", "methods/backbones/arl.py",
    "methods/backbones/msl.py", "methods/backbones/xml.py", "methods/backbones/blocks.py",
    "methods/relations", "methods/fit.py",
    # the harness's engine: config, build, the trainer, evaluation, records and their types, one run
    "harness/engine/sections.py", "harness/engine/config.py", "harness/engine/build.py", "harness/engine/optim.py", "harness/engine/precision.py",
    "harness/engine/checkpoints.py", "harness/engine/trainer.py", "harness/engine/evaluate.py", "harness/engine/vcmr.py", "harness/engine/rankings.py",
    "harness/engine/record_types.py", "harness/engine/records.py", "harness/engine/robustness.py", "harness/engine/runner.py",
    # the plumbing that parts and engine share, and a method's evaluate analysis
    "harness/base/devices.py", "harness/base/encoding.py", "harness/cli/fusion_weights.py",
    # the reports that read run records (RunRecord): the leaderboard, its rows and side reports, re-evaluation
    "harness/reports/leaderboard.py", "harness/reports/rows.py", "harness/reports/buckets.py", "harness/reports/noise.py", "harness/reports/calibration.py",
    "harness/cli/reevaluate.py", "harness/reports/quick.py",
    # the facts that keep a step from asking the device; the GPU-facing profiling (rehearsal, gpu-check)
    "harness/base/masks.py", "harness/profiling/training.py", "harness/profiling/rehearsal.py",
    "harness/cli/gpu_check.py",
)
PACKAGE_DIRS = ("harness", "methods", "datasets")  # prvr.<folder> (pyproject.toml package-dir)


def _typecheck(session: nox.Session) -> None:
    """mypy over TYPED, seen as modules of `prvr`: a folder of links prvr/<folder> -> <folder>."""
    root = os.path.abspath(os.path.dirname(__file__))
    tree = os.path.join(session.virtualenv.location, "typecheck")
    os.makedirs(os.path.join(tree, "prvr"), exist_ok=True)
    for folder in PACKAGE_DIRS:
        link = os.path.join(tree, "prvr", folder)
        if not os.path.islink(link):
            os.symlink(os.path.join(root, folder), link)
    with session.chdir(tree):
        session.run("mypy", "--config-file", os.path.join(root, "pyproject.toml"),
                    *(os.path.join("prvr", path) for path in TYPED))


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The type check of the typed files, then the test suite (CI runs exactly this). Ray is
    installed with it, so that the local-Ray test of `--executor ray` runs here and in CI."""
    _install(session, "test,ray")
    _typecheck(session)
    session.run("pytest", *session.posargs)


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
    """Every GPU check in one run, 136 s on an H200 (docs/gpu.md): the CUDA
    tests, an epoch of every method, evaluate, kill and resume, the evaluator at TVR shape,
    precision and determinism costs, the profile's device rows; results/gpu/gpu-check.md.
    Arguments go to `prvr-bench gpu-check`."""
    _install(session, "test")
    session.run("prvr-bench", "gpu-check", *session.posargs)
