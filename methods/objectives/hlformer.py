"""HLFormer's partial-order preservation loss (L_pop), a pure function of Lorentz embeddings.

"text < video": a query is entailed by each of its positive videos when, on the hyperboloid,
it lies inside the video's entailment cone (MERU's cones, Desai et al., 2023, which the
reference's hyperbolic code comes from): the exterior angle at the video of the triangle
(origin, video, query) is at most the cone's half-aperture. L_pop penalises the excess.
"""

from __future__ import annotations

import torch

from prvr.harness.base import masks
from prvr.harness.base.registry import OBJECTIVES
from prvr.methods.backbones import hyperbolic as H


@OBJECTIVES.register("hlformer-partial-order", "HLFormer's L_pop: each query inside the entailment cone of its "
                                               "positive videos on a hyperboloid")
def partial_order(queries: torch.Tensor, videos: torch.Tensor, positive: torch.Tensor,
                  curvature: torch.Tensor | float, min_radius: float = 0.1) -> torch.Tensor:
    """Mean over positive pairs (q, v) of [angle_v(q) - aperture(v)]_+: queries [Q, d] and
    videos [V, d] by their space coordinates on the hyperboloid of curvature -c, positive
    [Q, V]; angle_v(q) the exterior angle at v of (origin, v, q) (`hyperbolic.exterior_angle`),
    aperture(v) = asin(2 min_radius / (sqrt(c) |v|)) (`hyperbolic.half_aperture`). With
    one-to-one labels: the reference's mean over the batch's queries of their labelled video."""
    q, v = masks.true_pairs(positive)
    if len(q) == 0:
        return queries.sum() * 0
    parent = videos[v]
    excess = H.exterior_angle(parent, queries[q], curvature) - H.half_aperture(parent, curvature, min_radius)
    return excess.clamp(min=0).mean()
