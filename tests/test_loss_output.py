"""`LossOutput` (harness/base/contract.py): what an objective returns, the loss, its parts and the
diagnostics kept apart; the trainer logs them all and takes only a LossOutput."""

import dataclasses

import pytest
import torch

from prvr.datasets.loader import epoch_batches
from prvr.harness.engine.build import build_run
from prvr.harness.engine.config import resolve
from prvr.harness.base.contract import LossOutput
from prvr.harness.base.io import UserError


def _t(x: float) -> torch.Tensor:
    return torch.tensor(x)


def test_as_a_mapping_it_is_what_a_step_logs_in_the_history_order():
    out = LossOutput(_t(3.0), {"a": _t(1.0), "b": _t(2.0)}, {"sigma": _t(0.5)})
    assert list(out) == ["a", "b", "loss", "sigma"] and len(out) == 4
    assert {k: float(v) for k, v in out.items()} == {"a": 1.0, "b": 2.0, "loss": 3.0, "sigma": 0.5}
    assert "sigma" in out and "c" not in out
    with pytest.raises(KeyError):
        out["c"]


@pytest.mark.parametrize("parts, diagnostics", [({"loss": _t(1.0)}, {}), ({}, {"loss": _t(1.0)}),
                                                ({"a": _t(1.0)}, {"a": _t(2.0)})])
def test_a_name_used_twice_is_refused(parts, diagnostics):
    with pytest.raises(ValueError, match="twice"):
        LossOutput(_t(0.0), parts, diagnostics)


def test_detached_keeps_the_figures_and_leaves_the_graph():
    w = torch.ones((), requires_grad=True)
    out = LossOutput(w * 2, {"a": w * 3}, {"s": (w * 4).detach()}).detached()
    assert not any(v.requires_grad for v in out.values())
    assert [float(v) for v in out.values()] == [3.0, 2.0, 4.0]


def _trainer(method: str):
    cfg = resolve(method, "sim-tiny", 0, ["train.device=cpu"])
    run = build_run(cfg)
    trainer = run.trainer("unused")  # one step, no checkpoint: nothing is written
    batches = epoch_batches(len(trainer.has_queries), cfg.train.batch_size, 0, 0, trainer.has_queries)
    return trainer, trainer.batchers["train"].train_batch(batches[0])


def test_the_trainer_keeps_a_detached_loss_output():
    trainer, batch = _trainer("baseline")
    out = trainer.train_step(batch, 0, 0)
    assert isinstance(out, LossOutput) and not out.loss.requires_grad
    assert set(out.parts) == {"clip_triplet", "clip_nce", "frame_triplet", "frame_nce"} and out.diagnostics == {}


def test_an_objective_that_returns_a_dict_is_named():
    trainer, batch = _trainer("baseline")
    trainer.spec = dataclasses.replace(trainer.spec, objective=lambda cfg, scores, relations, ctx: {
        "loss": scores.fused.sum()})
    with pytest.raises(UserError, match=r"^method 'baseline': its objective returned dict, not a LossOutput"):
        trainer.train_step(batch, 0, 0)
