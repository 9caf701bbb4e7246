"""Noise robustness (RAL Fig. 5): a segment of p x each test video inserted at its start
(datasets/noise.py), the curve in run records and from `prvr-bench evaluate`, and the
leaderboard's figures and tables (harness/reports/noise.py)."""

import json

import numpy as np
import pytest

from prvr.datasets.noise import StackedRows, with_noise
from prvr.datasets.types import Ragged, Split
from prvr.harness.cli import main
from prvr.harness.base.io import UserError
from prvr.harness.engine.records import load_record, record_path, write_record

LEVELS = (0.1, 0.25, 0.5, 1.0)


def toy_split(lengths=(5, 3, 8, 1, 6), dim=4, rows=None, unit=False, seed=0) -> Split:
    """Videos whose rows carry their own row number in column 0 (so inserted rows can be traced)."""
    rng = np.random.default_rng(seed)
    total = int(sum(lengths))
    data = rng.standard_normal((total if rows is None else int(max(rows)) + 1, dim)).astype(np.float32)
    if unit:
        data /= np.linalg.norm(data, axis=1, keepdims=True)
    else:
        data[:, 0] = np.arange(len(data))
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    frames = Ragged(data, offsets, rows)
    nv = len(lengths)
    durations = 1.5 * np.asarray(lengths, dtype=np.float64)
    query_video = np.array([0, 2, 2, 4, 1]) % nv
    moments = np.array([[0.0, 3.0], [1.5, 4.5], [np.nan, np.nan], [0.0, 9.0], [3.0, 4.5]])
    tokens = Ragged.from_list([np.ones((2, 3), dtype=np.float32)] * len(query_video))
    relevance = Split(["v"] * nv, frames, durations, ["q"] * 5, ["t"] * 5, tokens, query_video, moments).labels()
    return Split([f"v{i}" for i in range(nv)], frames, durations, [f"q{i}" for i in range(5)],
                 [f"query {i}" for i in range(5)], tokens, query_video, moments, relevance=relevance)


def round_half_up(x: float) -> int:
    return int(np.floor(x + 0.5))


# ----------------------------------------------------------------------------- the noisy split
@pytest.mark.parametrize("source", ["other", "gaussian"])
@pytest.mark.parametrize("p", LEVELS)
def test_each_video_gains_round_p_n_rows_before_its_own(source, p):
    s = toy_split()
    noisy = with_noise(s, p, source)
    for v, n in enumerate(s.frames.lengths):
        k = round_half_up(p * n)
        assert len(noisy.frames[v]) == n + k
        np.testing.assert_array_equal(noisy.frames[v][k:], s.frames[v])  # its own rows follow, unchanged
    assert noisy.frames.dim == s.frames.dim and noisy.frames.data.dtype == s.frames.data.dtype


@pytest.mark.parametrize("p", LEVELS)
def test_timestamps_shift_by_h_p_and_durations_grow(p):
    s = toy_split()
    noisy = with_noise(s, p)
    h = s.durations[s.query_video]
    np.testing.assert_allclose(noisy.moments, s.moments + (h * p)[:, None])
    np.testing.assert_allclose(noisy.durations, s.durations * (1 + p))
    np.testing.assert_allclose(noisy.moment_fraction(), s.moment_fraction() / (1 + p))  # NaN where unknown
    # labels, relevance and queries are untouched
    assert noisy.tokens is s.tokens and noisy.relevance is s.relevance and noisy.query_ids is s.query_ids
    np.testing.assert_array_equal(noisy.query_video, s.query_video)


@pytest.mark.parametrize("source", ["other", "gaussian"])
def test_level_zero_is_the_identity(source):
    s = toy_split()
    assert with_noise(s, 0.0, source) is s
    assert with_noise(s, 0, source) is s


