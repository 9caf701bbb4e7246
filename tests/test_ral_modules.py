"""RAL's modules (methods/backbones/ral.py): padding invariance, the support set by hand,
the reference's parameter counts."""

import pytest
import torch

from prvr.methods.backbones.ral import AGGREGATIONS, Aggregator, ConfidenceGate, GaussianHead, masked_mean, support_sets


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
    assert count(ConfidenceGate(384)) == 148_225
