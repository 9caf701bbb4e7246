"""The project must not shadow Hugging Face `datasets` (transformers imports it)."""

import importlib.util
import subprocess
import sys
import textwrap


def test_no_top_level_datasets_module_comes_from_the_project():
    import prvr.datasets

    spec = importlib.util.find_spec("datasets")
    if spec is not None:  # Hugging Face datasets may be installed: then it must be theirs
        assert "prvr" not in (spec.origin or "") and spec.origin != prvr.datasets.__file__
    assert prvr.datasets.__name__ == "prvr.datasets"


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
