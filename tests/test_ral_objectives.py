"""RAL's pure functions (methods/objectives/ral.py, and the CSA score in methods/backbones/ral.py)
against closed forms, Monte Carlo and hand-computed values."""

import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from prvr.methods.backbones.ral import csa_reference, csa_scores, word_confidences
from prvr.methods.objectives.ral import (distribution_alignment, gaussian_kl, kl_to_standard, proxy_matching,
                                         sample_proxies)


def test_gaussian_kl_closed_form_by_hand():
    # 1-d: p = N(1, 2^2), q = N(0, 1): log(1/2) + (4 + 1) / 2 - 1/2
    kl = gaussian_kl(torch.tensor([[1.0]]), torch.tensor([[math.log(2.0)]]), torch.zeros(1, 1), torch.zeros(1, 1))
    assert kl.item() == pytest.approx(math.log(0.5) + 2.5 - 0.5, abs=1e-6)


def test_gaussian_kl_matches_torch_distributions_and_monte_carlo():
    gen = torch.Generator().manual_seed(0)
    mu_p, mu_q = torch.randn(3, 5, generator=gen), torch.randn(3, 5, generator=gen)
    ls_p, ls_q = 0.3 * torch.randn(3, 5, generator=gen), 0.3 * torch.randn(3, 5, generator=gen)
    p, q = torch.distributions.Normal(mu_p, ls_p.exp()), torch.distributions.Normal(mu_q, ls_q.exp())
    exact = torch.distributions.kl_divergence(p, q).sum(-1)
    assert torch.allclose(gaussian_kl(mu_p, ls_p, mu_q, ls_q), exact, atol=1e-5)
    x = p.sample((200_000,))  # Monte Carlo: E_p[log p - log q]
    mc = (p.log_prob(x) - q.log_prob(x)).sum(-1).mean(0)
    assert torch.allclose(mc, exact, atol=0.05)


def test_kl_to_standard_is_the_kl_to_n01():
    mu, ls = torch.tensor([[0.5, -1.0]]), torch.tensor([[0.2, -0.4]])
    assert torch.allclose(kl_to_standard(mu, ls), gaussian_kl(mu, ls, torch.zeros(1, 2), torch.zeros(1, 2)))
    by_hand = 0.5 * sum(math.exp(2 * s) + m * m - 1 - 2 * s for m, s in ((0.5, 0.2), (-1.0, -0.4)))
    assert kl_to_standard(mu, ls).item() == pytest.approx(by_hand, abs=1e-6)
    assert kl_to_standard(torch.zeros(2, 3), torch.zeros(2, 3)).abs().max() == 0


def test_distribution_alignment_is_cross_plus_both_priors_averaged_over_pairs():
    mu_t, ls_t = torch.tensor([[0.0], [1.0]]), torch.tensor([[0.0], [0.5]])
    mu_v, ls_v = torch.tensor([[1.0], [1.0]]), torch.tensor([[0.0], [0.0]])
    cross = gaussian_kl(mu_t, ls_t, mu_v, ls_v)
    want = (cross + kl_to_standard(mu_t, ls_t) + kl_to_standard(mu_v, ls_v)).mean()
    assert distribution_alignment(mu_t, ls_t, mu_v, ls_v).item() == pytest.approx(want.item())
    # pair 0 by hand: cross 0.5, priors 0 and 0.5
    assert cross[0].item() == pytest.approx(0.5)


def test_distribution_alignment_code_reading_reads_the_prior_sigma_as_a_variance():
    """reading=code: the cross-modal KL as in std, each prior KL 1/2 sum(exp(ls) + mu^2 - 1 - ls)
    (exp(log sigma) a variance), written out by hand for one pair."""
    mu_t, ls_t = torch.tensor([[0.5, -1.0]]), torch.tensor([[0.2, -0.4]])
    mu_v, ls_v = torch.tensor([[0.1, 0.3]]), torch.tensor([[-0.3, 0.6]])
    prior = lambda mu, ls: 0.5 * sum(math.exp(s) + m * m - 1 - s for m, s in zip(mu, ls))  # noqa: E731
    want = (gaussian_kl(mu_t, ls_t, mu_v, ls_v).item() + prior([0.5, -1.0], [0.2, -0.4])
            + prior([0.1, 0.3], [-0.3, 0.6]))
    assert distribution_alignment(mu_t, ls_t, mu_v, ls_v, "code").item() == pytest.approx(want, abs=1e-6)
    # against torch's KL of N(mu, exp(ls)) (variance) to N(0, 1)
    var_prior = torch.distributions.kl_divergence(torch.distributions.Normal(mu_t, (0.5 * ls_t).exp()),
                                                  torch.distributions.Normal(0.0, 1.0)).sum()
    assert var_prior.item() == pytest.approx(prior([0.5, -1.0], [0.2, -0.4]), abs=1e-6)
    assert distribution_alignment(mu_t, ls_t, mu_v, ls_v, "std").item() != pytest.approx(want)
    with pytest.raises(ValueError, match="reading must be one of std, code"):
        distribution_alignment(mu_t, ls_t, mu_v, ls_v, "variance")


