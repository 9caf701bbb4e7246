"""The XML backbone (methods/backbones/xml.py): s_vr is the best cosine of the query vector with a
video's H1 rows (Eq. 1); start / end logits over H2 rows come from ConvSE on the row similarities,
are -inf on padding rows and do not change with padding; `span_logits` for chosen pairs is the
batch helper's rows, sliced or not. The registry-wide contract (shapes, gradients, padding of
the Scores, determinism) is tests/test_backbones.py."""

import pytest
import torch
import torch.nn.functional as F

from prvr.harness.engine.config import resolve
from prvr.harness.engine.evaluate import index_videos
from prvr.harness.base.io import UserError
from prvr.methods.backbones.xml import temporal_endpoints
from test_backbones import FRAME_LENGTHS, VIDEO_DIM, build, content, query_batch, video_batch


@pytest.fixture
def encoded():
    model = build("xml").eval()
    frames, tokens = content()
    vb = video_batch(frames)
    with torch.no_grad():
        q, v = model.encode_queries(query_batch(tokens)), model.encode_videos(vb)
    return model, vb, q, v


def test_s_vr_is_the_best_cosine_over_each_videos_real_h1_rows(encoded):
    model, vb, q, v = encoded
    s = model.score(q, v).fused
    for i in range(len(q["query"])):
        for j, n in enumerate(FRAME_LENGTHS):
            best = F.cosine_similarity(q["query"][i][None], v["h1"][j, :n], dim=-1).max()
            assert s[i, j].item() == pytest.approx(best.item(), abs=1e-6)


