"""Profiling (`prvr-bench profile`): FLOP counts against hand counts, the figures of every
registered method, the evaluator race, and the files the command writes."""

import csv
import io
import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from prvr.harness.cli import main
from prvr.harness.engine.evaluate import reference_ranks
from prvr.harness.profiling import evaluator_speed as ev
from prvr.harness.profiling.flops import UncountedOpsError, count_flops, flops_per_query
from prvr.harness.profiling.report import CSV_COLUMNS
from prvr.harness.profiling.reported import REPORTED
from prvr.harness.profiling.runtime import encode_collection, runtime_per_query
from prvr.harness.profiling.subjects import build_model, count_params, default_names, random_queries, subjects
from prvr.harness.profiling.training import peak_memory
from prvr.harness.base.registry import METHODS

L, D, HEADS, FF, BATCH = 10, 16, 2, 32, 3


def hand_attention_flops(length: int, d: int) -> tuple[int, int]:
    """(projections, attention) FLOPs of one self-attention over `length` tokens, per sequence:
    Q, K, V and output maps 4 * 2 L d^2; scores Q K^T and weights x V 2 * 2 L^2 d (over all heads)."""
    return 8 * length * d * d, 4 * length * length * d


def test_multi_head_attention_flops_match_the_hand_count():
    mha = nn.MultiheadAttention(D, HEADS, batch_first=True).eval()
    x = torch.randn(BATCH, L, D)
    proj, attn = hand_attention_flops(L, D)
    with torch.no_grad():  # eval + no_grad: the fused fast path, which the plain counter misses
        assert count_flops(lambda: mha(x, x, x, need_weights=False)).total == BATCH * (proj + attn)


def test_encoder_layer_flops_match_the_hand_count_with_and_without_padding():
    layer = nn.TransformerEncoderLayer(D, HEADS, FF, dropout=0.0, batch_first=True).eval()
    x = torch.randn(BATCH, L, D)
    proj, attn = hand_attention_flops(L, D)
    expected = BATCH * (proj + attn + 4 * L * D * FF)  # + two feed-forward maps
    mask = torch.zeros(BATCH, L, dtype=torch.bool)
    mask[0, 6:] = True
    with torch.no_grad():
        assert count_flops(lambda: layer(x)).total == expected
        assert count_flops(lambda: layer(x, src_key_padding_mask=mask)).total == expected  # the kernel runs all L
    # Cross-check: on the meta device attention decomposes into counted matrix products.
    meta = nn.TransformerEncoderLayer(D, HEADS, FF, dropout=0.0, batch_first=True, device="meta").eval()
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        meta(x.to("meta"))
    assert counter.get_total_flops() == expected


@pytest.mark.skipif(not torch.__version__.startswith("2.13"), reason="documents a gap of torch 2.13's counter")
def test_the_plain_counter_misses_cpu_attention():
    """Why flops.py exists: torch 2.13 counts no FLOPs for CPU scaled-dot-product attention."""
    mha = nn.MultiheadAttention(D, HEADS, batch_first=True)  # training mode: no fast path
    x = torch.randn(1, L, D)
    counter = FlopCounterMode(display=False)
    with counter:
        mha(x, x, x, need_weights=False)
    assert counter.get_total_flops() == hand_attention_flops(L, D)[0]  # the projections only


def test_an_uncounted_matrix_op_is_an_error_not_an_undercount():
    layer = nn.TransformerEncoderLayer(D, HEADS, FF, dropout=0.0, batch_first=True).eval().requires_grad_(False)
    x = torch.randn(1, L, D)
    with pytest.raises(UncountedOpsError, match="_transformer_encoder_layer_fwd"):
        count_flops(lambda: layer(x))  # frozen + eval: the fused layer, which has no formula


def test_the_default_subjects_are_every_method_and_ral_on_each_backbone():
    names = default_names()
    assert set(METHODS.names()) <= set(names) and {"ral@msl", "ral@gmmformer"} <= set(names)
    assert names.index("ral") < names.index("ral@gmmformer") < names.index("ral@msl") < names.index("xml")
    named = {s.method: s for s in subjects(["ral", "ral@msl", "msl"], "sim-tiny")}
    assert {k: (s.backbone, s.cfg.method) for k, s in named.items()} == {
        "ral": ("gmmformer2", "ral"), "ral@msl": ("msl", "ral"), "msl": ("msl", "msl")}
    # the name wins over a --set backbone for every subject
    assert subjects(["ral@gmmformer"], "sim-tiny", ["backbone=msl"])[0].backbone == "gmmformer"


@pytest.mark.parametrize("method", default_names())
def test_every_method_gets_params_flops_and_runtime(method):
    subject = subjects([method], "sim-tiny")[0]
    dims = (48, 32)
    model = build_model(subject, dims)
    assert count_params(model) > 0
    f = flops_per_query(model, subject, dims)
    assert f.query > 0 and f.video > 0 and f.score > 0 and f.total == f.query + f.video + f.score
    out = runtime_per_query(model, subject, [3, 7], dims, repeats=2, warmup=1, unique=2, device=torch.device("cpu"))
    assert [r.videos for r in out] == [3, 7]
    for r in out:
        assert r.runs == 2 and 0 < r.p25_ms <= r.median_ms <= r.p75_ms and math.isfinite(r.p75_ms)


def test_a_collection_holds_every_video_and_scores_against_all_of_them():
    subject = subjects(["baseline"], "sim-tiny")[0]
    model = build_model(subject, (48, 32))
    videos = encode_collection(model, subject, 7, 3, 48, torch.device("cpu"))
    assert all(t.shape[0] == 7 for t in videos.values())
    queries = model.encode_queries(random_queries(1, subject.tokens, 32))
    assert model.score(queries, videos).fused.shape == (1, 7)
    assert torch.equal(videos["clip"][3], videos["clip"][0])  # tiled copies


