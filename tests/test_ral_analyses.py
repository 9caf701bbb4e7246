"""RAL's analyses (paper section 4.2): R@1 of query groups by uncertainty (Fig. 3,
`prvr-bench uncertainty`, harness/cli/ral_uncertainty.py) and the M/V bucket chart (Fig. 4, written
by `prvr-bench leaderboard`, harness/reports/buckets.py)."""

import json

import numpy as np
import pytest
import torch

from prvr.harness.cli import main
from prvr.harness.engine.records import load_record, record_path, write_record
from prvr.harness.cli.ral_uncertainty import make_groups, smooth

BUCKET, GROUP = "short", 5  # sim-tiny's test split: 63 short, 8 medium, 1 long queries


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """RAL seeds 0 and 1, GMMFormer v2 seed 0 and RAL without MSRA, 1 epoch each on sim-tiny."""
    from prvr.harness.engine.config import resolve
    from prvr.harness.engine.runner import run_one

    out = tmp_path_factory.mktemp("ral_analyses")
    paths = {}
    for key, method, seed, sets, tag in (("ral0", "ral", 0, [], ""), ("ral1", "ral", 1, [], ""),
                                         ("gmm0", "gmmformer2", 0, [], ""),
                                         ("nomsra", "ral", 0, ["ral.msra=false"], "nomsra")):
        record = run_one(resolve(method, "sim-tiny", seed, ["train.epochs=1", *sets]), out, tag=tag)
        paths[key] = record_path(out, "sim-tiny", record["run_name"], seed)
    return out, paths


def independent(path):
    """(log u_q of every test query, each computed from a batch of that query alone, or None
    for a non-RAL run; labelled ranks from score_matrices' fused matrix and compute_ranks)."""
    from prvr.datasets.loader import Batcher
    from prvr.harness.engine.evaluate import compute_ranks, score_matrices
    from prvr.harness.cli.reevaluate import StoredRun
    from prvr.harness.base.registry import DATASETS

    run = StoredRun(path, "cpu")
    data = DATASETS.get(run.cfg.dataset).load(run.cfg)
    split, batcher = data["test"], Batcher(data["test"], run.cfg.data)
    model = run.model(data)
    fused = score_matrices(model, split, batcher, run.device, run.cfg.eval.chunk, ["fused"])["fused"]
    ranks = compute_ranks(lambda s, e: fused[s:e], split.num_queries, split.labels())["labelled"]
    log_u = None
    if getattr(model, "text_head", None) is not None:
        with torch.no_grad():
            log_u = []
            for q in range(split.num_queries):
                qb = batcher.queries(np.array([q])).to(run.device)
                _, log_sigma = model.text_head(model.tokens(qb.tokens, qb.token_mask), qb.token_mask)
                log_u.append(float(log_sigma.mean()))
        log_u = np.array(log_u)
    return log_u, ranks, split, run.record


def r1(ranks):
    return 100.0 * np.mean(ranks <= 1)


