"""`prvr-bench evaluate --official-weights`: an official code's trained weights in our model (the
maps of methods/backbones/msl.py and gmmformer.py, `from_official`), read from a .npz without pickle,
and its bad input. The same function gives the same figures: a checkpoint of ours written out under
the official code's parameter names and read back ranks exactly as the checkpoint itself."""

import hashlib
import os

import numpy as np
import pytest
import torch

from prvr.harness.base.io import UserError
from prvr.harness.cli import main
from prvr.harness.cli.reevaluate import evaluate_runs
from prvr.harness.engine.config import resolve
from prvr.harness.engine.records import budget_label
from prvr.harness.engine.runner import run_one
from prvr.harness.reports.table import records_frame
from prvr.methods.backbones.gmmformer2 import from_official
from prvr.methods.backbones.hlformer import from_official as hlformer_official
from prvr.methods.backbones.xml import from_official as xml_official


def _attention(ours: dict[str, torch.Tensor], layer: str, names: list[str], ffn: bool = False
               ) -> dict[str, torch.Tensor]:
    """Our GaussianBranches at `layer` as the official BertAttention layers `names`, one per branch:
    each branch's q, k, v rows of the fused product, its linear maps ([branch, in, out] -> nn.Linear's
    [out, in]) and its norms' slices; the maps and norms of MS-SL's and GMMFormer's layers
    (output.dense, output.LayerNorm) or, with `ffn`, of GMMFormer v2's and Holmes' (norm1,
    output.layer1, output.layer2, norm2)."""
    n = len(names)
    qkv_w, qkv_b = ours[f"{layer}.qkv.weight"].chunk(3 * n), ours[f"{layer}.qkv.bias"].chunk(3 * n)
    maps = (("ffn_in", "output.layer1"), ("ffn_out", "output.layer2")) if ffn else (("dense", "output.dense"),)
    norms = (("norm1", "norm1"), ("norm2", "norm2")) if ffn else (("norm", "output.LayerNorm"),)
    out = {}
    for b, name in enumerate(names):
        for i, m in enumerate(("query", "key", "value")):
            out[f"{name}.self.{m}.weight"], out[f"{name}.self.{m}.bias"] = qkv_w[3 * b + i], qkv_b[3 * b + i]
        for mine, theirs in maps:
            out[f"{name}.{theirs}.weight"] = ours[f"{layer}.{mine}.weight"][b].t()
            out[f"{name}.{theirs}.bias"] = ours[f"{layer}.{mine}.bias"].chunk(n)[b]
        for mine, theirs in norms:
            out[f"{name}.{theirs}.weight"] = ours[f"{layer}.{mine}.weight"].chunk(n)[b]
            out[f"{name}.{theirs}.bias"] = ours[f"{layer}.{mine}.bias"].chunk(n)[b]
    return out


MSL_INPUTS = (("query_encoder.embed", "query_input_proj", "query_pos_embed"),
              ("clip_embed", "clip_input_proj", "clip_pos_embed"), ("frame_embed", "frame_input_proj", "frame_pos_embed"))


def _embeddings(ours: dict[str, torch.Tensor], inputs=MSL_INPUTS) -> dict[str, torch.Tensor]:
    """Our InputEmbeddings `inputs` [(ours, official LinearLayer, official positions)] under the official names."""
    out = {}
    for mine, embed, pos in inputs:
        out.update({f"{embed}.LayerNorm.weight": ours[f"{mine}.in_norm.weight"],
                    f"{embed}.LayerNorm.bias": ours[f"{mine}.in_norm.bias"],
                    f"{embed}.net.1.weight": ours[f"{mine}.linear.weight"], f"{embed}.net.1.bias": ours[f"{mine}.linear.bias"],
                    f"{pos}.position_embeddings.weight": ours[f"{mine}.positions.weight"],
                    f"{pos}.LayerNorm.weight": ours[f"{mine}.norm.weight"], f"{pos}.LayerNorm.bias": ours[f"{mine}.norm.bias"]})
    return out


