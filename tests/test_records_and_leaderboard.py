"""Run records (atomic, versioned) and the leaderboard derived from them."""

import csv
import io
import json
import re
import shlex
import shutil
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from prvr.harness.reports import leaderboard
from prvr.harness.reports.table import mean_std
from prvr.harness.base.io import UserError, atomic_path, write_json
from prvr.harness.engine.records import cpu_facts, load_record, provenance, record_path, write_record

DATA = Path(__file__).parent / "data"


def possible_recalls(sumr):
    """R@1, R@5, R@10, R@100 summing to sumr in the ratio 1:2:3:4, with what would exceed 100
    (records.METRIC_RANGES) moved to the smaller K (a record's figures must be possible)."""
    r = [sumr * w for w in (0.1, 0.2, 0.3, 0.4)]
    for i in (3, 2, 1):
        excess = max(0.0, r[i] - 100.0)
        r[i] -= excess
        r[i - 1] += excess
    return r


def fake_record(seed, sumr, method="baseline", run_name=None, relations="none", oracle=None, buckets=True,
                epochs=12):
    r = possible_recalls(sumr)
    test = {"R@1": r[0], "R@5": r[1], "R@10": r[2], "R@100": r[3], "SumR": sumr,
            "buckets": {"short": {"SumR": sumr - 1}, "medium": {"SumR": sumr}, "long": {"SumR": sumr + 1}}
            if buckets else {},
            "oracle": {"SumR": oracle} if oracle is not None else {}}
    return {"method": method, "dataset": "sim-x", "seed": seed, "backbone": "dual-branch", "relations": relations,
            "run_name": run_name or method, "tag": "", "command": "prvr-bench bench --seeds 0 1 2",
            "config": {"train": {"epochs": epochs, "patience": 5}}, "provenance": {},
            "metrics": {"val": test, "test": test}}


def store(root, rec):
    write_record(record_path(root, rec["dataset"], rec["run_name"], rec["seed"]), rec)


def test_rows_off_the_protocol_are_their_own_marked_rows_without_delta(tmp_path):
    """sim-x is unregistered, so its protocol is the dataclass budget (12 epochs, early stop 5)."""
    for seed in (0, 1):
        store(tmp_path, fake_record(seed, 150.0 + seed))
        store(tmp_path, fake_record(seed, 170.0, run_name="arl", method="arl"))
    store(tmp_path, fake_record(2, 190.0, run_name="arl", method="arl", epochs=30))  # another budget
    rows = {(r["run"], r["budget"]): r for r in leaderboard.rebuild(tmp_path, show=False)}
    on, off = rows[("arl", "12 ep / stop 5")], rows[("arl", "30 ep / stop 5")]
    assert on["SumR"] == [170.0, 170.0] and off["SumR"] == [190.0]  # never averaged together
    assert on["on_protocol"] and not off["on_protocol"]
    assert on["delta"] == pytest.approx(19.5) and off["delta"] is None
    md = (tmp_path / "leaderboard.md").read_text()
    assert "30 ep / stop 5 (off protocol)" in md
    assert "sim-x: at most 12 epochs, early stop after 5 epochs without a val SumR gain" in md


def test_records_from_older_versions_keep_loading():
    rec = load_record(DATA / "record_v1.json")
    assert rec["schema_version"] == 2
    assert rec["metrics"]["test"]["SumR"] == 161.0 and rec["metrics"]["val"]["R@1"] == 10.0
    assert rec["metrics"]["test"]["buckets"] == {} and rec["run_name"] == "baseline"
    assert leaderboard.build_rows([rec])[0]["SumR"] == [161.0]


def test_provenance_names_the_processor(tmp_path):
    """Records made on two processors round floats differently, so each names its own: the
    first processor block of cpuinfo (name, family, model) and torch's vector capability."""
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
                    "model name\t: AMD EPYC 9654\n\nprocessor\t: 1\nmodel name\t: other\n")
    facts = cpu_facts(info)
    assert facts["model"] == "AMD EPYC 9654 (family 25, model 17)"
    assert facts["capability"] and facts["machine"]
    assert "model" not in cpu_facts(tmp_path / "absent")  # no cpuinfo: the rest still there
    assert set(provenance("cpu")["cpu"]) >= {"machine", "capability"}


