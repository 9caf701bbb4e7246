"""Real datasets in their public layouts (MS-SL feature release, TVRetrieval / XML).

Registers `tvr`, `activitynet` and `charades` (PRVR, MS-SL layout) and `charades-sta` and
`didemo` (moment retrieval, TVRetrieval / XML layout only): `--data-root DIR` (or $PRVR_DATA)
names the folder holding `<collection>/`; `--set data.layout=xml` reads TVR from the
TVRetrieval layout. See msl.py and xml.py for the layouts, store.py for validation, caching and
memory mapping, annotations.py for the timestamp join.
"""

# No `from __future__ import annotations` here: it would bind the name `annotations` in this
# package and hide the submodule prvr.datasets.real.annotations.
from prvr.datasets.base import PRESETS, DatasetSpec
from prvr.datasets.real.specs import SPECS
from prvr.harness.registry import DATASETS


def _load(name: str):
    def load(cfg):
        from prvr.datasets.real.store import load_real

        return load_real(name, cfg)

    return load


for _name, _spec in SPECS.items():
    DATASETS.add(_name, DatasetSpec(_name, _load(_name), PRESETS / f"{_name}.yaml", simulated=False), _spec.summary)