def _arrays(out: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """Tensors by official name as the .npz the conversion line of docs/parity.md writes."""
    return {k: v.detach().numpy().copy() for k, v in out.items()}


def _dynamic_as_official(ours: dict[str, torch.Tensor], attentions: list[str], token: torch.Tensor
                         ) -> dict[str, np.ndarray]:
    return _arrays(_dynamic_tensors(ours, attentions, token))


def _dynamic_tensors(ours: dict[str, torch.Tensor], attentions: list[str], token: torch.Tensor
                     ) -> dict[str, torch.Tensor]:
    """Our gmmformer2 or holmes state dict under the official models' names (huangmozhi9527/GMMFormer_v2
    src/Models/gmmformerV2, lijun2005/ICML26-Holmes src/Models/holmes): DyGMMBlocks `clip_encoder`,
    `frame_encoder_1` of the attention layers `attentions`, a BertCrossAttention `ca` (its key and value
    maps are our `kv`'s two halves), and the `weight_token` (v2's learned one; the unused one Holmes keeps)."""
    out = {**_embeddings(ours), **_attention(ours, "query_encoder.layer.branches", ["query_encoder"], ffn=True)}
    for mine, theirs in (("clip_block", "clip_encoder"), ("frame_block", "frame_encoder_1")):
        out.update(_attention(ours, f"{mine}.branches", [f"{theirs}.{a}" for a in attentions], ffn=True))
        out.update(_fusion(ours, mine, theirs))
    out["modular_vector_mapping.weight"] = ours["query_encoder.pool.score.weight"]
    out["weight_token"] = token
    return out


def _fusion(ours: dict[str, torch.Tensor], mine: str, theirs: str) -> dict[str, torch.Tensor]:
    """Our dynamic block's fusion head at `mine` under the official block `theirs`: the cross-attention `ca`
    and the weight map `layer1`, `layer2`."""
    out = _cross(ours, f"{mine}.cross", f"{theirs}.ca")
    for m in ("layer1", "layer2"):
        out[f"{theirs}.{m}.weight"], out[f"{theirs}.{m}.bias"] = ours[f"{mine}.{m}.weight"], ours[f"{mine}.{m}.bias"]
    return out


def _cross(ours: dict[str, torch.Tensor], mine: str, theirs: str) -> dict[str, torch.Tensor]:
    """Our CrossAttentionLayer at `mine` as an official BertCrossAttention (or HLFormer's CrossAttention)
    `theirs`: its key and value maps are our `kv`'s two halves."""
    key_w, value_w = ours[f"{mine}.kv.weight"].chunk(2)
    key_b, value_b = ours[f"{mine}.kv.bias"].chunk(2)
    out = {f"{theirs}.self.query.weight": ours[f"{mine}.q.weight"], f"{theirs}.self.query.bias": ours[f"{mine}.q.bias"],
           f"{theirs}.self.key.weight": key_w, f"{theirs}.self.key.bias": key_b,
           f"{theirs}.self.value.weight": value_w, f"{theirs}.self.value.bias": value_b}
    for m, t in (("norm1", "norm1"), ("norm2", "norm2"), ("ffn_in", "output.layer1"), ("ffn_out", "output.layer2")):
        out[f"{theirs}.{t}.weight"], out[f"{theirs}.{t}.bias"] = ours[f"{mine}.{m}.weight"], ours[f"{mine}.{m}.bias"]
    return out


def _lorentz(ours: dict[str, torch.Tensor], layer: str, names: list[str]) -> dict[str, torch.Tensor]:
    """Our LorentzBranches at `layer` as HLFormer's LorentzAttentionBlocks `names` (lijun2005/ICCV25-HLFormer
    src/Models/HLFormer/model_components.py, src/Models/onmt/hyper_nets.py), one per branch: the input and
    output LinearLayers, `scale_alpha`, the LorentzLinear q / k / v maps (nn.Linear [out, in], no bias, and a
    time scale each), the attention's scale [1] and bias, then the feed-forward and norms."""
    n = len(names)
    point = ours[f"{layer}.qkv_weight"].shape[1]
    out = {}
    for b, name in enumerate(names):
        att, heads = f"{name}.self", f"{name}.self.lorentz_multiattention"
        for mine, theirs in (("in", "input_proj"), ("out", "output_proj")):
            out[f"{att}.{theirs}.LayerNorm.weight"] = ours[f"{layer}.{mine}_norm.weight"].chunk(n)[b]
            out[f"{att}.{theirs}.LayerNorm.bias"] = ours[f"{layer}.{mine}_norm.bias"].chunk(n)[b]
            out[f"{att}.{theirs}.net.1.weight"] = ours[f"{layer}.{mine}_proj.weight"][b].t()
            out[f"{att}.{theirs}.net.1.bias"] = ours[f"{layer}.{mine}_proj.bias"].chunk(n)[b]
        out[f"{att}.scale_alpha"] = ours[f"{layer}.log_scale"][b]
        for i, m in enumerate(("linear_query", "linear_keys", "linear_values")):
            out[f"{heads}.{m}.weight.weight"] = ours[f"{layer}.qkv_weight"][b][:, i * point:(i + 1) * point].t()
            out[f"{heads}.{m}.scale"] = ours[f"{layer}.log_time_scale"][b, i]
        out[f"{heads}.scale"] = ours[f"{layer}.logit_scale"][b].reshape(1)
        out[f"{heads}.bias"] = ours[f"{layer}.logit_bias"][b]
        for mine, theirs in (("ffn_in", "output.layer1"), ("ffn_out", "output.layer2")):
            out[f"{name}.{theirs}.weight"] = ours[f"{layer}.{mine}.weight"][b].t()
            out[f"{name}.{theirs}.bias"] = ours[f"{layer}.{mine}.bias"].chunk(n)[b]
        for norm in ("norm1", "norm2"):
            out[f"{name}.{norm}.weight"] = ours[f"{layer}.{norm}.weight"].chunk(n)[b]
            out[f"{name}.{norm}.bias"] = ours[f"{layer}.{norm}.bias"].chunk(n)[b]
    return out


def _hlformer_as_official(ours: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """Our hlformer state dict under HLFormer_Net's names (lijun2005/ICCV25-HLFormer src/Models/HLFormer)."""
    out = {**_embeddings(ours), **_attention(ours, "query_encoder.layer.branches", ["query_encoder"], ffn=True)}
    for mine, theirs in (("clip_block", "clip_encoder"), ("frame_block", "frame_encoder_1")):
        out.update(_attention(ours, f"{mine}.branches", [f"{theirs}.e_attns.{i}" for i in range(4)], ffn=True))
        out.update(_lorentz(ours, f"{mine}.lorentz", [f"{theirs}.h_attns.{i}" for i in range(4)]))
        out.update(_fusion(ours, mine, theirs))
    out.update({"modular_vector_mapping.weight": ours["query_encoder.pool.score.weight"],
                "modular_vector_mapping_2.weight": ours["frame_pool.score.weight"],
                "modular_vector_mapping_3.weight": ours["clip_pool.score.weight"],
                "curv": ours["log_curvature"], "textual_alpha": ours["log_query_scale"],
                "video_alpha": ours["log_video_scale"], "manifold.k": torch.tensor(1.0)})
    for block in ("clip_encoder", "frame_encoder_1"):  # geoopt's Lorentz(k=1) in every module that holds it
        for i in range(4):
            for holder in ("self", "self.lorentz_multiattention", *(f"self.lorentz_multiattention.linear_{m}"
                                                                     for m in ("query", "keys", "values"))):
                out[f"{block}.h_attns.{i}.{holder}.manifold.k"] = torch.tensor(1.0)
    return _arrays(out)


def _gmmformer_as_official(ours: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """Our gmmformer state dict under GMMFormer_Net's names (huangmozhi9527/GMMFormer model.py)."""
    out = _embeddings(ours)
    out.update(_attention(ours, "query_encoder.layer.branches", ["query_encoder"]))
    attns = [f"attn{i}" for i in range(4)]
    for i, (clip, frame) in enumerate([("clip_encoder", "frame_encoder_1"), ("clip_encoder_2", "frame_encoder_2")]):
        out.update(_attention(ours, f"clip_blocks.{i}.branches", [f"{clip}.{a}" for a in attns]))
        out.update(_attention(ours, f"frame_blocks.{i}.branches", [f"{frame}.{a}" for a in attns]))
    out["modular_vector_mapping.weight"] = ours["query_encoder.pool.score.weight"]
    out["modular_vector_mapping_2.weight"] = ours["frame_pool.score.weight"]
    return _arrays(out)


def _as_official(ours: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """Our msl state dict under ms-sl's parameter names (MS_SL_Net), written here by hand from its
    model.py: the inverse of the map, to check the map against."""
    out = {}
    for mine, embed, pos, enc, layer in (
            ("query_encoder.embed", "query_input_proj", "query_pos_embed", "query_encoder", "query_encoder.layer.branches"),
            ("clip_embed", "clip_input_proj", "clip_pos_embed", "clip_encoder", "clip_encoder.branches"),
            ("frame_embed", "frame_input_proj", "frame_pos_embed", "frame_encoder", "frame_encoder.branches")):
        out[f"{embed}.LayerNorm.weight"] = ours[f"{mine}.in_norm.weight"]
        out[f"{embed}.LayerNorm.bias"] = ours[f"{mine}.in_norm.bias"]
        out[f"{embed}.net.1.weight"] = ours[f"{mine}.linear.weight"]
        out[f"{embed}.net.1.bias"] = ours[f"{mine}.linear.bias"]
        out[f"{pos}.position_embeddings.weight"] = ours[f"{mine}.positions.weight"]
        out[f"{pos}.LayerNorm.weight"] = ours[f"{mine}.norm.weight"]
        out[f"{pos}.LayerNorm.bias"] = ours[f"{mine}.norm.bias"]
        for part, name in zip(ours[f"{layer}.qkv.weight"].chunk(3), ("query", "key", "value")):
            out[f"{enc}.self.{name}.weight"] = part
        for part, name in zip(ours[f"{layer}.qkv.bias"].chunk(3), ("query", "key", "value")):
            out[f"{enc}.self.{name}.bias"] = part
        out[f"{enc}.output.dense.weight"] = ours[f"{layer}.dense.weight"][0].t()  # nn.Linear: [out, in]
        out[f"{enc}.output.dense.bias"] = ours[f"{layer}.dense.bias"]
        out[f"{enc}.output.LayerNorm.weight"] = ours[f"{layer}.norm.weight"]
        out[f"{enc}.output.LayerNorm.bias"] = ours[f"{layer}.norm.bias"]
    out["modular_vector_mapping.weight"] = ours["query_encoder.pool.score.weight"]
    out["mapping_linear.0.weight"] = ours["key_map.weight"]
    out["mapping_linear.1.weight"] = ours["value_map.weight"]
    assert len(out) == len(ours) + 12  # each fused q/k/v weight and bias (three encoders) is three tensors there
    return _arrays(out)


def _xml_as_official(ours: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """Our xml state dict under TVRetrieval's XML names in its video-only layout (--ctx_mode video_tef:
    video_encoder1..3, video_query_linear, video_st_predictor / video_ed_predictor), written here by hand
    from its model_xml.py and model_components.py."""
    out = _embeddings(ours, (("query_encoder.embed", "query_input_proj", "query_pos_embed"),
                             ("video_embed", "video_input_proj", "ctx_pos_embed")))
    out.update(_attention(ours, "query_encoder.layer.branches", ["query_encoder"]))
    for i in (1, 2, 3):
        out.update(_attention(ours, f"encoder{i}.branches", [f"video_encoder{i}"]))
    out.update({"modular_vector_mapping.weight": ours["query_encoder.pool.score.weight"],
                "video_query_linear.weight": ours["query_linear.weight"], "video_query_linear.bias": ours["query_linear.bias"],
                "video_st_predictor.weight": ours["start_conv.weight"], "video_ed_predictor.weight": ours["end_conv.weight"]})
    return _arrays(out)


@pytest.fixture(scope="module")
def msl_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("official")
    record = run_one(resolve("msl", "sim-tiny", 0, ["train.epochs=1"]), out)
    path = out / "runs" / "sim-tiny" / "msl" / "seed0.json"
    weights = torch.load(out / "checkpoints" / "sim-tiny" / "msl" / "seed0" / "best.pt", weights_only=True)["model"]
    npz = out / "official.npz"
    np.savez(npz, **_as_official(weights))
    return path, npz, record


def test_the_official_names_read_back_rank_as_our_checkpoint(msl_run):
    path, npz, _ = msl_run
    ours = evaluate_runs([path], "val", parts=True)
    theirs = evaluate_runs([path], "val", parts=True, official=npz)
    assert [r["score"] for r in theirs] == [r["score"] for r in ours] == ["clip", "frame", "fused"]
    assert [r["metrics"] for r in theirs] == [r["metrics"] for r in ours]
    assert theirs[0]["run"] == "msl seed 0 (official weights official.npz)"


def _write(path, arrays):
    np.savez(path, **arrays)
    return path


def test_bad_official_weights_are_one_line(msl_run, tmp_path):
    path, npz, _ = msl_run
    arrays = dict(np.load(npz))
    lacking = _write(tmp_path / "lacking.npz", {k: v for k, v in arrays.items() if k != "mapping_linear.1.weight"})
    with pytest.raises(UserError, match=r"lacking.npz lacks 'mapping_linear.1.weight', a weight of "
                                        r"HuiGuanLab/ms-sl's msl model; is it that code's checkpoint, converted whole\?"):
        evaluate_runs([path], "val", official=lacking)
    extra = _write(tmp_path / "extra.npz", {**arrays, "reranker.weight": np.zeros(3, np.float32)})
    with pytest.raises(UserError, match=r"extra.npz holds 1 weights the map of HuiGuanLab/ms-sl does not use "
                                        r"\(e.g. reranker.weight\)"):
        evaluate_runs([path], "val", official=extra)
    shaped = _write(tmp_path / "shaped.npz", {**arrays, "mapping_linear.0.weight": np.zeros((2, 2), np.float32)})
    with pytest.raises(UserError, match=r"checkpoint .*shaped.npz holds another model than this run's \(key_map.weight "
                                        r"is \[2, 2\] there"):
        evaluate_runs([path], "val", official=shaped)
    text = tmp_path / "model.ckpt"
    text.write_text("not a zip")
    with pytest.raises(UserError, match=r"--official-weights .*model.ckpt: not a readable .npz of arrays"):
        evaluate_runs([path], "val", official=text)
    pickled = tmp_path / "pickled.npz"
    np.savez(pickled, config=np.array([{"lr": 1}], dtype=object))  # an object array: read only through pickle
    with pytest.raises(UserError, match=r"pickled.npz: not a readable .npz of arrays"):
        evaluate_runs([path], "val", official=pickled)


def test_a_backbone_without_a_map_and_other_analyses_are_refused(msl_run, tmp_path, capsys):
    path, npz, _ = msl_run
    base = tmp_path / "base"
    run_one(resolve("baseline", "sim-tiny", 0, ["train.epochs=1"]), base)
    with pytest.raises(UserError, match=r"backbone dual-branch has no map of its official code's weights "
                                        r"\(known: dreamprvr, gmmformer, gmmformer2, hlformer, holmes, msl, xml\)"):
        evaluate_runs([base / "runs" / "sim-tiny" / "baseline" / "seed0.json"], "val", official=npz)
    assert main(["evaluate", str(path), str(path), "--ensemble", "--official-weights", str(npz)]) != 0
    assert "--official-weights ranks one record's model with the official weights" in capsys.readouterr().err


def test_gmmformers_official_names_read_back_rank_as_our_checkpoint(tmp_path):
    out = tmp_path / "g"
    run_one(resolve("gmmformer", "sim-tiny", 0, ["train.epochs=1"]), out)
    path = out / "runs" / "sim-tiny" / "gmmformer" / "seed0.json"
    weights = torch.load(out / "checkpoints" / "sim-tiny" / "gmmformer" / "seed0" / "best.pt", weights_only=True)["model"]
    npz = tmp_path / "official.npz"
    np.savez(npz, **_gmmformer_as_official(weights))
    ours, theirs = evaluate_runs([path], "val", parts=True), evaluate_runs([path], "val", parts=True, official=npz)
    assert [r["metrics"] for r in theirs] == [r["metrics"] for r in ours]
    # another layout than the reference's: its weights cannot be read into it
    other = out / "runs" / "sim-tiny" / "gmmformer~w3" / "seed0.json"
    run_one(resolve("gmmformer", "sim-tiny", 0, ["train.epochs=1", "model.widths=[0.0, 1.0, 5.0]"]), out, tag="w3")
    with pytest.raises(UserError, match=r"the official GMMFormer has 2 blocks of widths \[0.0, 0.5, 1.0, 5.0\]; this "
                                        r"run's model has 2 of \[0.0, 1.0, 5.0\]"):
        evaluate_runs([other], "val", official=npz)


def test_xmls_official_names_read_back_rank_as_our_checkpoint(tmp_path):
    """TVRetrieval's XML (video only): the same videos and the same moments, every weight of ours once;
    a checkpoint of its video + subtitle layout (merged predictors, sub_* layers) is refused in one line."""
    run_one(resolve("xml", "sim-tiny", 0, ["train.epochs=1"]), tmp_path)
    path = tmp_path / "runs" / "sim-tiny" / "xml" / "seed0.json"
    weights = torch.load(tmp_path / "checkpoints" / "sim-tiny" / "xml" / "seed0" / "best.pt", weights_only=True)["model"]
    npz = _write(tmp_path / "official.npz", _xml_as_official(weights))
    ours, theirs = evaluate_runs([path], "val"), evaluate_runs([path], "val", official=npz)
    assert [r["metrics"] for r in theirs] == [r["metrics"] for r in ours]
    assert any(k.startswith("VCMR") for k in ours[0]["metrics"])  # the moments are ranked too, and alike
    named = {k: torch.from_numpy(v) for k, v in np.load(npz).items()}
    mapped = xml_official(named, resolve("xml", "sim-tiny", 0).model)
    assert set(mapped) == set(weights) and all(torch.equal(mapped[k], weights[k]) for k in weights)
    arrays = dict(np.load(npz))
    merged = {**{k: v for k, v in arrays.items() if "_predictor" not in k},
              "merged_st_predictor.weight": arrays["video_st_predictor.weight"],
              "merged_ed_predictor.weight": arrays["video_ed_predictor.weight"]}
    with pytest.raises(UserError, match=r"lacks 'video_st_predictor.weight', a weight of jayleicn/TVRetrieval's xml "
                                        r"model"):
        evaluate_runs([path], "val", official=_write(tmp_path / "merged.npz", merged))
    longer = {**arrays, "ctx_pos_embed.position_embeddings.weight": np.zeros((100, weights["video_embed.positions.weight"]
                                                                             .shape[1]), np.float32)}
    with pytest.raises(UserError, match=r"holds another model than this run's \(video_embed.positions.weight is "
                                        r"\[100, "):
        evaluate_runs([path], "val", official=_write(tmp_path / "longer.npz", longer))


def test_holmes_official_names_read_back_rank_as_our_checkpoint(tmp_path):
    cfg = resolve("holmes", "sim-tiny", 0, ["train.epochs=1"])
    run_one(cfg, tmp_path)
    path = tmp_path / "runs" / "sim-tiny" / "holmes" / "seed0.json"
    weights = torch.load(tmp_path / "checkpoints" / "sim-tiny" / "holmes" / "seed0" / "best.pt", weights_only=True)["model"]
    npz = tmp_path / "official.npz"
    np.savez(npz, **_dynamic_as_official(weights, [f"e_attns.{i}" for i in range(8)], torch.zeros(1, 1, cfg.model.hidden)))
    ours, theirs = evaluate_runs([path], "val", parts=True), evaluate_runs([path], "val", parts=True, official=npz)
    assert [r["metrics"] for r in theirs] == [r["metrics"] for r in ours]


def test_gmmformer2s_official_names_read_back_rank_as_our_checkpoint(tmp_path):
    """GMMFormer v2's names (attn0 .. attn7, and the learned token both encoders read, which the
    reference's checkpoint holds and the map must carry over)."""
    run_one(resolve("gmmformer2", "sim-tiny", 0, ["train.epochs=1"]), tmp_path)
    path = tmp_path / "runs" / "sim-tiny" / "gmmformer2" / "seed0.json"
    weights = torch.load(tmp_path / "checkpoints" / "sim-tiny" / "gmmformer2" / "seed0" / "best.pt",
                         weights_only=True)["model"]
    npz = tmp_path / "official.npz"
    np.savez(npz, **_dynamic_as_official(weights, [f"attn{i}" for i in range(8)], weights["weight_token"]))
    ours, theirs = evaluate_runs([path], "val", parts=True), evaluate_runs([path], "val", parts=True, official=npz)
    assert [r["metrics"] for r in theirs] == [r["metrics"] for r in ours]
    named = {k: torch.from_numpy(v) for k, v in np.load(npz).items()}
    mapped = from_official(named, resolve("gmmformer2", "sim-tiny", 0).model)
    assert mapped["weight_token"] is named["weight_token"] and set(mapped) == set(weights)  # every weight of ours, once
    run_one(resolve("gmmformer2", "sim-tiny", 0, ["train.epochs=1", "model.widths=[0.0, 1.0]"]), tmp_path, tag="w2")
    with pytest.raises(UserError, match=r"the official GMMFormer v2 has the widths \[0.0, 0.5, 1.0, 5.0, 10.0, 3.0, "
                                        r"0.1, 8.0\]; this run's model has \[0.0, 1.0\]"):
        evaluate_runs([tmp_path / "runs" / "sim-tiny" / "gmmformer2~w2" / "seed0.json"], "val", official=npz)


def test_hlformers_official_names_read_back_rank_as_our_checkpoint(tmp_path):
    """HLFormer's names: Euclidean e_attns, Lorentz h_attns (their LorentzLinear q / k / v maps and time
    scales, the attention's scale and bias), and L_pop's curvature, scales and poolings."""
    run_one(resolve("hlformer", "sim-tiny", 0, ["train.epochs=1"]), tmp_path)
    path = tmp_path / "runs" / "sim-tiny" / "hlformer" / "seed0.json"
    weights = torch.load(tmp_path / "checkpoints" / "sim-tiny" / "hlformer" / "seed0" / "best.pt",
                         weights_only=True)["model"]
    npz = _write(tmp_path / "official.npz", _hlformer_as_official(weights))
    ours, theirs = evaluate_runs([path], "val", parts=True), evaluate_runs([path], "val", parts=True, official=npz)
    assert [r["metrics"] for r in theirs] == [r["metrics"] for r in ours]
    named = {k: torch.from_numpy(v) for k, v in np.load(npz).items()}
    mapped = hlformer_official(named, resolve("hlformer", "sim-tiny", 0).model)
    assert set(mapped) == set(weights) and all(torch.equal(mapped[k], weights[k]) for k in weights)
    curved = _write(tmp_path / "curved.npz", {**dict(np.load(npz)), "manifold.k": np.array(2.0, np.float32)})
    with pytest.raises(UserError, match=r"manifold.k is 2.0, where the official HLFormer's attention manifold has "
                                        r"curvature 1.0"):
        evaluate_runs([path], "val", official=curved)
    run_one(resolve("hlformer", "sim-tiny", 0, ["train.epochs=1", "model.lorentz_widths=[0.0, 2.0]"]), tmp_path,
            tag="w2")
    with pytest.raises(UserError, match=r"the official HLFormer has the widths \[0.0, 2.0, 4.0, 8.0\] in both its "
                                        r"Euclidean and Lorentz branches; this run's model has \[0.0, 2.0, 4.0, 8.0\] "
                                        r"and \[0.0, 2.0\]"):
        evaluate_runs([tmp_path / "runs" / "sim-tiny" / "hlformer~w2" / "seed0.json"], "val", official=npz)


def _dreamprvr_as_official(ours: dict[str, torch.Tensor], registers: int, diffusion_layers: int) -> dict[str, np.ndarray]:
    """Our dreamprvr state dict under DreamPRVR_Net's names (lijun2005/CVPR26-DreamPRVR src/Models/DreamPRVR),
    written from its module names: v2's layers and fusion head in `clip_encoder` and `frame_encoder`, the
    register input `noise_input_layer`, `mean_clip_encoder`, `video_qformer`, the latent sampler and the
    denoiser `diffusion_mlp` (its `blcok_in` / `blcok_out` spelled as there)."""
    out = {**_embeddings(ours), **_attention(ours, "query_encoder.layer.branches", ["query_encoder"], ffn=True),
           "modular_vector_mapping.weight": ours["query_encoder.pool.score.weight"]}
    for mine, theirs in (("clip_block", "clip_encoder"), ("frame_block", "frame_encoder")):
        out.update(_attention(ours, f"{mine}.branches", [f"{theirs}.e_attns.{i}" for i in range(8)], ffn=True))
        out.update(_fusion(ours, mine, theirs))
        for t in ("weight", "bias"):
            out[f"{theirs}.noise_input_layer.LayerNorm.{t}"] = ours[f"{mine}.register_in.0.{t}"]
            out[f"{theirs}.noise_input_layer.net.1.{t}"] = ours[f"{mine}.register_in.2.{t}"]
    out.update(_attention(ours, "generator.context.branches", ["mean_clip_encoder"], ffn=True))
    out.update(_cross(ours, "generator.reader", "video_qformer.cross_attention"))
    out["video_qformer.query_tokens"] = ours["register_tokens"].reshape(1, registers, -1)
    sampler, latent = "video_probabilistic_variational_sampler", "generator.latent"
    for k, v in ours.items():
        if k.startswith(f"{latent}.pool.gru."):
            out[k.replace(f"{latent}.pool.gru.", f"{sampler}.gpo.gru.")] = v
    names = {"pool.score": "gpo.linear", "mean_pool.w1": "pie_net_video.attention.w_1",
             "mean_pool.w2": "pie_net_video.attention.w_2", "mean_fc": "pie_net_video.fc",
             "norm": "pie_net_video.layer_norm", "var_pool.w1": "uncertain_net_video.attention.w_1",
             "var_pool.w2": "uncertain_net_video.attention.w_2", "var_fc": "uncertain_net_video.fc",
             "var_pooled_fc": "uncertain_net_video.fc2",
             **{f"blocks.{i}.{a}": f"layers.{i}.{b}" for i in range(diffusion_layers) for a, b in (
                 ("block_in.0", "blcok_in.0"), ("block_in.2", "blcok_in.2"), ("time.1", "temb_proj.1"),
                 ("cond.1", "cond_proj.1"), ("block_out.0", "blcok_out.0"), ("block_out.2", "blcok_out.3"),
                 ("shortcut", "short_cut"))},
             "time.0": "time_embedding.timembedding.1", "time.2": "time_embedding.timembedding.3",
             "cond.0": "cond_embedding.0", "cond.2": "cond_embedding.2", "shortcut": "short_cut"}
    for mine, theirs in names.items():
        part = latent if not (mine.startswith(("blocks.", "time.", "cond.")) or mine == "shortcut") else "generator.denoiser"
        owner = sampler if part == latent else "diffusion_mlp"
        for t in ("weight", "bias"):
            if f"{part}.{mine}.{t}" in ours:
                out[f"{owner}.{theirs}.{t}"] = ours[f"{part}.{mine}.{t}"]
    out["diffusion_mlp.time_embedding.timembedding.0.weight"] = ours["generator.denoiser.step_table"]
    return _arrays(out)


def test_dreamprvrs_official_names_read_back_rank_as_our_checkpoint(tmp_path):
    """DreamPRVR's names: v2's blocks with their register input, the register generator's context
    encoder, query-former, latent sampler and denoiser."""
    cfg = resolve("dreamprvr", "sim-tiny", 0, ["train.epochs=1"])
    run_one(cfg, tmp_path)
    path = tmp_path / "runs" / "sim-tiny" / "dreamprvr" / "seed0.json"
    weights = torch.load(tmp_path / "checkpoints" / "sim-tiny" / "dreamprvr" / "seed0" / "best.pt",
                         weights_only=True)["model"]
    npz = _write(tmp_path / "official.npz", _dreamprvr_as_official(weights, cfg.model.registers,
                                                                   cfg.model.diffusion_layers))
    ours, theirs = evaluate_runs([path], "val", parts=True), evaluate_runs([path], "val", parts=True, official=npz)
    assert [r["metrics"] for r in theirs] == [r["metrics"] for r in ours]
    run_one(resolve("dreamprvr", "sim-tiny", 0, ["train.epochs=1", "model.widths=[0.0, 1.0]"]), tmp_path, tag="w2")
    with pytest.raises(UserError, match=r"the official DreamPRVR has the widths \[0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, "
                                        r"16.0\]; this run's model has \[0.0, 1.0\]"):
        evaluate_runs([tmp_path / "runs" / "sim-tiny" / "dreamprvr~w2" / "seed0.json"], "val", official=npz)


def _ral_as_official(ours: dict[str, torch.Tensor], attentions: list[str], token: torch.Tensor | None = None
                     ) -> dict[str, np.ndarray]:
    """Our ral state dict (the backbone under `base.`) under RAL-PRVR's names (zhanglong-ustc/RAL-PRVR
    src/Models/RAL4gmmv2) or Holmes multisrc/'s, which agree: the backbone's, then the token encoder
    `frame_branch_query_proj` / `frame_branch_query_encoder`, the gate `text_weight_fc` and, with MSRA, the
    PIENet and uncertainty modules of each side."""
    base = {k[len("base."):]: v for k, v in ours.items() if k.startswith("base.")}
    out = _dynamic_tensors(base, attentions, base["weight_token"] if token is None else token)
    out.update({"frame_branch_query_proj.LayerNorm.weight": ours["tokens.in_norm.weight"],
                "frame_branch_query_proj.LayerNorm.bias": ours["tokens.in_norm.bias"],
                "frame_branch_query_proj.net.1.weight": ours["tokens.linear.weight"],
                "frame_branch_query_proj.net.1.bias": ours["tokens.linear.bias"],
                **_attention(ours, "tokens.layer.branches", ["frame_branch_query_encoder"], ffn=True),
                **{f"text_weight_fc.{i}.{t}": ours[f"gate.net.{i}.{t}"] for i in (0, 2) for t in ("weight", "bias")}})
    for head, side in (("text_head", "text"), ("video_head", "video")):
        if f"{head}.mean_fc.weight" not in ours:
            continue
        for theirs, mine in ((f"pie_net_{side}.attention.w_1.weight", "mean_pool.w1.weight"),
                             (f"pie_net_{side}.attention.w_2.weight", "mean_pool.w2.weight"),
                             (f"uncertain_net_{side}.attention.w_1.weight", "sigma_pool.w1.weight"),
                             (f"uncertain_net_{side}.attention.w_2.weight", "sigma_pool.w2.weight")):
            out[theirs] = ours[f"{head}.{mine}"]
        for theirs, mine in ((f"pie_net_{side}.fc", "mean_fc"), (f"pie_net_{side}.layer_norm", "norm"),
                             (f"uncertain_net_{side}.fc", "sigma_fc"), (f"uncertain_net_{side}.fc2", "sigma_pooled_fc")):
            for t in ("weight", "bias"):
                out[f"{theirs}.{t}"] = ours[f"{head}.{mine}.{t}"]
    return _arrays(out)


@pytest.mark.parametrize("sets, run, attentions", [
    (("backbone=holmes",), "ral@holmes", [f"e_attns.{i}" for i in range(8)]),  # Holmes' multisrc/: CSA, no MSRA
    (("ral.heads=code",), "ral", [f"attn{i}" for i in range(8)]),  # RAL-PRVR: CSA and MSRA's heads as its code builds them
])
def test_rals_official_names_read_back_rank_as_our_checkpoint(sets, run, attentions, tmp_path):
    cfg = resolve("ral", "sim-tiny", 0, ["train.epochs=1", *sets])
    run_one(cfg, tmp_path)
    path = tmp_path / "runs" / "sim-tiny" / run / "seed0.json"
    weights = torch.load(tmp_path / "checkpoints" / "sim-tiny" / run / "seed0" / "best.pt", weights_only=True)["model"]
    token = torch.zeros(1, 1, cfg.model.hidden) if cfg.backbone == "holmes" else None
    npz = _write(tmp_path / "official.npz", _ral_as_official(weights, attentions, token))
    ours, theirs = evaluate_runs([path], "val", parts=True), evaluate_runs([path], "val", parts=True, official=npz)
    assert [r["metrics"] for r in theirs] == [r["metrics"] for r in ours]


@pytest.mark.parametrize("sets, message", [
    (("ral.heads=paper",), r"the reference's Gaussian heads are its PIENet and uncertainty modules \(ral.heads=code\)"),
    (("ral.heads=code", "ral.share_positions=false"), r"ral.share_positions=false \(positions of its own\), which no "
                                                      r"official checkpoint holds"),
])
def test_a_ral_model_no_official_checkpoint_holds_is_refused(sets, message, tmp_path):
    run_one(resolve("ral", "sim-tiny", 0, ["train.epochs=1", *sets]), tmp_path)
    weights = torch.load(tmp_path / "checkpoints" / "sim-tiny" / "ral" / "seed0" / "best.pt", weights_only=True)["model"]
    code = {k: v for k, v in weights.items() if not k.startswith(("text_head", "video_head"))}
    npz = _write(tmp_path / "official.npz", _ral_as_official(code, [f"attn{i}" for i in range(8)]))
    with pytest.raises(UserError, match=message):
        evaluate_runs([tmp_path / "runs" / "sim-tiny" / "ral" / "seed0.json"], "val", official=npz)


class _StartingWeights:
    """Trainer hook: the model's weights when its first epoch starts (before any step)."""

    def __init__(self) -> None:
        self.weights: dict[str, torch.Tensor] = {}

    def on_epoch_start(self, trainer, epoch: int) -> None:
        if not self.weights:
            self.weights = {k: v.detach().cpu().clone() for k, v in trainer.model.state_dict().items()}

    def on_step(self, trainer, step: int, out: dict) -> None:
        pass

    def on_epoch_end(self, trainer, epoch: int, summary: dict) -> None:
        pass


def test_a_run_starts_from_the_official_weights_it_is_given(msl_run, tmp_path):
    """`train.init_weights` (CPU): the model's first step starts from the official weights, read through
    the backbone's map, not from its seeded init; the record names the file by its digest, and its
    protocol says it started from given weights, so it is not the dataset's protocol."""
    path, npz, _ = msl_run
    given = torch.load(path.parents[3] / "checkpoints" / "sim-tiny" / "msl" / "seed0" / "best.pt",
                       weights_only=True)["model"]
    start = _StartingWeights()
    record = run_one(resolve("msl", "sim-tiny", 1, ["train.epochs=1", "train.device=cpu",
                                                    f"train.init_weights={npz}"]), tmp_path, hooks=[start])
    assert start.weights.keys() == given.keys()
    for key, value in given.items():
        torch.testing.assert_close(start.weights[key], value, rtol=0, atol=0, msg=key)
    seeded = _StartingWeights()
    run_one(resolve("msl", "sim-tiny", 1, ["train.epochs=1", "train.device=cpu"]), tmp_path / "seeded", hooks=[seeded])
    assert any(not torch.equal(seeded.weights[k], v) for k, v in given.items())
    assert record["provenance"]["init_weights"] == {"file": "official.npz",
                                                    "sha256": hashlib.sha256(npz.read_bytes()).hexdigest()}
    assert record["protocol"]["init"] == "given weights" and record["protocol"]["follows_protocol"] is False
    assert budget_label(record["protocol"]).endswith(", from given weights")
    row = records_frame([record]).iloc[0]  # the leaderboard's keys: a budget of its own, off the protocol
    assert row["budget"].endswith(", from given weights") and not row["on_protocol"]


def test_bad_initial_weights_are_one_line_and_write_nothing(msl_run, tmp_path):
    """train.init_weights that is missing, a FIFO (never opened: it would wait for a writer), of a
    backbone without a map, or of another model: one line naming the key, and no record."""
    _, npz, _ = msl_run
    fifo = tmp_path / "weights.npz"
    os.mkfifo(fifo)
    cases = [("msl", tmp_path / "none.npz", r"train.init_weights .*none.npz: no such file"),
             ("msl", fifo, r"train.init_weights .*weights.npz: not a regular file; write the .npz"),
             ("baseline", npz, r"train.init_weights: backbone dual-branch has no map of its official code's weights"),
             ("gmmformer", npz, r"train.init_weights .*official.npz lacks")]
    for method, weights, message in cases:
        out = tmp_path / f"out-{method}"
        with pytest.raises(UserError, match=message):
            run_one(resolve(method, "sim-tiny", 0, ["train.epochs=1", f"train.init_weights={weights}"]), out)
        assert not list(out.rglob("*.json"))