def test_other_takes_a_contiguous_run_of_another_video_and_is_seeded():
    s = toy_split(lengths=(5, 3, 8, 1, 6, 2, 9, 4))
    owner = np.repeat(np.arange(s.num_videos), s.frames.lengths)  # video of each row number
    for p in LEVELS:
        noisy = with_noise(s, p, "other")
        for v, n in enumerate(s.frames.lengths):
            k = round_half_up(p * n)
            inserted = noisy.frames[v][:k, 0].astype(np.int64)  # row numbers
            donors = set(owner[inserted])
            assert v not in donors and len(donors) <= 1  # one other video, never itself
            if k:
                (u,) = donors
                local = inserted - s.frames.offsets[u]  # rows of the donor, consecutive (cyclic when shorter)
                assert np.all(np.diff(local) % s.frames.lengths[u] == 1 % s.frames.lengths[u])
                if s.frames.lengths[u] >= k:
                    assert np.all(np.diff(local) == 1)
        again = with_noise(s, p, "other")
        np.testing.assert_array_equal(again.frames.rows, noisy.frames.rows)  # seeded by (seed, p)
    assert not np.array_equal(with_noise(s, 0.5).frames.rows[:20], with_noise(s, 0.6).frames.rows[:20])


def test_rows_of_a_shared_table_are_followed_and_nothing_is_copied():
    """A split whose videos select rows of a larger table (real data: one feature.bin)."""
    lengths = (4, 2, 5)
    table_rows = np.array([9, 10, 11, 12, 3, 4, 0, 1, 2, 7, 8])
    s = toy_split(lengths=lengths, rows=table_rows)
    for source in ("other", "gaussian"):
        noisy = with_noise(s, 0.5, source)
        for v, n in enumerate(lengths):
            np.testing.assert_array_equal(noisy.frames[v][-n:], s.frames[v])
        data = noisy.frames.data
        base = data.base if isinstance(data, StackedRows) else data
        assert base is s.frames.data  # the feature table is shared, not copied
    noisy = with_noise(s, 0.5, "other")
    assert noisy.frames.data is s.frames.data and set(noisy.frames.rows) <= set(table_rows)


def test_gaussian_matches_the_splits_mean_and_std():
    rng = np.random.default_rng(3)
    lengths = [40] * 150
    mean, std = np.array([2.0, -1.0, 0.0, 5.0]), np.array([0.5, 2.0, 1.0, 3.0])
    data = (rng.standard_normal((sum(lengths), 4)) * std + mean).astype(np.float32)
    s = Split([f"v{i}" for i in range(150)], Ragged(data, np.concatenate([[0], np.cumsum(lengths)])),
              np.full(150, 60.0), ["q"], ["t"], Ragged.from_list([np.ones((1, 2))]), [0], [[0.0, 1.0]])
    noisy = with_noise(s, 1.0, "gaussian")
    block = noisy.frames.data.extra
    assert block.shape == (6000, 4) and block.dtype == np.float32
    np.testing.assert_allclose(block.mean(0), data.mean(0), atol=0.08 * std.max())
    np.testing.assert_allclose(block.std(0), data.std(0), rtol=0.05)
    inserted = np.concatenate([noisy.frames[v][:40] for v in range(150)])
    np.testing.assert_array_equal(inserted, block)


def test_gaussian_rows_are_unit_vectors_only_when_the_splits_are():
    unit = with_noise(toy_split(unit=True), 0.5, "gaussian").frames.data.extra
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1.0, rtol=1e-5)
    raw = with_noise(toy_split(), 0.5, "gaussian").frames.data.extra
    assert np.abs(np.linalg.norm(raw, axis=1) - 1.0).max() > 0.1


