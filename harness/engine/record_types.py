"""A run record and its figures as types (issue 37): what `prvr-bench run` writes
(harness/engine/runner.py) and harness/engine/records.py reads back. Each is a `TypedDict`, a plain dict at run
time, so a record's JSON is the bytes it always was; mypy holds the code that builds or reads a
record to these keys. Where the keys are data (loss parts, timing phases, noise levels, bucket
names, config sections) a block is a dict keyed by str.

`Required` is what loading checks (records.REQUIRED, SHAPE, NOISE_SHAPE); every other key is
optional: today's runs write it, older or hand-made records may lack it
(`tests/test_record_types.py` checks every committed record and a fresh run against these types).
"""

# No `from __future__ import annotations`: Python 3.11 reads Required / NotRequired in a
# TypedDict class only from evaluated annotations (`__required_keys__`, which the tests read).
from typing import Any, NotRequired, Required, TypedDict

# R@K of the labelled video in percent and their sum (harness/engine/evaluate.py `recall_table`)
Recalls = TypedDict("Recalls", {"R@1": float, "R@5": float, "R@10": float, "R@100": float, "SumR": float},
                    total=False)

# Moment retrieval at the default tIoUs (harness/engine/vcmr.py, `eval.vcmr_tious` [0.5, 0.7]); other
# thresholds add keys of the same names (`MOMENT_METRIC_PREFIXES`).
VcmrRecalls = TypedDict("VcmrRecalls", {
    "VCMR-0.5 R@1": float, "VCMR-0.5 R@10": float, "VCMR-0.5 R@100": float,
    "VCMR-0.7 R@1": float, "VCMR-0.7 R@10": float, "VCMR-0.7 R@100": float}, total=False)
# the moment figures a split has beyond those its oracle has
SplitMoments = TypedDict("SplitMoments", {
    "VCMR SumR": float, "VCMR n": int,
    "SVMR-0.5 R@1": float, "SVMR-0.5 R@5": float, "SVMR-0.7 R@1": float, "SVMR-0.7 R@5": float}, total=False)
MOMENT_METRIC_PREFIXES = ("VCMR", "SVMR")  # a key of a split's block or its oracle that is a moment figure

# prvr-ea's multi-GT Recall@K (harness/engine/evaluate.py `dense_recall`)
DenseRecalls = TypedDict("DenseRecalls", {
    "dense R@1": float, "dense R@5": float, "dense R@10": float, "dense R@100": float, "dense SumR": float},
    total=False)


class BucketMetrics(Recalls, total=False):
    """One M/V bucket (short, medium, long) of a split."""

    n: int


class OracleMetrics(Recalls, DenseRecalls, VcmrRecalls, total=False):
    """A split against every truly relevant video (harness/engine/evaluate.py `oracle_block`; its
    moment figures: harness/engine/vcmr.py)."""

    unlabelled_above: float | None
    multi_relevant_share: float | None
    n: int  # queries the relevance covers
    queries: int


class SplitMetrics(Recalls, VcmrRecalls, SplitMoments, total=False):
    """One split's block in a record (`metrics.val`, `metrics.test`): the evaluator's figures
    that a record keeps (harness/engine/runner.py `_keep`: SPLIT_METRIC_KEYS, then the moment ones)."""

    median_rank: float
    mean_rank: float
    n: int
    buckets: dict[str, BucketMetrics]
    oracle: OracleMetrics


# The retrieval keys of a split's block, in the order a record writes them; moment keys follow.
SPLIT_METRIC_KEYS = tuple(k for k in SplitMetrics.__annotations__ if not k.startswith(MOMENT_METRIC_PREFIXES))


class NoiseCurve(TypedDict):
    """`metrics.noise` (harness/engine/robustness.py): test R@K per inserted-noise level ("0.0", "0.1", ...)."""

    source: str
    levels: dict[str, Recalls]


class RunMetrics(TypedDict):
    val: SplitMetrics  # of the selected epoch
    test: SplitMetrics
    noise: NotRequired[NoiseCurve]


class CpuFacts(TypedDict, total=False):
    """The processor of a run (records.cpu_facts)."""

    machine: str
    capability: str
    model: str


