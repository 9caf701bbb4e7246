"""`prvr-bench evaluate`: re-evaluate stored runs from their best checkpoints.

Given run records (`<out>/runs/<dataset>/<run>/seed<S>.json`), rebuild each model from the
record's resolved config, load `<out>/checkpoints/<dataset>/<run>/seed<S>/best.pt`
(weights only) and rank a split again with the suite's evaluator:
- the record's own score (`fused`): reproduces the record's metrics on the same machine;
- `--parts`: every [queries, videos] score the backbone returns, one by one (e.g. the clip
  and frame branches of the MS-SL family, ARL's two models theta and Phi);
- `--ensemble`: the mean of the fused scores of all given runs (e.g. two seeds of the
  baseline, to compare with ARL, whose prediction averages two models).
- `--NAME` of an analysis a method brings (`EVALUATIONS` below, registered by the module that makes it,
  e.g. GMMFormer v2's `--fusion-weights`: harness/cli/fusion_weights.py): its rows.
- `--score-levels`: where each score sits over the split: the mean over the labelled pairs,
  the mean, std, min and max over all pairs (with `--parts`, every score part). A model whose
  loss is lowered by moving every score down together shows it here: all pairs at one level,
  the labelled ones no higher (docs/methods/sbert-pr.md, "The confidence on a score that can be negative").
- `--noise-levels P...`: the run's noise robustness curve (harness/reports/noise.py): the split ranked
  once per level with a segment of p x each video's length inserted at its start (and at
  p = 0), stored beside each record as `seed<S>.noise-<source>.json` for the leaderboard's
  noise figures (test split only).
- `--relevance FILE`: the run scored under a relevance file (datasets/real/relevance.py), from
  the rankings stored beside its record (`seed<S>.rank.npz`, harness/engine/rankings.py) without its
  checkpoint, or with `--from-checkpoint` from the checkpoint (the full evaluation): R@K and
  SumR, the oracle R@K and SumR (any relevant video in the top K), dense R@K (prvr-ea's
  |top K ∩ relevant| / |relevant|), the multi-relevant share and the coverage, with the join's
  report.
Nothing is trained and no record is changed; `--json FILE` writes the figures atomically.
"""

from __future__ import annotations

import argparse
import os
import shlex
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

from prvr.harness.cli.args import command
from prvr.datasets.loader import Batcher
from prvr.datasets.noise import NOISE_SOURCES
from prvr.datasets.real.relevance import RelevanceFile, SplitKeys, join, read_relevance, report_lines
from prvr.harness.base import progress
from prvr.harness.engine.build import build_model
from prvr.harness.engine.config import apply_value, check_device, from_dict
from prvr.harness.base.devices import pick_device
from prvr.harness.engine.evaluate import evaluate_model, evaluate_scores, score_matrices
from prvr.harness.base.io import UserError, write_json
from prvr.harness.base.names import from_here
from prvr.harness.reports.noise import check_levels, store_curve
from prvr.harness.reports.table import markdown_table
from prvr.harness.engine.rankings import SUFFIX as RANKINGS_SUFFIX, metrics_of, rankings_of_record
from prvr.harness.engine.record_types import RunRecord
from prvr.harness.engine.records import RECORD_FILE, checkpoint_dir, load_record, load_record_at, record_layout
from prvr.harness.base.registry import DATASETS, Registry, load_all
from prvr.harness.engine.robustness import SUMMARY, curve_levels, noise_curve
from prvr.harness.engine.checkpoints import official_weights
from prvr.harness.engine.trainer import load_weights, read_checkpoint


