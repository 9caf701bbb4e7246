"""The XML recipes (methods/xml.py): moments in rows (datasets/loader.py moment_rows), the weights
each condition switches on, one objective step checked term by term against the pure losses on
a hand-made batch, and two training steps of every recipe on sim-tiny."""

import dataclasses
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from prvr.datasets.loader import Batcher, moment_rows, rows_to_seconds
from prvr.harness.engine.build import build_run
from prvr.harness.engine.config import resolve
from prvr.harness.base.io import UserError
from prvr.harness.base.registry import DATASETS, METHODS
from prvr.methods.objectives.xml import (pos_at_least_rel, pos_over_neg, rel_over_neg, sample_hard_negatives,
                                         segment_rows, span_nll, vcmr_relevance)
from prvr.methods.recipes import TABLES
from prvr.methods.relations.base import Relations
from prvr.methods.xml import Weights, XMLLossConfig, negative_pool, next_end, xml_objective
from test_backbones import build, content, query_batch, video_batch

NAN = float("nan")


# ----------------------------------------------------------------------------- moments in rows
def test_moment_rows_hand_computed():
    # 30 s in 20 rows of 1.5 s: [3.2, 7.6] -> rows 2..5 (XML's docstring example, end row inclusive)
    moments = torch.tensor([[3.2, 7.6], [3.0, 6.0], [0.0, 30.0], [25.0, 45.0], [4.5, 4.5], [NAN, 5.0]])
    rows = moment_rows(moments, torch.full((6,), 30.0), torch.full((6,), 20))
    assert rows.tolist() == [[2, 5], [2, 3], [0, 19], [16, 19], [3, 3], [-1, -1]]
    # the same video pooled to 10 rows of 3 s; a video without rows knows no moment
    assert moment_rows(moments[:1], torch.tensor([30.0]), torch.tensor([10])).tolist() == [[1, 2]]
    assert moment_rows(moments[:1], torch.tensor([30.0]), torch.tensor([0])).tolist() == [[-1, -1]]
    back = rows_to_seconds(torch.tensor([[2, 5], [19, 19]]), torch.tensor([30.0, 29.0]), torch.tensor([20, 20]))
    torch.testing.assert_close(back, torch.tensor([[3.0, 9.0], [27.55, 29.0]], dtype=torch.float64))


def test_xmls_training_end_label_is_the_next_row_capped_at_the_last():
    """loss.end_row=next: TVRetrieval's training label, ceil(t_ed / w): one row after the last row a
    moment reaches into, never past the video's last row; unknown moments stay -1."""
    moments = torch.tensor([[3.2, 7.6], [3.0, 6.0], [0.0, 30.0], [4.5, 4.5], [NAN, 5.0]])
    rows = moment_rows(moments, torch.full((5,), 30.0), torch.full((5,), 20))
    assert next_end(rows, torch.full((5,), 20)).tolist() == [[2, 6], [2, 4], [0, 19], [3, 4], [-1, -1]]
    pair = moment_rows(torch.tensor([[[27.0, 30.0], [NAN, NAN]]]), torch.tensor([30.0, 12.0])[None],
                       torch.tensor([10, 4])[None])
    assert next_end(pair, torch.tensor([10, 4])[None]).tolist() == [[[9, 9], [-1, -1]]]


def test_the_next_end_row_trains_nll_on_the_row_after_the_moment():
    cfg, out, model, q, v, scores, rel, moments, vb = _step("pr", end_row="next")
    labels = torch.tensor([0, 1, 2, 0])
    lengths = vb.frame_mask.sum(1)
    with torch.no_grad():
        start, end = model.span_logits_batch(q, v)
    query_rows = next_end(moment_rows(moments, vb.durations[labels], lengths[labels]), lengths[labels])
    pair_rows = next_end(moment_rows(rel.moments, vb.durations[None], lengths[None]), lengths[None])
    rows = segment_rows(query_rows, labels, 3, pair_rows)
    assert rows[0, 2].tolist() == [6, 8]  # [12, 18] s ends the 18 s video: its last row, capped
    assert rows[0, 0].tolist() == [1, 3]  # [2, 6] s of a 10 s video in 5 rows of 2 s: rows 1..2, trained end 3
    labelled = rel.positive
    assert out["nll1"].item() == pytest.approx(span_nll(start[labelled], end[labelled], rows[labelled]).item(), rel=1e-5)
    assert out["nll1"].item() != pytest.approx(_step("pr")[1]["nll1"].item())


