"""One protocol per dataset: no method preset changes a dataset's budget, and records say
which budget they were trained under."""

import pytest

from prvr.harness.config import resolve
from prvr.harness.records import budget_label, dataset_protocol, run_protocol
from prvr.harness.registry import DATASETS, METHODS


@pytest.mark.parametrize("dataset", DATASETS.names())
def test_every_method_resolves_to_the_datasets_protocol(dataset):
    expected = dataset_protocol(dataset)
    for method in METHODS.names():
        train = resolve(method, dataset, 0).train
        assert (train.epochs, train.patience) == (expected["epochs"], expected["patience"]), method


def test_the_protocols_stated_in_the_presets():
    assert budget_label(dataset_protocol("sim-tvr")) == "30 ep / stop 5"
    assert budget_label(dataset_protocol("tvr")) == "100 ep / stop 10"


def test_a_run_with_another_budget_is_off_protocol():
    on = run_protocol(resolve("msl", "sim-tvr", 0).to_dict(), "sim-tvr")
    off = run_protocol(resolve("msl", "sim-tvr", 0, ["train.epochs=12"]).to_dict(), "sim-tvr")
    assert on["follows_protocol"] and not off["follows_protocol"]
    assert off["dataset_protocol"]["epochs"] == 30 and off["epochs"] == 12