class StoredRun:
    """A run record with its model, restored from the best checkpoint."""

    def __init__(self, record_file: str | Path, device: str = "auto", data_root: str | None = None,
                 official: str | Path | None = None) -> None:
        load_all()
        self.path = Path(record_file)
        # The checkpoint is found from where the record lies, never from names inside it.
        out, dataset, run, seed = record_layout(self.path)
        self.record = load_record_at(self.path)  # a record that names another run than its folder's is refused
        self.cfg = from_dict(self.record["config"], f"run record {self.path} key 'config'")
        if (self.cfg.dataset, self.cfg.seed) != (dataset, seed):
            raise UserError(f"run record {self.path} holds the config of {self.cfg.dataset} seed {self.cfg.seed}, "
                            f"not of its folder's {dataset} seed {seed}; delete it or re-run that run")
        if data_root:  # real data moved or on another machine than the one that trained
            apply_value(self.cfg, "data.data_root", data_root, "--data-root")
        check_device(device, "--device", "--device cpu (or auto)")
        self.device = pick_device(device)
        self.checkpoint = checkpoint_dir(out, dataset, run, seed) / "best.pt"
        self.official = Path(official) if official is not None else None
        self.name = f"{run} seed {seed}"
        if self.official is not None:  # another's weights in this run's model: no checkpoint of its own read
            self.name += f" (official weights {self.official.name})"
        elif not self.checkpoint.exists():
            raise UserError(f"{self.path}: its best checkpoint {self.checkpoint} does not exist; checkpoints are "
                            "not committed, so re-run the run (`prvr-bench run` with the record's command) first")

    def model(self, data) -> torch.nn.Module:
        model = build_model(self.cfg, data.video_dim, data.query_dim)
        if self.official is not None:
            load_weights(model, official_weights(self.official, self.cfg.backbone, self.cfg.model, model), self.official,
                         "convert the official checkpoint of this run's model and settings (docs/parity.md)")
            return model.to(self.device).eval()
        fix = f"re-run the run of {self.path} (`prvr-bench run` with the record's command) to write it again"
        state = read_checkpoint(self.checkpoint, ("model",), fix, self.device)
        load_weights(model, state["model"], self.checkpoint, fix)  # another model's weights: named as such first
        check_checkpoint_of_record(self.checkpoint, state, self.path, self.record, fix)
        return model.to(self.device).eval()


def check_checkpoint_of_record(checkpoint: Path, state: dict[str, Any], record_file: Path, record: RunRecord,
                               fix: str) -> None:
    """A best checkpoint is the one its record's training selected: same best epoch, same val
    figure of the selection key. Another training of the same run (an interrupted re-run, a run
    trained again with other settings) writes the same path, and evaluating it would report
    that training's model under the record's name. Checkpoints written before `best` was stored
    are checked against the run state beside them (`last.pt`: its best epoch; its best score
    does not name its metric), when it is there; with neither, nothing can be checked."""
    best, by = state.get("best"), ""
    if not isinstance(best, dict):
        last = checkpoint.with_name("last.pt")
        if not last.exists():
            return
        run_state = read_checkpoint(last, ("best_epoch",), fix, mmap=True)
        best, by = {"epoch": run_state["best_epoch"]}, f" (by its run state {last.name})"
    if best.get("method", record.get("method")) != record.get("method"):  # stamped since the method was stored
        raise UserError(f"checkpoint {checkpoint} is a checkpoint of method {best.get('method')!r}, not of record "
                        f"{record_file}'s {record.get('method')!r}; {fix}")
    key, score = best.get("select"), best.get("score")
    val: Mapping[str, Any] = (record.get("metrics") or {}).get("val", {})
    want = val.get(key) if key else None
    same_epoch = best.get("epoch") == record.get("best_epoch")
    same_score = want is None or score is None or abs(float(score) - float(want)) <= 1e-6 * max(1.0, abs(float(want)))
    if not (same_epoch and same_score):
        theirs = f" (val {key} {float(score):.2f})" if key and score is not None else ""
        ours = f" (val {key} {want})" if want is not None else ""
        raise UserError(f"checkpoint {checkpoint}{by} is from another training of this run than record {record_file}: "
                        f"best epoch {best.get('epoch')}{theirs} against the record's {record.get('best_epoch')}{ours}; "
                        f"{fix}")


def split_metrics(scores: torch.Tensor, split, chunk: int) -> dict[str, Any]:
    return evaluate_scores(scores, split.labels(), split.relevance, split.moment_fraction(), chunk)