def test_moment_rows_broadcast_a_pair_matrix_over_the_batch_videos():
    pair = torch.tensor([[[3.2, 7.6], [NAN, NAN]], [[0.0, 3.0], [10.0, 12.0]]])  # [Q=2, B=2, 2]
    rows = moment_rows(pair, torch.tensor([30.0, 12.0])[None], torch.tensor([20, 4])[None])
    assert rows.tolist() == [[[2, 5], [-1, -1]], [[0, 1], [3, 3]]]


def test_batches_carry_durations_and_labelled_moments():
    cfg = resolve("xml", "sim-tiny", 0)
    split = DATASETS.get("sim-tiny").load(cfg)["train"]
    batch = Batcher(split, cfg.data).train_batch(np.array([3, 0, 5]))
    assert batch.videos.durations.tolist() == pytest.approx(split.durations[[3, 0, 5]].tolist())
    q = batch.queries.query_index.numpy()
    assert batch.moments.shape == (len(q), 2)
    np.testing.assert_allclose(batch.moments.numpy(), split.moments[q], rtol=1e-6)


# ----------------------------------------------------------------------------- conditions
def test_each_condition_switches_its_terms_on():
    def weights(**kw):
        return dataclasses.astuple(Weights.of(XMLLossConfig(**kw)))

    #              rel_neg_vr pos_rel_vr tl   tl2  vcmr rel_neg_vcmr pos_rel_vcmr
    assert weights(condition="xml") == (0, 0, 0.01, 0, 0, 0, 0)
    assert weights(condition="sl") == (0, 0, 0.01, 0, 1, 0, 0)
    assert weights(condition="pr") == (1, 1, 0.01, 1, 0, 0, 0)
    assert weights(condition="sl_pr") == (1, 1, 0.01, 1, 1, 1, 1)
    assert weights(condition="sl_pr", leave_out=["vr_rank"]) == (0, 0, 0.01, 1, 1, 1, 1)  # appendix B
    assert weights(condition="sl_pr", leave_out=["nll2"]) == (1, 1, 0.01, 0, 1, 1, 1)
    assert weights(condition="sl_pr", leave_out=["vcmr_rank"]) == (1, 1, 0.01, 1, 1, 0, 0)


@pytest.mark.parametrize("sets, message", [
    (["loss.unit_confidence=true"], "condition 'xml' has none of"),
    (["loss.condition=sl", "loss.confidence_on=hinge"], "'loss.confidence_on' acts on .* condition 'sl' has none of"),
    (["loss.condition=sl", "loss.leave_out=[nll2]"], "condition 'sl' has none of"),
    (["loss.condition=pr", "loss.leave_out=[vcmr_rank]"], "names vcmr_rank, which condition 'pr' does not train"),
])
def test_a_knob_the_condition_does_not_have_is_refused(sets, message):
    with pytest.raises(UserError, match=message):
        resolve("xml", "sim-tiny", 0, sets)


def test_the_recipes_and_their_conditions():
    expect = {"xml": ("xml", "none"), "xml-sl": ("sl", "none"), "xml-pr": ("pr", "sbert"),
              "xml-sl-pr": ("sl_pr", "sbert")}
    for name, (condition, relations) in expect.items():
        spec = METHODS.get(name)
        assert (spec.loss_cls().condition, spec.relations, spec.backbone) == (condition, relations, "xml")


def test_hard_negatives_from_the_top_20_after_epoch_20_any_negative_before():
    cfg = XMLLossConfig()
    assert [negative_pool(cfg, e) for e in (0, 19, 20, 99)] == [None, None, 20, 20]  # XML's code
    paper = XMLLossConfig(early_pool=1)  # appendix A as written: the hardest negative first
    assert [negative_pool(paper, e) for e in (0, 19, 20)] == [1, 1, 20]
    assert negative_pool(XMLLossConfig(hard_negative_epoch=-1, early_pool=1), 99) == 1