def test_proxies_are_mu_plus_sigma_eps_from_the_generator():
    mu, ls = torch.tensor([[1.0, -2.0]]), torch.tensor([[math.log(0.5), math.log(3.0)]])
    assert torch.equal(sample_proxies(mu, ls, 0, torch.Generator()), mu[:, None])  # K = 0: the mean only
    a = sample_proxies(mu, ls, 4, torch.Generator().manual_seed(7))
    b = sample_proxies(mu, ls, 4, torch.Generator().manual_seed(7))
    assert a.shape == (1, 4, 2) and torch.equal(a, b)
    many = sample_proxies(mu.expand(20_000, 2), ls.expand(20_000, 2), 5, torch.Generator().manual_seed(1))
    assert torch.allclose(many.mean((0, 1)), mu[0], atol=0.03)
    assert torch.allclose(many.std((0, 1)), ls[0].exp(), atol=0.03)  # sigma is the standard deviation


def _info_nce(logits):
    target = torch.arange(logits.shape[0])
    return F.cross_entropy(logits, target)


def test_proxy_matching_with_one_proxy_is_plain_info_nce():
    gen = torch.Generator().manual_seed(3)
    t, v = torch.randn(4, 1, 8, generator=gen), torch.randn(4, 1, 8, generator=gen)
    cos = F.normalize(t[:, 0], dim=-1) @ F.normalize(v[:, 0], dim=-1).t()
    assert proxy_matching(t, v, 0.1, "paper").item() == pytest.approx(_info_nce(cos / 0.1).item(), abs=1e-5)
    dots = t[:, 0] @ v[:, 0].t()
    code = 0.5 * (_info_nce(dots) + _info_nce(dots.t()))
    assert proxy_matching(t, v, reading="code").item() == pytest.approx(code.item(), abs=1e-5)


def test_proxy_matching_multi_instance_by_hand():
    """Two pairs, two proxies each, unit vectors with chosen cosines (temperature 1)."""
    e = torch.eye(3)
    text = torch.stack([torch.stack([e[0], e[0]]), torch.stack([e[1], e[1]])])  # [2, 2, 3]
    video = torch.stack([torch.stack([e[0], e[2]]), torch.stack([e[1], e[2]])])
    # text proxy of pair 0 (e0) against video proxies [e0, e2 | e1, e2]: cosines 1, 0 | 0, 0
    loss0 = -math.log((math.e + 1) / (math.e + 3))
    assert proxy_matching(text, video, 1.0, "paper").item() == pytest.approx(loss0, abs=1e-6)  # symmetric for pair 1
    # code reading: the mean over the two same-pair columns of -log_softmax, both directions
    row = torch.tensor([1.0, 0.0, 0.0, 0.0]).log_softmax(0)
    t2v = -(row[0] + row[1]) / 2
    col_v0 = torch.tensor([1.0, 1.0, 0.0, 0.0]).log_softmax(0)  # video proxy e0 against text proxies
    col_v1 = torch.tensor([0.0, 0.0, 0.0, 0.0]).log_softmax(0)  # video proxy e2: all zero
    v2t = (-(col_v0[0] + col_v0[1]) / 2 - (col_v1[0] + col_v1[1]) / 2) / 2
    assert proxy_matching(text, video, reading="code").item() == pytest.approx((0.5 * (t2v + v2t)).item(), abs=1e-6)


def test_proxy_matching_rejects_an_unknown_reading():
    with pytest.raises(ValueError, match="paper, code"):
        proxy_matching(torch.zeros(1, 1, 2), torch.zeros(1, 1, 2), reading="both")