def evaluate_runs(record_files: list[str | Path], split_name: str = "test", parts: bool = False,
                  ensemble: bool = False, device: str = "auto", data_root: str | None = None,
                  official: str | Path | None = None) -> list[dict[str, Any]]:
    """Rows {run, score, metrics} for each run's fused score (and parts), plus the ensemble; with
    `official`, the run's model holding the official code's weights from that file instead."""
    runs = [StoredRun(f, device, data_root, official) for f in record_files]
    if ensemble and len(runs) < 2:
        raise UserError("--ensemble needs at least two run records")
    if ensemble and len({_world(r) for r in runs}) > 1:
        raise UserError("--ensemble needs runs on the same data (dataset, `data.*` and `sim.*` settings); "
                        f"these runs differ: {', '.join(r.name for r in runs)}")
    rows: list[dict[str, Any]] = []
    fused: list[torch.Tensor] = []
    datasets: dict[str, Any] = {}
    for run in runs:
        data = split_data(run, split_name, datasets)
        split, chunk = data[split_name], run.cfg.eval.chunk
        batcher = Batcher(split, run.cfg.data)
        model = run.model(data)
        if not (parts or ensemble):  # the trainer's own path: the record's figures, reproduced
            progress.log(f"evaluate {run.name}: score 'fused' on {split_name}")
            rows.append({"run": run.name, "record": str(run.path), "score": "fused",
                         "metrics": evaluate_model(model, split, batcher, run.device, chunk,
                                                       eval_cfg=run.cfg.eval)})
            continue
        scores = score_matrices(model, split, batcher, run.device, chunk, None if parts else ["fused"])
        for k, matrix in scores.items():
            progress.log(f"evaluate {run.name}: score '{k}' on {split_name}")
            rows.append({"run": run.name, "record": str(run.path), "score": k,
                         "metrics": split_metrics(matrix, split, chunk)})
        if ensemble:
            fused.append(scores["fused"])
    if ensemble:
        first = runs[0]
        progress.log(f"evaluate the mean of {len(runs)} runs' fused scores on {split_name}")
        rows.append({"run": " + ".join(r.name for r in runs), "record": None, "score": "fused (mean)",
                     "metrics": split_metrics(torch.stack(fused).mean(0), datasets[_world(first)][split_name],
                                              first.cfg.eval.chunk)})
    return rows


def score_level_rows(record_files: list[str | Path], split_name: str = "test", parts: bool = False,
                     device: str = "auto", data_root: str | None = None) -> list[dict[str, Any]]:
    """Rows {run, record, score, labelled, mean, std, min, max, pairs} for each run's fused score
    (and every part with `parts`): `labelled` is the mean score of the split's labelled
    (query, video) pairs, the others are over all of its [queries, videos] pairs."""
    rows: list[dict[str, Any]] = []
    datasets: dict[str, Any] = {}
    for run in (StoredRun(f, device, data_root) for f in record_files):
        data = split_data(run, split_name, datasets)
        split = data[split_name]
        model = run.model(data)
        progress.log(f"evaluate {run.name}: score levels on {split_name}")
        scores = score_matrices(model, split, Batcher(split, run.cfg.data), run.device, run.cfg.eval.chunk,
                                None if parts else ["fused"])
        labelled = (torch.arange(split.num_queries), torch.as_tensor(split.query_video))
        for k, matrix in scores.items():
            m = matrix.double()
            rows.append({"run": run.name, "record": str(run.path), "score": k,
                         "labelled": m[labelled].mean().item(),
                         "mean": m.mean().item(), "std": m.std().item(), "min": m.min().item(),
                         "max": m.max().item(), "pairs": m.numel()})
    return rows


def format_score_level_rows(rows: list[dict[str, Any]]) -> str:
    header = ["run", "score", "labelled pairs' mean", "mean", "std", "min", "max"]
    return markdown_table(header, [[r["run"], r["score"], *(f"{r[k]:.3f}" for k in ("labelled", "mean", "std", "min",
                                                                                     "max"))] for r in rows])


def noise_rows(record_files: list[str | Path], levels: list[float], source: str = "other", split_name: str = "test",
               device: str = "auto", data_root: str | None = None, store: bool = True) -> list[dict[str, Any]]:
    """Rows {run, record, score, source, level, metrics} of each run's noise curve (harness/reports/noise.py)
    from its best checkpoint; on the test split each curve is stored beside its record."""
    levels = check_levels(levels, "--noise-levels")
    if source not in NOISE_SOURCES:
        raise UserError(f"--noise-source must be one of {', '.join(NOISE_SOURCES)}, got {source!r}")
    runs = [StoredRun(f, device, data_root) for f in record_files]
    rows: list[dict[str, Any]] = []
    datasets: dict[str, Any] = {}
    for run in runs:
        data = split_data(run, split_name, datasets)
        progress.log(f"evaluate {run.name}: noise levels {' '.join(f'{p:g}' for p in curve_levels(levels))} "
                     f"({source}) on {split_name}")
        curve = noise_curve(run.model(data), data[split_name], run.cfg.data, run.device, run.cfg.eval.chunk, levels,
                            source, show=True)
        for level, metrics in curve["levels"].items():
            rows.append({"run": run.name, "record": str(run.path), "score": "fused", "source": source,
                         "level": float(level), "metrics": metrics})
        if store and split_name == "test":
            command = shlex.join(["prvr-bench", "evaluate", _shown_path(run.path), "--noise-levels",
                                  *(f"{p:g}" for p in levels), "--noise-source", source])
            progress.log(f"wrote {store_curve(run.path, run.record, curve, command)}")
    return rows


