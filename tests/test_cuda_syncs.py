"""Host syncs in a training step: none where the host already knows the answer.

On a GPU every read of a device value by the host (`.item()`, `bool(t)`, `nonzero`, a boolean
index, a blocking copy) waits for all queued work. The step's avoidable reads are gone: masks
carry what the loader knows (harness/base/masks.py), the negatives are drawn as torch.multinomial
draws them without its two checks (`ranking.draw_one`), the detectors count on the device.

- Each sync-free path gives the numbers of the path it replaces, bit for bit (CPU tests).
- A CPU proxy counts, during a training step, the ops that would ask the device on a GPU, and the
  Python scalars made tensors (copied to the device on a GPU); other copies between host and
  device it cannot see (on a CPU there are none): the CUDA test does.
- The CUDA test (marked `cuda`) runs training steps of each method on sim-tiny after a warm-up
  step under torch.cuda.set_sync_debug_mode and counts the syncs. Steps that still sync for a
  reason outside this file's reach are marked xfail(strict) with the reason: when the reason
  goes, the test says so.
"""

import collections
import traceback
import warnings
import zlib

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from prvr.datasets.loader import epoch_batches
from prvr.harness.base import masks
from prvr.harness.engine.build import build_run
from prvr.harness.engine.config import resolve
from prvr.methods.backbones.blocks import pack, unpack
from prvr.methods.objectives.ranking import draw_one, mean_where
from prvr.methods.relations import sbert
from prvr.methods.relations.base import Relations


# ----------------------------------------------------------------------------- same numbers
def test_draw_one_is_torch_multinomial():
    """The same draws and the same generator state after them, on rows with zero weights."""
    for seed in range(200):
        g = torch.Generator().manual_seed(seed)
        rows, cols = torch.randint(1, 60, (2,), generator=g).tolist()
        w = (torch.rand(rows, cols, generator=g) < torch.rand(1, generator=g)).float()
        w = w + (w.sum(1, keepdim=True) == 0).float()  # every row with some weight, as sample_negatives makes them
        if seed % 2:
            w = w * torch.rand(rows, cols, generator=g)
        a, b = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        assert torch.equal(torch.multinomial(w, 1, generator=a).squeeze(1), draw_one(w, b))
        assert torch.equal(a.get_state(), b.get_state())


def _masks():
    rng = np.random.default_rng(0)
    partly = torch.from_numpy(rng.random((4, 7)) < 0.6)
    partly[:, 0] = True
    return [partly, torch.ones(4, 7, dtype=torch.bool), torch.zeros(4, 7, dtype=torch.bool)]


@pytest.mark.parametrize("described", [True, False])
@pytest.mark.parametrize("dim", [0, 1])
def test_pack_and_unpack_are_boolean_indexing_forward_and_backward(described, dim):
    for mask in _masks():
        if described:
            masks.describe_from_host(mask, mask)
        shape = (4, 7, 5) if dim == 0 else (3, 4, 7, 5)
        x = torch.randn(shape, requires_grad=True)
        ref = x.detach().clone().requires_grad_(True)
        at = (slice(None),) * dim + (mask,)
        packed, expected = pack(x, mask, dim), ref[at]
        assert torch.equal(packed, expected)
        weight = torch.randn(packed.shape)
        (packed * weight).sum().backward()
        (expected * weight).sum().backward()
        assert torch.equal(x.grad, ref.grad)
        rows = torch.randn(expected.shape, requires_grad=True)
        rows_ref = rows.detach().clone().requires_grad_(True)
        out = rows_ref.new_zeros((*shape[:dim], 4, 7, *shape[dim + 2:]))
        out[at] = rows_ref
        got = unpack(rows, mask, dim)
        assert torch.equal(got, out)
        g = torch.randn(out.shape)
        (got * g).sum().backward()
        (out * g).sum().backward()
        assert torch.equal(rows.grad, rows_ref.grad)


def test_facts_go_when_the_mask_changes_in_place():
    mask = torch.tensor([[True, False], [True, True]])
    masks.describe_from_host(mask, mask)
    assert masks.true_index(mask).tolist() == [0, 2, 3] and not masks.all_true(mask)
    mask[0, 1] = True
    assert masks.known(mask).index is None
    assert masks.true_index(mask).tolist() == [0, 1, 2, 3] and masks.all_true(mask)


