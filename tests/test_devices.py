"""Devices, precision and resume across device sets, on the CPU (docs/gpu.md).

The CUDA side of these (a CUDA epoch of every method, resume on CUDA, bf16 on a GPU) is in
tests/test_cuda.py, marked `cuda`; what can be checked without a GPU is here: where `auto`
trains, that a CPU run never touches CUDA, that a checkpoint of another device or another
number of GPUs resumes with one line (or is refused as a number-changing setting), and
bf16 against fp32.
"""

import json

import pytest
import torch

from prvr.harness.reports import leaderboard

from prvr.harness.engine import precision, trainer as trainer_mod

from prvr.harness.base import progress
from prvr.harness.cli import main
from prvr.harness.engine.config import resolve
from prvr.harness.base.io import UserError
from prvr.harness.profiling.flops import OpLog
from prvr.harness.base.registry import METHODS
from prvr.harness.engine.runner import run_one
from prvr.harness.base.devices import DEVICE_ENV, pick_device
from prvr.harness.engine.trainer import restore_cuda_rng

EPOCHS = ["train.epochs=2", "train.patience=10"]
RUN = ["run", "--method", "baseline", "--dataset", "sim-tiny", "--out", "out", "--quiet",
       *[a for s in EPOCHS for a in ("--set", s)]]
LAST = "out/checkpoints/sim-tiny/baseline/seed0/last.pt"
RECORD = "out/runs/sim-tiny/baseline/seed0.json"


def test_the_suite_trains_on_the_cpu_and_auto_reads_the_environment(monkeypatch):
    assert pick_device("auto") == torch.device("cpu")  # tests/conftest.py sets PRVR_DEVICE=cpu
    monkeypatch.setenv(DEVICE_ENV, "cuda:3")
    assert pick_device("auto") == torch.device("cuda:3")
    assert pick_device("cpu") == torch.device("cpu")  # a named device is taken as named


@pytest.mark.parametrize("method", ["baseline", "msl"])  # AdamW and BertAdam
def test_a_cpu_run_never_touches_cuda_where_cuda_is_present(method, tmp_path, monkeypatch):
    def touched(name):
        def call(*args, **kwargs):
            raise AssertionError(f"a CPU run called {name}")
        return call  # one function per name (torch's own tables refuse one function under two names)

    # as on a GPU machine: torch.cuda and torch.accelerator say CUDA is there
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda check_available=False: torch.device("cuda"))
    # _lazy_init is where every first use of CUDA goes (from C++ too); torch's optimizers ask
    # is_current_stream_capturing (torch 2.11) or the accelerator's current stream (2.13)
    for name in ("get_rng_state_all", "set_rng_state_all", "get_rng_state", "set_rng_state", "init", "_lazy_init",
                 "is_current_stream_capturing"):
        monkeypatch.setattr(torch.cuda, name, touched(f"torch.cuda.{name}"))
    monkeypatch.setattr(torch.accelerator, "current_stream", touched("torch.accelerator.current_stream"))
    record = run_one(resolve(method, "sim-tiny", 0, EPOCHS), tmp_path)
    assert record["provenance"]["device"].startswith("cpu")
    state = torch.load(tmp_path / f"checkpoints/sim-tiny/{method}/seed0/last.pt", weights_only=True)
    assert state["device"] == "cpu" and "cuda_rng" not in state


@pytest.fixture
def stopped(tmp_path, monkeypatch):
    """A 2-epoch run's folder whose last.pt is rewritten as if epoch 1 of 2 had been trained on
    a machine with 8 GPUs."""
    monkeypatch.chdir(tmp_path)
    assert main([*RUN, "--set", "train.epochs=1"]) == 0
    state = torch.load(LAST, weights_only=True)
    state["config"]["train"]["epochs"] = 2
    state["finished"] = False
    state["device"] = "cuda"
    state["cuda_rng"] = [torch.zeros(16, dtype=torch.uint8) for _ in range(8)]
    torch.save(state, LAST)
    return tmp_path


def test_resume_on_another_kind_of_device_is_refused_as_a_number_changing_setting(capsys, stopped):
    assert main([*RUN, "--resume"]) == 2
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and err.count("\n") == 1
    assert "trained with other settings (train.device 'cuda' -> 'cpu')" in err and "--force-resume" in err


