"""The papers' figures with any metric keys (methods/reported.yaml) and the tables driven by the
metrics their rows carry: a dataset whose runs localize gets the VCMR / SVMR / VR columns in the
leaderboard and in the ablation tables; a PRVR-only one is shown as before; the SBERT-PR paper's
figures are every figure of its Tables 1-8, checked against the paper's own repetitions."""

import csv
import io
from pathlib import Path

import pytest

from prvr.harness.reports import leaderboard
from prvr.harness.cli.ablate import resolve_row, paper_rows
from prvr.harness.cli import main
from prvr.harness.engine.config import resolve
from prvr.harness.engine.sections import EvalConfig
from prvr.harness.base.io import UserError
from prvr.harness.engine.records import record_path, write_record
from prvr.harness.base.registry import load_all
from prvr.harness.engine.runner import run_name
from prvr.harness.engine.vcmr import SVMR_KS, VCMR_KS, metric_name
from prvr.methods.recipes import TABLES

VCMR = [f"VCMR-{t} R@{k}" for t in ("0.5", "0.7") for k in (1, 10, 100)]
SVMR = [f"SVMR-{t} R@{k}" for t in ("0.5", "0.7") for k in (1, 5)]
PAPER_COLUMNS = [*VCMR, "SVMR-0.5 R@5", "SVMR-0.7 R@5", "R@100"]  # Tables 5-8: VCMR, SVMR R@5, VR R@100


def metrics(sumr: float, moment: float | None = None) -> dict:
    """A test block: R@K = SumR / 10 x (1, 2, 3, 4); with `moment`, every VCMR / SVMR key = moment."""
    r1 = sumr / 10
    block = {"R@1": r1, "R@5": 2 * r1, "R@10": 3 * r1, "R@100": 4 * r1, "SumR": sumr, "buckets": {}, "oracle": {}}
    if moment is not None:
        block.update({k: moment for k in VCMR + SVMR}, **{"VCMR SumR": 6 * moment, "VCMR n": 10})
    return block


def fake_record(dataset: str, method: str, seed: int, sumr: float, moment: float | None = None) -> dict:
    block = metrics(sumr, moment)
    backbone = "dual-branch" if method == "baseline" else method.split("-")[0]  # a registered backbone
    return {"method": method, "dataset": dataset, "seed": seed, "backbone": backbone,
            "relations": "none", "run_name": method, "tag": "", "command": f"prvr-bench bench --method {method}",
            "config": {"train": {"epochs": 12, "patience": 5}}, "provenance": {},
            "metrics": {"val": block, "test": block}}


def store(root: Path, rec: dict) -> None:
    write_record(record_path(root, rec["dataset"], rec["run_name"], rec["seed"]), rec)


# ----------------------------------------------------------------------------- metric metadata
def test_the_tables_moment_keys_are_the_evaluators():
    """The leaderboard keeps the evaluator's defaults without importing it: they must agree."""
    assert leaderboard.MOMENT_DEFAULTS == {"VCMR": VCMR_KS, "SVMR": SVMR_KS}
    assert leaderboard.MOMENT_TIOUS == tuple(EvalConfig().vcmr_tious)
    cols = leaderboard.moment_columns([{metric_name("VCMR", 0.5, 1): 1.0}])
    assert [c.name for c in cols] == [*VCMR, *SVMR, "VR R@1", "VR R@5", "VR R@10", "VR R@100"]
    assert [c.path for c in cols[-4:]] == [("R@1",), ("R@5",), ("R@10",), ("R@100",)]  # VR = the video ranks
    assert all(c.decimals == 2 for c in cols)
    # another tIoU the records carry joins in its place; no moment key, no moment columns
    extra = leaderboard.moment_columns([{"VCMR-0.3 R@1": 1.0, "SVMR-0.9 R@5": 1.0}])
    assert [c.name for c in extra][:4] == ["VCMR-0.3 R@1", "VCMR-0.5 R@1", "VCMR-0.5 R@10", "VCMR-0.5 R@100"]
    assert "SVMR-0.9 R@5" in [c.name for c in extra] and leaderboard.moment_columns([metrics(150.0)]) == ()


