"""The Lorentz (hyperboloid) model of hyperbolic space in plain torch, for HLFormer
(methods/backbones/hlformer.py) and its partial-order loss (methods/objectives/hlformer.py).

Convention (MERU's, which HLFormer's loss code follows): a curvature c > 0 names the
hyperboloid {x in R^(d+1): <x, x>_L = -1/c, x_0 > 0} of sectional curvature -c, with the
Minkowski product <x, y>_L = -x_0 y_0 + sum_i x_i y_i. A point is held either whole, time
coordinate first ([..., d+1], `full`), or by its space coordinates alone ([..., d]), its time
coordinate then being sqrt(1/c + |x|^2) (`time`). Tangent vectors at the origin
(sqrt(1/c), 0, ..., 0) have time coordinate 0 and are held by their space coordinates.

Every function is differentiable and finite everywhere: arcosh's argument is clamped at 1 with
the square root taken of a clamped x^2 - 1 (so its gradient at 1 is finite, where torch.acosh's
is infinite and a clamp in front of it turns that into 0 * inf = NaN), divisions by norms are
clamped, and sinh's argument is capped (`EXP_MAX`). tests/test_hlformer.py checks each against a
float64 reference written independently (the Poincare-ball distance, the hyperbolic law of
cosines, the hyperboloid constraint).
"""

from __future__ import annotations

import math

import torch

EPS = 1e-7  # the floor of a clamped norm or of x^2 - 1 under arcosh's square root
EXP_MAX = math.asinh(2.0**15)  # MERU's cap on sqrt(c) |v| in exp_0 (sinh stays below 2^15)
ATTENTION_EXP_MAX = 10.0  # the cap of geoopt-style exp_0 in HLFormer's Lorentz attention (EXP_MAX_NORM)