@pytest.mark.parametrize("content, message", [
    ("{not json", "does not parse \\(line 1"),
    ("[1, 2]", "holds list, expected an object"),
    ('{"method": "x"}', "lacks key\\(s\\) dataset, seed"),
])
def test_bad_records_get_one_line_errors(tmp_path, content, message):
    path = tmp_path / "runs" / "d" / "m" / "seed0.json"
    path.parent.mkdir(parents=True)
    path.write_text(content)
    with pytest.raises(UserError, match=message) as e:
        leaderboard.collect(tmp_path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)
    assert leaderboard.collect(tmp_path, skip_bad=True) == []


def test_atomic_write_leaves_old_file_on_failure(tmp_path):
    path = tmp_path / "r.json"
    write_json(path, {"a": 1})
    with pytest.raises(RuntimeError):
        with atomic_path(path) as tmp:
            tmp.write_text("half")
            raise RuntimeError("crash mid-write")
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temp file left behind


def test_leaderboard_means_spreads_and_significance(tmp_path):
    for seed, (b, o) in enumerate([(150.0, 160.0), (154.0, 161.0), (146.0, 158.0)]):
        store(tmp_path, fake_record(seed, b, oracle=b + 20))
        store(tmp_path, fake_record(seed, o, run_name="baseline+oracle", relations="oracle"))
    rows = leaderboard.rebuild(tmp_path, show=False)
    base, orc = rows
    assert base["run"] == "baseline" and base["n"] == 3
    assert np.mean(base["SumR"]) == pytest.approx(150.0)
    assert mean_std(base["SumR"]) == "150.0 ± 4.0"
    assert mean_std(base["oracle SumR"]) == "170.0 ± 4.0"
    assert orc["delta"] == pytest.approx(9.6667, abs=1e-3)
    assert orc["p"] is not None and orc["p"] < 0.05
    assert orc["oracle SumR"] == []  # missing metric: empty cell, not a mean over what exists
    md = (tmp_path / "leaderboard.md").read_text()
    assert "prvr-bench bench --seeds 0 1 2" in md and "| sim-x | baseline+oracle |" in md
    csv = (tmp_path / "leaderboard.csv").read_text().splitlines()
    measured = [line for line in csv[1:] if ",reported," not in line]
    assert csv[0].startswith("dataset,run,budget,on_protocol,method") and len(measured) == 2


def test_partial_metric_gives_empty_cell(tmp_path):
    store(tmp_path, fake_record(0, 150.0))
    store(tmp_path, fake_record(1, 152.0, buckets=False))
    (row,) = leaderboard.rebuild(tmp_path, show=False)
    assert row["short SumR"] == [] and row["SumR"] == [150.0, 152.0]


def test_leaderboard_of_real_committed_results_rebuilds(tmp_path):
    results = Path(__file__).parent.parent / "results"
    if not list(results.glob("runs/**/*.json")):
        pytest.skip("no committed run records")
    for folder in ("runs", "sweeps", "matrix"):  # the sweeps' and the matrix's gains are read from their reports
        shutil.copytree(results / folder, tmp_path / folder)
    leaderboard.rebuild(tmp_path, show=False)
    assert (tmp_path / "leaderboard.md").read_text() == (results / "leaderboard.md").read_text()