# ----------------------------------------------------------------------------- the leaderboard
def test_a_dataset_whose_runs_localize_gets_the_moment_table(tmp_path):
    """sim-y: xml (moment figures 1, 2, 3 over seeds 0-2) and xml-pr (2, 4, 3); sim-x: PRVR only."""
    for seed, (a, b) in enumerate([(1.0, 2.0), (2.0, 4.0), (3.0, 3.0)]):
        store(tmp_path, fake_record("sim-y", "xml", seed, 150.0, moment=a))
        store(tmp_path, fake_record("sim-y", "xml-pr", seed, 160.0, moment=b))
        store(tmp_path, fake_record("sim-x", "baseline", seed, 140.0 + seed))
    rows = {(r["dataset"], r["run"]): r for r in leaderboard.rebuild(tmp_path, show=False)}
    pr, base = rows[("sim-y", "xml-pr")], rows[("sim-x", "baseline")]
    assert pr["localizes"] and not base["localizes"]
    assert pr["VCMR-0.7 R@100"] == [2.0, 4.0, 3.0] and pr["VCMR SumR"] == [12.0, 24.0, 18.0]
    assert pr["VR R@1"] == [16.0] * 3 and base["VCMR-0.5 R@1"] == []  # no moments: an empty cell
    # Δ VCMR SumR vs xml: paired differences 6, 12, 0 -> mean 6, t = 6 / (6 / sqrt 3), 2 dof -> p = 0.225
    assert pr["vcmr_delta"] == pytest.approx(6.0) and pr["vcmr_p"] == pytest.approx(0.2254, abs=1e-4)
    md = (tmp_path / "leaderboard.md").read_text()
    moment = md.split("## Moment retrieval")[1].split("## Reported in the papers")[0]
    header = ("| dataset | run | budget | seeds | " + " | ".join([*VCMR, *SVMR]) + " | VR R@1 | VR R@5 | VR R@10 | "
              "VR R@100 | VCMR SumR | Δ VCMR SumR vs xml |")
    assert header in moment
    cells = " | ".join(["3.00 ± 1.00"] * 10 + ["16.00 ± 0.00", "32.00 ± 0.00", "48.00 ± 0.00", "64.00 ± 0.00"])
    # its interval: 6 +- t(0.975, 2) x 6 / sqrt 3 = 6 +- 4.303 x 3.464 = [-8.90, +20.90]
    assert (f"| sim-y | xml-pr | 12 ep / stop 5 | 3 | {cells} | 18.00 ± 6.00 | +6.00 [-8.90, +20.90] (t-test p=0.225, "
            "Holm 0.225) |") in moment
    assert "| sim-y | xml | 12 ep / stop 5 | 3 | 2.00 ± 1.00 |" in moment and "sim-x" not in moment
    # the PRVR table above still holds every row, sim-x's as before
    assert "| sim-x | baseline | 12 ep / stop 5 | dual-branch | none | 3 |" in md
    table = list(csv.reader(io.StringIO((tmp_path / "leaderboard.csv").read_text())))
    head = table[0]
    assert head[-1] == "source" and "VCMR-0.5 R@1 mean" in head and "delta VCMR SumR vs xml" in head
    pr_row = next(r for r in table if r[1] == "xml-pr")
    assert pr_row[head.index("VCMR SumR mean")] == "18.000" and pr_row[head.index("delta VCMR SumR vs xml")] == "6.000"