def _csa_inputs(seed=0, q=3, v=5, length=4, t=6, d=8):
    gen = torch.Generator().manual_seed(seed)
    tokens, frames = torch.randn(q, length, d, generator=gen), torch.randn(v, t, d, generator=gen)
    token_mask = torch.ones(q, length, dtype=torch.bool)
    token_mask[0, 3:] = False
    token_mask[1, 1:] = False
    frame_mask = torch.ones(v, t, dtype=torch.bool)
    frame_mask[2, 2:] = False
    weights = word_confidences(torch.randn(q, length, generator=gen), token_mask)
    return tokens, token_mask, weights, frames, frame_mask


def test_word_confidences_sum_to_one_over_real_words():
    tokens, token_mask, weights, *_ = _csa_inputs()
    assert torch.allclose(weights.sum(-1), torch.ones(3))
    assert (weights[~token_mask] == 0).all()


def test_csa_with_uniform_confidence_is_the_mean_of_word_maxima():
    tokens, token_mask, _, frames, frame_mask = _csa_inputs()
    uniform = token_mask.float() / token_mask.sum(-1, keepdim=True)
    got = csa_scores(tokens, token_mask, uniform, frames, frame_mask)
    sims = torch.einsum("qld,vtd->qvlt", F.normalize(tokens, dim=-1), F.normalize(frames, dim=-1))
    sims = sims.masked_fill(~frame_mask[None, :, None], float("-inf")).max(-1).values
    want = torch.stack([sims[i][:, token_mask[i]].mean(-1) for i in range(3)])
    assert torch.allclose(got, want, atol=1e-6)


@pytest.mark.parametrize("budget", [1, 50, 1 << 24])
def test_chunked_csa_equals_the_unchunked_reference(budget):
    args = _csa_inputs(seed=1)
    assert torch.allclose(csa_scores(*args, budget=budget), csa_reference(*args), atol=1e-6)


