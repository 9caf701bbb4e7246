"""The runtime's query path (harness/profiling/runtime.py): batched runs rank as one query at a
time does, a run asks the host nothing (what lets a GPU capture it as a CUDA graph), the mode
each row records, the options that choose it, and the memory estimate from the shapes. The
CUDA test (marked `cuda`, skipped without a GPU) checks that every subject's graph replays what
eager runs give. No test reads a clock."""

import csv
import io

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from prvr.harness.base import masks
from prvr.harness.base.batches import QueryBatch
from prvr.harness.cli import main
from prvr.harness.cli.app import build_parser
from prvr.harness.cli.profile import settings_from
from prvr.harness.profiling import runtime
from prvr.harness.profiling.runtime import (EAGER, GRAPHS, LiveBytes, capture, encode_collection, estimate_memory,
                                            retrieval, runtime_per_query, same_ranking, storage_bytes, summarize,
                                            timed_run, uses_graphs)
from prvr.harness.profiling.subjects import build_model, default_names, random_queries, subjects

DIMS = (48, 32)
CPU = torch.device("cpu")
# ops that ask the device for a value or read a shape from the data: each is a host sync on a GPU and
# breaks a CUDA graph's capture
HOST_OPS = {"aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten.unique", "aten._unique2",
            "aten.unique_dim", "aten.unique_consecutive", "aten.lift_fresh", "aten.lift_fresh_copy", "aten.item"}


def _setup(method, videos=9, device=CPU):
    """A sim-tiny subject's model and an untiled collection (every video distinct: no ties)."""
    subject = subjects([method], "sim-tiny")[0]
    model = build_model(subject, DIMS, device)
    return subject, model, encode_collection(model, subject, videos, videos, DIMS[0], device)


def _one(queries, i):
    return QueryBatch(queries.tokens[i : i + 1], queries.token_mask[i : i + 1], queries.query_index[i : i + 1])


@pytest.mark.parametrize("method", default_names())
@torch.no_grad()
def test_a_batched_run_ranks_as_single_query_runs_do(method):
    subject, model, videos = _setup(method)
    queries = random_queries(4, subject.tokens, DIMS[1])
    scores, order = retrieval(model, queries, videos)()
    assert scores.shape == order.shape == (4, 9)
    for i in range(4):
        one_scores, one_order = retrieval(model, _one(queries, i), videos)()
        torch.testing.assert_close(scores[i], one_scores[0], rtol=1e-5, atol=1e-6)
        assert torch.equal(order[i], one_order[0])
        naive = sorted(range(9), key=lambda v: -float(one_scores[0, v]))  # best first, one video at a time
        assert order[i].tolist() == naive


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("method", default_names())
@torch.no_grad()
def test_a_run_asks_the_host_nothing(method):
    """After a warm-up run (which may learn a mask's layout once), a run reads no value back from
    the device and no shape from the data: what CUDA graph capture needs, checked on the CPU taking
    a GPU's path (`masks.as_on_a_device`: RAL ranks on the CPU by another path, which reads counts)."""
    subject, model, videos = _setup(method)
    run = retrieval(model, random_queries(2, subject.tokens, DIMS[1]), videos)
    with masks.as_on_a_device():
        run()
        with _Ops() as seen:
            run()
    assert seen.ops and not seen.ops & HOST_OPS


def test_the_device_proxy_is_scoped():
    cpu = torch.zeros(2)
    assert masks.host_holds(cpu)
    with masks.as_on_a_device():
        assert not masks.host_holds(cpu)
        with masks.as_on_a_device():
            assert not masks.host_holds(cpu)
        assert not masks.host_holds(cpu)
    assert masks.host_holds(cpu)


