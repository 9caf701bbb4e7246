"""Small dataset folders in the public layouts, written by the tests themselves.

`exported(tmp_path, layout)` exports sim-tiny (48-d frames, 32-d tokens, 88 videos) as
`tvr`; the tests then break one file at a time.
"""

from __future__ import annotations

from pathlib import Path

from prvr.datasets.real.export import export
from prvr.harness.engine.config import resolve
from prvr.harness.base.registry import DATASETS

# sim-tiny's own sizes, so a model trained on the export matches one trained on sim-tiny
TINY = ["data.max_frames=16", "data.num_clips=8", "train.batch_size=16", "model.hidden=64", "model.heads=2"]


def sim_tiny():
    return DATASETS.get("sim-tiny").load(resolve("baseline", "sim-tiny", 0))


def exported(root: Path, layout: str = "msl") -> Path:
    """Export sim-tiny as tvr under root; returns root (the data root)."""
    export(sim_tiny(), "tvr", root, layout)
    return root


def tvr_config(root: Path, cache: Path, *overrides: str, layout: str = "msl"):
    return resolve("baseline", "tvr", 0, [f"data.data_root={root}", f"data.layout={layout}",
                                          f"data.cache_dir={cache}", *TINY, *overrides])


def load_tvr(root: Path, cache: Path, *overrides: str, layout: str = "msl"):
    return DATASETS.get("tvr").load(tvr_config(root, cache, *overrides, layout=layout))


def msl_paths(root: Path) -> dict[str, Path]:
    c = root / "tvr"
    feat = c / "FeatureData" / "i3d_resnet"
    return {
        "collection": c, "feature_dir": feat, "bin": feat / "feature.bin", "ids": feat / "id.txt",
        "shape": feat / "shape.txt", "v2f": feat / "video2frames.txt",
        "train_captions": c / "TextData" / "tvrtrain.caption.txt",
        "val_captions": c / "TextData" / "tvrval.caption.txt",
        "queries": c / "TextData" / "roberta_tvr_query_feat.hdf5",
        "annotations": c / "annotations", "train_ann": c / "annotations" / "tvr_train_release.jsonl",
    }