class DataFacts(TypedDict, total=False):
    """`provenance.data`: the dataset's name and the facts its loader records."""

    name: str
    generator_version: int  # a simulated world's
    test: dict[str, Any]
    train: dict[str, Any]
    selection: dict[str, Any]  # how val was chosen (datasets/selection.py)
    relevance: dict[str, Any]  # per split, the relevance file's join report (datasets/real/relevance.py)


class InitWeights(TypedDict):
    """`provenance.init_weights`: the file a run's model started from (train.init_weights), by name and digest."""

    file: str
    sha256: str


class Provenance(TypedDict, total=False):
    """What made a run (records.provenance), and its data."""

    git_revision: str
    git_dirty: bool
    packages: dict[str, str | None]
    python: str
    platform: str
    cpu: CpuFacts
    device: str
    created: str
    data: DataFacts
    init_weights: InitWeights  # where the model started from given weights (train.init_weights)


class Budget(TypedDict, total=False):
    """A training budget: a run's own, or its dataset's (records.dataset_protocol)."""

    epochs: int
    patience: int
    select_on: str  # absent from records made before train.select_on
    selection: str  # the selection rule, e.g. "val SumR"
    precision: str  # the run's train.precision, where it is not fp32
    init: str  # "given weights" where the model started from train.init_weights, not its seeded init


class RunProtocol(Budget, total=False):
    """`protocol` (records.run_protocol): the run's budget, its dataset's, and whether they agree."""

    dataset_protocol: Budget
    follows_protocol: bool


class Nonfinite(TypedDict, total=False):
    """The first step whose loss was not finite (train.on_nonfinite=continue)."""

    epoch: int
    step: int


class Degenerate(TypedDict, total=False):
    """What marks a run degenerate: an epoch whose loss parts were all 0, or test scores that tell
    no video apart."""

    epoch: int
    scores: str


class Resume(TypedDict, total=False):
    """One resume of a run: its epoch, the settings changed ({key: [old, new]}; None where the
    checkpoint stored none), and whether it was forced."""

    from_epoch: int
    changed: dict[str, Any] | None
    forced: bool


class RunResources(TypedDict):
    """`resources` (harness/engine/runner.py `run_resources`): what the run cost its process. Absent
    from records made before it (docs/records.md)."""

    peak_rss_mb: float | None  # the process's peak resident set during the run
    peak_rss_measure: str  # how: VmHWM reset at the run's start, or the process's lifetime peak
    device_peak_mb: float | None  # torch.cuda.max_memory_allocated where CUDA trained, else None
    device_reserved_mb: float | None  # torch.cuda.max_memory_reserved, likewise
    seconds_per_epoch: float | None  # timings.train / epochs_timed; None where no epoch ran here
    epochs_timed: int  # the epochs this process trained (a resumed run: those after the resume)


class RankingsFile(TypedDict, total=False):
    """`rankings`: the ranks stored beside the record (harness/engine/rankings.py)."""

    file: str
    top_k: int
    splits: list[str]


# One epoch's summary (harness/engine/trainer.py): epoch, loss and the objective's named loss parts, lr,
# val (R@K, SumR, and VCMR SumR where a backbone localizes), the detector's report (relations).
# The loss parts are the method's, so the keys are data.
HistoryEntry = dict[str, Any]


class RunRecord(TypedDict, total=False):
    """One run record (harness/engine/runner.py `train_and_record`), keys in the order it writes them."""

    schema_version: int  # written first by records.write_record
    method: Required[str]
    dataset: Required[str]
    seed: Required[int]
    backbone: str
    relations: str
    run_name: str
    tag: str
    command: str
    config: Required[dict[str, Any]]  # the resolved config (harness/engine/sections.py Config.to_dict)
    provenance: Required[Provenance]
    protocol: RunProtocol
    timings: dict[str, float]  # seconds per named phase
    resources: RunResources
    best_epoch: int
    epochs_run: int
    metrics: Required[RunMetrics]
    history: list[HistoryEntry]
    nonfinite: Nonfinite
    degenerate: Degenerate
    resumes: list[Resume]
    artifacts: list[str]  # the detector's files beside the record
    rankings: RankingsFile
