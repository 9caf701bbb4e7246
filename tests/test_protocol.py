"""One protocol per dataset: no method preset changes a dataset's budget, and records say
which budget they were trained under."""

import pytest

from prvr.harness.engine.config import resolve
from prvr.harness.engine.records import budget_label, dataset_protocol, run_protocol
from prvr.harness.base.registry import DATASETS, METHODS


@pytest.mark.parametrize("dataset", DATASETS.names())
def test_every_method_resolves_to_the_datasets_protocol(dataset):
    expected = dataset_protocol(dataset)
    for method in METHODS.names():
        train = resolve(method, dataset, 0).train
        assert (train.epochs, train.patience, train.select_on) == (
            expected["epochs"], expected["patience"], expected["select_on"]), method


def test_the_protocols_stated_in_the_presets():
    assert budget_label(dataset_protocol("sim-tvr")) == "30 ep / stop 5"
    assert budget_label(dataset_protocol("tvr")) == "100 ep / stop 10"
    # the moment retrieval datasets select on VCMR, as XML's code (docs/protocol.md)
    for dataset in ("sim-charades", "sim-didemo", "charades-sta", "didemo"):
        assert dataset_protocol(dataset)["select_on"] == "vcmr", dataset
    assert budget_label(dataset_protocol("sim-charades")) == "60 ep / stop 10, val VCMR SumR"


def test_a_run_with_another_budget_is_off_protocol():
    on = run_protocol(resolve("msl", "sim-tvr", 0).to_dict(), "sim-tvr")
    off = run_protocol(resolve("msl", "sim-tvr", 0, ["train.epochs=12"]).to_dict(), "sim-tvr")
    assert on["follows_protocol"] and not off["follows_protocol"]
    assert off["dataset_protocol"]["epochs"] == 30 and off["epochs"] == 12


def test_a_run_selected_on_another_figure_is_off_protocol():
    """Old records (no train.select_on: VR SumR) on a dataset that selects on VCMR are off its protocol;
    a backbone without moments under the dataset's setting follows it, selected on VR SumR."""
    xml = resolve("xml", "sim-charades", 0).to_dict()
    assert run_protocol(xml, "sim-charades")["follows_protocol"]
    del xml["train"]["select_on"]
    old = run_protocol(xml, "sim-charades")
    assert not old["follows_protocol"] and old["selection"] == "val SumR"
    msl = run_protocol(resolve("msl", "sim-charades", 0).to_dict(), "sim-charades", localizes=False)
    assert msl["follows_protocol"] and msl["selection"] == "val SumR"
