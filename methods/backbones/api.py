"""The backbone seam: what every backbone provides (`Backbone`, `Scores`: harness/base/contract.py).

A backbone is an `nn.Module` registered in `BACKBONES` with a `config_cls` (its `model`
config section) and four methods:

    encode_queries(QueryBatch) -> Encoded (named tensors of the query side; backbone-specific keys)
    encode_videos(VideoBatch)  -> Encoded (named tensors of the video side; backbone-specific keys)
    index_videos(videos)       -> videos (query-independent work done once per collection)
    score(queries, videos)     -> Scores (the same fields in training and in evaluation)

and declares `provides`: the named outputs (see `OUTPUTS`) that objectives and detectors
may ask for. A method's objective and a detector declare `needs`; a combination whose needs
the backbone does not provide is refused when the config resolves (`missing_outputs`,
`prvr.methods.fit.check_fit`). A backbone that provides `frame_views` also has

    frame_views()              -> [(branch, query key, frames key)] (ARL's detector encodes these)

and one that provides `span_logits` (a backbone that localizes moments, e.g. XML) has

    span_logits(queries, videos, pairs [Q, K]) -> start, end logits [Q, K, T] (the VCMR evaluator)
    span_logits_batch(queries, videos)         -> start, end logits [Q, B, T] (training losses)

Any backbone may also have (`StepExtras`, harness/base/contract.py)

    step_extras(queries, videos, video_of_query) -> {name: value} (what its objective alone reads)

which the trainer calls after `score` in each training step and hands on as the step outputs'
`extras`, so that an objective reads what the model computed for it (RAL's `Gaussians`) instead
of calling back into the model.
"""

from __future__ import annotations

# The types of the seam live in the contract (harness/base/contract.py); importable from here too.
from prvr.harness.base.contract import Backbone, OnDemand, Scores  # noqa: F401

# The outputs a backbone may provide, each with what it is (used in refusals and in docs).
OUTPUTS: dict[str, str] = {
    "clip_frame": "[queries, videos] scores of a clip branch and a frame branch (Scores.branches 'clip', 'frame')",
    "theta_phi": "[queries, videos] scores of ARL's two models (Scores.branches 'theta', 'phi'; "
                 "phi absent with model.branches=1)",
    "raw": "[queries, videos] unnormalised clip and frame scores, e.g. raw dot products for NCE "
           "(Scores.raw 'clip', 'frame')",
    "frame_items": "[queries, videos, frames] per-frame cosines of each branch (Scores.items)",
    "frame_views": "per-branch query vectors and [videos, frames, d] frame embeddings whose best cosine is the "
                   "branch score (frame_views())",
    "query_vector": "one vector per query (encode_queries()['query'])",
    "lorentz": "queries and videos on a hyperboloid of learned curvature for a partial-order loss "
               "(encode_queries()['lorentz.query'], encode_videos()['lorentz.video'], ['lorentz.curvature'])",
    "diffusion": "DreamPRVR's register diffusion: each video's condition, latent mean and log variance "
                 "(encode_videos()['dream.condition'], ['dream.mu'], ['dream.logvar']) and a training step's "
                 "text-supervised noise predictions (step_extras()['dream.denoising'])",
    "clip_vectors": "per-video clip embeddings (encode_videos()['clips'])",
    "frame_mask": "the frame padding mask on the video side (encode_videos()['frame_mask'])",
    "frame_tokens": "[videos, frames, d] encoded frames of the frame branch and their mask "
                    "(encode_videos()['frames'], ['frame_mask']; a backbone with `keep_frames` gives them once "
                    "that is set), e.g. for RAL's word-frame scores",
    "span_logits": "start / end logits over the frame rows of a video for a query, for moment localization: "
                   "span_logits(queries, videos, pairs [Q, K]) -> ([Q, K, T], [Q, K, T]) for the video pairs[q, k] "
                   "of each query, span_logits_batch(queries, videos) -> ([Q, B, T], [Q, B, T]) for every pair; "
                   "padding rows -inf",
}


def missing_outputs(needs: frozenset[str] | set[str], backbone_cls: type) -> list[str]:
    """The needed outputs that a backbone class does not provide, sorted."""
    return sorted(set(needs) - set(getattr(backbone_cls, "provides", frozenset())))