def test_stacked_rows_reads_slices_and_index_arrays_across_the_seam():
    base, extra = np.arange(12, dtype=np.float32).reshape(6, 2), -np.arange(1, 7, dtype=np.float32).reshape(3, 2)
    st, whole = StackedRows(base, extra), np.concatenate([base, extra])
    assert len(st) == 9 and st.shape == (9, 2)
    for key in (slice(0, 4), slice(4, 8), slice(6, 9), slice(0, 9, 2)):
        np.testing.assert_array_equal(st[key], whole[key])
    idx = np.array([8, 0, 6, 5, 7])
    np.testing.assert_array_equal(st[idx], whole[idx])
    np.testing.assert_array_equal(np.asarray(st), whole)


def test_bad_levels_and_sources_are_one_line_errors():
    s = toy_split()
    with pytest.raises(UserError, match=r"noise level must be a number in \[0, 1\], got 1.5"):
        with_noise(s, 1.5)
    with pytest.raises(UserError, match="noise source must be one of other, gaussian, got 'uniform'"):
        with_noise(s, 0.5, "uniform")
    one = Split(["v0"], Ragged.from_list([np.ones((3, 2))]), [4.5], ["q"], ["t"], Ragged.from_list([np.ones((1, 2))]),
                [0], [[0.0, 1.0]])
    with pytest.raises(UserError, match="needs at least two test videos"):
        with_noise(one, 0.5, "other")


# ----------------------------------------------------------------------------- config
@pytest.mark.parametrize("override, message", [
    ("eval.noise_levels=[1.5]", r"config key 'eval.noise_levels' must be a list of distinct items, each a finite "
                                r"number in \[0, 1\], got \[1.5\] \(from --set\)"),
    ("eval.noise_levels=[-0.1]", r"config key 'eval.noise_levels' must be .*got \[-0.1\]"),
    ("eval.noise_levels=[0.1, 0.1]",
     r"config key 'eval.noise_levels' must be a list of distinct items.*got \[0.1, 0.1\]"),
    ("eval.noise_source=uniform", r"config key 'eval.noise_source' must be one of other, gaussian, got 'uniform'"),
])
def test_noise_settings_are_checked_in_one_line(tiny_cfg, override, message):
    with pytest.raises(UserError, match=message) as err:
        tiny_cfg(overrides=[override])
    assert "\n" not in str(err.value)


def test_noise_settings_default_to_off(tiny_cfg):
    cfg = tiny_cfg(overrides=["eval.noise_levels=[0, 0.5]", "eval.noise_source=gaussian"])
    assert cfg.eval.noise_levels == [0.0, 0.5] and cfg.eval.noise_source == "gaussian"
    assert tiny_cfg().eval.noise_levels == [] and tiny_cfg().eval.noise_source == "other"


# ----------------------------------------------------------------------------- a run, evaluate, the leaderboard
@pytest.fixture(scope="module")
def noisy_run(tmp_path_factory):
    from prvr.harness.engine.config import resolve
    from prvr.harness.engine.runner import run_one

    out = tmp_path_factory.mktemp("noise")
    cfg = resolve("baseline", "sim-tiny", 0, ["train.epochs=1", "eval.noise_levels=[0, 0.5]"])
    record = run_one(cfg, out)
    return out, record_path(out, "sim-tiny", record["run_name"], 0), record


def test_a_run_with_noise_levels_stores_the_curve(noisy_run):
    _, path, record = noisy_run
    stored = load_record(path)
    noise = stored["metrics"]["noise"]
    assert noise["source"] == "other" and list(noise["levels"]) == ["0.0", "0.5"]
    test = stored["metrics"]["test"]
    assert noise["levels"]["0.0"] == {k: test[k] for k in ("R@1", "R@5", "R@10", "R@100", "SumR")}
    assert set(noise["levels"]["0.5"]) == {"R@1", "R@5", "R@10", "R@100", "SumR"}
    assert "eval_noise" in stored["timings"]