def _shown_path(path: Path) -> str:
    """A record's path for a stored command (`names.from_here`), else from its results folder on
    (no path of this machine)."""
    shown = from_here(path)
    if shown is None:
        out = record_layout(path)[0]
        shown = str(Path(out.name) / path.relative_to(out))
    return shown


def format_noise_rows(rows: list[dict[str, Any]]) -> str:
    header = ["run", "source", "p", *SUMMARY]
    return markdown_table(header, [[r["run"], r["source"], f"{r['level']:g}",
                                    *(f"{r['metrics'][k]:.1f}" for k in SUMMARY)] for r in rows])


def relevance_rows(record_files: list[str | Path], relevance: str | Path, split_name: str = "test",
                   from_checkpoint: bool = False, device: str = "auto",
                   data_root: str | None = None) -> list[dict[str, Any]]:
    """Rows {run, record, score, source, relevance (the join's report), metrics} of each run
    scored under a relevance file: from its stored rankings, or from its best checkpoint."""
    file = read_relevance(relevance)
    if from_checkpoint:
        runs = [StoredRun(f, device, data_root) for f in record_files]
        datasets: dict[str, Any] = {}
        return [_checkpoint_row(run, file, split_name, datasets) for run in runs]
    return [_stored_row(Path(f), file, split_name) for f in record_files]


def _stored_row(path: Path, file: RelevanceFile, split_name: str) -> dict[str, Any]:
    record = load_record(path)
    rankings, stored = rankings_of_record(path, record)
    if split_name not in rankings:
        raise UserError(f"{stored} holds the rankings of {', '.join(rankings)}, not of '{split_name}'; pick --split")
    ranking = rankings[split_name]
    relevance, report = _joined(file, ranking.keys, split_name, path)
    name = f"{record.get('run_name', record['method'])} seed {record['seed']}"
    progress.log(f"evaluate {name}: {split_name} from {stored.name} under {file.name}")
    return {"run": name, "record": str(path), "score": "fused", "source": stored.name,
            "relevance": report.as_dict(), "metrics": metrics_of(ranking, relevance)}


def _checkpoint_row(run: StoredRun, file: RelevanceFile, split_name: str, datasets: dict[str, Any]) -> dict[str, Any]:
    split = split_data(run, split_name, datasets)[split_name]
    relevance, report = _joined(file, SplitKeys.of_split(split), split_name, run.path)
    split.relevance = relevance  # this evaluation's ground truth, in place of the split's own
    progress.log(f"evaluate {run.name}: {split_name} from {run.checkpoint.name} under {file.name}")
    data = datasets[_world(run)]
    metrics = evaluate_model(run.model(data), split, Batcher(split, run.cfg.data), run.device, run.cfg.eval.chunk,
                             eval_cfg=run.cfg.eval, moments=False)
    return {"run": run.name, "record": str(run.path), "score": "fused", "source": run.checkpoint.name,
            "relevance": report.as_dict(), "metrics": metrics}


def _joined(file: RelevanceFile, keys: SplitKeys, split_name: str, record: Path):
    relevance, report = join(file, keys)
    for line in report.lines():
        progress.log(line)
    if not report.covered:
        raise UserError(f"relevance file {file.path} covers none of the {report.queries:,} {split_name} queries of "
                        f"{record} ({'; '.join(line.strip() for line in report.lines()[1:])}); is it that split's?")
    return relevance, report


@dataclass(frozen=True)
class Analysis:
    """An analysis a method brings to `evaluate` as a flag of its own (GMMFormer v2's `--fusion-weights`):
    its rows of a list of records on a split, and their table."""
    rows: Callable[[list[str | Path], str, str, str | None], list[dict[str, Any]]]
    format_rows: Callable[[list[dict[str, Any]]], str]


# flag name -> analysis; registered by the command module that makes it (harness/cli/fusion_weights.py),
# so `evaluate` itself knows no block of any method
EVALUATIONS: Registry[Analysis] = Registry("evaluation")


RELEVANCE_COLUMNS = (("R@1", ("R@1",)), ("R@5", ("R@5",)), ("R@10", ("R@10",)), ("R@100", ("R@100",)),
                     ("SumR", ("SumR",)), ("oracle SumR", ("oracle", "SumR")),
                     *((f"dense R@{k}", ("oracle", f"dense R@{k}")) for k in (1, 5, 10, 100)),
                     ("dense SumR", ("oracle", "dense SumR")), ("multi-relevant %", ("oracle", "multi_relevant_share")))