@pytest.mark.parametrize("budget", [1, 50, 1 << 24])
def test_csa_without_gradients_scores_as_the_gradient_path_does(budget):
    """Ranking takes the frames' maxima alone (amax), training `_BestFrame` (max and its index); on
    the CPU ranking also cuts each chunk of videos at its longest, so its products have other shapes
    and the scores agree to rounding (a float32 unit in the last place), chunked or not."""
    tokens, token_mask, weights, frames, frame_mask = _csa_inputs(seed=3)
    with torch.no_grad():
        ranked = csa_scores(tokens, token_mask, weights, frames, frame_mask, budget=budget)
    trained = csa_scores(tokens.clone().requires_grad_(), token_mask, weights, frames, frame_mask, budget=budget)
    assert trained.requires_grad and not ranked.requires_grad
    assert torch.allclose(ranked, trained.detach(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("prefix", [True, False])
@pytest.mark.parametrize("budget", [1, 200, 1 << 24])
def test_csa_ranking_on_the_cpu_scores_the_definition(budget, prefix):
    """The CPU's ranking path (real words only, videos sorted by their count of real frames, each chunk
    cut at its longest) against the definition, over videos of many lengths and queries of many
    words, with and without the zero-frame floor; with real frames that are not a video's first
    (`prefix` False) no chunk is cut and the scores are still the definition's."""
    gen = torch.Generator().manual_seed(11)
    q, v, length, t, d = 6, 13, 7, 9, 16
    tokens, frames = torch.randn(q, length, d, generator=gen), torch.randn(v, t, d, generator=gen)
    token_mask = torch.arange(length)[None] < torch.randint(1, length + 1, (q, 1), generator=gen)
    frame_mask = torch.arange(t)[None] < torch.randint(1, t + 1, (v, 1), generator=gen)
    if not prefix:
        frame_mask = frame_mask.flip(1)  # the real frames last
    weights = word_confidences(torch.randn(q, length, generator=gen), token_mask)
    for floor in (None, torch.rand(v, generator=gen) < 0.5):
        with torch.no_grad():
            got = csa_scores(tokens, token_mask, weights, frames, frame_mask, budget=budget, floor=floor)
        want = csa_reference(tokens, token_mask, weights, frames, frame_mask, floor=floor)
        assert torch.allclose(got, want, atol=1e-6)


def test_csa_ignores_padding():
    tokens, token_mask, weights, frames, frame_mask = _csa_inputs(seed=2)
    base = csa_scores(tokens, token_mask, weights, frames, frame_mask)
    pad_t = torch.cat([tokens, 9 * torch.ones(3, 2, 8)], 1)
    pad_tm = torch.cat([token_mask, torch.zeros(3, 2, dtype=torch.bool)], 1)
    pad_w = torch.cat([weights, torch.zeros(3, 2)], 1)
    pad_f = torch.cat([frames, 9 * torch.ones(5, 3, 8)], 1)
    pad_fm = torch.cat([frame_mask, torch.zeros(5, 3, dtype=torch.bool)], 1)
    assert torch.allclose(csa_scores(pad_t, pad_tm, pad_w, pad_f, pad_fm), base, atol=1e-6)


def test_csa_gradients_flow_to_tokens_weights_and_frames():
    tokens, token_mask, _, frames, frame_mask = _csa_inputs(seed=4)
    logits = torch.zeros(3, 4, requires_grad=True)
    tokens.requires_grad_(True)
    frames.requires_grad_(True)
    csa_scores(tokens, token_mask, word_confidences(logits, token_mask), frames, frame_mask).sum().backward()
    assert tokens.grad.abs().sum() > 0 and frames.grad.abs().sum() > 0 and logits.grad.abs().sum() > 0


_QUIET_BACKWARD = """
import warnings
import torch
from prvr.methods.backbones.ral import csa_scores
tokens, frames = torch.randn(2, 3, 4, requires_grad=True), torch.randn(3, 5, 4, requires_grad=True)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    csa_scores(tokens, torch.ones(2, 3, dtype=torch.bool), torch.full((2, 3), 1 / 3), frames,
               torch.ones(3, 5, dtype=torch.bool)).sum().backward()
print(torch.sparse.check_sparse_tensor_invariants.is_enabled())
for w in caught:
    print(str(w.message).splitlines()[0])
"""


def test_csa_backward_warns_nothing_and_leaves_the_invariant_setting():
    """Torch 2.11 warned once per process, 'Sparse invariant checks are implicitly disabled', from
    the sparse gradient although it passes check_invariants=False; a fresh process, as the warning
    is emitted only once."""
    out = subprocess.run([sys.executable, "-c", _QUIET_BACKWARD], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["False"], out.stdout + out.stderr


def test_csa_zero_padded_frames_floor_each_word_at_zero():
    """ral.padded_frames=zero: in a floored video every word's best frame scores at least 0 (the
    reference's zero frames take part in the max); other videos are unchanged."""
    tokens, token_mask, weights, frames, frame_mask = _csa_inputs(seed=9)
    floor = torch.tensor([True, False, True, False, True])
    got = csa_scores(tokens, token_mask, weights, frames, frame_mask, floor=floor)
    sims = torch.einsum("qld,vtd->qvlt", F.normalize(tokens, dim=-1), F.normalize(frames, dim=-1))
    best = sims.masked_fill(~frame_mask[None, :, None], float("-inf")).max(-1).values  # [Q, V, L]
    assert (best < 0).any()  # the inputs have words whose best frame is negative
    best = torch.where(floor[None, :, None], best.clamp_min(0), best).masked_fill(~token_mask[:, None], 0)
    assert torch.allclose(got, (best * weights[:, None]).sum(-1), atol=1e-6)
    plain = csa_scores(tokens, token_mask, weights, frames, frame_mask)
    assert torch.equal(got[:, ~floor], plain[:, ~floor]) and (got[:, floor] >= plain[:, floor]).all()
    assert torch.allclose(got, csa_reference(tokens, token_mask, weights, frames, frame_mask, floor=floor), atol=1e-6)


@pytest.mark.parametrize("floor", [None, torch.tensor([True, False, True, False, True])])
@pytest.mark.parametrize("cosine", [True, False])
@pytest.mark.parametrize("budget", [1, 50, 1 << 24])
def test_csa_gradients_equal_autograd_through_the_reference(cosine, budget, floor):
    """The sparse backward of `_BestFrame` against autograd through the definition, with an
    upstream gradient that differs per (query, video), over chunk sizes that split both passes
    (and with the reference's zero-padded frames: a word floored at 0 sends no gradient)."""
    tokens, token_mask, weights, frames, frame_mask = _csa_inputs(seed=6)
    upstream = torch.randn(3, 5, generator=torch.Generator().manual_seed(7))
    grads = []
    for score in (lambda *a: csa_scores(*a, budget=budget, cosine=cosine, floor=floor),
                  lambda *a: csa_reference(*a, cosine=cosine, floor=floor)):
        t, w, f = (x.clone().requires_grad_(True) for x in (tokens, weights, frames))
        (score(t, token_mask, w, f, frame_mask) * upstream).sum().backward()
        grads.append((t.grad, w.grad, f.grad))
    for got, want in zip(*grads):
        assert torch.allclose(got, want, atol=1e-5)


def test_csa_backward_passes_gradcheck():
    tokens, token_mask, weights, frames, frame_mask = (x.double() if x.is_floating_point() else x
                                                       for x in _csa_inputs(seed=8))
    tokens.requires_grad_(True)
    frames.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda t, f: csa_scores(t, token_mask, weights, f, frame_mask, budget=30),
                                    (tokens, frames))


def test_proxy_matching_pairs_texts_with_their_video_rows():
    """One distribution per query (Table 4, X^q = Q): queries 0 and 1 share video 0; the
    result equals stacking video rows per query only in the paper reading's numerator, so check
    against the definition written out."""
    gen = torch.Generator().manual_seed(5)
    t, v = torch.randn(3, 2, 4, generator=gen), torch.randn(2, 2, 4, generator=gen)
    pair = torch.tensor([0, 0, 1])
    got = proxy_matching(t, v, 0.5, "paper", pair)
    cos = F.normalize(t.reshape(6, 4), dim=-1) @ F.normalize(v.reshape(4, 4), dim=-1).t() / 0.5
    owner = pair.repeat_interleave(2)
    want = torch.stack([torch.logsumexp(cos[r], 0) - torch.logsumexp(cos[r, 2 * owner[r]: 2 * owner[r] + 2], 0)
                        for r in range(6)]).mean()
    assert got.item() == pytest.approx(want.item(), abs=1e-6)
    assert proxy_matching(t[[0, 2]], v, 0.5, "paper").item() == pytest.approx(
        proxy_matching(t[[0, 2]], v, 0.5, "paper", torch.tensor([0, 1])).item())


# ----------------------------------------------------------------------------- CSA training-step benchmark
# One training step's CSA (forward + backward) at sim-tvr's batch: 128 videos with 5 queries
# each, 30 words, 80 frames (the longest video of a batch), d = 384. Scaled down for CI; the
# full shape with PRVR_CSA_BENCH_FULL=1. Measure with
#     pytest tests/test_ral_objectives.py -k benchmark --benchmark-enable --benchmark-group-by=group
CSA_SHAPE = (640, 128, 30, 80, 384) if os.environ.get("PRVR_CSA_BENCH_FULL") else (160, 32, 30, 80, 384)


def csa_dense_autograd(tokens, token_mask, weights, frames, frame_mask):
    """Eq. 11-12 in one piece, differentiated by autograd: the dense [Q, V, L, T] path the
    sparse backward replaces (benchmark baseline and a second reference)."""
    sims = torch.einsum("qld,vtd->qvlt", F.normalize(tokens, dim=-1), F.normalize(frames, dim=-1))
    best = sims.masked_fill(~frame_mask[None, :, None], float("-inf")).max(-1).values
    return (best.masked_fill(~token_mask[:, None], 0.0) * weights[:, None]).sum(-1)


@pytest.fixture(scope="module")
def csa_step_inputs():
    q, v, length, t, d = CSA_SHAPE
    gen = torch.Generator().manual_seed(0)
    token_mask = torch.arange(length)[None] < torch.randint(8, length + 1, (q, 1), generator=gen)
    frame_mask = torch.arange(t)[None] < torch.randint(30, t + 1, (v, 1), generator=gen)
    weights = word_confidences(torch.randn(q, length, generator=gen), token_mask)
    return (torch.randn(q, length, d, generator=gen), token_mask, weights, torch.randn(v, t, d, generator=gen),
            frame_mask)


def _csa_step(score, tokens, token_mask, weights, frames, frame_mask):
    t, f = tokens.clone().requires_grad_(True), frames.clone().requires_grad_(True)
    score(t, token_mask, weights, f, frame_mask).sum().backward()
    return t.grad, f.grad


@pytest.mark.benchmark(group="csa-training-step")
def test_benchmark_csa_step_sparse_backward(benchmark, csa_step_inputs):
    got = benchmark(_csa_step, csa_scores, *csa_step_inputs)
    want = _csa_step(csa_dense_autograd, *csa_step_inputs)
    assert all(torch.allclose(g, w, atol=1e-5) for g, w in zip(got, want))


@pytest.mark.benchmark(group="csa-training-step")
def test_benchmark_csa_step_dense_autograd(benchmark, csa_step_inputs):
    grads = benchmark(_csa_step, csa_dense_autograd, *csa_step_inputs)
    assert all(g.abs().sum() > 0 for g in grads)
