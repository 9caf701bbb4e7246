"""Packaging: every dependency pinned exactly; the project must not shadow Hugging Face
`datasets` (transformers imports it)."""

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement


def test_no_top_level_datasets_module_comes_from_the_installed_project(tmp_path):
    """Outside the source tree (so the working folder is not on sys.path), the installed
    project provides `prvr.datasets` and no top-level `datasets`."""
    code = textwrap.dedent("""
        import importlib.util, pathlib, prvr.datasets
        ours = pathlib.Path(prvr.datasets.__file__).resolve().parent
        spec = importlib.util.find_spec("datasets")
        theirs = None if spec is None else pathlib.Path(spec.origin or list(spec.submodule_search_locations)[0]).resolve()
        print("none" if theirs is None else ("ours" if ours in (theirs, theirs.parent) else "other"))
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() in ("none", "other")


def test_a_third_party_datasets_package_imports_beside_the_project(tmp_path):
    fake = tmp_path / "datasets"
    fake.mkdir()
    (fake / "__init__.py").write_text("IS_HUGGING_FACE = True\n")
    code = textwrap.dedent("""
        import datasets, prvr.datasets, prvr.harness.base.registry as r
        r.load_all()
        assert datasets.IS_HUGGING_FACE
        assert 'sim-tvr' in r.DATASETS
        print('ok')
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         env={"PYTHONPATH": str(tmp_path), "PATH": ""})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def _requirements():
    meta = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    yield "dependencies", meta["dependencies"]
    yield from (("optional-dependencies." + name, reqs) for name, reqs in meta["optional-dependencies"].items())


@pytest.mark.parametrize("group,reqs", list(_requirements()), ids=lambda v: v if isinstance(v, str) else "")
def test_every_dependency_is_pinned_exactly(group, reqs):
    """A range would let a new numpy change the simulated worlds' streams, or a new torch the
    records' figures, between two installs of the same commit."""
    loose = [req for req in reqs if [spec.operator for spec in Requirement(req).specifier] != ["=="]]
    assert reqs and not loose, f"pyproject.toml [project.{group}]: pin these with ==: {loose}"