def test_a_prvr_only_leaderboard_is_shown_as_before(tmp_path):
    for seed in (0, 1):
        store(tmp_path, fake_record("sim-x", "baseline", seed, 150.0 + seed))
    rows = leaderboard.build_rows(leaderboard.collect(tmp_path))
    assert not any(r["localizes"] for r in rows) and "VCMR SumR" not in rows[0]
    prvr = leaderboard.reported_rows()
    md = leaderboard.to_markdown(rows, prvr)
    assert "Moment retrieval" not in md and "VCMR" not in md
    assert ("| dataset | run | budget | backbone | relations | seeds | best / run epochs | R@1 | R@5 | R@10 | R@100 | "
            "SumR | short SumR | medium SumR | long SumR | oracle SumR | Δ SumR vs baseline |") in md
    assert leaderboard.to_csv(rows, prvr).splitlines()[0] == (
        "dataset,run,budget,on_protocol,method,backbone,relations,tag,n_seeds,seeds,best/run epochs,R@1 mean,R@1 std,"
        "R@5 mean,R@5 std,R@10 mean,R@10 std,R@100 mean,R@100 std,SumR mean,SumR std,short SumR mean,short SumR std,"
        "medium SumR mean,medium SumR std,long SumR mean,long SumR std,oracle SumR mean,oracle SumR std,"
        "delta SumR vs baseline,low,high,p,test,p Holm,against,source")


def test_reported_moment_rows_are_marked_reported_with_their_table():
    moments = leaderboard.reported_moment_rows()
    assert {r["source"] for r in moments} == {"SBERT-PR Table 5", "SBERT-PR Table 6"} and len(moments) == 12
    md = leaderboard.to_markdown([], leaderboard.reported_rows() + moments)
    section = md.split("## Reported in the papers")[1]
    # the figures: Table 5 (Charades-STA, Phi_np-vp, theta 0.7) and Table 6 (DiDeMo, Phi_vp, theta 0.5)
    assert ("| charades-sta | xml | XML | test | ResNet-152+TEF+RoBERTa | 0.30 | 1.67 | 6.85 | 0.22 | 0.78 | 3.31 | "
            "51.75 | 27.85 | 26.59 | SBERT-PR Table 5 |") in section
    assert "| charades-sta | xml-pr | +PR | test | ResNet-152+TEF+RoBERTa | 0.48 | 1.80 | 7.80 |" in section
    assert "| didemo | xml | XML | test | ResNet-152+TEF+RoBERTa | 1.74 | 9.15 | 32.26 |" in section
    assert "| didemo | xml-sl-pr | +SL+PR | test | ResNet-152+TEF+RoBERTa | 2.21 | 11.34 | 37.88 |" in section
    assert "| SVMR-0.5 R@5 | SVMR-0.7 R@5 | VR R@100 | source |" in section  # only the columns the paper fills
    rows = list(csv.reader(io.StringIO(leaderboard.to_csv([], moments))))
    assert all(r[6] == "reported" and r[-1].startswith("SBERT-PR Table") for r in rows[1:])
    assert "xml-pr (reported, +PR (C = 1))" in [r[1] for r in rows]
    # the terminal's short view is the PRVR one: the moment figures stay in the markdown
    runs = leaderboard.build_rows([fake_record("charades-sta", "xml", 0, 150.0, moment=1.0)])
    assert [cells[1] for cells, _ in leaderboard.terminal_rows(runs, moments)] == ["xml"]


def test_the_xml_prvr_rows_both_seeds_report():
    by = {(r["method"], r["dataset"]): r for r in leaderboard.reported_rows()}
    tvr, anet = by[("xml", "tvr")], by[("xml", "activitynet")]
    assert (tvr["SumR"], anet["SumR"]) == (155.1, 128.4) and tvr["source"] == "ARL Table 1; RAL Table 1"
    assert [tvr[k] for k in ("R@1", "R@5", "R@10", "R@100")] == [10.0, 26.5, 37.3, 81.3]


# ----------------------------------------------------------------------------- the SBERT-PR figures
def _paper() -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in leaderboard.paper_figures():
        if r["source"].startswith("SBERT-PR"):
            out.setdefault(r["source"].removeprefix("SBERT-PR Table "), []).append(r)
    return out


