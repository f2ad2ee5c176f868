"""The hand-over to PyTorch: targets in one copy, in every form, equal to the batch's columns."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from detaug import handover

from detaug.handover import PAD_VALUE, TARGET_FORMS, build_targets, columns_to_device, host_targets, targets_to_device

DEVICES = [torch.device("cpu")] + ([torch.device("cuda", 0)] if torch.cuda.is_available() else [])


def _columns(rng, counts):
    n = int(sum(counts))
    xy = rng.uniform(0, 50, (n, 2)).astype(np.float32)
    boxes = np.concatenate([xy, xy + rng.uniform(1, 20, (n, 2)).astype(np.float32)], axis=1)
    labels = rng.integers(0, 80, n).astype(np.int64)
    fields = {"iscrowd": rng.integers(0, 2, n).astype(np.int64), "area": rng.uniform(1, 400, n).astype(np.float32),
              "points": rng.uniform(0, 9, (n, 3, 2)).astype(np.float32), "flag": rng.integers(0, 2, n).astype(bool)}
    return boxes, labels, fields


@pytest.mark.parametrize("device", DEVICES, ids=str)
@pytest.mark.parametrize("counts", [[3, 0, 5, 1], [0, 0], [7], [2, 2, 2]])
def test_every_form_holds_the_columns(device, counts):
    rng = np.random.default_rng(sum(counts) + len(counts))
    boxes, labels, fields = _columns(rng, counts)
    ids = np.arange(100, 100 + len(counts))
    starts = np.cumsum([0] + counts)
    per_image = build_targets(counts, boxes, labels, fields, ids, device, "dict")
    assert [t["image_id"] for t in per_image] == ids.tolist()
    for k, target in enumerate(per_image):
        rows = slice(starts[k], starts[k + 1])
        assert target["boxes"].dtype == torch.float32 and target["labels"].dtype == torch.int64
        assert target["boxes"].device.type == device.type
        np.testing.assert_array_equal(target["boxes"].cpu().numpy(), boxes[rows])
        np.testing.assert_array_equal(target["labels"].cpu().numpy(), labels[rows])
        for name, values in fields.items():
            np.testing.assert_array_equal(target[name].cpu().numpy(), values[rows])

    concat = build_targets(counts, boxes, labels, fields, ids, device, "concat")
    np.testing.assert_array_equal(concat["boxes"].cpu().numpy(), boxes)
    np.testing.assert_array_equal(concat["labels"].cpu().numpy(), labels)
    np.testing.assert_array_equal(concat["batch_index"].cpu().numpy(), np.repeat(np.arange(len(counts)), counts))
    np.testing.assert_array_equal(concat["num_boxes"].cpu().numpy(), counts)
    np.testing.assert_array_equal(concat["image_id"].cpu().numpy(), ids)
    for name, values in fields.items():
        np.testing.assert_array_equal(concat[name].cpu().numpy(), values)

    for max_boxes in (None, 9):
        padded = build_targets(counts, boxes, labels, fields, ids, device, "padded", max_boxes)
        rows_per_image = max(counts) if max_boxes is None else max_boxes
        assert padded["boxes"].shape == (len(counts), rows_per_image, 4)
        assert padded["labels"].shape == (len(counts), rows_per_image)
        np.testing.assert_array_equal(padded["num_boxes"].cpu().numpy(), counts)
        for k, count in enumerate(counts):
            rows = slice(starts[k], starts[k + 1])
            np.testing.assert_array_equal(padded["boxes"][k, :count].cpu().numpy(), boxes[rows])
            np.testing.assert_array_equal(padded["labels"][k, :count].cpu().numpy(), labels[rows])
            assert (padded["boxes"][k, count:] == PAD_VALUE).all() and (padded["labels"][k, count:] == PAD_VALUE).all()
            np.testing.assert_array_equal(padded["points"][k, :count].cpu().numpy(), fields["points"][rows])
            assert padded["points"].shape[2:] == (3, 2)


@pytest.mark.parametrize("device,pack", [(d, None) for d in DEVICES] + [(torch.device("cpu"), True)], ids=str)
def test_one_buffer_under_every_target(device, pack):
    """Every tensor of a batch's targets is a view of one buffer (one copy to the device), in
    its dtype and shape: packed on a GPU (and on the CPU when asked, so that CI checks the
    packing: the offsets, strides and dtypes of the views), empty and 3-D columns included."""
    rng = np.random.default_rng(0)
    counts = [2, 3, 1]
    boxes, labels, fields = _columns(rng, counts)
    fields["empty"] = np.zeros((0, 5), np.float64)
    fields["small"] = np.arange(3, dtype=np.int16)  # an odd byte count before the next column
    out = columns_to_device({"boxes": boxes, "labels": labels, **fields}, device, pack=pack)
    storages = {t.untyped_storage().data_ptr() for t in out.values()}
    if device.type == "cuda" or pack:
        assert len(storages) == 1
    for name, values in {"boxes": boxes, "labels": labels, **fields}.items():
        assert out[name].dtype == torch.from_numpy(values).dtype
        np.testing.assert_array_equal(out[name].cpu().numpy(), values)


def test_padded_overflow_names_the_image():
    boxes = np.zeros((5, 4), np.float32)
    with pytest.raises(ValueError, match="image 8 has 4 boxes, more than max_boxes=3"):
        build_targets([1, 4], boxes, np.zeros(5, np.int64), {}, [7, 8], torch.device("cpu"), "padded", 3)


def test_unknown_form():
    with pytest.raises(ValueError, match="form must be one of"):
        build_targets([0], np.zeros((0, 4), np.float32), np.zeros(0, np.int64), {}, [1], torch.device("cpu"), "ragged")
    assert TARGET_FORMS == ("dict", "padded", "concat")


def _same_targets(got, want):
    if isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want)
        for g, w in zip(got, want):
            _same_targets(g, w)
        return
    assert list(got) == list(want)
    for name, value in want.items():
        if isinstance(value, torch.Tensor):
            assert got[name].dtype == value.dtype and got[name].shape == value.shape and got[name].device == value.device
            np.testing.assert_array_equal(got[name].cpu().numpy(), value.cpu().numpy())
        else:
            assert got[name] == value


@pytest.mark.parametrize("device,pack", [(d, None) for d in DEVICES] + [(torch.device("cpu"), True)], ids=str)
@pytest.mark.parametrize("form", TARGET_FORMS)
def test_a_run_of_batches_in_one_copy_equals_each_batch_on_its_own(device, pack, form, monkeypatch):
    """The batches of a run go to the device together (targets_to_device): each batch's targets
    are those build_targets makes for it alone, in every form; a column whose trailing shape
    differs between batches (masks padded to each batch's largest image) too; on a GPU every
    tensor of every batch is a view of one buffer."""
    rng = np.random.default_rng(7)
    batches = []
    for k, counts in enumerate([[3, 0, 5], [1, 4, 2], [0, 0, 0], [6, 1, 1]]):
        boxes, labels, fields = _columns(rng, counts)
        fields["masks"] = rng.integers(0, 2, (int(sum(counts)), 5 + k, 7), dtype=np.uint8)  # sizes differ by batch
        batches.append((counts, boxes, labels, fields, np.arange(10 * k, 10 * k + 3)))
    want = [build_targets(*b, device, form) for b in batches]  # each batch alone (on the CPU: no packing)
    if pack:
        monkeypatch.setattr(handover, "columns_to_device", functools.partial(handover.columns_to_device, pack=True))
    run = targets_to_device([host_targets(*b, form=form, max_boxes=None) for b in batches], device)
    for got, one in zip(run, want):
        _same_targets(got, one)
    if device.type == "cuda" or pack:
        tensors = [t for got in run for target in (got if isinstance(got, list) else [got])
                   for t in target.values() if isinstance(t, torch.Tensor)]
        assert len({t.untyped_storage().data_ptr() for t in tensors}) == 1


def test_a_run_holds_batches_of_one_form():
    counts, boxes, labels = [1], np.zeros((1, 4), np.float32), np.zeros(1, np.int64)
    with pytest.raises(ValueError, match="one form"):
        targets_to_device([host_targets(counts, boxes, labels, {}, [1], "dict"),
                           host_targets(counts, boxes, labels, {}, [2], "padded")], torch.device("cpu"))
    assert targets_to_device([], torch.device("cpu")) == []
