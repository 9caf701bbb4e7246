"""HLFormer (methods/hlformer.py, methods/backbones/hlformer.py, methods/backbones/hyperbolic.py,
methods/objectives/hlformer.py): the Lorentz-model operations against float64 references written
independently (the Poincare-ball distance, the hyperbolic law of cosines, the hyperboloid
constraint), their gradients where they are clamped, the backbone's shapes, finiteness and
parameter count, the projection of its learned curvature and scales, L_pop, the range checks of
its settings, which methods and detectors it fits (RAL on it trains; ARL's method is refused),
and a short training on sim-tiny.

Device: the CPU, as the whole suite (tests/conftest.py); the one test marked `cuda` compares a
forward and backward pass on the GPU with the CPU's and is skipped without one.
"""

import json
import math

import pytest
import torch

from prvr.harness.base.io import UserError
from prvr.harness.base.registry import BACKBONES, OBJECTIVES
from prvr.harness.cli import main
from prvr.harness.engine.config import resolve
from prvr.methods.backbones import hyperbolic as H
from prvr.methods.backbones.hlformer import ATTENTION_CURVATURE, HLFormer, HLFormerConfig
from prvr.methods.objectives.hlformer import partial_order
from test_backbones import content, query_batch, video_batch

CURVATURES = [0.5, 1.0, 2.0]
F64 = torch.float64


def _points(n: int, d: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=F64) * scale


# ----------------------------------------------------------------------------- float64 references
def _ref_inner(x: torch.Tensor, y: torch.Tensor, c: float) -> torch.Tensor:
    """<x, y>_L of space coordinates, the time coordinates written out."""
    tx, ty = torch.sqrt(1 / c + (x * x).sum(-1)), torch.sqrt(1 / c + (y * y).sum(-1))
    return (x * y).sum(-1) - tx * ty


def _ref_poincare_distance(x: torch.Tensor, y: torch.Tensor, c: float) -> torch.Tensor:
    """Geodesic distance through the Poincare ball: scale onto the unit hyperboloid
    (u = sqrt(c) x), project p = u_space / (1 + u_time), then
    arcosh(1 + 2 |p - q|^2 / ((1 - |p|^2)(1 - |q|^2))) / sqrt(c)."""
    def ball(z):
        u = math.sqrt(c) * z
        return u / (1 + torch.sqrt(1 + (u * u).sum(-1, keepdim=True)))

    p, q = ball(x), ball(y)
    arg = 1 + 2 * ((p - q) ** 2).sum(-1) / ((1 - (p * p).sum(-1)) * (1 - (q * q).sum(-1)))
    return torch.acosh(arg) / math.sqrt(c)


def _ref_exterior_angle(x: torch.Tensor, y: torch.Tensor, c: float) -> torch.Tensor:
    """pi minus the interior angle at x of the triangle (origin, x, y), from its three side
    lengths by the hyperbolic law of cosines at curvature -c."""
    origin = torch.zeros_like(x)
    k = math.sqrt(c)
    a, b, o = (k * _ref_poincare_distance(origin, x, c), k * _ref_poincare_distance(x, y, c),
               k * _ref_poincare_distance(origin, y, c))
    interior = torch.acos((torch.cosh(a) * torch.cosh(b) - torch.cosh(o)) / (torch.sinh(a) * torch.sinh(b)))
    return math.pi - interior


# ----------------------------------------------------------------------------- hyperbolic.py
def test_arcosh_matches_torch_and_stays_finite_at_one():
    x = torch.cat([torch.linspace(1.001, 10.0, 50, dtype=F64), torch.logspace(1, 4, 20, dtype=F64)])
    torch.testing.assert_close(H.arcosh(x), torch.acosh(x), rtol=1e-6, atol=1e-6)
    edge = torch.tensor([0.5, 1.0, 1.0 + 1e-9], requires_grad=True)  # float32: 1 + 1e-9 is 1
    value = H.arcosh(edge)
    value.sum().backward()
    assert torch.isfinite(value).all() and torch.isfinite(edge.grad).all()
    assert value.max().item() < 1e-3  # arcosh(1) = 0 to within sqrt(EPS)


@pytest.mark.parametrize("c", CURVATURES)
def test_expmap0_lands_on_the_hyperboloid_at_the_tangent_length_and_logmap0_inverts_it(c):
    v = _points(16, 5, seed=1)
    x = H.expmap0(v, c)
    full = H.full(x, c)
    torch.testing.assert_close(H.minkowski(full, full), torch.full((16,), -1 / c, dtype=F64))
    torch.testing.assert_close(_ref_poincare_distance(torch.zeros_like(x), x, c), v.norm(dim=-1))
    torch.testing.assert_close(H.logmap0(x, c), v)
    torch.testing.assert_close(H.distance(torch.zeros_like(x), x, c), v.norm(dim=-1))


