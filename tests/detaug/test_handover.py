"""The hand-over to PyTorch: targets in one copy, in every form, equal to the batch's columns."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from detaug.handover import PAD_VALUE, TARGET_FORMS, build_targets, columns_to_device

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


@pytest.mark.parametrize("device", DEVICES, ids=str)
def test_one_buffer_under_every_target(device):
    """Every tensor of a batch's targets is a view of one buffer (one copy to the device)."""
    rng = np.random.default_rng(0)
    counts = [2, 3, 1]
    boxes, labels, fields = _columns(rng, counts)
    out = columns_to_device({"boxes": boxes, "labels": labels, **fields}, device)
    storages = {t.untyped_storage().data_ptr() for t in out.values()}
    if device.type == "cuda":
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
