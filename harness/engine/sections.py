"""The config's schema: its sections as typed dataclasses, each field with its default and
the values it accepts (harness/base/checks.py), and the choice sets fields are checked against.
How a run's config is resolved from these defaults, the presets and the overrides:
harness/engine/config.py.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from prvr.datasets.loader import PoolingRule
from prvr.datasets.noise import NoiseSource
from prvr.datasets.real.store import Layout, OnBadRows
from prvr.datasets.types import SplitName
from prvr.harness.base.checks import (FLAG, NON_NEGATIVE, POSITIVE, PROBABILITY, SEED, Device, Free, ListOf, OneOf, Range,
                                 Registered, Section, at_least, one_of, param, require, section, show)
from prvr.harness.base.io import UserError, read_yaml
from prvr.harness.engine.optim import OPTIMIZERS, Decay
from prvr.harness.base.registry import BACKBONES, DATASETS, DETECTORS, METHODS


OnNonfinite = Literal["stop", "continue"]  # train.on_nonfinite, read by harness/engine/trainer.py
ON_NONFINITE: tuple[OnNonfinite, ...] = get_args(OnNonfinite)
Precision = Literal["fp32", "tf32", "bf16"]  # train.precision, read by harness/engine/precision.py
# train.select_on: the validation figure that selects the tested epoch and drives early stopping
SelectOn = Literal["vr", "vcmr"]
# train.sample: what one training batch draws (datasets/loader.py epoch_batches)
Sample = Literal["videos", "queries"]
ClipUnit = Literal["tensor", "reference"]  # train.grad_clip_unit, read by harness/engine/optim.py
SELECT_ON: dict[SelectOn, str] = {"vr": "SumR", "vcmr": "VCMR SumR"}
# settings added after runs were stored, with the value those runs were trained under: a stored
# config (checkpoint, record) without the key reads as if it held that value, where the config it is
# compared with has the key (the standard objectives' loss.treatment and margin_a; ARL's always stored)
SETTLED_BEFORE = {"train.select_on": "vr", "train.precision": "fp32", "train.compile": False,
                  "train.deterministic": False, "data.relevance": "", "loss.treatment": "ignore",
                  "loss.margin_a": 0.05, "train.grad_clip_unit": "tensor", "loss.frame_matrix": "videos",
                  "train.init_weights": ""}


def load_yaml(path: str | Path | None) -> dict[str, Any]:
    if not path:
        return {}
    path = Path(path)
    data = read_yaml(path, "config file", "fix the file or pass another --config")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"config file {path} must hold a mapping of sections, got {type(data).__name__}")
    return data


_PRESETS: dict[tuple[str, int, int], dict[str, Any]] = {}


def load_preset(path: str | Path) -> dict[str, Any]:
    """A method's or dataset's preset file, as `load_yaml` reads it, parsed once per process and
    version of the file (its path, size and modification time): rebuilding every stored record's
    config parsed the same presets again each time. Each caller gets its own copy to change."""
    path = Path(path)
    try:
        st = path.stat()
    except OSError:
        return load_yaml(path)  # read_yaml's own line for a file that is not there
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _PRESETS:
        _PRESETS[key] = load_yaml(path)
    return copy.deepcopy(_PRESETS[key])


def dataset_preset(dataset: str) -> dict[str, Any]:
    """A registered dataset's preset. A variant (`variant_of: BASE`, e.g. sim-tvr-v of sim-tvr)
    is its base's preset with the variant's keys merged over it, section by section: its
    protocol, scales and family are the base's unless it says otherwise."""
    preset = load_preset(DATASETS.get(dataset).preset)
    base = preset.pop("variant_of", None)
    if base is None:
        return preset
    where = DATASETS.get(dataset).preset
    if not isinstance(base, str) or base not in DATASETS or base == dataset:
        raise UserError(f"{where}: 'variant_of' must name another registered dataset, got {show(base)}; "
                        f"fix the preset (datasets: {', '.join(DATASETS.names())})")
    under = load_preset(DATASETS.get(base).preset)
    if "variant_of" in under:
        raise UserError(f"{where}: 'variant_of: {base}' names a variant itself; name its base, "
                        f"{under['variant_of']}, with the keys of both")
    return {"variant_of": base, **_merged(under, preset)}