def arcosh(x: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """arcosh(x) = log(x + sqrt(x^2 - 1)) for x >= 1; x below 1 reads as 1 (to within sqrt(eps)).
    The gradient is finite everywhere (1 / (x + sqrt(eps)) at x = 1)."""
    x = x.clamp(min=1.0)
    return torch.log(x + torch.sqrt((x * x - 1).clamp(min=eps)))


def minkowski(x: torch.Tensor, y: torch.Tensor, keepdim: bool = False) -> torch.Tensor:
    """<x, y>_L of full points (time first), elementwise over the leading dims."""
    xy = x * y
    out = xy[..., 1:].sum(-1) - xy[..., 0]
    return out[..., None] if keepdim else out


def time(x: torch.Tensor, curvature: torch.Tensor | float) -> torch.Tensor:
    """The time coordinate [...] of points given by their space coordinates [..., d]."""
    return torch.sqrt(1 / curvature + (x * x).sum(-1))


def full(x: torch.Tensor, curvature: torch.Tensor | float) -> torch.Tensor:
    """Space coordinates [..., d] -> the whole point [..., d + 1], time first."""
    return torch.cat([time(x, curvature)[..., None], x], -1)


def expmap0(v: torch.Tensor, curvature: torch.Tensor | float, max_distance: float = EXP_MAX,
            eps: float = EPS) -> torch.Tensor:
    """exp_0: a tangent vector v [..., d] at the origin -> the space coordinates of its point,
    sinh(sqrt(c) |v|) v / (sqrt(c) |v|). The point lies at geodesic distance |v| from the origin
    (up to the cap max_distance / sqrt(c)); v = 0 maps to the origin."""
    r = (curvature**0.5) * v.norm(dim=-1, keepdim=True)
    return torch.sinh(r.clamp(max=max_distance)) * v / r.clamp(min=eps)


def logmap0(x: torch.Tensor, curvature: torch.Tensor | float, eps: float = EPS) -> torch.Tensor:
    """log_0, the inverse of `expmap0`: space coordinates [..., d] -> the tangent vector at the
    origin, arcosh(sqrt(c) x_0) x / (sqrt(c) |x|)."""
    root = curvature**0.5
    distance = arcosh(root * time(x, curvature), eps)[..., None]
    return distance * x / (root * x.norm(dim=-1, keepdim=True)).clamp(min=eps)


def pairwise_inner(x: torch.Tensor, y: torch.Tensor, curvature: torch.Tensor | float) -> torch.Tensor:
    """<x_i, y_j>_L [N, M] of points given by their space coordinates x [N, d], y [M, d]."""
    return x @ y.t() - time(x, curvature)[:, None] * time(y, curvature)[None, :]


def distance(x: torch.Tensor, y: torch.Tensor, curvature: torch.Tensor | float, eps: float = EPS) -> torch.Tensor:
    """Geodesic distance arcosh(-c <x, y>_L) / sqrt(c) of points by their space coordinates,
    elementwise over the leading dims."""
    inner = (x * y).sum(-1) - time(x, curvature) * time(y, curvature)
    return arcosh(-curvature * inner, eps) / curvature**0.5


def squared_distance(q: torch.Tensor, k: torch.Tensor, curvature: torch.Tensor | float) -> torch.Tensor:
    """The squared Lorentzian distance |q - k|_L^2 = -2/c - 2 <q, k>_L of full points,
    q [..., Lq, d+1] x k [..., Lk, d+1] -> [..., Lq, Lk] (HLFormer's attention logits are its
    negative over a learned scale)."""
    k_flipped = torch.cat([-k[..., :1], k[..., 1:]], -1)
    return -2 / curvature - 2 * (q @ k_flipped.transpose(-1, -2))


def centroid(points: torch.Tensor, weights: torch.Tensor, curvature: torch.Tensor | float,
             eps: float = EPS) -> torch.Tensor:
    """The Lorentzian centroid (Law et al., 2019) of full points [..., L, d+1] under weights
    [..., M, L] (rows of non-negative weights, e.g. attention) -> [..., M, d+1]: the weighted
    sum, rescaled back onto the hyperboloid (sum w x) / (sqrt(c) |<sum w x, sum w x>_L|^(1/2))."""
    mean = weights @ points
    norm = minkowski(mean, mean, keepdim=True).abs().clamp(min=eps).sqrt()
    return mean / (curvature**0.5 * norm)


def half_aperture(x: torch.Tensor, curvature: torch.Tensor | float, min_radius: float = 0.1,
                  eps: float = EPS) -> torch.Tensor:
    """Half-aperture [...] of the entailment cone at points x [..., d] (space coordinates;
    MERU Eq. 5): asin(2 K / (sqrt(c) |x|)), K = min_radius, in (0, pi/2); points within the
    neighbourhood of the origin where the cone is undefined get the widest aperture."""
    ratio = 2 * min_radius / (x.norm(dim=-1) * curvature**0.5 + eps)
    return torch.asin(ratio.clamp(min=-1 + eps, max=1 - eps))


def exterior_angle(x: torch.Tensor, y: torch.Tensor, curvature: torch.Tensor | float,
                   eps: float = EPS) -> torch.Tensor:
    """The exterior angle at x [...] of the hyperbolic triangle (origin, x, y), x and y [..., d]
    by their space coordinates (MERU Eq. 6, from the hyperbolic law of cosines), in (0, pi):
    0 when y lies straight on beyond x from the origin."""
    x_time, y_time = time(x, curvature), time(y, curvature)
    c_inner = curvature * ((x * y).sum(-1) - x_time * y_time)
    numerator = y_time + c_inner * x_time
    denominator = x.norm(dim=-1) * torch.sqrt((c_inner * c_inner - 1).clamp(min=eps))
    return torch.acos((numerator / (denominator + eps)).clamp(min=-1 + eps, max=1 - eps))


def onto_hyperboloid(raw: torch.Tensor, log_time_scale: torch.Tensor, curvature: torch.Tensor | float,
                     min_time: float = 1.1, eps: float = EPS) -> torch.Tensor:
    """A linear map's output [..., d+1] as a full point (HLFormer's Lorentz linear layer, from
    Chen et al.'s fully hyperbolic networks): time = sigmoid(raw_0) exp(s) + min_time, and the
    space part raw_1: rescaled to the norm sqrt(time^2 - 1/c) that puts it on the hyperboloid."""
    t = torch.sigmoid(raw[..., :1]) * log_time_scale.exp() + min_time
    space = raw[..., 1:]
    scale = (t * t - 1 / curvature) / (space * space).sum(-1, keepdim=True).clamp(min=eps)
    return torch.cat([t, space * scale.sqrt()], -1)


def concatenated_logmap0(y: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """HLFormer's way back from its multi-head Lorentz attention (curvature 1): the heads'
    points, concatenated [..., h (d_h + 1)], are read as one vector whose first entry (the first
    head's time) is its time: arcosh(y_0) / sqrt(y_0^2 - 1) * y_1: ([..., h (d_h + 1) - 1]). Where
    each head is a point of its own this is no logarithmic map of theirs (the other heads' time
    coordinates pass through as space coordinates); it is the reference's (docs/methods/hlformer.md)."""
    y0 = y[..., :1].clamp(min=1.0)
    root = torch.sqrt((y0 * y0 - 1).clamp(min=eps))
    return torch.log(y0 + root) / root * y[..., 1:]