def test_forced_resume_on_another_device_goes_on_with_the_change_recorded(capsys, stopped):
    assert main([*RUN, "--force-resume"]) == 0
    record = json.loads((stopped / RECORD).read_text())
    assert record["resumes"] == [{"from_epoch": 1, "changed": {"train.device": ["cuda", "cpu"]}, "forced": True}]
    assert record["epochs_run"] == 2


def test_checkpoints_written_before_they_named_their_device_resume_on_the_cpu(stopped):
    state = torch.load(LAST, weights_only=True)
    del state["device"], state["cuda_rng"]  # as every checkpoint before this change: CPU runs
    torch.save(state, LAST)
    assert main([*RUN, "--resume"]) == 0
    assert json.loads((stopped / RECORD).read_text())["resumes"][0]["forced"] is False


@pytest.mark.parametrize("saved, present", [(8, 1), (1, 2), (2, 2)])
def test_cuda_random_state_is_restored_for_the_gpus_present_with_one_warning(monkeypatch, saved, present):
    restored, lines = [], []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: present)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, i: restored.append((int(state[0]), i)))
    monkeypatch.setattr(progress, "log", lines.append)
    monkeypatch.setattr(progress, "warn", lambda m: lines.append(f"warning: {m}"))
    restore_cuda_rng([torch.full((4,), k, dtype=torch.uint8) for k in range(saved)], "last.pt")
    assert restored == [(k, k) for k in range(min(saved, present))]
    if saved == present:
        assert lines == []
    else:
        assert len(lines) == 1 and f"saved with {saved} GPU(s) visible, this process sees {present}" in lines[0]


@pytest.mark.parametrize("device", ["auto", "cpu"])
def test_tf32_on_a_cpu_is_refused_as_the_config_resolves(device, monkeypatch):
    monkeypatch.setenv(DEVICE_ENV, "cpu")  # auto: the CPU, as on a machine without CUDA
    with pytest.raises(UserError) as err:  # at resolve: no data loaded, no model built
        resolve("baseline", "sim-tiny", 0, [*EPOCHS, "train.precision=tf32", f"train.device={device}"])
    message = str(err.value)
    assert "\n" not in message
    assert message == ("config key 'train.precision' is 'tf32', but the run trains on cpu: TF32 is a CUDA matrix mode; "
                       "use --set train.precision=fp32 (or bf16)")
    resolve("baseline", "sim-tiny", 0, [*EPOCHS, "train.precision=bf16", f"train.device={device}"])  # bf16: on a CPU too