def test_maps_at_the_origin_are_zero_with_finite_gradients():
    v = torch.zeros(3, 4, requires_grad=True)
    x = H.expmap0(v, 1.0)
    back = H.logmap0(x, 1.0)
    (x.sum() + back.sum()).backward()
    assert torch.equal(x, torch.zeros(3, 4)) and torch.equal(back, torch.zeros(3, 4))
    assert torch.isfinite(v.grad).all()


def test_expmap0_caps_the_distance():
    v = torch.tensor([[100.0, 0.0]])
    assert H.expmap0(v, 1.0, max_distance=10.0)[0, 0].item() == pytest.approx(math.sinh(10.0), rel=1e-5)


@pytest.mark.parametrize("c", CURVATURES)
def test_distance_and_inner_products_match_the_poincare_ball_and_the_definition(c):
    x, y = _points(7, 6, seed=2), _points(7, 6, seed=3, scale=0.5)
    torch.testing.assert_close(H.distance(x, y, c), _ref_poincare_distance(x, y, c))
    torch.testing.assert_close(H.pairwise_inner(x, y, c), _ref_inner(x[:, None], y[None], c))
    fx, fy = H.full(x, c), H.full(y, c)
    diff = fx[:, None] - fy[None]
    torch.testing.assert_close(H.squared_distance(fx, fy, c), H.minkowski(diff, diff))  # |x - y|_L^2 by definition


@pytest.mark.parametrize("c", CURVATURES)
def test_centroid_lies_on_the_hyperboloid_and_halves_the_geodesic_of_two_points(c):
    x, y = _points(5, 4, seed=4), _points(5, 4, seed=5)
    points = torch.stack([H.full(x, c), H.full(y, c)], 1)  # [5, 2, d + 1]
    mid = H.centroid(points, torch.full((5, 1, 2), 0.5, dtype=F64), c)[:, 0]
    torch.testing.assert_close(H.minkowski(mid, mid), torch.full((5,), -1 / c, dtype=F64))
    m = mid[:, 1:]
    torch.testing.assert_close(H.distance(x, m, c), H.distance(m, y, c))
    torch.testing.assert_close(H.distance(x, m, c) + H.distance(m, y, c), H.distance(x, y, c))
    one = H.centroid(points, torch.tensor([1.0, 0.0], dtype=F64).expand(5, 1, 2), c)[:, 0]
    torch.testing.assert_close(one, points[:, 0])


@pytest.mark.parametrize("c", CURVATURES)
def test_exterior_angle_follows_the_law_of_cosines(c):
    x, y = _points(9, 3, seed=6), _points(9, 3, seed=7)
    torch.testing.assert_close(H.exterior_angle(x, y, c), _ref_exterior_angle(x, y, c), rtol=1e-5, atol=1e-5)
    beyond = H.expmap0(3 * H.logmap0(x, c), c)  # on the geodesic from the origin through x, past x
    assert H.exterior_angle(x, beyond, c).max().item() < 1e-3


@pytest.mark.parametrize("c", CURVATURES)
def test_half_aperture_is_merus_and_widest_near_the_origin(c):
    x = _points(6, 3, seed=8) + 1.0
    expected = torch.asin(2 * 0.1 / (math.sqrt(c) * x.norm(dim=-1)))
    torch.testing.assert_close(H.half_aperture(x, c), expected)
    assert H.half_aperture(torch.full((1, 3), 1e-4), c).item() == pytest.approx(math.pi / 2, abs=1e-3)


def test_onto_hyperboloid_puts_a_linear_output_on_the_hyperboloid():
    raw = _points(10, 8, seed=9)
    point = H.onto_hyperboloid(raw, torch.tensor(2.3, dtype=F64), 1.0)
    torch.testing.assert_close(H.minkowski(point, point), torch.full((10,), -1.0, dtype=F64))
    torch.testing.assert_close(point[:, 0], torch.sigmoid(raw[:, 0]) * math.exp(2.3) + 1.1)
    cos = torch.nn.functional.cosine_similarity(point[:, 1:], raw[:, 1:], dim=-1)
    torch.testing.assert_close(cos, torch.ones(10, dtype=F64))  # the space part keeps its direction