def test_reported_rows_are_separate_and_name_their_source(tmp_path):
    reported = leaderboard.reported_rows()
    by = {(r["method"], r["dataset"], r["features"]): r for r in reported}
    # The figures (ARL / RAL paper Table 1), each row's SumR the sum of its recalls.
    assert by[("msl", "tvr", "ResNet+I3D+RoBERTa")]["SumR"] == 172.4
    assert by[("gmmformer2", "activitynet", "I3D+RoBERTa")]["SumR"] == 154.9
    assert by[("arl", "tvr", "CLIP-L/14")]["SumR"] == 260.1
    for r in reported:
        assert abs(sum(r[k] for k in ("R@1", "R@5", "R@10", "R@100")) - r["SumR"]) < 0.15, r
        assert r["source"]
    md = leaderboard.to_markdown([], reported)
    assert "## Reported in the papers" in md and "ARL Table 1" in md
    csv_rows = list(csv.reader(io.StringIO(leaderboard.to_csv([], reported))))
    assert csv_rows[0][-1] == "source" and all(row[6] == "reported" for row in csv_rows[1:])


def test_reported_file_with_missing_key_is_a_clear_error(tmp_path):
    bad = tmp_path / "reported.yaml"
    bad.write_text("- {method: msl, dataset: tvr, SumR: 1.0}\n")
    with pytest.raises(UserError, match=r"entry 1 lacks features, source"):
        leaderboard.reported_rows(bad)


def test_files_beside_records_are_not_records_and_exports_are_marked(tmp_path):
    rec = fake_record(0, 150.0)
    rec["dataset"] = "tvr"
    rec["provenance"] = {"data": {"name": "tvr", "test": {"videos": 3, "exported_from": "sim-tvr", "simulated": True}}}
    write_record(record_path(tmp_path, "tvr", "baseline", 0), rec)
    # e.g. a detector's figure data written next to the record
    write_json(tmp_path / "runs" / "tvr" / "baseline" / "seed0.fig4.json", {"bins": [1, 2]})
    (row,) = leaderboard.rebuild(tmp_path, show=False)
    assert row["dataset"] == "tvr (export of sim-tvr)" and row["n"] == 1


def test_convergence_note_lists_runs_selected_near_the_cap(tmp_path):
    """sim-x's protocol is 12 epochs, early stop 5: a selected epoch among the last 5 (8-12,
    1-based) is listed with the spread of the last 5 validation SumRs; one before is not."""
    early = {**fake_record(0, 150.0), "best_epoch": 5, "epochs_run": 11,
             "history": [{"val": {"SumR": 100.0 + e}} for e in range(11)]}
    late = {**fake_record(1, 151.0), "best_epoch": 10, "epochs_run": 12,
            "history": [{"val": {"SumR": v}} for v in (90, 95, 99, 100, 101, 102, 103, 110.0, 111.5, 110.5, 112.25, 112)]}
    assert leaderboard.near_cap(early) is None
    assert leaderboard.near_cap(late) == {"seed": 1, "best": 11, "cap": 12, "patience": 5, "last": (110.0, 112.25)}
    for rec in (early, late):
        store(tmp_path, rec)
    leaderboard.rebuild(tmp_path, show=False)
    md = (tmp_path / "leaderboard.md").read_text()
    assert ("Convergence: 1 of the 2 runs above selected an epoch before the last `patience` epochs of their cap"
            in md)
    assert "sim-x baseline seed 1: epoch 11 of 12, last 5 val SumRs 110.0-112.2" in md
    store(tmp_path, {**late, "best_epoch": 6})
    leaderboard.rebuild(tmp_path, show=False)
    assert "each of the 2 runs above selected an epoch before the last `patience` epochs" in (
        tmp_path / "leaderboard.md").read_text()