def test_the_curve_with_its_queries_encoded_once_equals_each_level_evaluated_whole(noisy_run, tmp_path):
    """CPU. The noise curve encodes the queries once for every level (the noise is in the videos);
    each level's figures equal those of that level's split evaluated on its own, queries and all."""
    from prvr.datasets.loader import Batcher
    from prvr.harness.engine.build import build_run
    from prvr.harness.engine.evaluate import evaluate_model
    from prvr.harness.engine.robustness import noise_curve
    from prvr.harness.engine.config import resolve
    from prvr.harness.engine.records import checkpoint_dir

    out, _, record = noisy_run
    cfg = resolve("baseline", "sim-tiny", 0, ["train.epochs=1"])
    run = build_run(cfg)
    trainer = run.trainer(tmp_path / "checkpoints")
    trainer.load_model(checkpoint_dir(out, "sim-tiny", record["run_name"], 0) / "best.pt")  # the trained model
    test = run.data["test"]
    curve = noise_curve(trainer.model, test, cfg.data, trainer.device, cfg.eval.chunk, [0.25, 0.5], "other")
    for p in (0.25, 0.5):
        noisy = with_noise(test, p, "other")
        whole = evaluate_model(trainer.model, noisy, Batcher(noisy, cfg.data), trainer.device, cfg.eval.chunk,
                               moments=False)
        assert curve["levels"][str(p)] == {k: float(whole[k]) for k in ("R@1", "R@5", "R@10", "R@100", "SumR")}


def test_sim_events_move_with_the_inserted_rows(tiny_cfg):
    from prvr.harness.base.registry import DATASETS

    cfg = tiny_cfg()
    test = DATASETS.get("sim-tiny").load(cfg)["test"]
    noisy = with_noise(test, 0.5)
    k = noisy.frames.lengths - test.frames.lengths
    ev, old = noisy.extra["events"], test.extra["events"]
    np.testing.assert_array_equal(ev[:, 4:6], old[:, 4:6] + k[old[:, 0]][:, None])
    assert np.all(ev[:, 5] <= noisy.frames.lengths[ev[:, 0]])


def test_evaluate_makes_the_curve_of_a_stored_run_and_stores_it(noisy_run, tmp_path, capsys):
    _, path, record = noisy_run
    assert main(["evaluate", str(path), "--noise-levels", "0.5", "--json", str(tmp_path / "ev.json")]) == 0
    printed = capsys.readouterr().out
    assert "| baseline seed 0 | other | 0 |" in printed and "| baseline seed 0 | other | 0.5 |" in printed
    rows = json.loads((tmp_path / "ev.json").read_text())["rows"]
    assert [r["level"] for r in rows] == [0.0, 0.5]  # 0 is always part of the curve
    levels = record["metrics"]["noise"]["levels"]
    for r in rows:  # the same checkpoint on the same machine: the run's own figures
        assert r["metrics"] == levels[str(r["level"])]
    stored = json.loads((path.parent / "seed0.noise-other.json").read_text())
    assert stored["levels"] == levels and stored["command"].startswith("prvr-bench evaluate ")
    assert main(["evaluate", str(path), "--noise-levels", "0.5", "--parts"]) == 2
    assert "leave out --parts" in capsys.readouterr().err
    for args, message in ((["0.5", "0.5"], "--noise-levels must be distinct, got 0.5 0.5"),
                          (["1.5"], r"--noise-levels must be numbers in [0, 1], got 1.5"),
                          (["0.5", "--noise-source", "uniform"],
                           "--noise-source must be one of other, gaussian, got 'uniform'")):
        assert main(["evaluate", str(path), "--noise-levels", *args]) == 2
        assert message in capsys.readouterr().err


