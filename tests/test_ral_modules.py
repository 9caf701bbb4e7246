"""RAL's modules (methods/backbones/ral.py): padding invariance, the support set by hand,
the reference's parameter counts."""

import pytest
import torch
import torch.nn.functional as F

from prvr.harness.base.io import UserError
from prvr.methods.backbones.ral import (AGGREGATIONS, Aggregator, CodeGaussianHead, ConfidenceGate, GatedAttentionPool,
                                        GaussianHead, gaussian_heads, masked_mean, support_sets)


def _padded(x, mask, extra=3, value=7.0):
    b, _, d = x.shape
    return (torch.cat([x, torch.full((b, extra, d), value)], 1),
            torch.cat([mask, torch.zeros(b, extra, dtype=torch.bool)], 1))


@pytest.mark.parametrize("mode", AGGREGATIONS)
def test_gaussian_head_ignores_padding(mode):
    torch.manual_seed(0)
    head = GaussianHead(8, mode).eval()
    x, mask = torch.randn(3, 5, 8), torch.ones(3, 5, dtype=torch.bool)
    mask[1, 2:] = False
    x[1, 2:] = 0.0
    mu, ls = head(x, mask)
    mu_p, ls_p = head(*_padded(x, mask))
    assert torch.allclose(mu, mu_p, atol=1e-6) and torch.allclose(ls, ls_p, atol=1e-6)
    x2 = x.clone()
    x2[1, 2:] = 100.0  # what lies under the mask does not matter either
    assert torch.allclose(head(x2, mask)[0], mu, atol=1e-6)


def test_aggregator_terms_by_mode():
    torch.manual_seed(1)
    x, mask = torch.randn(2, 4, 6), torch.ones(2, 4, dtype=torch.bool)
    both, local, glob = (Aggregator(6, m) for m in AGGREGATIONS)
    local.load_state_dict(both.state_dict())
    glob.load_state_dict(both.state_dict())
    g = both.fc(masked_mean(x, mask))
    l = both.local(x, mask)
    assert torch.allclose(both(x, mask), both.norm(g + l), atol=1e-6)
    assert torch.allclose(local(x, mask), both.norm(l), atol=1e-6)
    assert torch.allclose(glob(x, mask), both.norm(g), atol=1e-6)
    with pytest.raises(ValueError, match="both, local, global"):
        Aggregator(6, "mean")


def test_local_pooling_is_a_softmax_over_real_rows():
    pool = Aggregator(2).local
    with torch.no_grad():
        pool.w1.weight.copy_(torch.eye(2))
        pool.w2.weight.copy_(torch.tensor([[1.0, 0.0]]))
    x = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [5.0, 5.0]]])
    mask = torch.tensor([[True, True, False]])
    w = torch.tensor([torch.tanh(torch.tensor(1.0)), 0.0]).softmax(0)  # logits tanh(x_1) of the real rows
    assert torch.allclose(pool(x, mask), (w[:, None] * x[0, :2]).sum(0, keepdim=True), atol=1e-6)


def test_support_sets_concatenate_the_labelled_queries_tokens_by_hand():
    tokens = torch.arange(4 * 3 * 1, dtype=torch.float32).reshape(4, 3, 1)  # query q, token t -> 3 q + t
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    video_of_query = torch.tensor([0, 1, 0, 2])
    sets, set_mask = support_sets(tokens, mask, video_of_query, 3)
    assert sets.shape == (3, 5, 1)  # video 0: 2 + 3 tokens; no fixed capacity
    assert sets[0, :, 0].tolist() == [0, 1, 6, 7, 8] and set_mask[0].all()
    assert sets[1, :1, 0].tolist() == [3] and set_mask[1].tolist() == [True, False, False, False, False]
    assert sets[2, :2, 0].tolist() == [9, 10] and set_mask[2].sum() == 2


def test_parameter_counts_match_the_reference_at_d384():
    """RAL-PRVR (RAL4gmmv2, TVR config): PIENet + UncertaintyModuleImage per modality 592,128,
    text_weight_fc 148,225 (counted from the public code's model built outside this repository)."""
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(GaussianHead(384)) == 592_128
    assert count(CodeGaussianHead(384)) == count(CodeGaussianHead(384, unit_pool=True)) == 592_128  # ral.heads=code
    assert count(ConfidenceGate(384)) == 148_225


@pytest.mark.parametrize("unit_pool", [False, True])
def test_code_gaussian_head_ignores_padding(unit_pool):
    torch.manual_seed(0)
    head = CodeGaussianHead(8, unit_pool).eval()
    x, mask = torch.randn(3, 5, 8), torch.ones(3, 5, dtype=torch.bool)
    mask[1, 2:] = False
    mu, ls = head(x, mask)
    mu_p, ls_p = head(*_padded(x, mask))
    assert torch.allclose(mu, mu_p, atol=1e-6) and torch.allclose(ls, ls_p, atol=1e-6)


def test_code_gaussian_head_by_hand():
    """mu = LN(p + sigmoid(FC(A(X)))), log sigma = FC(A'(X)) + FC'(p); with the FCs' weights at 0
    only their biases and p remain; p is the mean, or on the video side the normalised mean of
    the normalised rows."""
    x, mask = torch.tensor([[[3.0, 4.0], [0.0, 2.0], [9.0, 9.0]]]), torch.tensor([[True, True, False]])
    for unit_pool, pooled in ((False, torch.tensor([1.5, 3.0])), (True, None)):
        head = CodeGaussianHead(2, unit_pool)
        with torch.no_grad():
            for fc, bias in ((head.mean_fc, 0.0), (head.sigma_fc, 0.5), (head.sigma_pooled_fc, 0.0)):
                fc.weight.zero_()
                fc.bias.fill_(bias)
            head.sigma_pooled_fc.weight.copy_(torch.eye(2))
        if unit_pool:
            pooled = F.normalize((torch.tensor([0.6, 0.8]) + torch.tensor([0.0, 1.0])) / 2, dim=0)
        mu, ls = head(x, mask)
        assert torch.allclose(mu[0], F.layer_norm(pooled + 0.5, (2,)), atol=1e-6)  # sigmoid(0) = 0.5
        assert torch.allclose(ls[0], pooled + 0.5, atol=1e-6)


def test_zero_rows_in_the_attention_pool_are_zero_vectors_in_the_softmax():
    """pool_padding=code: n zero rows counted in the softmax give what n explicit zero rows give."""
    torch.manual_seed(0)
    pool = GatedAttentionPool(4, 2)
    x, mask = torch.randn(2, 3, 4), torch.tensor([[True, True, False], [True, True, True]])
    x[0, 2] = 0.0
    zeros = torch.tensor([2, 0])
    explicit = torch.cat([x, torch.zeros(2, 2, 4)], 1)
    emask = torch.cat([mask, torch.tensor([[True, True], [False, False]])], 1)
    assert torch.allclose(pool(x, mask, zeros), pool(explicit, emask), atol=1e-6)
    assert torch.allclose(pool(x, mask, torch.zeros(2, dtype=torch.long)), pool(x, mask), atol=1e-6)


def test_code_heads_have_no_table_4_aggregation():
    text, video = gaussian_heads(8, "code", "both")
    assert isinstance(text, CodeGaussianHead) and not text.unit_pool and video.unit_pool
    with pytest.raises(UserError, match="ral.aggregation' is 'local'.*ral.heads=paper"):
        gaussian_heads(8, "code", "local")