def test_logits_are_convse_over_the_row_similarities_of_each_video_alone(encoded):
    """(W q + b) . H2_n per real row, convolved with the width-5 start / end kernels as a video of
    its own length (zeros beyond its ends); padding rows -inf."""
    model, vb, q, v = encoded
    with torch.no_grad():
        start, end = model.span_logits_batch(q, v)
        query = model.query_linear(q["query"])
        for j, n in enumerate(FRAME_LENGTHS):
            sim = (query @ v["h2"][j, :n].t())[:, None]  # [Q, 1, n]
            for got, conv in ((start, model.start_conv), (end, model.end_conv)):
                ref = F.conv1d(sim, conv.weight, padding=conv.weight.shape[-1] // 2)[:, 0]
                torch.testing.assert_close(got[:, j, :n], ref)
                assert torch.isneginf(got[:, j, n:]).all()
    padding = ~vb.frame_mask[None].expand_as(start)
    assert (start.softmax(-1)[padding] == 0).all()  # P_st puts no mass on a padding row


def test_row_padding_changes_no_logit_of_a_real_row():
    model = build("xml").eval()
    frames, tokens = content()
    with torch.no_grad():
        q = model.encode_queries(query_batch(tokens))
        tight = model.span_logits_batch(q, model.encode_videos(video_batch(frames)))
        padded = model.span_logits_batch(q, model.encode_videos(video_batch(frames, pad_to=max(FRAME_LENGTHS) + 6,
                                                                            garbage=3.0)))
    for a, b in zip(tight, padded):
        torch.testing.assert_close(b[..., : a.shape[-1]], a)
        assert torch.isneginf(b[..., a.shape[-1]:]).all()


@pytest.mark.parametrize("budget", [1 << 24, 1])  # 1: one query per slice
def test_span_logits_of_pairs_are_the_batch_helpers_rows(encoded, budget):
    model, vb, q, v = encoded
    model.cfg.eval_budget = budget
    pairs = torch.tensor([[2, 0], [1, 1], [0, 2], [2, 1]])  # e.g. each query's top 2 videos
    with torch.no_grad():
        full = model.span_logits_batch(q, v)
        got = model.span_logits(q, index_videos(model, v), pairs)  # what the VCMR evaluator passes
        empty = model.span_logits({"query": q["query"][:0]}, v, pairs[:0])
    for g, f in zip(got, full):
        assert g.shape == (4, 2, max(FRAME_LENGTHS))
        torch.testing.assert_close(g, f[torch.arange(4)[:, None], pairs])
    assert [t.shape for t in empty] == [(0, 2, max(FRAME_LENGTHS))] * 2


def test_span_logits_of_pairs_train_like_the_batch_helper():
    model = build("xml").train()
    frames, tokens = content()
    q, v = model.encode_queries(query_batch(tokens)), model.encode_videos(video_batch(frames))
    pairs = torch.tensor([[0], [1], [2], [0]])
    torch.manual_seed(0)
    start, _ = model.span_logits(q, v, pairs)
    start.masked_fill(torch.isinf(start), 0).sum().backward()
    assert model.start_conv.weight.grad.abs().sum() > 0 and model.encoder3.branches.qkv.weight.grad is not None


def test_temporal_endpoints_of_each_real_row():
    mask = torch.tensor([[True, True, False], [True, True, True]])
    tef = temporal_endpoints(mask)
    torch.testing.assert_close(tef[0], torch.tensor([[0.0, 0.5], [0.5, 1.0], [0.0, 0.0]]))
    torch.testing.assert_close(tef[1], torch.tensor([[0.0, 1 / 3], [1 / 3, 2 / 3], [2 / 3, 1.0]]))
    assert build("xml").video_embed.linear.in_features == VIDEO_DIM + 2


def test_an_even_convolution_width_is_refused():
    with pytest.raises(UserError, match="model.conv_kernel' must be odd"):
        resolve("xml", "sim-tiny", 0, ["model.conv_kernel=4"])


def test_encoded_span_padding_reads_the_padding_rows_as_xmls_code_does():
    """`model.span_padding=encoded`: the convolutions read every row's similarity, the encoded padding
    rows' too, and mask only after them (TVRetrieval's XML): a real row within half the kernel of a
    video's end then depends on the padding, one farther from it does not; padding rows stay -inf."""
    model = build("xml").eval()
    frames, tokens = content()
    vb = video_batch(frames, pad_to=max(FRAME_LENGTHS) + 6)
    with torch.no_grad():
        q = model.encode_queries(query_batch(tokens))
        plain = model.encode_videos(vb)
        model.cfg.span_padding = "encoded"
        v = model.encode_videos(vb)
    for j, n in enumerate(FRAME_LENGTHS):  # the real rows are encoded alike; the padding rows only now
        for h in ("h1", "h2"):
            torch.testing.assert_close(v[h][j, :n], plain[h][j, :n])
            assert (plain[h][j, n:] == 0).all() and (v[h][j, n:].abs().sum(-1) > 0).all()
    with torch.no_grad():
        start, end = model.span_logits_batch(q, v)
        sim = torch.einsum("qd,btd->qbt", model.query_linear(q["query"]), v["h2"])  # every row, padding too
        half = model.start_conv.weight.shape[-1] // 2
        for j, n in enumerate(FRAME_LENGTHS):
            for got, conv in ((start, model.start_conv), (end, model.end_conv)):
                ref = F.conv1d(sim[:, j, None], conv.weight, padding=half)[:, 0]
                torch.testing.assert_close(got[:, j, :n], ref[:, :n])
                assert torch.isneginf(got[:, j, n:]).all()
        model.cfg.span_padding = "zero"
        zero_start, _ = model.span_logits_batch(q, v)
    n = min(FRAME_LENGTHS)
    j = FRAME_LENGTHS.index(n)
    torch.testing.assert_close(start[:, j, : n - half], zero_start[:, j, : n - half])  # away from the end: alike
    assert not torch.allclose(start[:, j, n - 1], zero_start[:, j, n - 1])  # the last row reads the padding


def test_an_unknown_span_padding_is_one_line():
    with pytest.raises(UserError, match=r"model.span_padding.*must be one of zero, encoded, got 'xml'"):
        resolve("xml", "sim-tiny", 0, ["model.span_padding=xml"])
