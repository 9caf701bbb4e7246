"""Caption files and token-level query features in HDF5 (one dataset [L, D] per query key)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from prvr.datasets.real.assemble import Caption
from prvr.datasets.real.problems import Report, layout_error

SKIP_HINT = "fix the features or pass --set data.on_bad_rows=skip to leave such items out"


def read_captions(path: Path, report: Report) -> list[Caption]:
    """MS-SL caption file: '<cap_id> <sentence>' per line; video id = cap_id up to the first '#'."""
    try:
        lines = path.read_text(encoding="utf-8-sig").splitlines()  # a leading BOM dropped
    except FileNotFoundError:
        raise layout_error(path, "missing", "check --data-root (MS-SL layout: TextData/<c>{train,val,test}.caption.txt)") \
            from None
    except UnicodeDecodeError as e:
        raise layout_error(path, f"not UTF-8 text ({e.reason})", "re-download the caption file") from None
    while lines and not lines[-1].strip():
        lines.pop()  # trailing blank lines are harmless
    out: list[Caption] = []
    first_line: dict[str, int] = {}
    for no, line in enumerate(lines, 1):
        parts = line.strip().split(None, 1)
        if not parts:
            report.problem(path, "empty caption line", "delete the line", line=no)
            continue
        cap_id = parts[0]
        if len(parts) < 2 or not parts[1].strip():
            report.problem(path, f"caption {cap_id!r} has no sentence", "write '<cap_id> <sentence>' or delete the line",
                           line=no)
            continue
        if cap_id in first_line:
            report.problem(path, f"caption id {cap_id!r} already on line {first_line[cap_id]}",
                           "caption ids must be unique; delete or rename one", line=no)
            continue
        first_line[cap_id] = no
        out.append(Caption(cap_id, parts[1].strip(), cap_id.split("#")[0], path, no))
    return out


class H5Tokens:
    """Token features of queries, one HDF5 dataset per key, checked as they are read."""

    def __init__(self, path: Path, on_bad_rows: str, hint: str) -> None:
        import h5py

        if not path.is_file():
            raise layout_error(path, "missing", hint)
        try:
            self.file = h5py.File(path, "r")
        except OSError as e:
            raise layout_error(path, f"not a readable HDF5 file ({e})", "re-download or regenerate it") from None
        self.path, self.on_bad_rows, self.dim = path, on_bad_rows, 0

    def has(self, key: str) -> bool:
        return key in self.file

    def read(self, key: str, caption: Caption, report: Report) -> np.ndarray | None:
        import h5py

        ds = self.file[key]
        if not isinstance(ds, h5py.Dataset) or ds.ndim != 2:
            shape = getattr(ds, "shape", "a group")
            report.problem(self.path, f"features have shape {shape}, expected [tokens, dim]",
                           "regenerate the query features (one [L, D] dataset per query)", key=key)
            return None
        if self.dim and ds.shape[1] != self.dim:
            report.problem(self.path, f"features are {ds.shape[1]}-d, earlier ones {self.dim}-d",
                           "regenerate the query features with one model", key=key)
            return None
        if ds.shape[0] == 0 or ds.shape[1] == 0:
            report.problem(self.path, f"features have shape {ds.shape}: no tokens", "regenerate them", key=key)
            return None
        self.dim = self.dim or int(ds.shape[1])
        tok = np.asarray(ds[()], dtype=np.float32)
        if not np.isfinite(tok).all():
            if self.on_bad_rows == "skip":
                report.count("queries left out: NaN/Inf in their token features")
                return None
            report.problem(self.path, "token features hold NaN/Inf", SKIP_HINT, key=key)
            return None
        return tok

    def close(self) -> None:
        self.file.close()