def _merged(under: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(under)
    for key, value in over.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def dataset_scales(cfg: Config | None) -> tuple[str, ...]:
    """data.scale: "default" and the scales the dataset's preset defines."""
    if cfg is None or cfg.dataset not in DATASETS:
        return ("default",)
    return ("default", *(dataset_preset(cfg.dataset).get("scales") or {}))


@dataclass(frozen=True)
class RealDataFile(Free):
    """A file only a real dataset reads: set for a simulated world, which carries its own ground
    truth, it is an error rather than a setting that does nothing."""

    def problem(self, value: Any, cfg: Config | None = None) -> str | None:
        if value and cfg is not None and cfg.dataset in DATASETS and DATASETS.get(cfg.dataset).simulated:
            return (f"is {show(value)}, but {cfg.dataset} is simulated and carries its own ground truth; leave it "
                    "out (or `data export` the world and load the export with it)")
        return None


def _optimizers():
    return OPTIMIZERS


@dataclass
class DataConfig:
    # simulated presets: "default" (CPU-sized), "full" (real split sizes), "tiny"
    scale: str = param("default", OneOf(dataset_scales))
    max_frames: int = param(128, at_least(1))  # frame branch: mean-pooled down to at most this many (MS-SL family)
    num_clips: int = param(32, at_least(1))  # clip branch: mean-pooled to exactly this many (MS-SL family)
    max_query_len: int = param(30, at_least(1))  # query tokens kept (MS-SL family)
    normalize_frames: bool = param(True, FLAG)  # L2-normalise frame rows (MS-SL family)
    normalize_tokens: bool = param(True, FLAG)  # L2-normalise token rows (MS-SL family)
    cache_dir: str = param("", Free("a folder"))  # "" -> $PRVR_CACHE or ~/.cache/prvr-bench
    data_root: str = param("", Free("a folder"))  # real datasets: "" -> $PRVR_DATA
    on_bad_rows: OnBadRows = param("error", one_of(OnBadRows))
    # real datasets: "msl" (MS-SL family release) | "xml" (TVRetrieval release: tvr, charades-sta, didemo)
    layout: Layout = param("msl", one_of(Layout))
    # real datasets: video features; "" -> MS-SL FeatureData/<the dataset's folder>, XML resnet_i3d
    feature: str = param("", Free("a feature folder under the data root, or a path"))
    # real datasets: folder of the original annotation files; "" -> <collection>/annotations
    annotations: str = param("", Free("a folder"))
    # real datasets: relevance file of the test split (docs/evaluation.md "Relevance files"); "" -> the
    # files found beside the splits, if any
    relevance: str = param("", RealDataFile("a relevance file (JSON lines)"))
    # Segment rule of the clip / frame mean-pooling: "reference" is the MS-SL family's (rounded,
    # clamped boundaries; the real-layout presets use it), "even" splits rows evenly (the
    # simulated presets, whose committed runs were made with it). See datasets/loader.py.
    pooling: PoolingRule = param("even", one_of(PoolingRule))
    # N > 0: N training videos (with all their queries) become the selection split (datasets/selection.py)
    val_from_train: int = param(0, at_least(0, "0 = the dataset's val split"))
    # real datasets: copy video and query features into RAM instead of memory-mapping them
    preload: bool = param(False, FLAG)
    # host memory a split may spend on its processed features and evaluation batches (datasets/loader.py
    # `keep_budget`); what does not fit is made per batch, bit for bit the same: -1 = half the free RAM
    keep_gb: float = param(-1.0, Range(-1, note="-1 = up to half the free RAM, 0 = keep nothing, N = at most N GB"))


@dataclass
class SimConfig:
    """Knobs of the simulated PRVR world (datasets/sim). Presets set them per dataset."""

    seed: int = param(0, SEED)  # the world's own seed: the dataset stays fixed across run seeds
    train_videos: int = param(1000, at_least(1))
    val_videos: int = param(250, at_least(1))
    test_videos: int = param(500, at_least(1))
    queries_per_video: float = param(5.0, POSITIVE)  # mean queries per video
    duration_mean: float = param(75.7, POSITIVE)  # seconds
    duration_std: float = param(15.0, NON_NEGATIVE)
    seconds_per_frame: float = param(1.5, POSITIVE)  # one feature row per 1.5 s, like the public features
    # moments that are short / medium / long
    mv_fractions: list[float] = param([0.853, 0.092, 0.055], ListOf(PROBABILITY, length=3, total=1.0))
    extra_events: float = param(2.0, NON_NEGATIVE)  # mean unannotated events per video (they can still be relevant)
    repeat_prob: float = param(0.45, PROBABILITY)  # label ambiguity: chance an event re-occurs from the recurring pool
    repeat_copies: float = param(4.0, POSITIVE)  # mean videos a recurring event appears in, per split
    vague_prob: float = param(0.1, PROBABILITY)  # queries that omit the object or the character
    # queries whose text says "someone" for the character their moment shows, while relevance still
    # requires that character: texts alike, videos not relevant (real text's low detector lift).
    # 0 = off: the world, its random draws and its cache key are those of before the knob
    unnamed_prob: float = param(0.0, PROBABILITY)
    # queries whose relevance requires the scene their moment is in while their text does not
    # name it: texts alike, videos in other scenes not relevant. 0 = off, as unnamed_prob
    hidden_scene_prob: float = param(0.0, PROBABILITY)
    # how many of the vocabulary's 60 actions the world's events use: few = a small, generic
    # vocabulary in which many queries of different moments read alike. 0 = all, as unnamed_prob
    actions_in_use: int = param(0, at_least(0))
    # queries of one recurring event that are worded apart: this share of a combination's later
    # queries take the paraphrase after its previous query's instead of their own draw, so two
    # queries of one event seldom read alike word for word (real relevant pairs are worded apart:
    # the text detector's recall falls off at high theta). 0 = off, as unnamed_prob
    distinct_wording: float = param(0.0, PROBABILITY)
    # recurring events whose later copies go unannotated: this share of a recurring (character,
    # action, object)'s annotated copies after its first trade places with an unannotated event of
    # their video, so the videos relevant to its query mostly hold it among what their own queries
    # do not describe (relevant videos whose queries share no words with it, as verified real
    # relevance mostly is: the text detector's recall falls at high theta). 0 = off, as unnamed_prob
    recurring_unannotated: float = param(0.0, PROBABILITY)
    # compound queries: this share of the queries also say another event of their video that
    # overlaps their moment ("... while Leonard picks up the phone"), and relevance requires both:
    # a relevant video's query shares part of what a query says and not the rest, as real
    # relevant pairs' texts do (the text detector's recall falls at high theta, not at low).
    # 0 = off, as unnamed_prob
    compound_prob: float = param(0.0, PROBABILITY)
    scene_prob: float = param(0.3, PROBABILITY)  # queries that name the scene
    filler_rate: float = param(0.3, PROBABILITY)  # chance of each filler slot (uninformative words)
    mislabel_rate: float = param(0.0, PROBABILITY)  # noisy correspondence: training queries moved to a random video
    latent_dim: int = param(64, at_least(1))
    video_dim: int = param(3072, at_least(1))
    query_dim: int = param(768, at_least(1))
    context_weight: float = param(0.6, NON_NEGATIVE)  # shared context: scene and cast in every frame
    frame_noise: float = param(1.0, NON_NEGATIVE)
    token_noise: float = param(0.5, NON_NEGATIVE)
    object_weight: float = param(0.8, NON_NEGATIVE)  # how visible the object is in an event's frames


@dataclass
class TrainConfig:
    epochs: int = param(12, at_least(1))
    # videos per batch, each with all its queries (MS-SL family: 128), or queries per batch under
    # sample=queries; a batch of one video has no negative video for any query, so every ranking
    # loss would be zero
    batch_size: int = param(128, at_least(2, "a batch of one video has no negative"))
    # what a batch draws: "videos" (batch_size videos, each with all its training queries: the MS-SL
    # family's loader) | "queries" (batch_size queries, each with its labelled video, a video two of
    # them share taken once: XML's TVRetrieval loader draws queries; docs/protocol.md)
    sample: Sample = param("videos", one_of(Sample))
    # "adamw" | "bertadam" (harness/engine/optim.py; the MS-SL family presets use bertadam)
    optimizer: str = param("adamw", Registered(_optimizers))
    lr: float = param(3e-4, POSITIVE)
    weight_decay: float = param(0.01, NON_NEGATIVE)  # not on biases / norms (each optimizer's groups: harness/engine/optim.py)
    warmup_frac: float = param(0.05, Range(0, 1, high_open=True))  # share of all steps with linear warm-up
    # "cosine" | "linear" | "constant" after warm-up, or "warmup_linear" (BertAdam's schedule)
    decay: Decay = param("cosine", one_of(Decay))
    # gradient-norm bound, 0 = none: adamw clips the global norm, bertadam each parameter's
    grad_clip: float = param(5.0, Range(0, note="0 = no clipping"))
    # what bertadam clips to grad_clip one by one: "tensor" (each parameter tensor here: the fused q/k/v of
    # an attention layer's branches is one) | "reference" (each tensor of the reference code: a fused
    # tensor's parts (each branch's query, key, value, its output map and norm) clipped one by one, as the
    # MS-SL family's separate nn.Linear / nn.LayerNorm are); adamw clips one global norm and takes neither
    grad_clip_unit: ClipUnit = param("tensor", one_of(ClipUnit))
    # early stop after this many epochs without a gain of the val figure of select_on (MS-SL: 10 of 100)
    patience: int = param(5, at_least(1))
    eval_every: int = param(1, at_least(1))
    # the val figure that picks the tested epoch and counts toward the early stop: "vr" (VR SumR,
    # as the PRVR papers) | "vcmr" (VCMR SumR, as XML's code: TVRetrieval --stop_task VCMR); a
    # backbone that does not localize is selected on VR SumR under "vcmr", and its record says so.
    # A dataset setting (its preset), like the budget: docs/protocol.md
    select_on: SelectOn = param("vr", one_of(SelectOn))
    # batch-building worker processes; -1: 4 with CUDA (keeps a GPU fed), 0 on CPU
    num_workers: int = param(-1, at_least(-1, "-1 = auto"))
    # "auto" (CUDA when present; the environment variable PRVR_DEVICE, when set, names the device
    # auto picks) | "cpu" | "cuda" | "cuda:1" ...
    device: str = param("auto", Device())
    # matrix-product precision (harness/engine/precision.py): "fp32" | "tf32" (CUDA only) | "bf16" (encoders
    # under bfloat16 autocast; scores, losses and ranks in float32)
    precision: Precision = param("fp32", one_of(Precision))
    compile: bool = param(False, FLAG)  # torch.compile the encoders (docs/gpu.md: where it helps)
    deterministic: bool = param(False, FLAG)  # deterministic CUDA kernels (a CPU run is exact either way)
    # a loss that is not finite (a diverged run): "stop" (one line naming the epoch and step, no
    # record) | "continue" (train on; the record is marked and left out of leaderboard means)
    on_nonfinite: OnNonfinite = param("stop", one_of(OnNonfinite))
    # an official code's weights the model starts from instead of its seeded init: a .npz of that code's state
    # dict, read through the backbone's map as `evaluate --official-weights` reads one; the seed still draws
    # the batches and the dropout. Both sides of a parity run from one start (docs/parity.md). "" = seeded init
    init_weights: str = param("", Free("a .npz of an official code's weights"))

    def check(self, key: str) -> None:
        require(self.grad_clip_unit == "tensor" or self.optimizer == "bertadam",
                f"config key '{key}.grad_clip_unit' is {self.grad_clip_unit!r}, which only bertadam clips by "
                f"(it clips each parameter; {key}.optimizer={self.optimizer} clips one global norm); "
                f"set {key}.optimizer=bertadam or {key}.grad_clip_unit=tensor")


@dataclass
class RelationsConfig:
    """Section `relations`: which detector; its own settings are the section `relations.<name>`
    (the detector class's `config_cls`, e.g. `relations.oracle.mode`, `relations.arl.similarity`)."""

    name: str = param("none", Registered(lambda: DETECTORS))  # relation detector: none | oracle | ... (see `prvr-bench list`)


@dataclass
class EvalConfig:
    chunk: int = param(1024, at_least(1))  # queries scored at once
    splits: list[SplitName] = param(["val", "test"], ListOf(one_of(SplitName), distinct=True))
    # noise robustness (RAL Fig. 5): the best checkpoint tested again with a segment of p x each
    # test video's length inserted at its start, per level p (and 0); [] = off (datasets/noise.py)
    noise_levels: list[float] = param([], ListOf(PROBABILITY, min_length=0, distinct=True))
    # where inserted rows come from: "other" (a run of another test video) | "gaussian"
    noise_source: NoiseSource = param("other", one_of(NoiseSource))
    # Moment retrieval (VCMR / SVMR, harness/engine/vcmr.py), for backbones that provide span_logits.
    # Spans of rows i_st <= i_ed with n_min <= i_ed - i_st <= n_max (SBERT-PR paper Eq. 4, in feature
    # rows). Defaults: XML's TVR settings (min_pred_l 2, max_pred_l 16; its code keeps
    # i_ed - i_st < 16, the same spans as n_max 15); the paper's Charades-STA 1 / 8, DiDeMo 2 / 4.
    vcmr_n_min: int = param(2, at_least(0))
    vcmr_n_max: int = param(15, at_least(0))
    vcmr_alpha: float = param(20.0, NON_NEGATIVE)  # s_vcmr = s_tl exp(alpha s_vr) (Eq. 3; XML q2c_alpha 20)
    vcmr_top_videos: int = param(100, at_least(1))  # videos localized per query, the top by s_vr (XML: 100)
    # moments kept per query, best first (XML: 100 after NMS, none by default); R@100 needs 100
    vcmr_top_moments: int = param(100, at_least(100, "VCMR R@100 needs the top 100"))
    vcmr_tious: list[float] = param([0.5, 0.7], ListOf(Range(0, 1, low_open=True), distinct=True))

    def check(self, key: str) -> None:
        require(self.vcmr_n_max >= self.vcmr_n_min,
                f"config key '{key}.vcmr_n_max' must be >= {key}.vcmr_n_min ({self.vcmr_n_min}), "
                f"got {self.vcmr_n_max}; raise it or lower {key}.vcmr_n_min")


@dataclass
class Config:
    method: str = param("", Registered(lambda: METHODS, empty="none yet: `resolve` sets it from --method"))
    dataset: str = param("sim-tvr-v2", Registered(lambda: DATASETS))
    seed: int = param(0, SEED)
    backbone: str = param("", Registered(lambda: BACKBONES, empty="the method's backbone"))
    data: DataConfig = section(DataConfig)
    sim: SimConfig = section(SimConfig)
    model: Section = section()  # the backbone's config dataclass (its `config_cls`), set by config.resolve
    loss: Section = section()  # the method's objective config dataclass (its `loss_cls`)
    train: TrainConfig = section(TrainConfig)
    relations: RelationsConfig = section(RelationsConfig)
    eval: EvalConfig = section(EvalConfig)
    extra: dict[str, Any] = section(dict)  # method-specific sections
    detector: Section | None = section()  # the detector's own settings (its config_cls), section `relations.<name>`

    @property
    def detector_key(self) -> str:
        """The section name of the detector's settings: `relations.<name>`."""
        return f"relations.{self.relations.name}"

    def section(self, name: str) -> Any:
        if name in self.extra:
            return self.extra[name]
        if name == self.detector_key:
            return self.detector
        return getattr(self, name, None) if "." not in name else None

    def section_names(self) -> tuple[str, ...]:
        return ("data", "sim", "model", "loss", "train", "relations", "eval", *self.extra,
                *((self.detector_key,) if self.detector is not None else ()))

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("extra", "detector")}
        out.update(self.extra)
        out = {k: dataclasses.asdict(v) if is_dataclass(v) and not isinstance(v, type) else v for k, v in out.items()}
        if self.detector is not None:
            out["relations"][self.relations.name] = dataclasses.asdict(self.detector)
        return out


def detector_settings(name: str) -> Section | None:
    """A fresh settings object of detector `name` (its `config_cls`), or None."""
    cls = getattr(DETECTORS.get(name), "config_cls", None)
    return cls() if cls is not None else None