def test_plug_in_rows_are_compared_with_their_backbones_row(tmp_path):
    def plug(seed, sumr, run_name, method, backbone, relations="none"):
        return {**fake_record(seed, sumr, method=method, run_name=run_name, relations=relations, oracle=sumr + 30 + seed
                              * (run_name == "ral@msl")), "backbone": backbone}

    for seed, (b, r, ro) in enumerate([(240.0, 250.0, 251.0), (241.0, 253.0, 250.0), (238.0, 249.0, 252.0)]):
        store(tmp_path, plug(seed, b, "msl", "msl", "msl"))
        store(tmp_path, plug(seed, r, "ral@msl", "ral", "msl"))
        store(tmp_path, plug(seed, ro, "ral@msl+oracle", "ral", "msl", "oracle"))  # no msl+oracle row: no comparison
    store(tmp_path, plug(0, 100.0, "arl", "arl", "arl"))  # its own backbone: no comparison
    rows = leaderboard.rebuild(tmp_path, show=False)
    (comp,) = leaderboard.backbone_comparisons(rows)
    assert (comp["run"], comp["against"], comp["shared"]) == ("ral@msl", "msl", [0, 1, 2])
    assert comp["delta"] == pytest.approx(11.0) and comp["paired_deltas"] == [10.0, 12.0, 11.0]
    assert comp["p"] == pytest.approx(float(stats.ttest_rel([250, 253, 249], [240, 241, 238]).pvalue))
    # oracle SumR: RAL's is SumR + 30 + seed, MS-SL's SumR + 30: +10, +13, +13
    assert comp["oracle_delta"] == pytest.approx(12.0)
    assert comp["oracle_p"] == pytest.approx(float(stats.ttest_rel([280, 284, 281], [270, 271, 268]).pvalue))
    md = (tmp_path / "leaderboard.md").read_text()
    assert "| sim-x | ral@msl | msl | 0 1 2 / 0 1 2 |" in md and "0: +10.0 1: +12.0 2: +11.0" in md
    # records without stored rankings: the fallback t-test, named, Holm-corrected over the leaderboard's two p-values
    from prvr.harness.reports.stats import fmt_p, holm
    _, oracle_holm = holm([comp["p"], comp["oracle_p"]])
    assert comp["oracle_comparison"]["p_holm"] == pytest.approx(oracle_holm)
    # ... with the paired t-test's interval (the seeds its only level)
    ci = stats.ttest_rel([280, 284, 281], [270, 271, 268]).confidence_interval(0.95)
    assert (comp["oracle_comparison"]["low"], comp["oracle_comparison"]["high"]) == pytest.approx((ci.low, ci.high))
    want = f"| +12.0 [{ci.low:+.1f}, {ci.high:+.1f}] (t-test p={fmt_p(comp['oracle_p'])}, Holm {fmt_p(oracle_holm)})"
    assert want in md
    assert comp["comparison"]["test"] == "t-test" and comp["comparison"]["low"] is not None
    assert leaderboard.backbone_row_name({"method": "ral", "backbone": "msl", "relations": "oracle",
                                          "run": "ral@msl+oracle"}) == "msl+oracle"
    assert leaderboard.backbone_row_name({"method": "xml-pr", "backbone": "xml", "relations": "sbert",
                                          "run": "xml-pr~c1"}) == "xml"


def test_a_record_names_the_code_its_run_started_with(tmp_path, monkeypatch):
    """A checkout that changes while a run trains (another commit checked out in that folder)
    must not become the revision its record names: provenance is taken before training."""
    from prvr.harness.engine import runner
    from prvr.harness.engine.config import resolve
    from prvr.harness.engine.trainer import Trainer

    checkout = {"rev": "started-with"}
    monkeypatch.setattr(runner, "provenance", lambda device: {"git_revision": checkout["rev"], "device": device})
    fit = Trainer.fit

    def fit_then_check_out_another_commit(self, *args, **kwargs):
        result = fit(self, *args, **kwargs)
        checkout["rev"] = "checked-out-later"
        return result

    monkeypatch.setattr(Trainer, "fit", fit_then_check_out_another_commit)
    record = runner.run_one(resolve("baseline", "sim-tiny", 0, ["train.epochs=1"]), tmp_path)
    stored = load_record(record_path(tmp_path, "sim-tiny", record["run_name"], 0))
    assert stored["provenance"]["git_revision"] == "started-with"
    assert stored["provenance"]["created"]  # the time the record was written