def test_one_to_one_labels_are_described_as_nonzero_finds_them():
    item = torch.tensor([2, 0, 0, 1, 2])
    for covers in (None, 3):
        if covers:
            masks.describe(item, covers=covers)
        positive = Relations.one_to_one(item, 3).positive
        for got, want in zip(masks.true_pairs(positive), positive.nonzero(as_tuple=True)):
            assert torch.equal(got, want)
        assert masks.covered(positive, 1) is True and masks.covered(positive, 0) is (covers and True)
    partial = Relations.one_to_one(masks.describe(torch.tensor([0, 0]), covers=1), 3).positive
    assert masks.covered(partial, 0) is None  # covers 1 of 3 videos: not known to cover all


@pytest.mark.parametrize("seed", range(20))
def test_xml_terms_over_a_described_mask_and_a_valid_mask_are_the_terms_over_their_and(seed):
    """The ranking terms and NLL_2 taken over the pairs of a described mask, kept where a
    device mask `valid` holds, against the same terms over `mask & valid` (what the code did,
    asking the device for the pairs): bit for bit where `valid` keeps every pair, else the
    same up to the summation order; nothing asked of the device."""
    from prvr.methods.objectives.xml import pos_at_least_rel, pos_over_neg, rel_over_neg, sample_hard_negatives

    g = torch.Generator().manual_seed(seed)
    q, b = (int(v) for v in torch.randint(2, 9, (2,), generator=g))
    scores = torch.randn(q, b, generator=g)
    host = torch.rand(q, b, generator=g) < 0.4
    positive = torch.zeros(q, b, dtype=torch.bool)
    positive[torch.arange(q), torch.randint(0, b, (q,), generator=g)] = True
    ambiguous = host & ~positive
    confidence = torch.rand(q, b, generator=g)
    for every in (True, False):
        valid = torch.ones(q, b, dtype=torch.bool) if every else torch.rand(q, b, generator=g) < 0.7
        described_amb = masks.describe_from_host(ambiguous, ambiguous.clone())
        described_pos = masks.describe_from_host(positive, positive.clone())
        negatives = sample_hard_negatives(scores, ~(positive | ambiguous), None, torch.Generator().manual_seed(seed))
        with DeviceReads() as reads:
            got = [pos_over_neg(scores, described_pos, negatives, 0.1, valid),
                   rel_over_neg(scores, described_amb, confidence, negatives, 0.1, "score", valid),
                   pos_at_least_rel(scores, described_pos, described_amb, confidence, "hinge", valid, valid)]
        assert not reads.where
        want = [pos_over_neg(scores, positive & valid, negatives, 0.1),
                rel_over_neg(scores, ambiguous & valid, confidence, negatives, 0.1, "score"),
                pos_at_least_rel(scores, positive & valid, ambiguous & valid, confidence, "hinge")]
        for a, w in zip(got, want):
            if every:
                assert torch.equal(a, w)
            else:
                torch.testing.assert_close(a, w)


def test_mean_where_is_the_masked_mean():
    x = torch.randn(6)
    keep = torch.tensor([True, False, True, True, False, True])
    assert torch.equal(mean_where(x, keep, None, x), x[keep].mean())
    every = torch.ones(6, dtype=torch.bool)
    assert torch.equal(mean_where(x, every, True, x), x[every].mean())
    assert mean_where(x, torch.zeros(6, dtype=torch.bool), None, x) == 0


def test_a_mask_described_from_the_host_gives_its_true_index_on_the_host():
    """`true_index_host` of a mask on another device (here torch's meta device, whose values
    cannot be read at all) described from its host copy: the host's index, asking nothing."""
    host = torch.tensor([[True, False, True], [False, False, True]])
    elsewhere = masks.describe_from_host(host, host.to("meta"))
    assert masks.true_index_host(elsewhere).tolist() == [0, 2, 5]
    assert masks.true_index_host(host.clone()).tolist() == [0, 2, 5]  # undescribed, on the CPU: read


@pytest.mark.parametrize("seed", range(40))
def test_the_largest_group_from_the_host_is_the_devices_answer(seed):
    """RAL's support-set capacity counted on the host from the described row lengths and
    groups, or from an all-true mask, equals the device's count; undescribed, it asks."""
    g = torch.Generator().manual_seed(seed)
    rows, cols, groups = (int(v) for v in torch.randint(1, 12, (3,), generator=g))
    host_mask = torch.rand(rows, cols, generator=g) < torch.rand(1, generator=g)
    host_groups = torch.randint(0, groups, (rows,), generator=g)
    naive = int(torch.zeros(groups, dtype=torch.long).index_add_(0, host_groups, host_mask.sum(1)).max())
    mask, group_of = host_mask.clone(), host_groups.clone()  # "device" copies, described from the host
    masks.describe_from_host(host_mask, mask)
    masks.describe_values(host_groups, group_of)
    every = masks.describe(torch.ones(rows, cols, dtype=torch.bool), all_true=True)
    with DeviceReads() as reads:  # answered from the facts: nothing asked
        got, got_every, every_index = (masks.largest_group(mask, group_of, groups),
                                       masks.largest_group(every, group_of, groups), masks.true_index(every))
    assert not reads.where
    assert got == naive
    assert got_every == int(torch.zeros(groups, dtype=torch.long).index_add_(0, host_groups, every.sum(1)).max())
    assert torch.equal(every_index, every.flatten().nonzero().squeeze(1))
    assert masks.largest_group(host_mask.clone(), host_groups.clone(), groups) == naive  # undescribed: asks
    assert masks.largest_group(mask, group_of, 0) == 0