def test_resume_with_another_precision_is_refused(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main([*RUN, "--set", "train.epochs=1"]) == 0
    assert main([*RUN, "--resume", "--set", "train.precision=bf16"]) == 2
    assert "train.precision 'fp32' -> 'bf16'" in capsys.readouterr().err


# The tolerance of bf16 against fp32 (docs/gpu.md): bfloat16 keeps 8 bits of mantissa (a
# relative rounding of 2^-9 per product input); after the encoders' layers the scores of
# the same weights differ by at most 0.05 (cosines in [-1, 1]) and the first loss by 5%.
BF16_SCORE_TOL, BF16_LOSS_RTOL = 0.05, 0.05


@pytest.mark.detects
@pytest.mark.parametrize("method", METHODS.names())
def test_bf16_scores_and_loss_are_within_tolerance_of_fp32(method):
    from prvr.harness.engine.build import build_run

    got = {}
    for precision in ("fp32", "bf16"):
        cfg = resolve(method, "sim-tiny", 0, [*EPOCHS, f"train.precision={precision}"])
        trainer = build_run(cfg).trainer("unused")
        batch = trainer.batchers["train"].train_batch(trainer.has_queries.nonzero()[0][:8])
        q, v = trainer.model.encode_queries(batch.queries), trainer.model.encode_videos(batch.videos)
        assert all(t.dtype == torch.float32 for t in [*q.values(), *v.values()] if t.is_floating_point())
        scores = trainer.model.score(q, v).fused
        out = trainer.train_step(batch, 0, 0)
        got[precision] = (scores.detach(), float(out["loss"]))
    assert (got["bf16"][0] - got["fp32"][0]).abs().max() <= BF16_SCORE_TOL
    assert got["bf16"][1] == pytest.approx(got["fp32"][1], rel=BF16_LOSS_RTOL)
    assert not torch.equal(got["bf16"][0], got["fp32"][0])  # bf16 did run in bf16


@pytest.fixture
def process_switches(monkeypatch):
    """set_deterministic's switches are process-wide: the test starts from torch's defaults (a
    CUDA test in this process may have changed them) and puts them back after."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
             [torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.mem_efficient_sdp_enabled(),
              torch.backends.cuda.cudnn_sdp_enabled()])
    torch.use_deterministic_algorithms(False)
    for enable in precision.SDPA_FUSED:
        enable(True)
    yield
    torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[2], saved[3]
    for enable, on in zip(precision.SDPA_FUSED, saved[4]):
        enable(on)


def _attention_kernels():
    """The attention and softmax ops that a training step of nn.MultiheadAttention dispatches."""
    attention = torch.nn.MultiheadAttention(16, 2, batch_first=True)
    x = torch.randn(3, 5, 16, requires_grad=True)
    with OpLog() as seen:
        out, _ = attention(x, x, x, need_weights=False)
        out.sum().backward()
    return {str(op) for op in seen.ops if "attention" in str(op) or "softmax" in str(op)}


def test_deterministic_cuda_runs_keep_attention_off_the_fused_kernels(process_switches):
    """On an H200 the baseline's deterministic epoch warned that memory-efficient attention is not
    deterministic: train.deterministic on CUDA now leaves attention to the math kernel (matrix
    products and a softmax). The switches are torch's, process-wide, and the CPU's fused kernel
    obeys them too, so the choice is seen here on a CPU tensor."""
    fused = _attention_kernels()
    assert any("flash_attention" in op for op in fused)  # the CPU's fused kernel, by default
    precision.set_deterministic(True, torch.device("cuda"))
    assert torch.are_deterministic_algorithms_enabled()
    math = _attention_kernels()
    assert not any("attention" in op for op in math) and any("softmax" in op for op in math), math
    precision.set_deterministic(False, torch.device("cuda"))
    assert _attention_kernels() == fused and not torch.are_deterministic_algorithms_enabled()
    # a CPU run, deterministic either way, gets torch's defaults even after a deterministic CUDA
    # run in the same process (the suite on a GPU machine; gpu-check)
    precision.set_deterministic(True, torch.device("cuda"))
    precision.set_deterministic(True, torch.device("cpu"))
    assert _attention_kernels() == fused and not torch.are_deterministic_algorithms_enabled()
    assert not torch.backends.cudnn.deterministic


def test_precision_is_in_the_record_and_the_leaderboard_budget(tmp_path):
    run_one(resolve("baseline", "sim-tiny", 0, [*EPOCHS, "train.precision=bf16"]), tmp_path)
    run_one(resolve("baseline", "sim-tiny", 0, EPOCHS), tmp_path / "fp32")
    rows = leaderboard.rebuild(tmp_path, show=False)
    assert [r["budget"] for r in rows] == ["2 ep / stop 10, bf16"]
    (fp32,) = leaderboard.rebuild(tmp_path / "fp32", show=False)
    assert fp32["budget"] == "2 ep / stop 10"
    assert trainer_mod.RESUME_FREE_KEYS.isdisjoint({"train.precision", "train.device", "train.compile",
                                                    "train.deterministic"})


def test_a_bf16_model_encodes_in_bf16_wherever_it_is_called():
    """build_model applies train.precision to the encoders themselves, so evaluation, a
    detector's pass and re-evaluation (which call model.encode_*) run as training does."""
    from prvr.harness.engine.build import build_run

    runs = {p: build_run(resolve("msl", "sim-tiny", 0, [f"train.precision={p}"])) for p in ("fp32", "bf16")}
    batcher = runs["fp32"].trainer("unused").batchers["val"]
    qb = batcher.queries(list(range(6)))
    for run in runs.values():
        run.model.eval()  # no dropout: the same weights give the same outputs
    with torch.no_grad():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            by_hand = runs["fp32"].model.encode_queries(qb)
        wrapped = runs["bf16"].model.encode_queries(qb)
    for k, t in by_hand.items():
        assert wrapped[k].dtype == torch.float32 and torch.equal(wrapped[k], t.float())
    assert "encode_queries" not in vars(runs["fp32"].model)  # fp32: the model as the backbone made it