def test_counting_and_argsort_loop_agree_on_every_query_even_with_ties():
    shape = ev.EvalShape(queries=60, videos=25, frames=4, clips=2, dim=8, queries_per_video=3)
    labels = ev.labels_of(shape)
    scores = torch.randint(0, 4, (shape.queries, shape.videos)).float()  # many exact ties
    counted, sorted_ = ev.counting_ranks(scores, labels), ev.argsort_ranks(scores, labels)
    assert np.array_equal(counted, sorted_)
    assert np.array_equal(counted, reference_ranks(scores.numpy(), [[t] for t in labels.indices]))


def test_evaluator_speed_on_a_small_shape():
    shape = ev.EvalShape(queries=200, videos=40, frames=6, clips=3, dim=16, queries_per_video=5)
    out = ev.evaluator_speed(shape, torch.device("cpu"), repeats=1)
    assert out.identical == shape.queries
    assert out.score_s > 0 and out.count_s > 0 and out.argsort_s > 0 and out.ranking_ratio > 0


def test_peak_memory_on_cpu_names_its_measure():
    with peak_memory(torch.device("cpu")) as peak:
        x = torch.ones(4_000_000)
        del x
    assert peak["mb"] >= 0 and "RSS" in peak["measure"]


def test_reported_rows_name_their_gpu_and_table():
    for r in REPORTED:
        assert r.source in ("reported, RTX 3090", "reported, A800") and "Table" in r.tables
        assert r.params_m and r.flops_g and r.runtime_ms
        assert set(r.runtime_ms) <= {500, 1000, 1500, 2000, 2500}
    assert {r.method for r in REPORTED} >= {"msl", "gmmformer", "gmmformer2", "arl"}


def _read_csv(path):
    rows = list(csv.DictReader(io.StringIO(path.read_text())))
    assert rows and list(rows[0]) == list(CSV_COLUMNS)
    assert all(None not in r and all(v is not None for v in r.values()) for r in rows)  # no ragged rows
    return rows


def test_profile_quick_writes_md_and_csv(capsys, tmp_path):
    (tmp_path / "profile.md").write_text("old")
    code = main(["profile", "--quick", "--method", "baseline", "--videos", "4", "8", "--out", str(tmp_path),
                 "--quiet"])
    assert code == 0, capsys.readouterr().err
    rows = _read_csv(tmp_path / "profile.csv")
    assert {r["section"] for r in rows} == {"params", "flops", "runtime", "training", "evaluator"}
    runtime = [r for r in rows if r["quantity"] == "runtime_median"]
    assert [r["condition"].split(";")[0] for r in runtime] == ["videos=4", "videos=8"]
    assert all(float(r["value"]) > 0 for r in runtime)
    qps = next(r for r in rows if r["quantity"] == "throughput")
    assert float(qps["value"]) > 0 and "sim-tiny" in qps["condition"]
    per_batch = {r["quantity"]: float(r["value"]) for r in rows if r["quantity"].endswith(("batch_seconds",
                                                                                           "batch_seconds_median"))}
    assert set(per_batch) == {"first_batch_seconds", "later_batch_seconds_median"}  # sim-tiny's epoch: 3 batches
    epoch = next(float(r["value"]) for r in rows if r["quantity"] == "epoch_seconds")
    assert 0 < per_batch["first_batch_seconds"] < epoch and 0 < per_batch["later_batch_seconds_median"] < epoch
    md = (tmp_path / "profile.md").read_text()
    for heading in ("## Parameters", "## FLOPs per query", "## Inference runtime", "## Training", "## Evaluator"):
        assert heading in md
    assert md.count("Protocol:") == 5 and "| baseline | dual-branch | measured |" in md
    assert not list(tmp_path.glob(".profile*"))  # no temporary files left behind


def test_profile_puts_reported_rows_beside_ours(capsys, tmp_path):
    code = main(["profile", "--quick", "--method", "msl", "--skip-runtime", "--skip-training", "--skip-evaluator",
                 "--out", str(tmp_path), "--quiet"])
    assert code == 0, capsys.readouterr().err
    rows = _read_csv(tmp_path / "profile.csv")
    sources = {r["source"] for r in rows if r["section"] == "params"}
    assert sources == {"measured", "reported, RTX 3090 (ARL paper Tables 3, 4)",
                       "reported, A800 (RAL paper Tables 6, 7)"}
    md = (tmp_path / "profile.md").read_text()
    assert "| msl | MS-SL | reported, A800 (RAL paper Tables 6, 7) | 4.85 |" in md


def test_a_failed_render_keeps_the_previous_files(capsys, tmp_path, monkeypatch):
    from prvr.harness.profiling import report

    for name in ("profile.md", "profile.csv"):
        (tmp_path / name).write_text("previous")
    monkeypatch.setattr(report, "render_markdown", lambda p: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        main(["profile", "--quick", "--method", "baseline", "--skip-runtime", "--skip-training", "--skip-evaluator",
              "--out", str(tmp_path), "--quiet"])
    assert [(tmp_path / n).read_text() for n in ("profile.md", "profile.csv")] == ["previous", "previous"]


@pytest.mark.parametrize("args, message", [
    (["--repeats", "0"], "--repeats must be at least 1"),
    (["--videos", "0", "5"], "--videos must be at least 1"),
    (["--method", "mls"], "unknown method 'mls': did you mean 'msl'"),
])
def test_bad_profile_options_are_one_line_errors(capsys, tmp_path, args, message):
    code = main(["profile", "--quick", "--out", str(tmp_path), "--quiet", *args])
    assert code == 2 and message in capsys.readouterr().err
