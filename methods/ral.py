"""RAL: robust alignment learning (Zhang et al.; docs/references.md) on MS-SL, GMMFormer and
GMMFormer v2: `--method ral --backbone msl|gmmformer|gmmformer2` (default gmmformer2, the one
the public code covers).

RAL extends the method whose own backbone it runs on (its home method: msl, gmmformer,
gmmformer2): that method's preset and loss apply, and RAL adds to them

    model: RalModel (methods/backbones/ral.py): CSA in the frame branch (Eq. 11-12), MSRA's
           Gaussian heads (Eq. 3-7); section `ral`;
    loss:  L = L_base (the home method's objective, on RAL's scores and the detector's
           relations) + lambda_da L_DA (Eq. 8) + lambda_pm L_PM (Eq. 10, Eq. 13);
           RAL's knobs join the home method's `loss` section.

The text distributions come from the query support sets (Eq. 5: all labelled queries of a
video in the batch, from the labels, never from a detector's relations) or, with
`loss.text_source=query`, from each query alone (Table 4). The model computes them
(`RalModel.gaussians`, given the `loss` settings when it is built) and hands them to the
objective as a step output (`Gaussians`, the step's extras); the objective never calls into the
model. Paper and code disagree on several values: each is a field below with both values named.
"""

from __future__ import annotations

from dataclasses import dataclass

from prvr.harness.base.checks import FLAG, NON_NEGATIVE, POSITIVE, Range, at_least, one_of, param
from prvr.harness.base.contract import LossOutput, Objective, Relations, Scores, StepContext
from prvr.harness.base.registry import METHODS
from prvr.methods.backbones.blocks import PaddedFrames
from prvr.methods.backbones.ral import (GAUSSIANS, Aggregation, Gaussians, Heads, MsraGrad, PoolPadding, RalModel,
                                        TextSource)
from prvr.methods.objectives.ral import KlReading, PmReading, distribution_alignment, proxy_matching, sample_proxies
from prvr.methods.recipes import PRESETS, AblationRow, AblationTable, MethodSpec, register_table


@dataclass
class RalConfig:
    """Section `ral`: RAL's modules (Table 2 switches) and its score fusion."""

    msra: bool = param(True, FLAG)  # Gaussian heads + L_DA + L_PM (Table 2)
    csa: bool = param(True, FLAG)  # confidence-gated word-frame score in the frame branch (Table 2)
    aggregation: Aggregation = param("both", one_of(Aggregation))  # Eq. 6-7; Table 4: local or global only
    # RAL's token encoder uses the base query encoder's learned positions and their LayerNorm
    # (the reference shares query_pos_embed between its two query encoders; the paper is silent);
    # false: its own, so that nothing of RAL's frame branch reaches the clip branch's queries
    share_positions: bool = param(True, FLAG)
    # ranked score = w clip + (1 - w) frame; -1 = the backbone's own model.clip_weight. The code
    # fuses 0.5 / 0.5 on TVR and 0.6 / 0.4 on ActivityNet (the preset's values); the paper says
    # "summed" (appendix A)
    clip_weight: float = param(-1.0, Range(-1, 1, note="-1 = the backbone's own"))
    # padded frames in CSA's max over frames: exclude (Eq. 11, the max over a video's real frames)
    # or zero (the reference's: each video's encoded frames are padded to 128 with zero vectors
    # that take part in the max, so in a video shorter than the backbone's model.max_frames every
    # word scores at least 0, in the cosine score and in the raw one)
    padded_frames: PaddedFrames = param("exclude", one_of(PaddedFrames))
    # parity switches (docs/parity.md), each the reference's form of an MSRA part:
    # the Gaussian heads: paper (Eq. 3-7: mu and log sigma linear heads on LN(FC(mean) + local))
    # or code (its PIENet / uncertainty-module pair: mu = LN(pooled + sigmoid(FC(attention))),
    # the video's pooled vector the normalised mean of normalised frames; backbones.ral.CodeGaussianHead)
    heads: Heads = param("paper", one_of(Heads))
    # the heads' attention poolings: masked (over real rows) or code (the reference's unmasked
    # poolings over its padded tensors: a video's frames padded with zeros to model.max_frames,
    # a support set made of each query's whole padded token matrix, zero-padded to
    # support_capacity queries)
    pool_padding: PoolPadding = param("masked", one_of(PoolPadding))
    support_capacity: int = param(26, at_least(1))  # the reference's hard-coded 26 (pool_padding=code only)
    # [queries, videos, words, frames] elements scored at once in evaluation (memory only)
    eval_budget: int = param(1 << 24, at_least(1))