def test_a_host_made_constant_goes_to_its_device_once():
    """masks.constant_on: a constant a model makes on the host (a Gaussian window, DreamPRVR's
    position codes and register windows, MS-SL's proposal matrix) is made and moved once per
    (make, args, device, dtype), in that dtype, equal to what `make` gives. The H200's check
    (2026-11-29) found DreamPRVR moving two such constants at every step: 6 syncs in 2 steps."""
    made = []

    def make(n):
        made.append(n)
        return torch.arange(n, dtype=torch.float32)

    cpu = torch.device("cpu")
    first, again = (masks.constant_on(make, (4,), cpu, torch.float64) for _ in range(2))
    other = masks.constant_on(make, (5,), cpu, torch.float64)
    assert first is again and made == [4, 5]
    assert first.dtype == torch.float64 and torch.equal(first, torch.arange(4, dtype=torch.float64))
    assert torch.equal(other, torch.arange(5, dtype=torch.float64))


# ----------------------------------------------------------------------------- the steps
ATEN = torch.ops.aten
ASKS = {ATEN._local_scalar_dense.default, ATEN.nonzero.default, ATEN.masked_select.default,
        ATEN.is_nonzero.default, ATEN.equal.default, ATEN.multinomial.default, ATEN._unique2.default,
        ATEN.unique_consecutive.default, ATEN.unique_dim.default}
# A Python scalar made a tensor (`x[i] = True`, `torch.tensor(0.5)`): on a GPU it is copied to the
# device from pageable host memory when used with device tensors, a blocking copy (seen on an H100:
# `positive[rows, item] = True` synced every step)
HOST_VALUES = {ATEN.lift_fresh.default}
BOOL_INDEX = {ATEN.index.Tensor, ATEN.index_put_.default, ATEN.index_put.default, ATEN._index_put_impl_.default}
# What still asks, outside what this suite's data path and losses own (the reason, and the fix)
ELSEWHERE: dict[str, str] = {}  # (baseline's and ARL's frame maps now go through blocks.rowwise)
# (GMMFormer v2's Hungarian matching was here, solved on the host; it is solved on the device now)
INHERENT: dict[str, str] = {}
# Functions that work on host tensors only (so ask no device), which the proxy cannot tell from
# device tensors on a CPU: the CUDA test checks them
ON_HOST = {"host_lookup": "the SBERT detector's and the oracle's lookups from the batch indices, the labels and the "
                          "ground truth the loader described",
           "host_positive": "the labels' mask made on the host from the labelled columns the loader described",
           "describe_from_host": "the facts of a mask read off its host copy, before the copy",
           "_positive_rows": "GMMFormer v2's matching: the videos' positive queries, read off the mask's host copy",
           "host_tensors": "host-made index arrays (GMMFormer v2's matching, Holmes' query groups), before their pinned "
                           "copy"}
NOT_YET: dict[str, str] = {}  # function -> why its step still reads the device: each a fix left to do
HOST_COPIES = ("numpy", "tolist", "cpu")  # Tensor methods that copy a device tensor to the host
# A `.to(device)` in a step that is not `non_blocking`: on a GPU, of a host-made tensor, a blocking copy
# from pageable memory (the H200 found DreamPRVR moving its position codes and register windows so at
# every step, 2026-11-29); of a device tensor, nothing. The proxy cannot tell the two apart, so each
# project line that moves what is already on the device says so here (the CUDA test checks it)
ALREADY_THERE = {"methods/relations/sbert.py": "the batch's ground truth, moved with the batch: the detector's count "
                                               "of true pairs (`xml-pr` passes the CUDA test)"}