def test_runs_on_a_cpu_are_eager_and_figures_are_per_query():
    subject, model, _ = _setup("baseline")
    for graphs in ("auto", "off"):
        out = runtime_per_query(model, subject, [3, 5], DIMS, repeats=2, warmup=0, unique=2, device=CPU,
                                query_batch=3, graphs=graphs)
        assert [(r.videos, r.queries, r.mode, r.runs) for r in out] == [(3, 3, EAGER, 2), (5, 3, EAGER, 2)]
        assert all(r.peak_mb != r.peak_mb for r in out)  # nan: no GPU memory to measure
    assert not uses_graphs("auto", CPU) and not uses_graphs("off", torch.device("cuda"))
    assert uses_graphs("auto", torch.device("cuda"))


def test_a_run_s_milliseconds_are_shared_by_its_queries():
    r = summarize(100, [3.0, 6.0, 9.0, 12.0, 15.0], queries=3, mode=GRAPHS)
    assert (r.median_ms, r.p25_ms, r.p75_ms, r.run_ms, r.runs, r.mode) == (3.0, 2.0, 4.0, 9.0, 5, GRAPHS)
    assert summarize(7, [2.5]).median_ms == 2.5


def test_a_failed_capture_runs_eager_and_names_its_first_error(monkeypatch):
    def fails(retrieve, device):
        try:
            raise RuntimeError("operation not permitted when stream is capturing\nmore")
        finally:
            raise RuntimeError("capture_end: invalidated | by a previous error")  # what `torch.cuda.graph` raises after

    monkeypatch.setattr(runtime, "capture", fails)
    run = lambda: (torch.zeros(1, 2), torch.zeros(1, 2, dtype=torch.long))
    fn, mode = timed_run(run, True, CPU)
    assert fn is run and mode == "eager (capture failed: RuntimeError: operation not permitted when stream is capturing)"
    assert timed_run(run, False, CPU) == (run, EAGER)


def test_a_capture_on_a_cpu_fails_in_one_line():
    run = lambda: (torch.zeros(1, 2), torch.zeros(1, 2, dtype=torch.long))
    fn, mode = timed_run(run, True, CPU)  # a CPU build of torch cannot make a CUDA stream
    assert fn is run and mode.startswith("eager (capture failed: ") and "\n" not in mode and "|" not in mode


def test_same_ranking_lets_tied_videos_change_places():
    scores = torch.tensor([[0.5, 0.9, 0.5, 0.1]])
    assert same_ranking((scores, torch.tensor([[1, 0, 2, 3]])), (scores, torch.tensor([[1, 2, 0, 3]])))
    assert not same_ranking((scores, torch.tensor([[0, 1, 2, 3]])), (scores, torch.tensor([[1, 2, 0, 3]])))
    assert not same_ranking((scores + 0.01, torch.tensor([[1, 0, 2, 3]])), (scores, torch.tensor([[1, 0, 2, 3]])))


# --------------------------------------------------------------------------------------- options
def _settings(*args):
    parsed = build_parser().parse_args(["profile", "--quick", *args])
    return settings_from(parsed, CPU)


def test_graphs_and_query_batch_are_parsed():
    assert (_settings().graphs, _settings().query_batch) == ("auto", 1)
    s = _settings("--graphs", "off", "--query-batch", "16")
    assert (s.graphs, s.query_batch) == ("off", 16)


@pytest.mark.parametrize("args, message", [
    (["--query-batch", "0"], "--query-batch must be at least 1, got 0"),
    (["--query-batch", "-2"], "--query-batch must be at least 1, got -2"),
    (["--graphs", "on"], "--graphs must be auto or off, got 'on'"),
])
def test_bad_runtime_options_are_one_line_errors(capsys, tmp_path, args, message):
    code = main(["profile", "--quick", "--out", str(tmp_path), "--quiet", *args])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1


