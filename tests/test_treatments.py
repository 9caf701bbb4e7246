"""`loss.treatment` of the standard objectives (baseline, MS-SL, GMMFormer): ignore, the default, is
the loss as it always was, to the last bit; positive is the loss with the ambiguous pairs among the
positives; restrain adds ARL's restrained triplet (Eq. 11) on each branch's score matrix, checked
against a loop; soft (Holmes' soft targets in the text-to-video InfoNCE) is ignore to the last bit where the
detector trusts every label, and a soft cross-entropy by hand where it does not; bad values are one line; a
checkpoint from before the knob resumes."""

import json
import math
from dataclasses import replace

import pytest
import torch

from prvr.harness.base.contract import Relations, Scores, StepContext
from prvr.harness.base.io import UserError
from prvr.harness.engine.config import resolve
from prvr.harness.engine.runner import run_one
from prvr.harness.engine.trainer import resume_changes
from prvr.methods.baseline import StandardLossConfig, standard_objective
from prvr.methods.gmmformer import GMMFormerLossConfig, gmmformer_objective
from prvr.methods.msl import MSLLossConfig, msl_objective
from prvr.methods.objectives.arl import TREATMENTS, restrained_triplet
from prvr.methods.objectives.holmes import soft_info_nce, soft_targets
from prvr.methods.objectives.prvr import query_diversity, same_video_pairs, two_branch_ranking
from prvr.methods.objectives.ranking import hard_pool_at, info_nce, triplet

Q, B = 9, 5
METHODS = {"baseline": (StandardLossConfig, standard_objective), "msl": (MSLLossConfig, msl_objective),
           "gmmformer": (GMMFormerLossConfig, gmmformer_objective)}


def batch(seed: int = 0):
    """A fixed random batch: scores of two branches (cosines and raw dot products), a query vector each,
    one-to-one labels (several queries a video) and a few ambiguous pairs beside them."""
    g = torch.Generator().manual_seed(seed)
    raw = {b: torch.randn(Q, B, generator=g) * 3 for b in ("clip", "frame")}
    branches = {b: t.tanh() for b, t in raw.items()}
    scores = Scores((branches["clip"] + branches["frame"]) / 2, branches, raw)
    labels = torch.tensor([0, 0, 1, 1, 2, 3, 3, 4, 4])
    rel = Relations.one_to_one(labels, B)
    ambiguous = (torch.rand(Q, B, generator=g) < 0.3) & ~rel.positive
    assert ambiguous.any()
    queries = torch.randn(Q, 8, generator=g)
    return scores, Relations(rel.positive, ambiguous, rel.positive.float() + 0.5 * ambiguous.float()), queries


def context(epoch: int, queries: torch.Tensor, seed: int = 7) -> StepContext:
    outputs = {"queries": {"query": queries}, "videos": {}, "scores": None, "extras": {}}
    return StepContext(epoch, 0, torch.Generator().manual_seed(seed), None, outputs, None)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- the losses as they were
def old_standard(cfg, scores, relations, ctx):
    hard = hard_pool_at(ctx.epoch, cfg.hard_negative_epoch, cfg.hard_pool)
    out = {}
    pos, neg = relations.positive, relations.negative
    for b in cfg.branches:
        out[f"{b}_triplet"] = triplet(scores.branches[b], pos, neg, cfg.margin, hard, ctx.generator)
        out[f"{b}_nce"] = info_nce(scores.branches[b], pos, neg, cfg.temperature)
    return sum(out[f"{b}_triplet"] + cfg.nce_weight * out[f"{b}_nce"] for b in cfg.branches), out


def _two_branch(cfg, out):
    return (cfg.clip_nce_weight * out["clip_nce"] + out["clip_triplet"]
            + cfg.frame_nce_weight * out["frame_nce"] + cfg.frame_triplet_weight * out["frame_triplet"])


def old_msl(cfg, scores, relations, ctx):
    hard = hard_pool_at(ctx.epoch, cfg.hard_negative_epoch, cfg.hard_pool)
    out = two_branch_ranking(scores, relations.positive, relations.negative, cfg.margin, hard, ctx.generator)
    return _two_branch(cfg, out), out


def old_gmmformer(cfg, scores, relations, ctx):
    hard = hard_pool_at(ctx.epoch, cfg.hard_negative_epoch, cfg.hard_pool)
    out = two_branch_ranking(scores, relations.positive, relations.negative, cfg.margin, hard, ctx.generator)
    out["diversity"] = query_diversity(ctx.outputs["queries"]["query"], same_video_pairs(relations.positive),
                                       cfg.diversity_margin, cfg.diversity_alpha)
    return _two_branch(cfg, out) + cfg.diversity_weight * out["diversity"], out