@dataclass
class RalLossConfig:
    """RAL's knobs in the `loss` section (next to the home method's own)."""

    # lambda_3 of Eq. 13: 0.001 in the paper (section 4.1), 2.5e-4 hard-coded in the code (Losses/loss.py)
    lambda_da: float = param(0.001, NON_NEGATIVE)
    lambda_pm: float = param(0.004, NON_NEGATIVE)  # lambda_4: 0.004 in the paper and the code
    proxies: int = param(6, at_least(0, "0 = the mean only"))  # K: 6 (paper, code); 0 = Table 3 "w/o sampling"
    # Eq. 10 as printed (cosine / temperature, text to video) or the code's (raw dot products,
    # mean -log_softmax over the K x K same-video pairs, both directions); default: the code's,
    # the only fully specified one (the paper gives no temperature)
    pm_reading: PmReading = param("code", one_of(PmReading))
    pm_temperature: float = param(0.05, POSITIVE)  # paper reading only; open (the paper names none)
    use_da: bool = param(True, FLAG)  # Table 3 "w/o L_DA"
    use_pm: bool = param(True, FLAG)  # Table 3 "w/o L_PM"
    text_source: TextSource = param("support", one_of(TextSource))  # Table 4 "X^q = Q"
    # the code L2-normalises the means before sampling and in the KLs; the paper says nothing
    normalize_mean: bool = param(True, FLAG)
    # L_DA's reading of sigma: std (exp(log sigma) a standard deviation in both KLs, the KLs at
    # mu; Eq. 9 fixes it) or code (the reference's, for parity runs: a variance in the prior KL,
    # a standard deviation in the cross-modal one, both at the mean of the K sampled proxies)
    kl_reading: KlReading = param("std", one_of(KlReading))
    # the encoders L_DA and L_PM reach (MsraGrad, methods/backbones/ral.py); both: the paper's and the code's
    msra_grad: MsraGrad = param("both", one_of(MsraGrad))


def wrap(base, cfg, video_dim: int, query_dim: int) -> RalModel:
    """The run's model: the backbone with RAL in its frame branch (section `ral`); its Gaussians
    follow the run's `loss` settings (text_source, msra_grad, normalize_mean)."""
    return RalModel(base, cfg.extra["ral"], query_dim, cfg.loss)


def ral_objective(cfg: RalLossConfig, scores: Scores, relations: Relations, context: StepContext,
                  base: Objective) -> LossOutput:
    """Eq. 13: the home method's loss on RAL's scores + lambda_da L_DA + lambda_pm L_PM, from the
    step's Gaussians (`Gaussians`, a step output of the model: none without MSRA)."""
    out = base(cfg, scores, relations, context)
    if not (cfg.use_da or cfg.use_pm):
        return out
    g = context.outputs["extras"].get(GAUSSIANS)  # computed here, on first reading
    if not isinstance(g, Gaussians):  # ral.msra=false: the model gives none
        return out
    mu_t, ls_t, mu_v, ls_v, video_of_text = g.mu_text, g.log_sigma_text, g.mu_video, g.log_sigma_video, g.video_of_text
    # the proxies (Eq. 9), text then video from the step's generator: L_PM's, and under the
    # code's KL reading also L_DA's means
    sample_means = cfg.kl_reading == "code" and cfg.proxies > 0
    if cfg.use_pm or (cfg.use_da and sample_means):
        z_t = sample_proxies(mu_t, ls_t, cfg.proxies, context.generator)
        z_v = sample_proxies(mu_v, ls_v, cfg.proxies, context.generator)
    # the geometric mean of sigma over the batch, text and video: the epoch's uncertainty in the
    # run's history (appendix B.1, Fig. 10: it falls as training goes on); not part of the loss
    out.diagnostics["ral_sigma_text"] = ls_t.detach().mean().exp()
    out.diagnostics["ral_sigma_video"] = ls_v.detach().mean().exp()
    if cfg.use_da:
        m_t, m_v = (z_t.mean(1), z_v.mean(1)) if sample_means else (mu_t, mu_v)
        out.parts["ral_da"] = distribution_alignment(m_t, ls_t, m_v[video_of_text], ls_v[video_of_text],
                                                     cfg.kl_reading)
        out.loss = out.loss + cfg.lambda_da * out.parts["ral_da"]
    if cfg.use_pm:
        out.parts["ral_pm"] = proxy_matching(z_t, z_v, cfg.pm_temperature, cfg.pm_reading, video_of_text)
        out.loss = out.loss + cfg.lambda_pm * out.parts["ral_pm"]
    return out