def test_uncertainty_groups_are_sorted_and_their_r1_is_the_evaluators(runs, tmp_path, capsys):
    from prvr.harness.engine.evaluate import bucket_of

    _, p = runs
    out = tmp_path / "report"
    assert main(["uncertainty", "--run", str(p["ral0"]), str(p["ral1"]), "--against", str(p["gmm0"]),
                 "--bucket", BUCKET, "--group", str(GROUP), "--out", str(out)]) == 0
    assert "ral on sim-tiny: 12 groups of 5 short-bucket queries (3 dropped)" in capsys.readouterr().out
    report = json.loads((out / "uncertainty_sim-tiny_ral.json").read_text())
    assert (out / "uncertainty_sim-tiny_ral.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "uncertainty_sim-tiny_ral.md").read_text()
    assert "| group | uncertainty | ral R@1 | gmmformer2 R@1 |" in md
    assert not list(out.glob(".*.tmp"))
    assert report["command"].startswith("prvr-bench uncertainty --run ") and str(tmp_path) not in report["command"]

    ral = [independent(p["ral0"]), independent(p["ral1"])]
    _, gmm_ranks, _, gmm_record = independent(p["gmm0"])
    split = ral[0][2]
    selected = np.flatnonzero(bucket_of(split.moment_fraction()) == BUCKET)
    assert report["queries_in_bucket"] == len(selected) == 63
    assert (report["groups_per_seed"], report["dropped"], report["seeds"]) == (12, 3, [0, 1])
    assert [r["run"] for r in report["runs"]] == ["ral", "gmmformer2"]
    for s, (log_u, ranks, _, record) in enumerate(ral):
        # the evaluator's ranks are the record's: the same checkpoint, the same machine
        assert r1(ranks) == pytest.approx(record["metrics"]["test"]["R@1"])
        kept = np.concatenate([g["queries"][s] for g in report["groups"]])
        assert len(set(kept)) == 60 and set(kept) <= set(selected.tolist())
        assert sorted(set(selected.tolist()) - set(kept)) == sorted(  # the dropped: the 3 most uncertain
            selected[np.argsort(log_u[selected], kind="stable")][-3:].tolist())
        assert np.all(np.diff(log_u[kept]) >= -1e-6)  # consecutive groups of the queries sorted by u_q
        for g in report["groups"]:
            q = np.array(g["queries"][s])
            assert len(q) == GROUP
            assert g["uncertainty_per_seed"][s] == pytest.approx(np.exp(log_u[q].mean()), rel=1e-4)
            assert g["R@1_per_seed"]["ral"][s] == pytest.approx(r1(ranks[q]))
            assert g["R@1_per_seed"]["gmmformer2"][s] == pytest.approx(r1(gmm_ranks[q]))
    assert r1(gmm_ranks) == pytest.approx(gmm_record["metrics"]["test"]["R@1"])
    for g in report["groups"]:
        for run in ("ral", "gmmformer2"):
            assert g["R@1"][run] == pytest.approx(np.mean(g["R@1_per_seed"][run]))
        assert g["uncertainty"] == pytest.approx(np.exp(np.mean(np.log(g["uncertainty_per_seed"]))))
    per_seed_sorted = [[g["uncertainty_per_seed"][s] for g in report["groups"]] for s in (0, 1)]
    assert all(np.all(np.diff(u) >= -1e-6) for u in per_seed_sorted)
    assert report["overall"]["ral"] == pytest.approx(np.mean([g["R@1"]["ral"] for g in report["groups"]]))


def test_uncertainty_defaults_to_the_medium_bucket_and_the_records_folder(runs, capsys):
    _, p = runs
    assert main(["uncertainty", "--run", str(p["ral0"]), "--group", "3", "--smooth", "1"]) == 0
    report = json.loads((p["ral0"].parent / "uncertainty_sim-tiny_ral.json").read_text())
    assert (report["bucket"], report["bounds"], report["queries_in_bucket"]) == ("medium", [0.2, 0.4], 8)
    assert (report["groups_per_seed"], report["dropped"]) == (2, 2)
    assert [r["run"] for r in report["runs"]] == ["ral"]
    assert load_record(p["ral0"])["method"] == "ral"  # the report beside it is no record


@pytest.mark.parametrize("key, args, message", [
    ("nomsra", [], "its model has no MSRA (ral.msra=false), so no sigma^q to group queries by"),
    ("gmm0", [], "--run takes runs of method ral; "),
    ("ral0", ["--group", "9"], "the medium M/V bucket (0.2, 0.4] of the test split holds 8 queries, fewer than one "
                               "group of 9"),
    ("ral0", ["--group", "0"], "--group must be a whole number >= 1, got 0"),
])
def test_uncertainty_refusals_are_one_line(runs, capsys, key, args, message):
    _, p = runs
    assert main(["uncertainty", "--run", str(p[key]), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.strip().count("\n") == 0


def test_a_ral_run_given_as_against_and_as_run_is_refused(runs, capsys):
    _, p = runs
    assert main(["uncertainty", "--run", str(p["ral0"]), "--against", str(p["ral0"])]) == 2
    assert "is given twice" in capsys.readouterr().err
    assert main(["uncertainty", "--run", str(p["ral0"]), "--against", str(p["ral1"])]) == 2
    assert "is a seed of the --run run ral itself" in capsys.readouterr().err


@pytest.mark.parametrize("padding", ["masked", "code"])
def test_query_uncertainty_pools_as_the_run_was_trained(padding):
    """sigma^q of a run trained with ral.pool_padding=code attends over every padded token row
    (the reference's unmasked pooling of a lone query); the default over the real tokens only."""
    from types import SimpleNamespace

    from prvr.harness.cli.ral_uncertainty import query_log_uncertainty
    from prvr.methods.backbones.ral import GaussianHead, RalModel

    torch.manual_seed(0)
    head = GaussianHead(8)
    tokens, mask = torch.randn(5, 6, 8), torch.arange(6)[None, :] < torch.tensor([[2], [6], [3], [1], [4]])
    model = SimpleNamespace(settings=SimpleNamespace(pool_padding=padding), text_head=head)
    model.query_gaussians = lambda *a: RalModel.query_gaussians(model, *a)  # the model's own reading
    got = query_log_uncertainty(model, {"ral.tokens": tokens, "ral.token_mask": mask}, batch=2)
    with torch.no_grad():
        masked = np.array([float(head(tokens[i : i + 1, : int(mask[i].sum())], mask[i : i + 1, : int(mask[i].sum())])[1].mean())
                           for i in range(5)])  # each query alone, its padding cut off
        every = head(tokens, mask, torch.ones_like(mask))[1].mean(-1).numpy()
    want, other = (masked, every) if padding == "masked" else (every, masked)
    assert got == pytest.approx(want, abs=1e-5)
    assert not np.allclose(got, other, atol=1e-3)  # the two readings differ on padded queries


def test_groups_sort_ascending_and_drop_the_last_partial_group():
    log_u = np.array([5.0, 0.0, 3.0, 1.0, 4.0, 2.0, 9.0])
    groups, dropped = make_groups(log_u, np.array([0, 1, 2, 3, 4, 5]), 4)
    assert groups.tolist() == [[1, 3, 5, 2]] and dropped == 2
    groups, dropped = make_groups(log_u, np.array([0, 1, 2, 3, 4, 5]), 2)
    assert groups.tolist() == [[1, 3], [5, 2], [4, 0]] and dropped == 0
    assert smooth(np.array([0.0, 3.0, 6.0, 3.0]), 3).tolist() == [1.5, 3.0, 4.0, 4.5]
    assert smooth(np.array([1.0, 2.0]), 1).tolist() == [1.0, 2.0]


# ----------------------------------------------------------------------------- M/V bucket chart
def bucket_record(seed, run="baseline", r1s=(10.0, 20.0, 30.0), sums=(150.0, 200.0, 250.0), ns=(40, 7, 3),
                  epochs=12, nonfinite=None):
    buckets = {b: {**({"R@1": r} if r is not None else {}), "SumR": s, "n": n}
               for b, r, s, n in zip(("short", "medium", "long"), r1s, sums, ns)}
    test = {"R@1": 1.0, "R@5": 2.0, "R@10": 3.0, "R@100": 4.0, "SumR": 10.0, "buckets": buckets}
    rec = {"method": run, "dataset": "sim-x", "seed": seed, "run_name": run, "command": f"prvr-bench run --seed {seed}",
           "config": {"train": {"epochs": epochs, "patience": 5}}, "provenance": {},
           "metrics": {"val": test, "test": test}}
    if nonfinite:
        rec["nonfinite"] = nonfinite
    return rec


def test_bucket_table_means_spreads_and_counts_and_rebuild_writes_it(tmp_path):
    from prvr.harness.reports import leaderboard

    records = [bucket_record(0), bucket_record(1, r1s=(12.0, 24.0, 30.0), sums=(160.0, 210.0, 250.0)),
               bucket_record(0, "arl", r1s=(30.0, 40.0, 50.0)),
               bucket_record(1, "arl", r1s=(32.0, 44.0, None), ns=(40, 7, 2)),  # a seed lacks long R@1
               bucket_record(2, "arl", r1s=(99.0, 99.0, 99.0), nonfinite={"epoch": 0, "step": 1}),  # diverged
               bucket_record(0, "msl", epochs=30)]  # off the protocol
    for r in records:
        write_record(record_path(tmp_path, "sim-x", r["run_name"], r["seed"]), r)
    leaderboard.rebuild(tmp_path, show=False)
    md = (tmp_path / "buckets" / "sim-x.md").read_text()
    assert ("| run | seeds | short R@1 | medium R@1 | long R@1 | short SumR | medium SumR | long SumR | "
            "queries (short / medium / long) |") in md
    assert "| baseline | 2 (0 1) | 11.0 ± 1.4 | 22.0 ± 2.8 | 30.0 ± 0.0 | 155.0 ± 7.1 | 205.0 ± 7.1 | 250.0 ± 0.0 | " \
           "40 / 7 / 3 |" in md
    assert "| arl | 2 (0 1) | 31.0 ± 1.4 | 42.0 ± 2.8 |  | 150.0 ± 0.0 | 200.0 ± 0.0 | 250.0 ± 0.0 | 40 / 7 / 2-3 |" in md
    assert "99.0" not in md and "msl" not in md  # diverged and off-protocol runs are left out
    assert "Test queries per bucket: short 40, medium 7, long 2-3 (a range" in md
    assert md.index("| baseline |") < md.index("| arl |")  # the leaderboard's order: baseline first
    assert (tmp_path / "buckets" / "sim-x.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list((tmp_path / "buckets").glob(".*.tmp"))


def test_records_without_bucket_metrics_make_no_chart(tmp_path):
    from prvr.harness.reports.buckets import write_reports

    rec = bucket_record(0)
    rec["metrics"]["test"]["buckets"] = {}
    assert write_reports(tmp_path, [rec]) == [] and not (tmp_path / "buckets").exists()


def test_thirds_are_the_means_of_consecutive_groups():
    from prvr.harness.cli.ral_uncertainty import report_markdown, thirds

    groups = [{"index": i, "uncertainty": 0.5 + i / 100, "R@1": {"ral": float(i), "msl": 2.0 * i}} for i in range(7)]
    report = {"runs": [{"run": "ral", "role": "ral", "seeds": [0]}, {"run": "msl", "role": "against", "seeds": [0]}],
              "groups": groups, "overall": {"ral": 3.0, "msl": 6.0}, "run": "ral", "dataset": "sim-x", "split": "test",
              "bucket": "medium", "bounds": [0.2, 0.4], "queries_in_bucket": 35, "group": 5, "dropped": 0,
              "command": ""}
    # groups 0-2, 3-4, 5-6
    assert thirds(report) == {"ral": [1.0, 3.5, 5.5], "msl": [2.0, 7.0, 11.0]}
    assert "least to most uncertain): ral 1.0 / 3.5 / 5.5; msl 2.0 / 7.0 / 11.0." in report_markdown(report, "x.png")
