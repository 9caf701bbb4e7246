"""`model.padded_frames=zero` (methods/backbones/blocks.py `encode_frames`, `frame_scores`,
`DynamicGMMBlock.forward_padded`): the GMMFormer v2 family's frame encoder and frame max as the
reference code runs them, on frames padded to max_ctx_l with zero features. The padding rows must
leave the real rows' branch outputs as they were (each row attends to the real rows only), enter
the mean fusion token (Holmes, HLFormer), and score 0 in the frame max. Against plain
computations: the block on the real rows alone, the mean over every row written out, the floor
hand-computed.

Device: the CPU, as the whole suite (tests/conftest.py).
"""

import json
import math

import pytest
import torch

from prvr.harness.base import masks
from prvr.harness.base.io import UserError
from prvr.harness.cli import main
from prvr.harness.engine.config import resolve
from prvr.methods.backbones.blocks import GaussianBranches, floor_padded, full_mask, init_weights, pack, pad_rows
from prvr.methods.backbones.gmmformer2 import GMMFormer2, GMMFormer2Config
from prvr.methods.backbones.hlformer import HLFormer, HLFormerConfig, LorentzBranches
from prvr.methods.backbones.holmes import Holmes, HolmesBackboneConfig
from test_backbones import QUERY_DIM, VIDEO_DIM, content, query_batch, video_batch

TOTAL = 16  # max_frames of the small models: the reference's 128, scaled down
SMALL = {"hidden": 32, "heads": 2, "max_frames": TOTAL, "max_query_len": 16}