OLD = {"baseline": old_standard, "msl": old_msl, "gmmformer": old_gmmformer}


@pytest.mark.parametrize("epoch", [0, 100], ids=["random-negatives", "hard-negatives"])
@pytest.mark.parametrize("method", list(METHODS))
def test_the_default_is_the_loss_as_it_was_to_the_last_bit(method, epoch):
    cls, objective = METHODS[method]
    cfg = cls()
    assert cfg.treatment == "ignore"
    scores, rel, queries = batch()
    new = objective(cfg, scores, rel, context(epoch, queries))
    old_loss, old_parts = OLD[method](cfg, scores, rel, context(epoch, queries))
    assert torch.equal(new.loss, old_loss)
    assert list(new.parts) == list(old_parts)
    assert all(torch.equal(new.parts[k], old_parts[k]) for k in old_parts)


@pytest.mark.parametrize("epoch", [0, 100], ids=["random-negatives", "hard-negatives"])
@pytest.mark.parametrize("method", list(METHODS))
def test_positive_is_the_loss_with_the_ambiguous_pairs_added_to_the_positives(method, epoch):
    cls, objective = METHODS[method]
    scores, rel, queries = batch(1)
    treated = objective(cls(treatment="positive"), scores, rel, context(epoch, queries))
    by_hand = Relations(rel.positive | rel.ambiguous, torch.zeros_like(rel.ambiguous), rel.confidence)
    expected = objective(cls(), scores, by_hand, context(epoch, queries))
    assert torch.equal(treated.loss, expected.loss)
    assert treated.parts.keys() == expected.parts.keys()
    assert all(torch.equal(treated.parts[k], expected.parts[k]) for k in expected.parts)
    assert not torch.equal(treated.loss, objective(cls(), scores, rel, context(epoch, queries)).loss)


# ----------------------------------------------------------------------------- restrain
def loop_restrained(s, positive, ambiguous, margin_a):
    """ARL Eq. 11 with the hardest ambiguous pair (hard_pool=1), pair by pair."""
    t2v, v2t = [], []
    for q in range(s.shape[0]):
        for v in range(s.shape[1]):
            if not positive[q, v]:
                continue
            videos = [float(s[q, j]) for j in range(s.shape[1]) if ambiguous[q, j] and j != v]
            queries = [float(s[i, v]) for i in range(s.shape[0]) if ambiguous[i, v] and i != q]
            t2v.append(max(0.0, margin_a + max(videos) - float(s[q, v])) if videos else 0.0)
            v2t.append(max(0.0, margin_a + max(queries) - float(s[q, v])) if queries else 0.0)
    return sum(t2v) / len(t2v) + sum(v2t) / len(v2t)


def test_the_restrained_triplet_against_a_loop():
    s = torch.tensor([[0.9, 0.85, 0.2, 0.5],
                      [0.1, 0.6, 0.7, 0.3],
                      [0.4, 0.3, 0.8, 0.75],
                      [0.95, 0.2, 0.1, 0.6]])
    positive = torch.tensor([[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]], dtype=torch.bool)
    ambiguous = torch.tensor([[0, 1, 0, 1], [0, 0, 1, 0], [0, 0, 0, 1], [1, 0, 0, 0]], dtype=torch.bool)
    got = restrained_triplet(s, positive, ambiguous, 0.05, hard_pool=1)
    assert got.item() == pytest.approx(loop_restrained(s, positive, ambiguous, 0.05))
    assert got.item() > 0
    # one ambiguous pair a row and a column: the uniform draw has no choice to make
    single = torch.tensor([[0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1], [1, 0, 0, 0]], dtype=torch.bool)
    uniform = restrained_triplet(s, positive, single, 0.1, None, torch.Generator().manual_seed(3))
    assert uniform.item() == pytest.approx(loop_restrained(s, positive, single, 0.1))
    # no ambiguous pair, or no positive pair: 0, in the graph
    assert restrained_triplet(s, positive, torch.zeros_like(single), 0.05, 1).item() == 0
    x = s.clone().requires_grad_()
    zero = restrained_triplet(x, torch.zeros_like(positive), single, 0.05, 1)
    zero.backward()
    assert zero.item() == 0 and x.grad is not None


