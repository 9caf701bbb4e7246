"""Bad input, round four: tables that cannot be injected (docs/bad-input.md, "Round four: where the suite
writes"). Every markdown table the suite writes goes through `markdown_table` and every CSV through
`csv_text` (harness/reports/table.py). Each table writer below gets cells taken from input (run names,
tags, file names, record fields, error messages) that hold a pipe, line breaks, a code fence, a backslash
and a spreadsheet formula; its markdown must keep one row per line with the header's number of columns,
show the cell escaped, let no line start a heading or a fence, and its CSV must read back with csv.reader
to the original text (or, for a cell starting with = + - @, the text behind a quote)."""

import csv
import io
import re
from pathlib import Path

import pytest

from prvr.harness.reports.table import markdown_cell

# a formula first (spreadsheets run it), then a pipe, a heading and a fence each after a line break
HOSTILE = "=cmd()|x\n# injected\n```\nfence \\ end`"
# a plain cell that still needs the csv module: a pipe, a line break, a comma and quotes
ROW = 'a|b\nc, "d"'


# ---------------------------------------------------------------------------- checks


def _unescaped_pipes(line: str) -> int:
    """The pipes of a table line that split cells: those behind an even number of backslashes."""
    count = backslashes = 0
    for ch in line:
        if ch == "|" and backslashes % 2 == 0:
            count += 1
        backslashes = backslashes + 1 if ch == "\\" else 0
    return count


def _tables(md: str) -> list[list[str]]:
    blocks: list[list[str]] = []
    previous = False
    for line in md.splitlines():
        if line.startswith("|"):
            if not previous:
                blocks.append([])
            blocks[-1].append(line)
        previous = line.startswith("|")
    return blocks


def check_markdown(md: str, *cells: str) -> None:
    """Every table: a header, a separator and rows with the header's number of cells; each hostile
    `cells` shown escaped on one table line; no line the input made a heading or a fence."""
    blocks = _tables(md)
    assert blocks, "no table written"
    for block in blocks:
        width = _unescaped_pipes(block[0])
        assert re.fullmatch(r"\|(---\|)+", block[1]) and block[1].count("---") == width - 1, block[:2]
        assert [_unescaped_pipes(line) for line in block] == [width] * len(block), block
    rows = [line for block in blocks for line in block]
    for cell in cells:
        assert any(markdown_cell(cell) in line for line in rows), f"{cell!r} not escaped in a row"
    lines = md.splitlines()
    assert not [line for line in lines if line.startswith(("# injected", "```", "fence"))]


def check_csv(text: str, *cells: str) -> list[list[str]]:
    """Every row as wide as the header, and each of `cells` read back whole (a formula behind a quote)."""
    rows = list(csv.reader(io.StringIO(text, newline="")))
    assert rows and all(len(r) == len(rows[0]) for r in rows), rows
    found = {c for r in rows for c in r}
    for cell in cells:
        assert ("'" + cell if cell[:1] in "=+-@" else cell) in found, f"{cell!r} not read back"
    assert HOSTILE not in found  # never the formula as it came
    return rows


# ---------------------------------------------------------------------------- the writers


def _profile(tmp_path):
    from prvr.harness.profiling.report import MethodProfile, Profile, Settings, render_csv, render_markdown
    from prvr.harness.profiling.reported import Reported

    settings = Settings(dataset="sim-tiny", model_dataset="sim-tvr", dims=(4, 4), sizes=[100], repeats=1, warmup=0,
                        unique=1, eval_shape=None, eval_repeats=1)  # type: ignore[arg-type]
    method = MethodProfile(method=HOSTILE, backbone=ROW, runtime_device="cpu",
                           errors={"flops": HOSTILE, "runtime": HOSTILE, "training": HOSTILE})
    paper = Reported(HOSTILE, ROW, "reported, " + ROW, HOSTILE, 1.0, 2.0, {100: 1.0})
    provenance = {"command": f"prvr-bench profile --tag {HOSTILE}", "created": "2026", "git_revision": "abc",
                  "device": "cpu", "wall_s": 1.0, "torch": "2"}
    profile = Profile(settings, [method], [paper], None, provenance)  # type: ignore[arg-type]
    check_markdown(render_markdown(profile), HOSTILE, ROW)
    check_csv(render_csv(profile), HOSTILE, ROW)