def test_concatenated_logmap0_of_one_head_is_the_log_map():
    x = _points(4, 5, seed=10)
    torch.testing.assert_close(H.concatenated_logmap0(H.full(x, 1.0)), H.logmap0(x, 1.0))


# ----------------------------------------------------------------------------- L_pop
def test_partial_order_hand_computed_and_zero_inside_the_cone():
    c = 1.0
    videos = torch.tensor([[2.0, 0.0], [0.0, 1.0]], dtype=F64)
    queries = torch.stack([H.expmap0(2 * H.logmap0(videos[0], c), c), torch.tensor([1.0, 1.0], dtype=F64)])
    positive = torch.tensor([[True, False], [False, True]])
    # query 0 lies on the ray beyond video 0 (angle 0): no loss; query 1 against video 1
    angle = _ref_exterior_angle(videos[1:], queries[1:], c)[0]
    aperture = math.asin(2 * 0.1 / 1.0)
    expected = (0.0 + max(0.0, angle.item() - aperture)) / 2
    assert partial_order(queries, videos, positive, c).item() == pytest.approx(expected, abs=1e-5)
    assert partial_order(queries, videos, torch.zeros_like(positive), c).item() == 0.0
    assert "hlformer-partial-order" in OBJECTIVES


# ----------------------------------------------------------------------------- the backbone
SMALL = {"hidden": 32, "heads": 2, "lorentz_dim": 15, "max_frames": 32, "max_query_len": 16}


def _small(seed: int = 0, **over) -> HLFormer:
    cfg = HLFormerConfig(**{**SMALL, **over})
    torch.manual_seed(seed)
    return HLFormer(cfg, 24, 16)


def test_forward_and_backward_are_finite_with_the_expected_shapes():
    model = _small().train()
    frames, tokens = content()
    q, v = model.encode_queries(query_batch(tokens)), model.encode_videos(video_batch(frames))
    s = model.score(q, v)
    assert s.fused.shape == (4, 3) and set(s.branches) == {"clip", "frame"}
    assert q["lorentz.query"].shape == (4, 32) and v["lorentz.video"].shape == (3, 32)
    assert v["lorentz.curvature"].shape == (3,)
    pop = partial_order(q["lorentz.query"], v["lorentz.video"], torch.eye(4, 3, dtype=torch.bool),
                        v["lorentz.curvature"][0])
    (s.fused.sum() + s.raw["frame"].sum() + pop).backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values()), \
        [n for n, g in grads.items() if g is None or not torch.isfinite(g).all()]
    assert grads["log_curvature"].abs().item() > 0  # the curvature learns through L_pop
    assert grads["frame_block.lorentz.qkv_weight"].abs().sum().item() > 0


def test_parameter_count_at_tvr_dims_is_the_references():
    """lijun2005/ICCV25-HLFormer `HLFormer_Net` at TVR dims (video 3072-d, query 768-d, Configs/tvr.py)
    holds 29,911,483 trainable parameters (built with geoopt stubbed out; geoopt's manifold adds
    its curvature k, a frozen parameter)."""
    with torch.device("meta"):
        model = HLFormer(HLFormerConfig(), 3072, 768)
    assert sum(p.numel() for p in model.parameters()) == 29_911_483
    assert "hlformer" in BACKBONES.names()


def test_curvature_and_scales_are_projected_into_their_ranges_before_use():
    model = _small(curvature=2.0, curvature_range=10.0)
    frames, tokens = content()
    with torch.no_grad():
        model.log_curvature.fill_(5.0)
        model.log_query_scale.fill_(0.7)
        model.frame_block.lorentz.log_scale.fill_(0.3)
    v = model.encode_videos(video_batch(frames))
    model.encode_queries(query_batch(tokens))
    assert model.log_curvature.item() == pytest.approx(math.log(20.0))
    assert v["lorentz.curvature"][0].item() == pytest.approx(20.0, rel=1e-5)
    assert model.log_query_scale.item() == 0.0 and model.frame_block.lorentz.log_scale.max().item() == 0.0
    frozen = _small(learn_curvature=False)
    assert not frozen.log_curvature.requires_grad and ATTENTION_CURVATURE == 1.0


@pytest.mark.cuda
def test_forward_and_backward_on_cuda_match_the_cpu():
    frames, tokens = content()
    grads = []
    for device in ("cpu", "cuda"):
        model = _small(seed=1).to(device).eval()
        q = model.encode_queries(query_batch(tokens).to(torch.device(device)))
        v = model.encode_videos(video_batch(frames).to(torch.device(device)))
        pop = partial_order(q["lorentz.query"], v["lorentz.video"],
                            torch.eye(4, 3, dtype=torch.bool, device=device), v["lorentz.curvature"][0])
        (model.score(q, v).fused.sum() + pop).backward()
        grads.append(model.frame_block.lorentz.qkv_weight.grad.cpu())
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-3, atol=1e-5)