def test_leaderboard_writes_the_noise_figure_and_table(noisy_run):
    from prvr.harness.reports import leaderboard

    out, _, record = noisy_run
    leaderboard.rebuild(out, show=False)
    md = (out / "noise" / "sim-tiny.md").read_text()
    assert "| baseline | other | 1 (0) |" in md and f"{record['metrics']['test']['SumR']:.1f}" in md
    assert (out / "noise" / "sim-tiny.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ----------------------------------------------------------------------------- records and reports
def _level(sumr):
    """A noise level's figures whose SumR is `sumr` and is the sum of its R@K (as a run's are)."""
    return {"R@1": sumr / 10, "R@5": sumr / 5, "R@10": 3 * sumr / 10, "R@100": 4 * sumr / 10, "SumR": sumr}


def fake_record(seed, curve, run="baseline", source="other", nonfinite=None):
    test = {"R@1": 1.0, "R@5": 2.0, "R@10": 3.0, "R@100": 4.0, "SumR": 10.0}
    rec = {"method": run, "dataset": "sim-x", "seed": seed, "run_name": run, "command": f"prvr-bench run --seed {seed}",
           "config": {"train": {"epochs": 12, "patience": 5}}, "provenance": {},
           "metrics": {"val": test, "test": test,
                       "noise": {"source": source, "levels": {k: _level(v) for k, v in curve.items()}}}}
    if nonfinite:
        rec["nonfinite"] = nonfinite
    return rec


def test_noise_table_and_figure_from_records(tmp_path):
    from prvr.harness.reports.noise import write_reports

    records = [fake_record(0, {"0.0": 200.0, "0.1": 190.0, "0.5": 150.0}),
               fake_record(1, {"0.0": 210.0, "0.1": 180.0, "0.5": 160.0}),
               fake_record(0, {"0.0": 220.0, "0.5": 200.0}, run="arl"),
               fake_record(1, {"0.0": 230.0, "0.1": 215.0, "0.5": 210.0}, run="arl"),
               fake_record(2, {"0.0": 1.0, "0.5": 1.0}, run="arl", nonfinite={"epoch": 0, "step": 1})]
    for r in records:
        write_record(record_path(tmp_path, "sim-x", r["run_name"], r["seed"]), r)
    written = write_reports(tmp_path, [load_record(record_path(tmp_path, "sim-x", r["run_name"], r["seed"]))
                                       for r in records])
    assert [p.name for p in written] == ["sim-x.png", "sim-x.md"]
    md = (tmp_path / "noise" / "sim-x.md").read_text()
    assert "| run | source | seeds | p=0 | p=0.1 | p=0.5 |" in md
    assert "| baseline | other | 2 (0 1) | 205.0 ± 7.1 | 185.0 ± 7.1 | 155.0 ± 7.1 |" in md
    # p=0.1 lacks seed 0: an empty cell, no partial mean
    assert "| arl | other | 2 (0 1) | 225.0 ± 7.1 |  | 205.0 ± 7.1 |" in md
    assert "prvr-bench run --seed 0" in md and "--seed 2" not in md  # the diverged seed is left out
    assert (tmp_path / "noise" / "sim-x.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list((tmp_path / "noise").glob(".*.tmp"))  # written atomically, no temporaries left


def test_records_without_noise_load_and_a_bad_curve_is_named(tmp_path):
    plain = fake_record(0, {})
    del plain["metrics"]["noise"]
    write_record(tmp_path / "runs" / "sim-x" / "baseline" / "seed0.json", plain)
    assert "noise" not in load_record(tmp_path / "runs" / "sim-x" / "baseline" / "seed0.json")["metrics"]
    bad = fake_record(0, {"0.5": 1.0})
    bad["metrics"]["noise"]["levels"]["0.5"]["SumR"] = "high"
    write_record(tmp_path / "bad.json", bad)
    with pytest.raises(UserError, match=r"key 'metrics.noise.levels.0.5.SumR': str 'high', expected a number"):
        load_record(tmp_path / "bad.json")
    del bad["metrics"]["noise"]["source"]
    write_record(tmp_path / "bad.json", bad)
    with pytest.raises(UserError, match=r"key 'metrics.noise.source': missing, expected a string"):
        load_record(tmp_path / "bad.json")