def format_relevance_rows(rows: list[dict[str, Any]]) -> str:
    """The runs under a relevance file: the labelled figures, oracle SumR (a hit when any relevant
    video is in the top K), dense R@K (|top K ∩ relevant| / |relevant|) and the coverage."""
    header = ["run", "from", *(name for name, _ in RELEVANCE_COLUMNS), "covered"]
    table = []
    for r in rows:
        cells = [r["run"], r["source"]]
        for _, path in RELEVANCE_COLUMNS:
            value: Any = r["metrics"]
            for key in path:
                value = value.get(key) if isinstance(value, dict) else None
            cells.append("" if value is None else f"{value:.1f}")
        rel = r["relevance"]
        cells.append(f"{rel['covered']:,} of {rel['queries']:,}")
        table.append(cells)
    return markdown_table(header, table)


def split_data(run: StoredRun, split_name: str, datasets: dict[str, Any]) -> Any:
    """The run's dataset, loaded once per world (`_world`) across runs; a missing split is one line."""
    key = _world(run)
    if key not in datasets:
        datasets[key] = DATASETS.get(run.cfg.dataset).load(run.cfg)
    data = datasets[key]
    if split_name not in data.splits:
        raise UserError(f"dataset '{run.record['dataset']}' has no split '{split_name}' "
                        f"(it has {', '.join(data.splits)})")
    return data


def _world(run: StoredRun) -> str:
    """What decides a run's data: the dataset and its `data` / `sim` settings."""
    d = run.cfg.to_dict()
    return repr((run.record["dataset"], d.get("data"), d.get("sim")))


def format_rows(rows: list[dict[str, Any]]) -> str:
    header = ["run", "score", *SUMMARY, "oracle SumR"]
    table = []
    for r in rows:
        m = r["metrics"]
        oracle = m.get("oracle", {}).get("SumR")
        table.append([r["run"], r["score"], *(f"{m[k]:.1f}" for k in SUMMARY),
                      "" if oracle is None else f"{oracle:.1f}"])
    return markdown_table(header, table)


@command("evaluate", "re-evaluate stored runs")
def add_commands(sub) -> None:
    p = sub.add_parser("evaluate", help="re-evaluate stored runs from their best checkpoints (score parts, ensembles, "
                                        "noise robustness)")
    p.add_argument("records", nargs="+", help="run records, e.g. results/runs/sim-tvr/arl/seed0.json")
    p.add_argument("--split", default="test", help="split to rank (default test)")
    p.add_argument("--parts", action="store_true", help="also rank every score the backbone returns on its own")
    p.add_argument("--ensemble", action="store_true", help="also rank the mean of the runs' fused scores")
    p.add_argument("--device", default="auto")
    p.add_argument("--data-root", default=None, metavar="DIR",
                   help="root of real datasets when it differs from the one stored in the records (default: $PRVR_DATA)")
    p.add_argument("--quiet", action="store_true", help="no progress messages")
    p.add_argument("--json", default=None, help="write the rows (with full metrics) to this JSON file")
    p.add_argument("--noise-levels", nargs="+", type=float, default=None, metavar="P",
                   help="noise robustness instead: rank again with a segment of P x each video's length inserted at "
                        "its start, per level in [0, 1] (0 is always added); stored beside each record as "
                        "seed<S>.noise-<source>.json for the leaderboard's results/noise/ figures")
    p.add_argument("--noise-source", default="other", metavar="SOURCE",
                   help="where inserted rows come from: other (a run of another test video, default) | gaussian")
    p.add_argument("--no-store", action="store_true", help="with --noise-levels: print only, store no curve files")
    p.add_argument("--score-levels", action="store_true",
                   help="instead: each score's level over the split (mean of the labelled pairs; mean, std, min, max "
                        "over all pairs), with --parts every part's")
    p.add_argument("--relevance", default=None, metavar="FILE",
                   help="instead: score each run under this relevance file (prvr-ea's or ours, docs/evaluation.md) "
                        "from the rankings stored beside its record (no checkpoint, no training)")
    p.add_argument("--from-checkpoint", action="store_true",
                   help="with --relevance: rank the split again from the best checkpoint instead of the stored rankings")
    p.add_argument("--official-weights", default=None, metavar="NPZ",
                   help="rank with the official code's trained weights (a .npz of its state dict, docs/parity.md) in "
                        "the record's model instead of its checkpoint: the same function, the same figures as its log")
    for entry in EVALUATIONS.entries():  # the analyses methods bring, e.g. --fusion-weights
        p.add_argument(f"--{entry.name}", dest=_dest(entry.name), action="store_true", help=f"instead: {entry.summary}")
    p.set_defaults(func=cmd_evaluate)