# ----------------------------------------------------------------------------- settings, fit, training
@pytest.mark.parametrize("item, says", [
    ("model.curvature=0", "config key 'model.curvature' must be a finite number > 0, got 0"),
    ("model.curvature=-1", "config key 'model.curvature' must be a finite number > 0, got -1"),
    ("model.curvature_range=0.5", "config key 'model.curvature_range' must be a finite number >= 1, got 0.5"),
    ("model.lorentz_dim=16", "config key 'model.lorentz_dim' (16) + 1 must be a multiple of 'model.heads' (2)"),
    ("model.lorentz_widths=[-1]", "config key 'model.lorentz_widths' must be a list of at least 1 items, each a "
                                  "finite number >= 0"),
    ("loss.pop_weight=-0.1", "config key 'loss.pop_weight' must be a finite number >= 0, got -0.1"),
    ("loss.pop_min_radius=0", "config key 'loss.pop_min_radius' must be a finite number > 0, got 0"),
])
def test_a_setting_out_of_range_is_refused_in_one_line(item, says):
    with pytest.raises(UserError) as e:
        resolve("hlformer", "sim-tiny", 0, [item])
    assert says in str(e.value) and "\n" not in str(e.value)


def test_presets_follow_the_reference_configs():
    tvr, act, cha = (resolve("hlformer", d, 0) for d in ("tvr", "activitynet", "charades"))
    assert (tvr.train.lr, act.train.lr, cha.train.lr) == (3e-4, 2.5e-4, 2e-4)
    assert (tvr.model.temperature, act.model.temperature, cha.model.temperature) == (0.09, 0.6, 0.6)
    assert (tvr.model.dropout, act.model.dropout, cha.model.dropout) == (0.2, 0.31, 0.25)
    assert (tvr.loss.diversity_weight, act.loss.diversity_weight) == (8e-5, 0.003)
    assert tvr.loss.pop_weight == act.loss.pop_weight == cha.loss.pop_weight == 1e-3
    assert tvr.model.clip_weight == cha.model.clip_weight == 0.7
    # frames padded to 128 as every reference config runs them (parity: docs/parity.md)
    assert tvr.model.padded_frames == act.model.padded_frames == cha.model.padded_frames == "zero"
    assert resolve("hlformer", "sim-tvr-v2", 0).model.padded_frames == "zero"


def test_arls_method_is_refused_on_hlformer_and_the_hlformer_loss_off_it():
    with pytest.raises(UserError, match=r"^method 'arl' cannot train backbone 'hlformer': its objective needs "
                                        r"frame_items .* and theta_phi"):
        resolve("arl", "sim-tiny", 0, ["backbone=hlformer"])
    with pytest.raises(UserError, match=r"^method 'hlformer' cannot train backbone 'gmmformer2': its objective "
                                        r"needs lorentz .*; use --backbone hlformer"):
        resolve("hlformer", "sim-tiny", 0, ["backbone=gmmformer2"])


def test_arls_detector_and_the_ms_sl_family_losses_fit_hlformer():
    assert resolve("hlformer", "sim-tiny", 0, ["relations=arl"]).relations.name == "arl"  # it reads frame_views
    assert resolve("gmmformer2", "sim-tiny", 0, ["backbone=hlformer"]).backbone == "hlformer"


@pytest.mark.parametrize("method, run, parts", [
    ("hlformer", "hlformer", {"clip_nce", "frame_triplet", "diversity", "pop"}),
    ("ral@hlformer", "ral@hlformer", {"pop", "ral_da", "ral_pm"}),  # RAL extends HLFormer's loss, L_pop kept
])
def test_one_epoch_on_sim_tiny(tmp_path, method, run, parts):
    name, _, backbone = method.partition("@")
    argv = ["run", "--method", name, "--dataset", "sim-tiny", "--set", "train.epochs=1", "--out", str(tmp_path),
            "--quiet", *(["--backbone", backbone] if backbone else [])]
    assert main(argv) == 0
    record = json.loads((tmp_path / "runs" / "sim-tiny" / run / "seed0.json").read_text())
    epoch = record["history"][0]
    assert parts <= set(epoch) and all(math.isfinite(epoch[p]) for p in parts)
    assert 0.1 <= epoch["curvature"] <= 10.0
    assert math.isfinite(record["metrics"]["test"]["SumR"])