def _figures(row: dict, keys=PAPER_COLUMNS) -> list[float]:
    return [row[k] for k in keys]


def test_every_table_of_the_sbert_paper_is_there_with_its_split_and_conditions():
    paper = _paper()
    assert {n: len(rows) for n, rows in paper.items()} == {"1": 13, "2": 13, "3": 13, "4": 13, "5": 6, "6": 6,
                                                           "7": 14, "8": 14}
    for n, rows in paper.items():
        assert {r["table"] for r in rows} == {int(n)}
        assert {r["split"] for r in rows} == ({"val"} if n in "34" else {"test"})
        assert {r["dataset"] for r in rows} == ({"charades-sta"} if n in "1257" else {"didemo"})
        keys = VCMR if n in "1234" else PAPER_COLUMNS
        assert all(sorted(k for k in r if leaderboard.is_metric_key(k)) == sorted(keys) for r in rows), n
        assert all(r.get("leaderboard", True) is False for r in rows) == (n not in "56")
    grid = [(r["phi"], r["theta"]) for r in paper["1"][1:]]
    assert grid == [(p, t) for p in ("sent", "vp", "np-vp") for t in (0.5, 0.6, 0.7, 0.8)]
    assert [r["condition"] for r in paper["5"]] == ["XML", "+PR", "+PR (C = 1)", "+SL", "+SL+PR", "+SL+PR (C = 1)"]
    assert [r["method"] for r in paper["6"]] == ["xml", "xml-pr", "xml-pr", "xml-sl", "xml-sl-pr", "xml-sl-pr"]
    # Tables 7-8: the rows whose condition cannot be read say so
    for n in ("7", "8"):
        unread = [r for r in paper[n] if "cannot be read" in r.get("note", "")]
        assert [r["label"] for r in unread] == [*(f"+PR group, row {i}" for i in (3, 4, 5)),
                                                *(f"+SL+PR group, row {i}" for i in range(3, 8)), "last row"]
        assert all("terms" not in r for r in unread)


def test_the_paper_agrees_with_itself():
    """Transcription check: the figures the paper prints twice are equal here too."""
    paper = _paper()
    for grid, condition in (("1", "+PR"), ("2", "+SL+PR")):
        by = {r["label"]: r for r in paper[grid]}
        main = {r["label"]: r for r in paper["5"]}
        assert _figures(by["np-vp 0.7"], VCMR) == _figures(main[condition], VCMR)  # Table 5's detector setting
        assert _figures(by["XML"], VCMR) == _figures(main["XML"], VCMR)
    assert _figures(paper["3"][0], VCMR) == _figures(paper["4"][0], VCMR)  # DiDeMo val's XML
    for appendix, main in (("7", "5"), ("8", "6")):
        rows = {r["label"]: r for r in paper[appendix]}
        for r in paper[main]:
            if r["label"] != "+SL":  # Tables 7-8 have no +SL row
                assert _figures(rows[r["label"]]) == _figures(r), (appendix, r["label"])
    # the figures the issue quotes
    t5, t6 = ({r["label"]: r for r in paper[n]} for n in ("5", "6"))
    assert _figures(t5["XML"], VCMR[:3]) == [0.3, 1.67, 6.85] and _figures(t5["+PR"], VCMR[:3]) == [0.48, 1.8, 7.8]
    assert _figures(t6["XML"], VCMR[:3]) == [1.74, 9.15, 32.26]
    assert _figures(t6["+SL+PR"], VCMR[:3]) == [2.21, 11.34, 37.88]