METHODS.add(
    "ral",
    MethodSpec("ral", backbone="gmmformer2", relations="none", loss_cls=RalLossConfig, objective=ral_objective,
               preset=PRESETS / "ral.yaml", sections={"ral": RalConfig}, needs=frozenset({"frame_tokens"}),
               objectives=("ral-distribution-alignment", "ral-proxy-matching"), extends_backbone=True, wrap=wrap),
    "RAL: Gaussian proxies (MSRA) and confidence-gated word-frame scores (CSA) in the frame branch of "
    "MS-SL / GMMFormer / GMMFormer v2",
)

# Paper Tables 2-4 as one command each: `prvr-bench ablate --method ral --table 2`.
register_table(AblationTable("ral", "2", "RAL Table 2: model structure", ("MSRA", "CSA"), (
    # the backbone alone: no RAL module and its own score fusion, which trains exactly as the
    # backbone's own method (tests/test_ral.py), so the row is that method's plain run
    AblationRow("base", "", ("ral.msra=false", "ral.csa=false", "ral.clip_weight=-1"), ("", ""), home=True),
    AblationRow("msra", "msra", ("ral.csa=false",), ("✓", "")),
    AblationRow("csa", "csa", ("ral.msra=false",), ("", "✓")),
    AblationRow("full", "", (), ("✓", "✓")),
), reported={"base": (16.2, 37.6, 48.8, 86.4, 189.1), "msra": (17.5, 39.2, 50.7, 87.4, 194.8),
             "csa": (17.0, 38.5, 51.0, 88.1, 194.5), "full": (18.2, 40.4, 52.1, 88.0, 198.8)},
    reported_source="RAL paper Table 2, GMMFormer v2 on TVR, ResNet+I3D+RoBERTa"))
register_table(AblationTable("ral", "3", "RAL Table 3: distribution optimisation and proxies", ("variant",), (
    AblationRow("w/o L_DA", "no_da", ("loss.use_da=false",), ("w/o L_DA",)),
    AblationRow("w/o L_PM", "no_pm", ("loss.use_pm=false",), ("w/o L_PM",)),
    AblationRow("w/o sampling", "k0", ("loss.proxies=0",), ("mean only",)),
    AblationRow("K=2", "k2", ("loss.proxies=2",), ("K = 2",)),
    AblationRow("K=4", "k4", ("loss.proxies=4",), ("K = 4",)),
    AblationRow("K=6", "", (), ("K = 6",)),
), reference="K=6", reported={
    "w/o L_DA": (17.7, 39.9, 51.8, 88.0, 197.4), "w/o L_PM": (17.4, 39.7, 51.6, 87.8, 196.5),
    "w/o sampling": (17.6, 39.8, 51.7, 87.6, 196.7), "K=2": (17.9, 40.1, 51.8, 87.7, 197.5),
    "K=4": (18.0, 40.3, 51.8, 87.9, 198.0), "K=6": (18.2, 40.4, 52.1, 88.0, 198.8)},
    reported_source="RAL paper Table 3, GMMFormer v2 on TVR, ResNet+I3D+RoBERTa"))
register_table(AblationTable("ral", "4", "RAL Table 4: uncertainty modelling", ("method",), (
    AblationRow("X^q = Q", "query_text", ("loss.text_source=query",), ("X^q = Q",)),
    AblationRow("local only", "local", ("ral.aggregation=local",), ("g = x^l",)),
    AblationRow("global only", "global", ("ral.aggregation=global",), ("g = x^g",)),
    AblationRow("ours", "", (), ("Ours",)),
), reference="ours", reported={
    "X^q = Q": (17.6, 39.8, 51.5, 87.9, 196.9), "local only": (17.9, 40.2, 51.2, 87.4, 196.7),
    "global only": (18.0, 40.1, 51.6, 88.2, 197.9), "ours": (18.2, 40.4, 52.1, 88.0, 198.8)},
    reported_source="RAL paper Table 4, GMMFormer v2 on TVR, ResNet+I3D+RoBERTa"))

# RAL's command: `prvr-bench uncertainty` (R@1 of query groups by its query uncertainty, RAL Fig. 3)
