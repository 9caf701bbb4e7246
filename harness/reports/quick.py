"""`bench --quick`: every registered method on sim-tiny in a few minutes, a first command that finishes.

A smoke test, not a benchmark: the runs train on a tiny world under sim-tiny's preset budget
(3 epochs), so their figures say that each method trains and evaluates end to end, nothing
about how it compares. Their records carry the tag `quick` (run names `<run>~quick`), go to
their own results folder (results/quick/, not under version control) and the leaderboard
leaves out every record so tagged, wherever it is.
"""

from __future__ import annotations


from prvr.harness.engine.record_types import RunRecord

QUICK_TAG = "quick"
QUICK_DATASET = "sim-tiny"
QUICK_OUT = "results/quick"


def is_quick(record: RunRecord) -> bool:
    """Whether a run record was made by `bench --quick` (its tag is `quick`)."""
    return record.get("tag") == QUICK_TAG