@pytest.mark.parametrize("dataset, epoch", [("sim-charades", 12), ("sim-didemo", 12), ("sim-tvr", 6)])
def test_the_hard_negative_epoch_scales_with_the_datasets_budget(dataset, epoch):
    from prvr.harness.engine.config import resolve

    cfg = resolve("xml-pr", dataset, 0, [])
    assert cfg.loss.hard_negative_epoch == epoch and cfg.loss.early_pool == 0
    assert cfg.train.epochs == (60 if epoch == 12 else 30)  # XML's 20 of 100, scaled


def test_tables_7_8_leave_out_each_group_with_and_without_unit_confidence():
    pr, sl_pr = TABLES[("xml-pr", "7")], TABLES[("xml-sl-pr", "7")]
    assert [r.tag for r in pr.rows] == ["", "c1", "no_vr_rank", "no_vr_rank_c1", "no_nll2", "no_nll2_c1"]
    assert len(sl_pr.rows) == 8 and sl_pr.rows[-1].tag == "no_vcmr_rank_c1"
    assert sl_pr.rows[-1].marks == ("✓", "✓", "✓", "", "", "✓")
    for table in (pr, sl_pr):
        for row in table.rows:  # every row resolves (the oracle stands in for the sbert detector)
            resolve(table.method, "sim-tiny", 0, [*row.overrides, "relations.name=oracle"])


# ----------------------------------------------------------------------------- one step, term by term
def _step(condition: str, unit_confidence: bool = False, pair_moments: bool = True, confidence_on: str = "score",
          end_row: str = "last"):
    """The XML backbone on 4 queries x 3 videos (q0, q3 -> v0; q1 -> v1; q2 -> v2) with durations
    and moments; (q0, v2) and (q1, v0) potentially relevant with C = 0.6 and 0.3, (q0, v2) with a
    moment of its own when `pair_moments`."""
    torch.manual_seed(0)
    model = build("xml").eval()
    frames, tokens = content()
    labels = torch.tensor([0, 1, 2, 0])
    vb = dataclasses.replace(video_batch(frames), durations=torch.tensor([10.0, 28.0, 18.0]))
    moments = torch.tensor([[2.0, 6.0], [4.0, 20.0], [0.0, 9.0], [7.0, 9.5]])
    q, v = model.encode_queries(query_batch(tokens)), model.encode_videos(vb)
    scores = model.score(q, v)
    rel = Relations.one_to_one(labels, 3)
    rel.ambiguous[0, 2], rel.ambiguous[1, 0] = True, True
    rel.confidence[0, 2], rel.confidence[1, 0] = 0.6, 0.3
    if pair_moments:
        rel.moments = torch.full((4, 3, 2), NAN)
        rel.moments[0, 2] = torch.tensor([12.0, 18.0])
    batch = SimpleNamespace(moments=moments, videos=vb, query_item=labels)
    ctx = SimpleNamespace(epoch=0, step=0, generator=torch.Generator().manual_seed(3), batch=batch,
                          outputs={"queries": q, "videos": v, "scores": scores,
                                   "extras": model.step_extras(q, v, labels)}, video_of_query=labels)
    cfg = XMLLossConfig(condition=condition, unit_confidence=unit_confidence, margin=0.2, confidence_on=confidence_on,
                        end_row=end_row)
    return cfg, xml_objective(cfg, scores, rel, ctx), model, q, v, scores, rel, moments, vb


def _rows(moments, vb, labels, pair_moments):
    lengths = vb.frame_mask.sum(1)
    query_rows = moment_rows(moments, vb.durations[labels], lengths[labels])
    pair_rows = None if pair_moments is None else moment_rows(pair_moments, vb.durations[None], lengths[None])
    return segment_rows(query_rows, labels, 3, pair_rows)