class DeviceReads(TorchDispatchMode):
    """The ops that read a device value on the host on a GPU, and the calls that copy a tensor
    to the host (`HOST_COPIES`), each with the project file, line and function that ran it
    ("backward" for the backward pass). Reads inside torch.optim are left out: the optimizers'
    step counters live on the host on a GPU too. Host-to-device copies are not there to see on a
    CPU; a blocking `.to(device)` the project's code calls is counted in their place
    (`ALREADY_THERE`: the lines that move what is already on the device)."""

    def __init__(self) -> None:
        super().__init__()
        self.where: collections.Counter = collections.Counter()
        self.saved = {}

    def __enter__(self):
        for name in HOST_COPIES:
            self.saved[name] = real = getattr(torch.Tensor, name)
            setattr(torch.Tensor, name, self._counted(real))
        self.saved["to"] = real_to = torch.Tensor.to

        def to(t, *args, **kwargs):  # a blocking move to a named device, called from the project's code
            device = kwargs.get("device", next((a for a in args if isinstance(a, (torch.device, str))), None))
            blocking = not kwargs.get("non_blocking", len(args) > 1 and args[1] is True)
            if device is not None and blocking:
                frames = traceback.extract_stack()[:-1]
                caller = frames[-1].filename
                if "site-packages" not in caller and "/tests/" not in caller and not any(
                        part in caller for part in ALREADY_THERE):
                    self.where["to(device) " + _source(frames)] += 1
            return real_to(t, *args, **kwargs)

        torch.Tensor.to = to
        return super().__enter__()

    def __exit__(self, *exc):
        for name, real in self.saved.items():
            setattr(torch.Tensor, name, real)
        return super().__exit__(*exc)

    def _counted(self, real):
        def call(t, *args, **kwargs):
            self._note()
            return real(t, *args, **kwargs)
        return call

    def _note(self) -> None:
        frames = traceback.extract_stack()
        if not any("torch/optim/" in f.filename for f in frames):
            self.where[_source(frames)] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        boolean = func in BOOL_INDEX and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool
                                             for i in (args[1] if len(args) > 1 else ()) or ())
        interleave = func == ATEN.repeat_interleave.Tensor and kwargs.get("output_size") is None
        if func in ASKS or func in HOST_VALUES or boolean or interleave:
            self._note()
        return func(*args, **kwargs)


# A comprehension's frame (Python 3.11; 3.12 inlines them) counts as the function that holds it
COMPREHENSIONS = {"<listcomp>", "<setcomp>", "<dictcomp>", "<genexpr>"}


def _source(frames) -> str:
    if any("torch/autograd/" in f.filename for f in frames):
        return "backward"
    asked = [f for f in frames if "harness/base/masks.py" in f.filename and f.name == "_from_device"]
    if asked:  # a host copy nobody described: asks the device, whatever function (ON_HOST too) called it
        return f"harness/base/masks.py:{asked[-1].lineno} _from_device"
    own = [f for f in frames if "site-packages" not in f.filename and "/tests/" not in f.filename
           and ("harness/base/masks.py" not in f.filename or f.name in ON_HOST) and f.name not in COMPREHENSIONS]
    f = own[-1]
    for part in ("methods/", "harness/", "datasets/"):
        if part in f.filename:
            return f"{part}{f.filename.split(part, 1)[1]}:{f.lineno} {f.name}"
    return f"{f.filename}:{f.lineno} {f.name}"


def _explained(where: str, allowed: set[str]) -> bool:
    return (any(where.startswith(f) for f in allowed) or (where == "backward" and bool(allowed))
            or where.split(" ")[-1] in INHERENT or where.split(" ")[-1] in ON_HOST)


class _WordEncoder:
    """A stand-in sentence encoder (the normalised sum of a fixed random vector per word): the
    SBERT detector's pairs without the `text` extra's model, which a GPU machine may not have.
    The step's lookup, not the detection at setup, is what these tests measure."""

    def encode(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), 32), dtype=np.float32)
        for k, t in enumerate(texts):
            for w in t.lower().replace(".", " ").replace(",", " ").split():
                out[k] += np.random.default_rng(zlib.crc32(w.encode())).standard_normal(32)
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)


@pytest.fixture
def text_pairs(monkeypatch, tmp_path):
    """The SBERT detector (xml-pr, xml-sl-pr) with `_WordEncoder`, its pairs cached in a folder
    of this test's (never read as the real model's)."""
    monkeypatch.setattr(sbert, "make_encoder", lambda model, device="cpu", batch_size=256: _WordEncoder())
    monkeypatch.setenv("PRVR_CACHE", str(tmp_path))