@pytest.mark.parametrize("method", list(METHODS))
def test_restrain_adds_the_restrained_triplet_of_each_branch(method):
    cls, objective = METHODS[method]
    scores, rel, queries = batch(2)
    cfg = cls(treatment="restrain", hard_negative_epoch=0, hard_pool=1)  # the hardest pairs: no draw
    out = objective(cfg, scores, rel, context(0, queries))
    ignored = objective(replace(cfg, treatment="ignore"), scores, rel, context(0, queries))
    weight = {"clip": 1.0, "frame": getattr(cfg, "frame_triplet_weight", 1.0)}
    added = 0.0
    for b in ("clip", "frame"):
        expected = loop_restrained(scores.branches[b], rel.positive, rel.ambiguous, cfg.margin_a)
        assert out.parts[f"{b}_trip_a"].item() == pytest.approx(expected)
        added += weight[b] * expected
    assert out.loss.item() == pytest.approx(ignored.loss.item() + added)
    assert {k: v for k, v in out.parts.items() if not k.endswith("_trip_a")}.keys() == ignored.parts.keys()


# ----------------------------------------------------------------------------- soft
def smoothed(rel: Relations, row: int = 2, trust: float = 0.8) -> Relations:
    """The relations with the labelled pair of one query at confidence `trust` (as the holmes detector's)."""
    confidence = rel.confidence.clone()
    confidence[row] = confidence[row] * trust
    return Relations(rel.positive, rel.ambiguous, confidence)


@pytest.mark.parametrize("epoch", [0, 100], ids=["random-negatives", "hard-negatives"])
@pytest.mark.parametrize("method", list(METHODS))
def test_soft_is_ignore_to_the_last_bit_where_every_label_is_trusted(method, epoch):
    cls, objective = METHODS[method]
    for seed in range(3):
        scores, rel, queries = batch(seed)  # confidence 1 on every labelled pair (and 0.5 on the ambiguous ones)
        soft = objective(cls(treatment="soft"), scores, rel, context(epoch, queries))
        ignored = objective(cls(), scores, rel, context(epoch, queries))
        assert torch.equal(soft.loss, ignored.loss)
        assert soft.parts.keys() == ignored.parts.keys()
        assert all(torch.equal(soft.parts[k], ignored.parts[k]) for k in ignored.parts)
        # a smoothed row changes the NCE parts alone
        doubted = objective(cls(treatment="soft"), scores, smoothed(rel), context(epoch, queries))
        assert not torch.equal(doubted.loss, ignored.loss)
        assert all(torch.equal(doubted.parts[k], ignored.parts[k]) for k in ignored.parts if not k.endswith("_nce"))


def by_hand_soft_nce(s, positive, negative, temperature, target_scores, confidence):
    """-sum_v t_qv log softmax(s_q / T)_v over the row's classes, t = soft_targets, mean over the rows; plus the
    video-to-text InfoNCE term, column by column."""
    classes = positive | negative
    t = soft_targets(target_scores, positive, confidence, classes)
    rows = []
    for q in range(s.shape[0]):
        keep = classes[q]
        logp = torch.log_softmax(s[q][keep] / temperature, 0)
        rows.append(float(-(t[q][keep] * logp).sum()))
    cols = []
    for v in range(s.shape[1]):
        keep = classes[:, v]
        logp = torch.log_softmax(s[:, v][keep] / temperature, 0)
        cols.append(float(-torch.logsumexp(logp[positive[:, v][keep]], 0)))
    return sum(rows) / len(rows) + sum(cols) / len(cols)


def test_soft_against_a_soft_cross_entropy_by_hand():
    scores, rel, _ = batch(3)
    rel = smoothed(rel, row=4, trust=0.7)
    target_scores = (scores.branches["clip"], scores.branches["frame"])
    t = soft_targets(target_scores, rel.positive, rel.confidence, rel.positive | rel.negative)
    assert t[4, 2].item() < 1 and (t[4] > 0).sum() > 1 and t[0].max().item() == 1  # one row smoothed, the rest one-hot
    assert torch.allclose(t.sum(1), torch.ones(Q, dtype=t.dtype))
    for temperature in (0.05, 1.0):
        got = soft_info_nce(scores.branches["frame"], rel.positive, rel.negative, temperature, target_scores,
                            rel.confidence)
        expected = by_hand_soft_nce(scores.branches["frame"], rel.positive, rel.negative, temperature, target_scores,
                                    rel.confidence)
        assert got.item() == pytest.approx(expected, rel=1e-5)
    # the baseline's clip_nce is that on its cosines at its temperature
    cfg = StandardLossConfig(treatment="soft")
    out = standard_objective(cfg, scores, rel, context(0, torch.zeros(Q, 8)))
    assert out.parts["clip_nce"].item() == pytest.approx(by_hand_soft_nce(
        scores.branches["clip"], rel.positive, rel.negative, cfg.temperature, target_scores, rel.confidence), rel=1e-5)