@pytest.mark.parametrize("unit_confidence", [False, True])
def test_one_step_of_sl_pr_is_the_sum_of_the_pure_terms(unit_confidence):
    cfg, out, model, q, v, scores, rel, moments, vb = _step("sl_pr", unit_confidence)
    labels = torch.tensor([0, 1, 2, 0])
    with torch.no_grad():
        start, end = model.span_logits_batch(q, v)
    rows = _rows(moments, vb, labels, rel.moments)
    assert rows[0, 2].tolist() == [6, 8]  # (q0, v2): [12, 18] s of an 18 s video in 9 rows of 2 s
    labelled = rel.positive
    nll1 = span_nll(start[labelled], end[labelled], rows[labelled])
    c = 1.0 if unit_confidence else 0.6
    nll2 = span_nll(start[0, 2][None], end[0, 2][None], rows[0, 2][None], torch.tensor([c]))  # (q1, v0): no moment
    assert out["nll1"].item() == pytest.approx(nll1.item(), rel=1e-5)
    assert out["nll2"].item() == pytest.approx(nll2.item(), rel=1e-5)
    r = vcmr_relevance(start, end, rows, scores.fused, 20.0)
    # first draw of the step: the VR negatives, then the VCMR ones, from the same generator
    g = torch.Generator().manual_seed(3)
    sample_hard_negatives(scores.fused, rel.negative, 1, g)
    negatives = sample_hard_negatives(r, rel.negative & (rows >= 0).all(-1), 1, g)
    assert out["vcmr_pos_neg"].item() == pytest.approx(pos_over_neg(r, rel.positive, negatives, 0.2).item(),
                                                       rel=1e-5)
    total = out["vr"] + 0.01 * (out["nll1"] + out["nll2"]) + out["vcmr"]
    assert out["loss"].item() == pytest.approx(total.item(), rel=1e-6)
    assert out["vr"].item() == pytest.approx((out["vr_pos_neg"] + out["vr_rel_neg"] + out["vr_pos_rel"]).item())


@pytest.mark.parametrize("on", ["score", "hinge"])
def test_the_ranking_terms_of_a_step_take_the_confidence_where_the_config_puts_it(on):
    """loss.confidence_on reaches both levels' rel>neg and pos>=rel (the VR ones checked against
    the pure terms with the step's first draw); NLL_2 weighs by C either way."""
    cfg, out, *_, scores, rel, moments, vb = _step("sl_pr", confidence_on=on)
    negatives = sample_hard_negatives(scores.fused, rel.negative, 1, torch.Generator().manual_seed(3))
    for got, want in ((out["vr_rel_neg"], rel_over_neg(scores.fused, rel.ambiguous, rel.confidence, negatives, 0.2, on)),
                      (out["vr_pos_rel"], pos_at_least_rel(scores.fused, rel.positive, rel.ambiguous, rel.confidence, on))):
        assert got.item() == pytest.approx(want.item(), rel=1e-5)
    _, paper, *_ = _step("sl_pr")
    assert out["nll2"].item() == pytest.approx(paper["nll2"].item())
    if on == "hinge":  # C < 1 on (q0, v2) and (q1, v0): another loss
        assert out["vr"].item() != pytest.approx(paper["vr"].item())


def test_a_potentially_relevant_pair_without_a_moment_leaves_nll_2_and_the_segment_terms():
    _, out, *_ = _step("sl_pr", pair_moments=False)  # e.g. the oracle on a world that gives no moment
    assert out["nll2"].item() == 0.0 and out["vcmr_rel_neg"].item() == 0.0 and out["vcmr_pos_rel"].item() == 0.0
    assert out["vr_rel_neg"].item() > 0  # the ranking on s_vr still uses the pair


def test_the_xml_condition_trains_the_labels_only():
    _, out, *_ = _step("xml")
    assert set(out) == {"vr_pos_neg", "vr", "nll1", "loss"}
    assert out["loss"].item() == pytest.approx((out["vr_pos_neg"] + 0.01 * out["nll1"]).item())


def test_a_step_without_moments_trains_the_ranking_on_s_vr():
    cfg, _, model, q, v, scores, rel, *_ = _step("sl_pr")
    ctx = SimpleNamespace(epoch=0, step=0, generator=torch.Generator().manual_seed(3), batch=None,
                          outputs={"queries": q, "videos": v, "scores": scores,
                                   "extras": model.step_extras(q, v, torch.tensor([0, 1, 2, 0]))},
                          video_of_query=torch.tensor([0, 1, 2, 0]))
    out = xml_objective(cfg, scores, rel, ctx)
    assert out["nll1"].item() == 0.0 and out["vcmr"].item() == 0.0 and math.isfinite(out["loss"].item())