def _padded(x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x padded to TOTAL rows with noise (what a padding row holds must not matter to a real row)."""
    rows, keys = pad_rows(x, mask, TOTAL)
    noise = torch.randn(rows.shape, generator=torch.Generator().manual_seed(7))
    return torch.where(keys[..., None], rows, noise), keys


def _real_batch(lengths=(5, 9, 16)) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    length = max(lengths)
    mask = torch.arange(length)[None, :] < torch.tensor(lengths)[:, None]
    return torch.randn(len(lengths), length, 32, generator=g) * mask[..., None], mask


@pytest.mark.parametrize("make", [
    lambda: GaussianBranches(32, 2, [0.0, 2.0, 8.0], 0.1, 4, window_len=TOTAL),
    lambda: LorentzBranches(32, 2, [0.0, 4.0], 15, 0.1, 4, TOTAL, 0.2),
], ids=["euclidean", "lorentz"])
def test_padding_rows_that_attend_leave_the_real_rows_as_they_were(make):
    """Every row of the padded sequence attends to the real rows (`keys`): the real rows' outputs are those
    of the block run on the real rows alone, whatever the padding rows hold."""
    torch.manual_seed(0)
    branches = make().eval()
    init_weights(branches, 0.2)
    x, mask = _real_batch()
    full, keys = _padded(x, mask)
    alone = branches(x, mask)  # [branches, N, D]
    everywhere = branches(full, full_mask(full), keys).unflatten(1, keys.shape)  # [branches, B, TOTAL, D]
    torch.testing.assert_close(pack(everywhere, keys, dim=1), alone, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(everywhere[:, 0, 5:], torch.zeros(()))  # the padding rows are encoded too


def test_the_floor_hand_computed():
    score = torch.tensor([[-0.2, 0.3, -0.4], [0.1, -0.5, 0.6]])
    mask = torch.tensor([[True, True, False, False], [True] * 4, [True, False, False, False]])
    want = torch.tensor([[0.0, 0.3, 0.0], [0.1, -0.5, 0.6]])  # the full-length video keeps its -0.5
    assert torch.equal(floor_padded(score, mask, 4), want)
    with pytest.raises(ValueError, match="cannot be padded to 4"):
        pad_rows(torch.zeros(1, 5, 2), torch.ones(1, 5, dtype=torch.bool), 4)


def _model(cls, cfg_cls, padded: str, **over):
    torch.manual_seed(0)
    return cls(cfg_cls(**{**SMALL, "padded_frames": padded, **over}), VIDEO_DIM, QUERY_DIM).eval()


def _encode(model, frames):
    with torch.no_grad():
        return model.encode_videos(video_batch(frames))


def test_with_v2s_learned_token_only_the_frame_max_changes():
    """GMMFormer v2 reads its branch weights with a learned token: padding the frames leaves every
    encoded frame as it was, and the frame branch becomes the floored max (the test score with it)."""
    frames, tokens = content()
    ours, reference = _model(GMMFormer2, GMMFormer2Config, "exclude"), _model(GMMFormer2, GMMFormer2Config, "zero")
    v_ours, v_ref = _encode(ours, frames), _encode(reference, frames)
    torch.testing.assert_close(v_ref["frames"], v_ours["frames"], rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        q = ours.encode_queries(query_batch(tokens))
        against = -v_ours["frames"][:, :5].sum(1)  # away from each video's first frames: maxima below 0 to floor
        q = {"query": torch.cat([q["query"], against])}
        s_ours, s_ref = ours.score(q, v_ours), reference.score(q, v_ref)
    short = v_ours["frame_mask"].sum(1) < TOTAL
    assert short.all()  # every test video is shorter than TOTAL
    torch.testing.assert_close(s_ref.branches["frame"], s_ours.branches["frame"].clamp(min=0))
    torch.testing.assert_close(s_ref.raw["frame"], s_ours.raw["frame"].clamp(min=0))
    assert (s_ours.branches["frame"] < 0).any() and (s_ours.raw["frame"] < 0).any()  # the floor was met


@pytest.mark.parametrize("cls, cfg_cls, over", [
    (Holmes, HolmesBackboneConfig, {}),
    (HLFormer, HLFormerConfig, {"lorentz_dim": 15}),
], ids=["holmes", "hlformer"])
def test_the_mean_token_counts_the_padding_rows(cls, cfg_cls, over, monkeypatch):
    """Holmes and HLFormer read the branch weights with each sequence's mean branch output: with zero
    padding it is the mean over all max_frames rows, the padding rows encoded from zero features at their
    positions, as the reference's `torch.mean(oo, dim=1)`; a video of max_frames real frames has no
    padding and is encoded alike either way."""
    frames, _ = content()
    frames = [*frames, torch.nn.functional.normalize(torch.randn(TOTAL, VIDEO_DIM), dim=-1)]  # one full-length
    ours, reference = _model(cls, cfg_cls, "exclude", **over), _model(cls, cfg_cls, "zero", **over)
    tokens = []
    block = reference.frame_block
    original = type(block).branch_weights
    monkeypatch.setattr(type(block), "branch_weights",
                        lambda self, out, mask, token: tokens.append(token) or original(self, out, mask, token))
    v_ref = _encode(reference, frames)
    frame_token = tokens[-1]  # the clip block reads its weights first
    # the naive token: embed the zero-padded frames, run every branch on all TOTAL rows, average them all
    vb = video_batch(frames, pad_to=TOTAL)
    with torch.no_grad():
        embedded = reference.frame_embed(vb.frames, full_mask(vb.frames))
        outputs = block.outputs(embedded, full_mask(embedded), vb.frame_mask).unflatten(1, vb.frame_mask.shape)
    want = torch.stack([outputs[:, b].mean(0).mean(0) for b in range(len(frames))])
    torch.testing.assert_close(frame_token, want, rtol=1e-5, atol=1e-5)
    v_ours = _encode(ours, frames)  # the same weights: ours' token is the mean over the real rows
    ours_token = tokens[-1]
    torch.testing.assert_close(ours_token[-1], frame_token[-1], rtol=1e-5, atol=1e-5)  # no padding: one token
    torch.testing.assert_close(v_ref["frames"][-1], v_ours["frames"][-1], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(ours_token[0], frame_token[0], atol=1e-3)  # 11 of 16 rows padding: another token
    assert not torch.equal(v_ref["frames"][0, :5], v_ours["frames"][0, :5])


def test_dreamprvr_refuses_zero_padding_and_an_unknown_value_is_refused(tmp_path):
    with pytest.raises(UserError) as e:
        resolve("dreamprvr", "sim-tiny", 0, ["model.padded_frames=zero"])
    assert "'model.padded_frames' (zero)" in str(e.value) and "leave it 'exclude'" in str(e.value)
    with pytest.raises(UserError, match="model.padded_frames") as e:
        resolve("hlformer", "sim-tiny", 0, ["model.padded_frames=pad"])
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("method", ["holmes", "hlformer", "gmmformer2"])
def test_an_epoch_with_the_references_padding_on_sim_tiny(tmp_path, method):
    argv = ["run", "--method", method, "--dataset", "sim-tiny", "--set", "train.epochs=1", "--set",
            "model.padded_frames=zero", "--tag", "zero", "--out", str(tmp_path), "--quiet"]
    assert main(argv) == 0
    record = json.loads((tmp_path / "runs" / "sim-tiny" / f"{method}~zero" / "seed0.json").read_text())
    assert record["config"]["model"]["padded_frames"] == "zero"
    assert math.isfinite(record["metrics"]["test"]["SumR"])


@pytest.mark.parametrize("how", ["from the host", "all true", "undescribed"])
def test_the_padded_mask_carries_what_is_known_of_the_real_one(how):
    """pad_rows moves the mask's facts (harness/base/masks.py) to the new width, so that packing by the
    padded mask asks the device nothing on a GPU (the CPU proxy of tests/test_cuda_syncs.py counts it
    for hlformer, holmes~zero, gmmformer2~zero); each fact equals what the device would answer."""
    from prvr.harness.base import masks

    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)
    if how == "all true":
        mask = masks.describe(torch.ones(3, 5, dtype=torch.bool), all_true=True)
    elif how == "from the host":
        masks.describe_from_host(mask, mask)
    x = torch.randn(3, 5, 4)
    rows, padded = pad_rows(x, mask, 9)
    assert torch.equal(padded, torch.cat([mask, torch.zeros(3, 4, dtype=torch.bool)], 1))
    facts = masks.known(padded)
    assert facts.all_true is False and facts.cols is False
    if how == "undescribed":
        assert facts.index is None and facts.lengths is None and facts.rows is None
    else:
        assert torch.equal(facts.index, padded.flatten().nonzero().squeeze(1))
        assert facts.lengths == tuple(padded.sum(1).tolist()) and facts.rows is True
    assert torch.equal(pack(rows, padded), rows[padded]) and torch.equal(rows[padded], x[mask])
    same, same_mask = pad_rows(x, mask, 5)  # nothing to pad: the tensors as they were, facts and all
    assert same is x and same_mask is mask


@pytest.mark.parametrize("shape, keep_shape", [((4, 5, 6), (1, 5, 6)), ((3, 2, 5, 6), (1, 2, 1, 6)), ((7, 6), (7, 6))])
def test_keep_where_is_masked_fill_in_values_and_gradients(shape, keep_shape):
    """masks.keep_where, the padded rows' fill the scores use (CPU): the values and the gradient of
    `x.masked_fill(~keep, -inf)`, with the mask broadcast as the callers broadcast it."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen)
    keep = torch.rand(keep_shape, generator=gen) > 0.3
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    filled, plain = masks.keep_where(a, keep, float("-inf")), b.masked_fill(~keep, float("-inf"))
    assert torch.equal(filled, plain)
    weights = torch.randn(shape, generator=gen)
    (filled.clamp_min(-5) * weights).sum().backward()
    (plain.clamp_min(-5) * weights).sum().backward()
    assert torch.equal(a.grad, b.grad)