def _rehearsal(tmp_path):
    from prvr.harness.profiling.rehearsal import Phase, write_rehearsal

    figures = {"device": "cpu", "prepare_s": 1.0, "train_kept": ROW, "batches": 2, "epoch_batches": 10,
               "s_per_batch": 0.5, "epoch_s_extrapolated": 5.0, "note": HOSTILE}
    phases = [Phase(HOSTILE, 1.0, 2.0, error=HOSTILE, revision=ROW, cpu=ROW),
              Phase("method " + HOSTILE, 1.0, 2.0, figures=figures, cpu=ROW)]
    md, table = write_rehearsal(tmp_path, phases, "Written by `prvr-bench rehearse`.")
    text = md.read_text()
    check_markdown(text, HOSTILE, ROW, "failed: " + HOSTILE)
    assert len(_tables(text)) == 2  # the phases and the per-method table
    check_csv(table.read_text(), HOSTILE, ROW)


def _reevaluate(tmp_path):
    from prvr.harness.cli import reevaluate
    from prvr.harness.engine.robustness import SUMMARY

    figures = {k: 1.0 for k in SUMMARY}
    check_markdown(reevaluate.format_score_level_rows([{"run": HOSTILE, "score": ROW, "labelled": 0.5, "mean": 0.1,
                                                         "std": 0.2, "min": -1.0, "max": 1.0}]), HOSTILE, ROW)
    check_markdown(reevaluate.format_noise_rows([{"run": HOSTILE, "source": ROW, "level": 0.5, "metrics": figures}]),
                   HOSTILE, ROW)
    check_markdown(reevaluate.format_relevance_rows([{"run": HOSTILE, "source": ROW, "relevance": {"covered": 1,
                                                      "queries": 2}, "metrics": {**figures, "oracle": {"SumR": 2.0}}}]),
                   HOSTILE, ROW)
    check_markdown(reevaluate.format_rows([{"run": HOSTILE, "score": ROW, "metrics": figures}]), HOSTILE, ROW)


def _fusion_weights(tmp_path):
    from prvr.harness.cli.fusion_weights import format_rows

    check_markdown(format_rows([{"run": HOSTILE, "block": ROW, "positions": 3, "widths": [0, 2.0],
                                 "mean": [0.5, 0.5], "max_mean": 0.6}]), HOSTILE, ROW)


def _ablate(tmp_path):
    from prvr.harness.cli.ablate import PaperRow, plan_runs, report, reported_lines
    from prvr.harness.reports.rows import COLUMNS
    from prvr.methods.recipes import AblationRow, AblationTable

    rows = (AblationRow(HOSTILE, "", (), marks=(ROW,)), AblationRow("(b)", "b", ("train.epochs=2",), marks=("",)))
    table = AblationTable("baseline", "x", "A table", (HOSTILE,), rows, reported={HOSTILE: (1.0, 2.0, 3.0, 4.0, 10.0)},
                          reported_source=ROW)
    path = report(table, str(tmp_path), "sim-tiny", plan_runs(table, "sim-tiny", [0], [], None))
    text = path.read_text()
    check_markdown(text, HOSTILE, ROW)
    assert len(_tables(text)) == 2  # the runs and the paper's rows
    check_csv(path.with_suffix(".csv").read_text(), HOSTILE, ROW)
    check_markdown("\n".join(reported_lines(ROW, [PaperRow(HOSTILE, {"SumR": 1.0}, HOSTILE)], COLUMNS)), HOSTILE)


def _detection(tmp_path):
    """Its cells are numbers (the run and dataset are checked names): the table's shape and the CSV."""
    from prvr.harness.cli.detection import write_table
    from prvr.harness.engine.records import record_path, write_record

    for seed in (0, 1):
        history = [{"epoch": 0, "relations": {"active": False}},
                   {"epoch": 1, "relations": {"active": True, "theta": {"tau_s": -0.4, "frame_share": 0.25},
                                              "union": {"per_query": 1.0, "precision": None, "recall": 0.5}}}]
        write_record(record_path(tmp_path, "sim-x", "arl", seed),
                     {"method": "arl", "dataset": "sim-x", "seed": seed, "run_name": "arl", "config": {},
                      "provenance": {}, "metrics": {"val": {}, "test": {}}, "history": history})
    path = write_table(tmp_path, "sim-x", "arl")
    blocks = _tables(path.read_text())
    assert len(blocks) == 1 and len(blocks[0]) == 3 and _unescaped_pipes(blocks[0][2]) == _unescaped_pipes(blocks[0][0])
    rows = check_csv(path.with_suffix(".csv").read_text())
    assert rows[1][:2] == ["2", "2"] and "-0.4" in rows[1]  # a negative figure stays a number


