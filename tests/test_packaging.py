"""The project must not shadow Hugging Face `datasets` (transformers imports it)."""

import subprocess
import sys
import textwrap


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
        import datasets, prvr.datasets, prvr.harness.registry as r
        r.load_all()
        assert datasets.IS_HUGGING_FACE
        assert 'sim-tvr' in r.DATASETS
        print('ok')
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         env={"PYTHONPATH": str(tmp_path), "PATH": ""})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