def test_the_standard_treatments_are_arls_and_soft_and_arl_keeps_its_own():
    from prvr.methods.arl import ArlConfig
    from prvr.methods.objectives.arl import STANDARD_TREATMENTS
    assert STANDARD_TREATMENTS == (*TREATMENTS, "soft") and "soft" not in TREATMENTS
    with pytest.raises(UserError, match="must be one of restrain, positive, ignore, got 'soft'"):
        resolve("arl", "sim-tiny", 0, ["loss.treatment=soft"])
    assert ArlConfig().treatment == "restrain"


# ----------------------------------------------------------------------------- settings
@pytest.mark.parametrize("method", list(METHODS))
def test_a_bad_treatment_is_one_line_naming_the_key(method):
    with pytest.raises(UserError,
                       match=r"'loss.treatment' must be one of restrain, positive, ignore, soft, got 'drop'") as err:
        resolve(method, "sim-tiny", 0, ["loss.treatment=drop"])
    assert "\n" not in str(err.value)
    with pytest.raises(UserError, match=r"restrain needs loss.margin_a < loss.margin \(ARL Eq. 11-12\)") as err:
        resolve(method, "sim-tiny", 0, ["loss.treatment=restrain", "loss.margin_a=0.5"])
    assert "\n" not in str(err.value)
    assert resolve(method, "sim-tiny", 0, ["loss.margin_a=0.5"]).loss.margin_a == 0.5  # read by restrain alone
    with pytest.raises(UserError, match=r"loss.treatment must be one of restrain, positive, ignore, soft, got 'drop'"):
        cls, objective = METHODS[method]
        scores, rel, queries = batch()
        objective(cls(treatment="drop"), scores, rel, context(0, queries))  # a config built in code


def test_a_checkpoint_from_before_the_treatment_resumes(tmp_path):
    requested = resolve("msl", "sim-tiny", 0, ["train.epochs=1"]).to_dict()
    stored = json.loads(json.dumps(requested))
    del stored["loss"]["treatment"], stored["loss"]["margin_a"]  # written before the knob existed
    assert resume_changes(stored, requested, tmp_path / "last.pt", force=False) == {}
    requested["loss"]["treatment"] = "positive"
    with pytest.raises(UserError, match="loss.treatment 'ignore' -> 'positive'"):
        resume_changes(stored, requested, tmp_path / "last.pt", force=False)


# ----------------------------------------------------------------------------- training
@pytest.mark.slow
@pytest.mark.parametrize("treatment", ["positive", "restrain"])
def test_baseline_trains_one_epoch_with_the_oracles_pairs_treated(treatment, tmp_path):
    cfg = resolve("baseline", "sim-tiny", 0, ["train.epochs=1", "relations.name=oracle", "relations.oracle.mode=ignore",
                                              f"loss.treatment={treatment}"])
    record = run_one(cfg, tmp_path)
    history = record["history"][0]
    assert math.isfinite(history["loss"]) and history["clip_triplet"] >= 0
    if treatment == "restrain":
        assert history["clip_trip_a"] > 0 and history["frame_trip_a"] >= 0  # the oracle's pairs were restrained
    assert record["config"]["loss"]["treatment"] == treatment


@pytest.mark.slow
def test_positive_trains_what_the_oracles_mode_positive_gives(tmp_path):
    """Why the matrix keeps the oracle's mode for `positive` on the standard objectives: the same run."""
    sets = ["train.epochs=1", "relations.name=oracle"]
    by_mode = run_one(resolve("baseline", "sim-tiny", 0, [*sets, "relations.oracle.mode=positive"]), tmp_path / "a")
    by_loss = run_one(resolve("baseline", "sim-tiny", 0, [*sets, "relations.oracle.mode=ignore",
                                                          "loss.treatment=positive"]), tmp_path / "b")
    assert by_mode["history"] == by_loss["history"] and by_mode["metrics"] == by_loss["metrics"]


@pytest.mark.slow
def test_baseline_trains_one_epoch_with_holmes_detector_and_soft_targets(tmp_path):
    cfg = resolve("baseline", "sim-tiny", 0, ["train.epochs=1", "relations.name=holmes", "loss.treatment=soft"])
    assert cfg.detector.warmup_epochs == 0  # below train.epochs: the division runs in the one epoch
    record = run_one(cfg, tmp_path)
    history = record["history"][0]
    assert math.isfinite(history["loss"]) and math.isfinite(history["clip_nce"]) and math.isfinite(history["frame_nce"])
    assert record["config"]["loss"]["treatment"] == "soft" and record["config"]["relations"]["name"] == "holmes"
    assert history["relations"]["active"] and history["relations"]["smoothed"] > 0  # some labels were softened