def _census(tmp_path):
    from prvr.harness.cli.census import update_vp_table, write_census

    row = {"dataset": "sim-x", "world": HOSTILE, "split": ROW, "queries": 3, "videos": 2, "phi": "np-vp",
           "theta": 0.7, "parser": ROW, "model": HOSTILE, "share_with_pr": 0.5, "pr_queries_per_query": 1.0,
           "pr_videos_per_query": 1.0, "precision": None, "recall": None, "base_rate": None}
    path = write_census(tmp_path, "sim-x", [row], f"prvr-bench census --tag {HOSTILE}", [], "")
    check_markdown(path.read_text(), HOSTILE, ROW)
    check_csv(path.with_suffix(".csv").read_text(), HOSTILE, ROW)
    vp = {"dataset": "sim-x", "split": ROW, "parser": HOSTILE, "status": ROW, "queries": 3, "gold_vps": 4,
          "extracted_vps": 4, "matched": 2, "precision": 0.5, "recall": 0.5}
    for _ in range(2):  # the second time over its own CSV: the kept rows read back and written as they were
        md = update_vp_table(tmp_path, [vp], f"prvr-bench census --tag {HOSTILE}")
        check_markdown(md.read_text(), HOSTILE, ROW)
    check_csv(md.with_suffix(".csv").read_text(), HOSTILE, ROW)


def _reproduce(tmp_path):
    from prvr.harness.cli.reproduce import Figure, render

    text = render(Path("seed0.json"), {"run_name": HOSTILE, "method": "baseline", "seed": 0}, "abc",
                  [Figure(HOSTILE, 1.0, 2.0), Figure(ROW, 1.0, 1.0)], 0.1)
    check_markdown(text, HOSTILE, ROW)


def _gpu_check(tmp_path):
    import torch

    from prvr.harness.cli.gpu_check import Row, render

    text = render([Row(HOSTILE, HOSTILE, 1.0, 2.0, ok=False), Row(ROW, ROW, 1.0)], torch.device("cpu"), 1.0)
    check_markdown(text, HOSTILE, ROW)
    assert f"| **FAILED** {markdown_cell(HOSTILE)} |" in text  # the bold mark stays markdown, the result escaped


def _ral_uncertainty(tmp_path):
    from prvr.harness.cli.ral_uncertainty import report_markdown

    groups = [{"index": i, "uncertainty": 0.5 + i / 100, "R@1": {HOSTILE: float(i), ROW: 2.0 * i}} for i in range(3)]
    report = {"runs": [{"run": HOSTILE, "role": "ral", "seeds": [0]}, {"run": ROW, "role": "against", "seeds": [0]}],
              "groups": groups, "overall": {HOSTILE: 1.0, ROW: 2.0}, "run": "ral", "dataset": "sim-x",
              "split": "test", "bucket": "medium", "bounds": [0.2, 0.4], "queries_in_bucket": 9, "group": 3,
              "dropped": 0, "command": f"prvr-bench uncertainty --tag {HOSTILE}"}
    check_markdown(report_markdown(report, "x.png"), HOSTILE + " R@1", ROW + " R@1")


def _parity(tmp_path):
    """Its cells are numbers; the run's name, command and the log's file name are code spans."""
    from prvr.harness.cli.parity import report

    official = {"val": [{"epoch": 1, "SumR": 10.0, "parts": {}}], "test": None, "seed": None}
    record = {"run_name": HOSTILE, "seed": 0, "command": f"prvr-bench run --tag '{HOSTILE}'", "provenance": {}}
    check_markdown(report(official, {"val": [{"epoch": 1, "SumR": 11.0}], "test": None, "record": record}, "x", "",
                          HOSTILE))


WRITERS = {"profile": _profile, "rehearsal": _rehearsal, "evaluate": _reevaluate, "fusion-weights": _fusion_weights,
           "ablate": _ablate, "detection": _detection, "census": _census, "reproduce": _reproduce,
           "gpu-check": _gpu_check, "uncertainty": _ral_uncertainty, "parity": _parity}


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_hostile_cell_stays_one_escaped_cell_in_every_table(tmp_path, writer):
    WRITERS[writer](tmp_path)


def test_no_table_is_built_by_hand():
    """No module of the suite joins cells with pipes itself: each table goes through `markdown_table`."""
    root = Path(__file__).resolve().parents[1]
    hand = re.compile(r"\" \| \"\.join|\"\|---|f\"\| \{")
    found = [f"{path.relative_to(root)}:{n}" for folder in ("harness", "methods", "datasets")
             for path in sorted((root / folder).rglob("*.py")) if path.name != "table.py"
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if hand.search(line)]
    assert found == []