def _dest(name: str) -> str:
    return "evaluation_" + name.replace("-", "_").replace(".", "_")


def _analyses(args: argparse.Namespace) -> list[str]:
    """The method-brought analyses (registry.EVALUATIONS) asked for on the command line."""
    return [name for name in EVALUATIONS.names() if getattr(args, _dest(name), False)]


def cmd_evaluate(args: argparse.Namespace) -> None:
    root = args.data_root or os.environ.get("PRVR_DATA")
    if args.from_checkpoint and args.relevance is None:
        raise UserError("--from-checkpoint goes with --relevance FILE (plain `evaluate` ranks from the checkpoint already)")
    analyses = _analyses(args)
    if args.official_weights is not None and (len(args.records) != 1 or args.ensemble or args.relevance is not None
                                              or args.noise_levels is not None or args.score_levels or analyses):
        raise UserError("--official-weights ranks one record's model with the official weights, its fused score and "
                        "with --parts its parts; give one record and leave out the other analyses")
    if args.relevance is not None:
        if args.parts or args.ensemble or args.noise_levels is not None or args.score_levels or analyses:
            raise UserError("--relevance scores each run's fused ranks; leave out --parts, --ensemble, --noise-levels, "
                            f"--score-levels and {', '.join('--' + n for n in EVALUATIONS.names())}")
        rows = relevance_rows(args.records, args.relevance, args.split, args.from_checkpoint, args.device, root)
        print(format_relevance_rows(rows))
        for r in rows:  # what joined and what did not, per run
            print("\n".join([f"{r['run']}: {line.strip()}" if i == 0 else line
                             for i, line in enumerate(report_lines(r["relevance"]))]))
        _write_json(args, rows, relevance=Path(args.relevance).name)
        return
    if analyses:
        flags = " ".join(f"--{n}" for n in analyses)
        if len(analyses) > 1 or args.parts or args.ensemble or args.noise_levels is not None or args.score_levels:
            raise UserError(f"{flags} is an analysis of its own; leave out --parts, --ensemble, --noise-levels, "
                            "--score-levels and the other analyses")
        analysis = EVALUATIONS.get(analyses[0])
        rows = analysis.rows(args.records, args.split, args.device, root)
        print(analysis.format_rows(rows))
        _write_json(args, rows)
        return
    if args.score_levels:
        if args.ensemble or args.noise_levels is not None:
            raise UserError("--score-levels reads each run's own scores; leave out --ensemble and --noise-levels")
        rows = score_level_rows(args.records, args.split, args.parts, args.device, root)
        print(format_score_level_rows(rows))
        _write_json(args, rows)
        return
    if args.noise_levels is not None:
        if args.parts or args.ensemble:
            raise UserError("--noise-levels ranks each run's fused score; leave out --parts and --ensemble")
        rows = noise_rows(args.records, args.noise_levels, args.noise_source, args.split, args.device, root,
                          store=not args.no_store)
        print(format_noise_rows(rows))
        _write_json(args, rows, noise_source=args.noise_source)
        return
    rows = evaluate_runs(args.records, args.split, args.parts, args.ensemble, args.device, root, args.official_weights)
    print(format_rows(rows))
    _write_json(args, rows)


def _write_json(args: argparse.Namespace, rows: list[dict[str, Any]], **extra: Any) -> None:
    """`--json FILE`: the split, any extra keys and the rows, written atomically; never over a run's
    record or rankings (a file named as the runs name theirs, or one of the records given)."""
    if args.json:
        target = Path(args.json)
        rankings = target.name.endswith(RANKINGS_SUFFIX)
        as_record = target.name.removesuffix(RANKINGS_SUFFIX) + (".json" if rankings else "")
        if RECORD_FILE.fullmatch(as_record) or any(Path(r).resolve() == target.resolve() for r in args.records):
            raise UserError(f"--json {args.json}: that is the name of a run's record or rankings, which evaluate "
                            "never changes; write the figures to another file")
        write_json(args.json, {"split": args.split, **extra, "rows": rows})
        progress.log(f"wrote {args.json}")