VARIANTS = {"code": ["ral.pool_padding=code"], "query": ["loss.text_source=query"],  # RAL's other support-set paths
            "oracle": ["relations.name=oracle"],  # the `+oracle` rows: the ground truth's pairs as positives
            "ignore": ["relations.name=oracle", "relations.oracle.mode=ignore"],  # ... or as not negatives
            "zero": ["model.padded_frames=zero"], "exclude": ["model.padded_frames=exclude"]}  # the reference's padding, or none


def _trainer(method: str, device: str | None = None):
    """`method`, `method@backbone`, or `method@backbone~variant` (VARIANTS)."""
    name, _, variant = method.partition("~")
    method, _, backbone = name.partition("@")
    overrides = ["loss.warmup_epochs=0"] if method == "arl" else []  # its detector active from the first step
    overrides += [f"backbone={backbone}"] * bool(backbone) + VARIANTS.get(variant, [])
    if device:
        overrides.append(f"train.device={device}")
    trainer = build_run(resolve(method, "sim-tiny", 0, overrides)).trainer("unused")
    trainer.model.train()
    trainer.detector.on_epoch_start(trainer.detector_state(0))
    batches = epoch_batches(len(trainer.has_queries), trainer.cfg.train.batch_size, 0, 0, trainer.has_queries)
    return trainer, batches


def _step_batch(trainer, videos):
    batch = trainer.batchers["train"].train_batch(videos)
    return (batch.pin_memory() if trainer.device.type == "cuda" else batch).to(trainer.device)


@pytest.mark.parametrize("method", ["baseline", "msl", "gmmformer", "gmmformer2", "arl", "ral", "ral@msl",
                                    "ral@gmmformer", "ral@msl~code", "ral@gmmformer~query", "xml", "xml-sl", "xml-pr",
                                    "xml-sl-pr", "baseline~oracle", "msl~ignore", "arl~oracle", "xml-pr~oracle",
                                    "xml-sl-pr~ignore", "holmes", "holmes~zero", "hlformer", "hlformer~exclude",
                                    "dreamprvr", "gmmformer2~zero"])
def test_a_training_step_asks_the_device_nothing_it_knows_cpu_proxy(method, text_pairs):
    trainer, batches = _trainer(method, "cpu")
    trainer.train_step(_step_batch(trainer, batches[0]), 0, 0)  # warm-up
    ready = [_step_batch(trainer, videos) for videos in batches[1:3]]  # on the host: the loader's work
    with DeviceReads() as reads:
        for i, batch in enumerate(ready, start=1):
            trainer.train_step(batch, 0, i)
    allowed = {f for f in ELSEWHERE if any(k.startswith(f) for k in reads.where)}
    allowed |= {k for k in reads.where if k.split(" ")[-1] in NOT_YET}
    unexplained = {k: n for k, n in reads.where.items() if not _explained(k, allowed)}
    assert not unexplained, f"{method}: host reads in a training step at {unexplained}"
    if method.endswith("-pr"):  # the SBERT detector's pairs' paths ran
        assert trainer.detector.epoch_report()["batch"]["per_query"] > 0


# ----------------------------------------------------------------------------- CUDA
def _syncs(fn) -> list[str]:
    """Where `fn` synchronised with the GPU (torch.cuda.set_sync_debug_mode's warnings)."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return [f"{w.filename}:{w.lineno}" for w in caught if "synchronizing CUDA operation" in str(w.message)]


STILL_SYNCS: dict[str, str] = {}  # method -> why its step still syncs (not in this suite's data path or losses)


@pytest.mark.cuda
@pytest.mark.parametrize("method", [
    pytest.param(m, marks=pytest.mark.xfail(strict=True, raises=AssertionError, reason=STILL_SYNCS[m]))
    if m in STILL_SYNCS else m
    for m in ["baseline", "msl", "gmmformer", "gmmformer2", "arl", "ral", "ral@msl", "ral@gmmformer", "xml", "xml-sl",
              "xml-pr", "xml-sl-pr", "baseline~oracle", "arl~oracle", "xml-sl-pr~ignore", "holmes", "holmes~zero",
              "hlformer", "dreamprvr", "gmmformer2~zero"]])
def test_training_steps_do_not_sync_with_the_gpu(method, on_cuda, text_pairs):
    trainer, batches = _trainer(method)
    assert trainer.device.type == "cuda"
    trainer.train_step(_step_batch(trainer, batches[0]), 0, 0)  # warm-up: first allocations, cached constants
    ready = [_step_batch(trainer, videos) for videos in batches[1:4]]

    def steps():
        for i, batch in enumerate(ready, start=1):
            trainer.train_step(batch, 0, i)

    syncs = _syncs(steps)
    assert not syncs, f"{method}: {len(syncs)} host syncs in {len(ready)} steps, at {collections.Counter(syncs)}"
