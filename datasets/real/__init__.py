"""Real datasets in their public layouts (MS-SL feature release, TVRetrieval / XML).

Registers `tvr`, `activitynet` and `charades` (PRVR, MS-SL layout) and `charades-sta` and
`didemo` (moment retrieval, TVRetrieval / XML layout only): `--data-root DIR` (or $PRVR_DATA)
names the folder holding `<collection>/`; `--set data.layout=xml` reads TVR from the
TVRetrieval layout. See msl.py and xml.py for the layouts, store.py for validation, caching and
memory mapping, annotations.py for the timestamp join, relevance.py for the relevance files
joined to the splits on every load (not cached: they are small, and may change).
"""

# No `from __future__ import annotations` here: it would bind the name `annotations` in this
# package and hide the submodule prvr.datasets.real.annotations.
from prvr.datasets.base import PRESETS, DatasetSpec
from prvr.datasets.real.relevance import attach
from prvr.datasets.real.specs import SPECS
from prvr.datasets.real.store import load_real, make_layout
from prvr.harness.base import progress
from prvr.harness.base.registry import DATASETS


def _load(name: str):
    def load(cfg):
        data = load_real(name, cfg)
        for line in attach(data, make_layout(name, cfg), cfg.data.relevance):  # relevance files, where there are
            progress.log(line)
        return data

    return load


for _name, _spec in SPECS.items():
    DATASETS.add(_name, DatasetSpec(_name, _load(_name), PRESETS / f"{_name}.yaml", simulated=False), _spec.summary)