def test_a_row_of_another_world_is_compared_with_its_backbone_on_that_world(tmp_path):
    """A sweep's `ral@msl~repeat_prob0` is scored on another test set than `msl`: its Δ is against the backbone's
    run of the same world (`msl~repeat_prob0`), and with none on its world it gets no Δ at all."""
    def plug(seed, sumr, run_name, method, share):
        rec = {**fake_record(seed, sumr, method=method, run_name=run_name), "backbone": "msl"}
        rec["provenance"] = {"data": {"test": {"queries": 100, "multi_relevant_share": share}}}
        return rec

    for seed in (0, 1):
        store(tmp_path, plug(seed, 240.0 + seed, "msl", "msl", 0.1))
        store(tmp_path, plug(seed, 260.0 + seed, "ral@msl~repeat_prob0", "ral", 0.0))
        store(tmp_path, plug(seed, 270.0 + seed, "ral@msl~repeat_prob1", "ral", 0.3))
    store(tmp_path, plug(0, 250.0, "msl~repeat_prob0", "msl", 0.0))
    store(tmp_path, plug(1, 252.0, "msl~repeat_prob0", "msl", 0.0))
    rows = leaderboard.rebuild(tmp_path, show=False)
    found = {c["run"]: c for c in leaderboard.backbone_comparisons(rows)}
    assert set(found) == {"ral@msl~repeat_prob0"}  # repeat_prob1 has no msl run on its world
    assert found["ral@msl~repeat_prob0"]["against"] == "msl~repeat_prob0"
    assert found["ral@msl~repeat_prob0"]["paired_deltas"] == [10.0, 9.0]


@pytest.mark.parametrize("cell, mark", [
    ({"delta": 5.4, "low": -0.6, "high": 13.9, "p": 0.001, "test": "randomization", "p_holm": 0.045}, "°"),
    ({"delta": 5.4, "low": 0.6, "high": 13.9, "p": 0.001, "test": "randomization", "p_holm": 0.045}, "*"),
    ({"delta": -3.4, "low": -6.9, "high": -0.2, "p": 0.001, "test": "randomization", "p_holm": 0.045}, "*"),
    ({"delta": 66.3, "low": None, "high": None, "p": 0.003, "test": "t-test", "p_holm": 0.041}, "*"),
    ({"delta": 5.4, "low": 0.6, "high": 13.9, "p": 0.04, "test": "randomization", "p_holm": 0.08}, ""),
])
def test_the_star_claims_only_what_the_interval_also_says(cell, mark):
    """A Holm p below 0.05 earns * only where the cell's interval (which resamples the seeds too)
    excludes 0; where the interval holds 0 the cell says so with °, no claim."""
    text = leaderboard.fmt_comparison(cell)
    assert text.endswith(")" + mark) and text.count("*") + text.count("°") == len(mark), text


def test_committed_comparison_tables_cover_every_shared_seed():
    """Each committed results/compare table is made again whenever a row gains seeds: its seeds column
    for a pair is every seed both rows have a record and rankings for (the table once showed three
    of ten seeds). The figures themselves `prvr-bench compare`, written under each table, repeats."""
    results = Path(__file__).parent.parent / "results"
    tables = sorted((results / "compare").glob("*.md"))
    if not tables:
        pytest.skip("no committed comparison tables")
    for table in tables:
        text = table.read_text()
        command = shlex.split(re.search(r"Written by `(prvr-bench compare [^`]+)`", text).group(1))
        dataset = command[command.index("--dataset") + 1]
        chosen = None
        if "--seeds" in command:
            after = command[command.index("--seeds") + 1:]
            chosen = set(after[:next((i for i, a in enumerate(after) if a.startswith("--")), len(after))])
        for line in text.splitlines():
            cells = [c.strip() for c in line.strip("|").split("|")]
            if len(cells) < 10 or cells[0] in ("A", "---"):
                continue
            have = [{p.name.split(".")[0][4:] for p in (results / "runs" / dataset / row).glob("seed*.rank.npz")
                     if (p.parent / f"{p.name.split('.')[0]}.json").is_file()} for row in cells[:2]]
            shared = have[0] & have[1] & (chosen if chosen is not None else have[0])
            assert sorted(cells[9].split(), key=int) == sorted(shared, key=int), (table.name, cells[:3], shared)