def test_a_batched_profile_labels_its_rows(capsys, tmp_path):
    code = main(["profile", "--quick", "--method", "baseline", "--videos", "4", "8", "--query-batch", "2",
                 "--graphs", "off", "--skip-training", "--skip-evaluator", "--out", str(tmp_path), "--quiet"])
    assert code == 0, capsys.readouterr().err
    rows = [r for r in csv.DictReader(io.StringIO((tmp_path / "profile.csv").read_text())) if r["section"] == "runtime"]
    medians = [r for r in rows if r["quantity"] == "runtime_median"]
    assert [r["condition"] for r in medians] == [f"videos={n}; queries per run=2; 3 runs; mode=eager" for n in (4, 8)]
    assert {r["unit"] for r in medians} == {"ms per query (run / 2)"}
    runs = {r["condition"]: float(r["value"]) for r in rows if r["quantity"] == "runtime_run_median"}
    assert len(runs) == 2 and all(v > 0 for v in runs.values())
    md = (tmp_path / "profile.md").read_text()
    assert "## Inference runtime per text query (ms per query, in batches of 2)" in md
    assert "| method | backbone | source | device | queries per run | mode | 4 videos | 8 videos |" in md
    assert "| baseline | dual-branch | measured | cpu" in md and "| 2 queries | eager |" in md
    assert "**not** one-query figures" in md and "`--graphs off`" in md


def test_the_papers_rows_say_one_query_per_run(capsys, tmp_path):
    code = main(["profile", "--quick", "--method", "msl", "--videos", "4", "--skip-training", "--skip-evaluator",
                 "--out", str(tmp_path), "--quiet"])
    assert code == 0, capsys.readouterr().err
    md = (tmp_path / "profile.md").read_text()
    assert "## Inference runtime per text query (ms)\n" in md and "| 1 query | eager |" in md
    assert "| msl | MS-SL | reported, RTX 3090 (ARL paper Tables 3, 4) | RTX 3090 | 1 query | not stated |" in md


# --------------------------------------------------------------------------------------- memory
def test_live_bytes_counts_what_ops_make_while_it_lives():
    before = torch.ones(10)
    with LiveBytes() as mem:
        a = torch.ones(1000)  # 4,000 bytes
        b = a * 2  # 4,000 more: the peak
        view = b[10:]  # a view makes no storage
        del a
        c = before + 1  # 40 bytes; `before` was made outside and is not counted
    assert (mem.peak, mem.live) == (8000, 4040)
    del b, view, c
    assert mem.live == 0


def test_the_estimate_counts_the_collection_a_cpu_holds():
    subject, model, _ = _setup("msl")
    held = encode_collection(model, subject, 11, 4, DIMS[0], CPU)  # 3 copies of 4 videos, cut to 11
    est = estimate_memory(subject, DIMS, 11, 4, query_batch=2)
    assert est.index == storage_bytes(held) > 0
    assert est.params == 4 * sum(p.numel() for p in model.parameters())
    assert est.run_peak > 0 and est.build_peak >= est.index
    assert est.total == est.params + max(est.build_peak, est.index + est.run_peak)


def test_estimate_memory_prints_a_table_and_measures_nothing(capsys, tmp_path):
    code = main(["profile", "--quick", "--method", "baseline", "--videos", "50", "1000", "--estimate-memory",
                 "--out", str(tmp_path), "--quiet"])
    out = capsys.readouterr().out
    assert code == 0 and "| baseline | 1,000 | 1 |" in out and not (tmp_path / "profile.md").exists()


# --------------------------------------------------------------------------------------- CUDA
@pytest.mark.cuda
@pytest.mark.parametrize("method", default_names())
@torch.no_grad()
def test_a_graph_replays_what_eager_runs_give(method):
    """On a GPU every subject's run is captured (the row's mode is `graphs`) and its replay gives
    eager's scores and ranking, for one query and for a batch."""
    cuda = torch.device("cuda")
    subject, model, videos = _setup(method, videos=300, device=cuda)
    for batch in (1, 5):
        run = retrieval(model, random_queries(batch, subject.tokens, DIMS[1], cuda), videos)
        eager = tuple(t.clone() for t in run())
        replay = capture(run, cuda)
        for _ in range(2):
            got = replay()
            torch.testing.assert_close(got[0], eager[0], rtol=1e-5, atol=1e-6)
            assert same_ranking(got, eager)
    out = runtime_per_query(model, subject, [40, 300], DIMS, repeats=2, warmup=1, unique=16, device=cuda)
    assert [r.mode for r in out] == [GRAPHS, GRAPHS] and all(r.peak_mb > 0 for r in out)