# ----------------------------------------------------------------------------- every recipe trains
class _Stop(Exception):
    pass


class _StopAfter:
    def __init__(self, n: int) -> None:
        self.n, self.outs = n, []

    def on_epoch_start(self, trainer, epoch: int) -> None:
        pass

    def on_step(self, trainer, step: int, out: dict) -> None:
        self.outs.append({k: float(t) for k, t in out.items()})
        if len(self.outs) >= self.n:
            raise _Stop

    def on_epoch_end(self, trainer, epoch: int, summary: dict) -> None:
        pass


@pytest.mark.parametrize("method", ["xml", "xml-sl", "xml-pr", "xml-sl-pr"])
def test_each_recipe_trains_two_steps_on_sim_tiny(method, tmp_path):
    """The PR recipes with the oracle's relations (any detector's ambiguous pairs feed the loss)."""
    sets = ["train.batch_size=8", "train.device=cpu", "train.num_workers=0"]
    if METHODS.get(method).relations != "none":
        sets.append("relations.name=oracle")
    run = build_run(resolve(method, "sim-tiny", 0, sets))
    stop = _StopAfter(2)
    with pytest.raises(_Stop):
        run.trainer(tmp_path / "ckpt", [stop]).train_epoch(30)  # past the hard-negative start
    for out in stop.outs:
        assert all(math.isfinite(v) for v in out.values()), out
        assert out["nll1"] > 0
    if "pr" in method:
        assert any(out["vr_rel_neg"] > 0 for out in stop.outs)  # the oracle's pairs arrived


@pytest.mark.parametrize("method", ["xml", "xml-sl-pr"])
def test_query_batches_train_the_recipes_as_xml_s_own_loader_draws(method, tmp_path):
    """train.sample=queries (TVRetrieval's loader: batches of queries, each with its labelled video):
    the epoch has ceil(queries / batch) steps, each batch holds batch_size queries, and the
    losses are finite and train."""
    sets = ["train.sample=queries", "train.batch_size=16", "train.device=cpu", "train.num_workers=0"]
    if METHODS.get(method).relations != "none":
        sets.append("relations.name=oracle")
    run = build_run(resolve(method, "sim-tiny", 0, sets))
    stop = _StopAfter(2)
    trainer = run.trainer(tmp_path / "ckpt", [stop])
    queries = run.data.splits["train"].num_queries
    assert trainer.steps_per_epoch == math.ceil(queries / 16) == len(trainer.epoch_batches(0))
    with pytest.raises(_Stop):
        trainer.train_epoch(30)
    for out in stop.outs:
        assert all(math.isfinite(v) for v in out.values()), out
        assert out["nll1"] > 0 and out["vr_pos_neg"] > 0


def test_the_oracle_pairs_carry_the_worlds_relevant_moments():
    """+PR with the oracle: each truly relevant unlabelled pair carries its event's moment
    (the first matching event of the video), every other non-labelled pair none."""
    from prvr.datasets.sim.world import relevant_moments
    from prvr.methods.relations.base import OracleDetector

    cfg = resolve("xml-pr", "sim-tiny", 0, ["relations.name=oracle"])
    data = DATASETS.get("sim-tiny").load(cfg)
    split = data["train"]
    detector = OracleDetector(cfg)
    detector.setup(data)
    videos = np.arange(split.num_videos)  # the whole tiny split: every unlabelled relevant pair of it
    batch = Batcher(split, cfg.data).train_batch(videos)
    rel = detector.detect(batch, {})
    query, video, spans = relevant_moments(split)
    first: dict[tuple[int, int], np.ndarray] = {}
    for q, v, span in zip(query, video, spans):
        first.setdefault((int(q), int(v)), span)
    got = rel.moments.numpy()
    assert rel.ambiguous.any()
    for i, q in enumerate(batch.queries.query_index.tolist()):
        for j, v in enumerate(videos.tolist()):
            if (q, v) in first:
                np.testing.assert_allclose(got[i, j], first[(q, v)], rtol=1e-5)
            else:
                assert np.isnan(got[i, j]).all()
    assert not np.isnan(got[rel.ambiguous.numpy()]).any()