@pytest.mark.parametrize("text, message", [
    ("- {method: m, dataset: d, features: f, source: s, R@1: 1, R@5: 1, R@10: 1, R@100: 1, SumR: 4, R@ 1: 2}\n",
     r"entry 1 has unknown key\(s\) R@ 1"),
    ("- {method: m, dataset: d, features: f, source: s, columns: [VCMR-0.5 R@1, R@100], figures: [0.3]}\n",
     r"entry 1 has 1 figures for 2 columns"),
    ("- {method: m, dataset: d, features: f, source: s, VCMR-0.5 R@1: n/a}\n", r"entry 1 figure\(s\) VCMR-0.5 R@1"),
    ("- {source: s, features: f, rows: {a: 1}}\n", r"entry 1 key 'rows' must be a list"),
    ("- {source: s, features: f, columns: [VCMR-0.5 R@1], rows: [{method: m, figures: [1.0]}]}\n",
     r"entry 1 row 1 lacks dataset; every entry needs method, dataset, features, source"),
    ("- {method: m, dataset: d, features: f, source: s, VCMR-0.5 R@1: 1.0, columns: [VCMR-0.5 R@1], figures: [2]}\n",
     r"gives 'VCMR-0.5 R@1' twice"),
])
def test_bad_reported_entries_get_one_line_errors(tmp_path, text, message):
    path = tmp_path / "reported.yaml"
    path.write_text(text)
    with pytest.raises(UserError, match=message) as e:
        leaderboard.paper_figures(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


# ----------------------------------------------------------------------------- the ablation tables
def test_each_sbert_table_is_registered_with_the_papers_rows_beside_ours():
    load_all()
    for (method, name), grid in (((m, n), TABLES[(m, n)]) for m, n in
                                 (("xml-pr", "1"), ("xml-sl-pr", "2"), ("xml-pr", "3"), ("xml-sl-pr", "4"))):
        source, paper = paper_rows(grid)
        assert [p.label for p in paper] == [r.label for r in grid.rows]  # every paper row stands beside ours
        assert source.startswith(f"SBERT-PR Table {name}, ") and grid.reference == "XML"
        assert grid.rows[0].overrides == ("loss.condition=xml", "relations.name=none")
        assert grid.rows[6].overrides == ("relations.sbert.phi=vp", "relations.sbert.theta=0.6")
        for row in grid.rows[:2]:  # XML and a detector row resolve
            resolve(method, "sim-tiny", 0, list(row.overrides))
    for n in ("7", "8"):
        for method, condition in (("xml-pr", "+PR"), ("xml-sl-pr", "+SL+PR")):
            table = TABLES[(method, n)]
            source, paper = paper_rows(table)
            ours = {r.label for r in table.rows}
            assert {p.label for p in paper} & ours == {condition, f"{condition} (C = 1)"}
            assert len(paper) == 14 and "Phi " in source  # the whole paper table, its detector setting named


@pytest.mark.parametrize("method,name", [("xml-pr", "1"), ("xml-sl-pr", "2"), ("xml-pr", "3"), ("xml-sl-pr", "4")])
def test_the_xml_row_of_tables_1_to_4_is_the_plain_xml_run(tmp_path, method, name):
    """The XML row is a home row: its own overrides (condition `xml`, no detector) give `xml`'s
    config on every dataset but for the method's name, with the same objective and model, so the
    row is trained and read as the plain `xml` run (the leaderboard's), never again as a copy."""
    from prvr.harness.base.registry import METHODS

    load_all()
    table = TABLES[(method, name)]
    row = table.rows[0]
    assert row.label == "XML" and row.home
    for dataset in ("sim-charades", "sim-didemo", "sim-tiny"):
        own = resolve(method, dataset, 0, list(row.overrides)).to_dict()
        plain = resolve("xml", dataset, 0).to_dict()
        assert own.pop("method") == method and plain.pop("method") == "xml"
        assert own == plain
    a, b = METHODS.get(method), METHODS.get("xml")
    assert (a.objective, a.backbone, a.needs, a.wrap) == (b.objective, b.backbone, b.needs, b.wrap)
    cfg = resolve_row(table, row, "sim-tiny", 2, [], None)
    assert (cfg.method, cfg.seed, run_name(cfg, row.tag)) == ("xml", 2, "xml")
    with pytest.raises(UserError, match=r"row 'XML' of SBERT-PR Table .*relations.name=none after this command's.*'relations.sbert'"):
        resolve_row(table, row, "sim-tiny", 0, ["relations.sbert.theta=0.6"], None)
    detector = resolve_row(table, table.rows[1], "sim-tiny", 2, [], None)
    assert (detector.method, run_name(detector, table.rows[1].tag)) == (method, f"{method}~sent_0.5")
    # the table reads the stored `xml` records for its XML row
    for seed, sumr in ((0, 150.0), (1, 170.0)):
        rec = fake_record("sim-tiny", "xml", seed, sumr, moment=1.0)
        rec.update(config=resolve("xml", "sim-tiny", seed).to_dict())
        store(tmp_path, rec)
    assert main(["ablate", "--method", method, "--table", name, "--dataset", "sim-tiny", "--seeds", "0", "1",
                 "--report-only", "--out", str(tmp_path), "--quiet"]) == 0
    md = (tmp_path / "ablations" / "sim-tiny" / f"{method}_table{name}.md").read_text()
    assert next(line for line in md.splitlines() if line.startswith("| XML |")).endswith("| 2 | xml |")


@pytest.mark.parametrize("method,name", [("xml-pr", "1"), ("xml-sl-pr", "4")])
def test_the_phi_theta_row_of_the_datasets_preset_is_the_plain_run(tmp_path, method, name):
    """A Phi x theta row whose settings are the dataset's preset (np-vp 0.7 on sim-charades, vp 0.5
    on sim-didemo) changes nothing of the plain recipe, so the table reads and trains it as the plain
    run (`xml-pr`), never again as `xml-pr~np-vp_0.7`; every other row keeps its own run."""
    from prvr.harness.cli.ablate import plan_runs

    load_all()
    table = TABLES[(method, name)]
    for dataset, plain in (("sim-charades", "np-vp 0.7"), ("sim-didemo", "vp 0.5")):
        plan = plan_runs(table, dataset, [0], [], None)
        names = {p.row.label: run_name(p.cfg, p.tag) for p in plan}
        assert names[plain] == method and names["XML"] == "xml"
        assert all(n == f"{method}~{r.tag}" for r in table.rows[1:] if (n := names[r.label]) and r.label != plain)
        assert len(set(names.values())) == len(table.rows)
        row = next(p for p in plan if p.row.label == plain)
        assert row.cfg.to_dict() == resolve(method, dataset, 0).to_dict() and row.overrides == ()
    # with --tag the plain row is the plain run of that tag; its records fill the row
    plan = plan_runs(table, "sim-charades", [0, 1], [], None, "x")
    assert {run_name(p.cfg, p.tag) for p in plan if p.row.label == "np-vp 0.7"} == {f"{method}~x"}
    for seed, v in ((0, 1.0), (1, 3.0)):
        rec = fake_record("sim-charades", method, seed, 150.0, moment=v)
        rec.update(config=resolve(method, "sim-charades", seed).to_dict())
        store(tmp_path, rec)
    assert main(["ablate", "--method", method, "--table", name, "--dataset", "sim-charades", "--seeds", "0", "1",
                 "--report-only", "--out", str(tmp_path), "--quiet"]) == 0
    md = (tmp_path / "ablations" / "sim-charades" / f"{method}_table{name}.md").read_text()
    line = next(line for line in md.splitlines() if line.startswith("| np-vp 0.7 |"))
    assert line.startswith("| np-vp 0.7 | np-vp | 0.7 | 2.00 ± 1.41 |") and line.endswith(f"| 2 | {method} |")
    assert "Records trained with other settings" not in md
    assert f"(`prvr-bench ablate --method {method} --table {name} --dataset sim-charades --seeds 0 1`)" in md
    assert main(["ablate", "--method", method, "--table", name, "--dataset", "sim-charades", "--seeds", "0",
                 "--report-only", "--out", str(tmp_path), "--quiet"]) == 0  # the seeds, where not the default
    md = (tmp_path / "ablations" / "sim-charades" / f"{method}_table{name}.md").read_text()
    assert f"(`prvr-bench ablate --method {method} --table {name} --dataset sim-charades --seeds 0`)" in md
    assert next(line for line in md.splitlines() if line.startswith("| np-vp 0.7 |")).endswith(f"| 1 | {method} |")


def _records_for(out: Path, table, dataset: str, values: dict[int, dict[int, float]]) -> None:
    """Fake records of a table's first rows: each moment key = values[row][seed]."""
    for i, row in enumerate(table.rows[:2]):
        for seed in values[i]:
            cfg = resolve(table.method, dataset, seed, list(row.overrides))
            rec = fake_record(dataset, table.method, seed, 150.0, moment=values[i][seed])
            rec.update(config=cfg.to_dict(), run_name=run_name(cfg, row.tag), tag=row.tag)
            write_record(record_path(out, dataset, rec["run_name"], seed), rec)


def test_an_ablation_table_of_a_localizing_backbone_shows_the_moment_columns(tmp_path):
    load_all()
    table = TABLES[("xml-pr", "7")]
    out = tmp_path
    _records_for(out, table, "sim-tiny", {0: {0: 1.0, 1: 2.0}, 1: {0: 2.0, 1: 4.0}})
    assert main(["ablate", "--method", "xml-pr", "--table", "7", "--dataset", "sim-tiny", "--seeds", "0", "1",
                 "--report-only", "--out", str(out), "--quiet"]) == 0
    md = (out / "ablations" / "sim-tiny" / "xml-pr_table7.md").read_text()
    assert ("| VCMR-0.5 R@1 | VCMR-0.5 R@10 | VCMR-0.5 R@100 | VCMR-0.7 R@1 | VCMR-0.7 R@10 | VCMR-0.7 R@100 | "
            "SVMR-0.5 R@1 | SVMR-0.5 R@5 | SVMR-0.7 R@1 | SVMR-0.7 R@5 | VR R@1 | VR R@5 | VR R@10 | VR R@100 | "
            "Δ VCMR SumR vs +PR | seeds | run |") in md
    # "+PR (C = 1)": 2, 4 against 1, 2 -> VCMR SumR 12, 24 against 6, 12: +9.00 over 2 seeds, p = 0.205
    assert "| +PR (C = 1) | ✓ | ✓ | ✓ |  |  | ✓ | 3.00 ± 1.41 |" in md
    assert "| 15.00 ± 0.00 | 30.00 ± 0.00 | 45.00 ± 0.00 | 60.00 ± 0.00 | +9.00 (2 seeds, p=0.205) | 2 | xml-pr~c1 |" in md
    assert "| +PR without nll2 |" in md and md.count("|  | 0 | xml-pr~no_") == 4  # no records: empty cells
    reported = md.split("Reported in the paper (")[1]
    assert reported.startswith("SBERT-PR Table 7, charades-sta test, Phi np-vp, theta 0.7, ResNet-152+TEF+RoBERTa;")
    assert "| +PR (C = 1) | 0.38 | 1.24 | 6.48 | 0.22 | 0.59 | 2.96 |  | 51.83 |  | 27.47 |  |  |  | 22.58 | =" in md
    assert "| last row |" in md and "cannot be read" in md
    csv_head = (out / "ablations" / "sim-tiny" / "xml-pr_table7.csv").read_text().splitlines()[0]
    assert "VCMR-0.5 R@1 mean,VCMR-0.5 R@1 std" in csv_head and "delta VCMR SumR,p,paired seeds" in csv_head


# ral_table2.{md,csv} as the code before moment columns wrote them, from the records of
# test_a_prvr_ablation_table_is_written_as_before (OUT: the results folder); since then the
# base row reads the backbone's own run (`gmmformer2`), not `ral~base`, and the command names
# its seeds where they are not the default 0 1 2; and the paper's table, written by `markdown_table` since
# round four, has its empty first header cell as the runs' table has it (`|  |`, was `| |`).
RAL_TABLE2_MD = """# RAL Table 2: model structure on sim-tiny

Test split, mean ± std over seeds; from the run records under OUT/runs/sim-tiny/ (`prvr-bench ablate --method ral --table 2 --dataset sim-tiny --seeds 0 1`).

|  | MSRA | CSA | R@1 | R@5 | R@10 | R@100 | SumR | Δ SumR vs base | seeds | run |
|---|---|---|---|---|---|---|---|---|---|---|
| base |  |  | 15.2 ± 0.3 | 30.4 ± 0.6 | 45.6 ± 0.8 | 60.8 ± 1.1 | 152.0 ± 2.8 |  | 2 | gmmformer2 |
| msra | ✓ |  | 15.8 ± 0.3 | 31.6 ± 0.6 | 47.4 ± 0.8 | 63.2 ± 1.1 | 158.0 ± 2.8 | +6.0 (2 seeds, p=0.000) | 2 | ral~msra |
| csa |  | ✓ |  |  |  |  |  |  | 0 | ral~csa |
| full | ✓ | ✓ |  |  |  |  |  |  | 0 | ral |

Reported in the paper (RAL paper Table 2, GMMFormer v2 on TVR, ResNet+I3D+RoBERTa; not reproduced here, another dataset and protocol):

|  | R@1 | R@5 | R@10 | R@100 | SumR |
|---|---|---|---|---|---|
| base | 16.2 | 37.6 | 48.8 | 86.4 | 189.1 |
| msra | 17.5 | 39.2 | 50.7 | 87.4 | 194.8 |
| csa | 17.0 | 38.5 | 51.0 | 88.1 | 194.5 |
| full | 18.2 | 40.4 | 52.1 | 88.0 | 198.8 |
"""
RAL_TABLE2_CSV = """row,MSRA,CSA,R@1 mean,R@1 std,R@5 mean,R@5 std,R@10 mean,R@10 std,R@100 mean,R@100 std,SumR mean,SumR std,delta SumR,p,paired seeds,seeds,run
base,,,15.200,0.283,30.400,0.566,45.600,0.849,60.800,1.131,152.000,2.828,,,,2,gmmformer2
msra,✓,,15.800,0.283,31.600,0.566,47.400,0.849,63.200,1.131,158.000,2.828,6.000,0.0000,2,2,ral~msra
csa,,✓,,,,,,,,,,,,,,0,ral~csa
full,✓,✓,,,,,,,,,,,,,,0,ral
"""


def test_a_prvr_ablation_table_is_written_as_before(tmp_path):
    """A table whose records and paper figures are PRVR only: byte for byte what the code wrote
    before the moment columns (RAL Table 2, two rows of fake records, its reported figures)."""
    load_all()
    table = TABLES[("ral", "2")]
    for i, row in enumerate(table.rows[:2]):
        for seed in (0, 1):
            cfg = resolve_row(table, row, "sim-tiny", seed, [], None)  # the base row: the gmmformer2 run
            rec = fake_record("sim-tiny", "ral", seed, 150.0 + 6 * i + 4 * seed)
            rec.update(config=cfg.to_dict(), run_name=run_name(cfg, row.tag), tag=row.tag, method=cfg.method)
            write_record(record_path(tmp_path, "sim-tiny", rec["run_name"], seed), rec)
    assert main(["ablate", "--method", "ral", "--table", "2", "--dataset", "sim-tiny", "--seeds", "0", "1",
                 "--report-only", "--out", str(tmp_path), "--quiet"]) == 0
    folder = tmp_path / "ablations" / "sim-tiny"
    assert (folder / "ral_table2.md").read_text() == RAL_TABLE2_MD.replace("OUT", str(tmp_path))
    assert (folder / "ral_table2.csv").read_text() == RAL_TABLE2_CSV
