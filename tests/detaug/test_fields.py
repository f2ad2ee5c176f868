"""Per-box fields (issue 18): ``iscrowd``, ``difficult``, ``area`` and user columns follow their
boxes through every transform and filter, in both loaders, from every source kind.

The reference for "which box is which" is the recipe itself: ``Compose.plan_batch`` given the
real labels (the path the planner took before fields) says which label each output box has;
every sample's boxes carry labels unique in the dataset and fields that are functions of the
label, so a field row that left its box shows up. DALI runs on the CPU, small images.
"""

from __future__ import annotations

import io
import json
import os
import pickle

os.environ.setdefault("KERAS_BACKEND", "torch")  # before Keras is imported

import numpy as np
import pytest
import torch
from PIL import Image

import detaug.transforms as T
from detaug import DatasetError, DataWarning
from detaug.epochs import EpochSpec
from detaug.field_selection import select_fields
from detaug.planning import BatchPlanner
from detaug.seeds import sample_keys
from detaug.sources import CocoSource, Sample, SampleListSource, VocSource
from detaug.synthetic import write_voc_dataset
from detaug.torch import DetectionLoader
from detaug.transforms.compose import Partners

SEED = 3
N = 8


def track_of(labels: np.ndarray) -> np.ndarray:
    return 1000 + 7 * np.asarray(labels, np.int64)


def crowd_of(labels: np.ndarray) -> np.ndarray:
    return np.asarray(labels, np.int64) % 2


def scenes(n: int = N, per_image: int = 5) -> list[Sample]:
    """Decoded images with ``per_image`` boxes each; labels unique (10 i + j), fields of the label:
    ``track_id`` int32, ``iscrowd`` bool, ``area`` (any value: recomputed), ``score`` float [N, 2]."""
    rng = np.random.default_rng(7)
    samples = []
    for i in range(n):
        h, w = int(rng.integers(60, 100)), int(rng.integers(70, 110))
        xy = rng.uniform(0, [w - 12, h - 12], (per_image, 2))
        wh = rng.uniform(6, 30, (per_image, 2))
        boxes = np.concatenate([xy, np.minimum(xy + wh, [w, h])], axis=1).astype(np.float32)
        labels = 10 * (i + 1) + np.arange(per_image)
        fields = {"track_id": track_of(labels).astype(np.int32), "iscrowd": crowd_of(labels).astype(bool),
                  "area": np.full(per_image, -5.0), "score": np.stack([labels / 100, -labels / 100], axis=1)}
        samples.append(Sample(rng.integers(0, 255, (h, w, 3), dtype=np.uint8), boxes, labels, 100 + i, fields=fields))
    return samples


def reference(recipe: T.Compose, source, epoch: int, image_ids, positions, partner_positions=None):
    """``(boxes, labels)`` per sample from ``plan_batch`` on the samples' real labels."""
    samples = [source.samples[int(p)] for p in positions]
    shapes = [s.image.shape for s in samples]
    keys = sample_keys(SEED, epoch, np.asarray(image_ids))
    partners = None
    if recipe.num_partners:
        slots = partner_positions.T
        pick = [[source.samples[int(p)] if p >= 0 else None for p in slot] for slot in slots]
        partners = Partners(
            [[(1, 1, 3) if s is None else s.image.shape for s in slot] for slot in pick],
            [[np.zeros((0, 4), np.float32) if s is None else s.boxes for s in slot] for slot in pick],
            [[np.zeros(0, np.int64) if s is None else s.labels for s in slot] for slot in pick])
    _, boxes, labels = recipe.plan_batch(shapes, [s.boxes for s in samples], [s.labels for s in samples], keys, partners)
    return boxes, labels


def check_rows(boxes, labels, fields, names=("track_id", "iscrowd", "area", "score")) -> None:
    """The fields of kept boxes are those of their labels; area is the output box's."""
    boxes, labels = np.asarray(boxes, np.float32).reshape(-1, 4), np.asarray(labels)
    assert list(fields) == list(names)
    np.testing.assert_array_equal(fields["track_id"], track_of(labels))
    np.testing.assert_array_equal(fields["iscrowd"], crowd_of(labels))
    score = fields["score"]
    np.testing.assert_array_equal(score, np.stack([labels / 100, -labels / 100], axis=1).astype(score.dtype))
    np.testing.assert_array_equal(fields["area"], (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]))


CROP_FLIP = T.Compose([T.RandomIoUCrop(), T.RandomHorizontalFlip(), T.Resize((48, 64))])


@pytest.fixture(scope="module")
def source():
    return SampleListSource(scenes())


def test_sample_list_fields_are_checked_and_typed(source):
    specs = source.field_specs
    assert list(specs) == ["track_id", "iscrowd", "area", "score"]
    assert specs["iscrowd"].dtype == np.int64 and specs["track_id"].dtype == np.int32  # bools become int64
    assert specs["score"].shape == (2,) and specs["area"].dtype == np.float64
    as_mapping = SampleListSource([{"image": s.image, "boxes": s.boxes, "labels": s.labels, "fields": s.fields}
                                   for s in scenes(2)])
    assert as_mapping.samples[1].fields["track_id"].tolist() == track_of(as_mapping.samples[1].labels).tolist()
    image = np.zeros((20, 20, 3), np.uint8)
    bad = [
        ({"track_id": [1]}, r"sample 1.*field 'track_id' has 1 rows, expected one per box \(2\)"),
        ({"labels": [1, 2]}, r"sample 1.*field name 'labels' is reserved"),
        ({"name": ["a", "b"]}, r"sample 1.*field 'name' of dtype <U1 is not numbers"),
        (None, r"sample 1.*no field 'track_id' \(sample 0 has one\)"),
        ({"track_id": [[1], [2]]}, r"sample 1.*field 'track_id' of shape \(2, 1\)"),
    ]
    two = np.array([[1, 1, 5, 5], [2, 2, 9, 9]], np.float32)
    for fields, message in bad:
        with pytest.raises(DatasetError, match=message):
            SampleListSource([Sample(image, two, [1, 2], fields={"track_id": [4, 5]}),
                              Sample(image, two, [1, 2], fields=fields)])
    empty = SampleListSource([Sample(image, two, [1, 2], fields={"track_id": np.array([4, 5], np.int16)}),
                              Sample(image)])  # no boxes: may leave the fields out
    assert empty.samples[1].fields["track_id"].dtype == np.int16 and empty.samples[1].fields["track_id"].shape == (0,)


def test_rows_dropped_by_the_checks_and_by_clipping_leave_with_their_boxes():
    image = np.zeros((40, 50, 3), np.uint8)
    boxes = np.array([[1, 1, 10, 10], [60, 60, 70, 70], [45, 5, 80, 20]], np.float32)  # outside, then clipped
    with pytest.warns(DataWarning):
        checked = SampleListSource([Sample(image, boxes, [1, 2, 3], fields={"track_id": [11, 22, 33]})])
    assert checked.samples[0].labels.tolist() == [1, 3] and checked.samples[0].fields["track_id"].tolist() == [11, 33]
    png = io.BytesIO()
    Image.fromarray(image).save(png, format="PNG")
    encoded = SampleListSource([Sample(png.getvalue(), boxes, [1, 2, 3], fields={"track_id": [11, 22, 33]})])
    assert len(encoded.samples[0].boxes) == 3  # size unknown until read: clipped when planned
    planner = BatchPlanner(encoded, T.Compose([T.RandomHorizontalFlip(p=1.0)]), EpochSpec(n=1, batch_size=1),
                           fields=["track_id", "area"])  # area: computed, the source has none
    planned = planner.plan(0, 0)
    assert planned.labels[0].tolist() == [1, 3] and planned.fields[0]["track_id"].tolist() == [11, 33]
    np.testing.assert_array_equal(planned.boxes[0], [[40, 1, 49, 10], [0, 5, 5, 20]])
    np.testing.assert_array_equal(planned.fields[0]["area"], [81, 75])
    assert [r["reason"] for r in planned.repaired] == ["box clipped to the image", "box outside the image dropped"]


def test_torch_targets_carry_the_fields_through_a_crop_and_a_flip(source):
    loader = DetectionLoader(source, CROP_FLIP, 4, device="cpu", shuffle=True, seed=SEED, num_threads=2)
    plain = DetectionLoader(source, CROP_FLIP, 4, device="cpu", shuffle=True, seed=SEED, num_threads=2, fields="none")
    by_id = {s.image_id: k for k, s in enumerate(source.samples)}
    dropped = 0
    for epoch in range(2):
        loader.set_epoch(epoch)
        plain.set_epoch(epoch)
        for (images, targets), (images0, targets0) in zip(loader, plain):
            torch.testing.assert_close(images, images0, rtol=0, atol=0)  # fields change no draw
            for t, t0 in zip(targets, targets0):
                assert list(t) == ["boxes", "labels", "image_id", "track_id", "iscrowd", "area", "score"]
                assert list(t0) == ["boxes", "labels", "image_id"]
                assert t["iscrowd"].dtype == torch.int64 and t["area"].dtype == torch.float32
                assert t["track_id"].dtype == torch.int32 and t["score"].shape == (len(t["boxes"]), 2)
                boxes, labels = reference(CROP_FLIP, source, epoch, [t["image_id"]], [by_id[t["image_id"]]])
                np.testing.assert_array_equal(t["boxes"].cpu().numpy(), boxes[0])
                np.testing.assert_array_equal(t["labels"].cpu().numpy(), labels[0])
                np.testing.assert_array_equal(t0["labels"].cpu().numpy(), labels[0])
                check_rows(t["boxes"], t["labels"], {k: t[k].numpy() for k in ("track_id", "iscrowd", "area", "score")})
                dropped += 5 - len(t["labels"])
    assert dropped > 0  # the crop dropped boxes (and their rows)
    chosen = DetectionLoader(source, CROP_FLIP, 4, device="cpu", seed=SEED, num_threads=1, fields=["area", "track_id"])
    _, targets = next(iter(chosen))
    assert list(targets[0]) == ["boxes", "labels", "image_id", "area", "track_id"]
    with pytest.raises(ValueError, match=r"fields 'tracks': the source has no such per-box field \(it has 'track_id'"):
        DetectionLoader(source, CROP_FLIP, 4, device="cpu", fields=["tracks"])
    for one in (loader, plain, chosen):
        one.close()


def test_keras_targets_pad_the_fields_like_the_labels(source):
    keras = pytest.importorskip("keras", reason="Keras 3 is not installed")  # noqa: F841
    from detaug.keras import DetectionSequence

    seq = DetectionSequence(source, CROP_FLIP, 4, max_boxes=6, seed=SEED, device="cpu", num_threads=2,
                            images_on_device=False, plan_workers=0, fields="all")  # the Keras default: "none"
    assert seq.field_specs == {"track_id": (np.int32, ()), "iscrowd": (np.int32, ()), "area": (np.float32, ()),
                               "score": (np.float32, (2,))}
    images, targets = seq[1]
    assert list(targets) == ["boxes", "labels", "track_id", "iscrowd", "area", "score"]
    assert targets["score"].shape == (4, 6, 2) and targets["area"].dtype == np.float32
    assert targets["track_id"].dtype == np.int32
    ids = seq.planner.plan(0, 1).image_ids
    by_id = {s.image_id: k for k, s in enumerate(source.samples)}
    boxes, labels = reference(CROP_FLIP, source, 0, ids, [by_id[int(i)] for i in ids])
    for k in range(4):
        n = len(labels[k])
        np.testing.assert_array_equal(targets["labels"][k, :n], labels[k])
        np.testing.assert_array_equal(targets["boxes"][k, :n], boxes[k])
        check_rows(targets["boxes"][k, :n], targets["labels"][k, :n],
                   {name: targets[name][k, :n] for name in ("track_id", "iscrowd", "area", "score")})
        for name in ("labels", "track_id", "iscrowd", "area", "score"):
            assert (targets[name][k, n:] == -1).all()
    plain = DetectionSequence(source, CROP_FLIP, 4, max_boxes=6, seed=SEED, device="cpu", num_threads=2,
                              images_on_device=False, plan_workers=0, fields="none")
    images0, targets0 = plain[1]
    assert list(targets0) == ["boxes", "labels"] and np.array_equal(images0, images)
    np.testing.assert_array_equal(targets0["boxes"], targets["boxes"])
    cut = DetectionSequence(source, T.Compose([T.Resize((48, 64))]), 4, max_boxes=3, device="cpu", num_threads=2,
                            images_on_device=False, plan_workers=0, overflow="truncate", fields=["track_id"])
    _, few = cut[0]
    assert few["track_id"].shape == (4, 3)
    np.testing.assert_array_equal(few["track_id"], track_of(few["labels"]))
    for one in (seq, plain, cut):
        one.close()


def test_mosaic_partners_fields_are_merged_in_their_boxes_order(source):
    recipe = T.Compose([T.Mosaic(size=(64, 64)), T.RandomHorizontalFlip(), T.Resize((64, 64))])
    spec = EpochSpec(n=len(source), batch_size=4, shuffle=True, seed=SEED)
    planner = BatchPlanner(source, recipe, spec)
    owners = 0
    for epoch in range(2):
        for step in range(len(spec)):
            planned = planner.plan(epoch, step)
            labels = reference(recipe, source, epoch, planned.image_ids, planned.positions, planned.partner_positions)[1]
            for k in range(len(planned.image_ids)):
                np.testing.assert_array_equal(planned.labels[k], labels[k])
                check_rows(planned.boxes[k], planned.labels[k], planned.fields[k])
                owners = max(owners, len(set((planned.labels[k] // 10).tolist())))
    assert owners >= 3  # boxes of several images in one mosaic
    none = BatchPlanner(source, recipe, spec, fields="none").plan(1, 0)
    again = planner.plan(1, 0)
    assert none.fields == [{}] * 4 and all(np.array_equal(a, b) for a, b in zip(none.boxes, again.boxes))
    np.testing.assert_array_equal(none.params, again.params)


def write_coco(root) -> str:
    (root / "images").mkdir()
    for name in ("a.png", "b.png"):
        Image.fromarray(np.full((30, 40, 3), 90, np.uint8)).save(root / "images" / name)
    doc = {
        "images": [{"id": 1, "file_name": "a.png", "height": 30, "width": 40},
                   {"id": 2, "file_name": "b.png", "height": 30, "width": 40}],
        "categories": [{"id": 1, "name": "x"}, {"id": 2, "name": "y"}],
        "annotations": [
            {"id": 10, "image_id": 1, "category_id": 1, "bbox": [2, 2, 10, 8], "area": 50.0, "iscrowd": 0},
            {"id": 11, "image_id": 1, "category_id": 2, "bbox": [20, 10, 16, 12], "area": 99.0, "iscrowd": 1},
            {"id": 12, "image_id": 2, "category_id": 1, "bbox": [0, 0, 40, 30], "iscrowd": 0},
        ],
    }
    path = root / "annotations.json"
    path.write_text(json.dumps(doc))
    return path


def test_coco_iscrowd_and_area_from_a_coco_json(tmp_path):
    path = write_coco(tmp_path)
    plain = CocoSource(path, tmp_path / "images")
    cached = CocoSource(path, tmp_path / "images", cache=tmp_path / "cache")
    for source in (plain, cached, pickle.loads(pickle.dumps(cached))):
        assert list(source.field_specs) == ["iscrowd", "area"]
        first = source.samples[0].fields
        assert first["iscrowd"].dtype == np.int64 and first["iscrowd"].tolist() == [0, 1]
        assert first["area"].dtype == np.float32 and first["area"].tolist() == [80.0, 192.0]  # the boxes'
    for source in (CocoSource(path, tmp_path / "images", include_iscrowd=False),
                   CocoSource(path, tmp_path / "images", cache=tmp_path / "cache", include_iscrowd=False)):
        assert source.samples[0].fields["iscrowd"].tolist() == [0] and source.samples[0].labels.tolist() == [1]
    recipe = T.Compose([T.RandomHorizontalFlip(p=1.0), T.Resize((15, 20))])  # half size: a quarter of the area
    loader = DetectionLoader(plain, recipe, 2, device="cpu", num_threads=1)
    _, targets = next(iter(loader))
    loader.close()
    assert select_fields(plain) == ("iscrowd", "area")
    t = targets[0]
    assert t["iscrowd"].tolist() == [0, 1] and t["labels"].tolist() == [1, 2]
    np.testing.assert_array_equal(t["boxes"].cpu().numpy(), [[14, 1, 19, 5], [2, 5, 10, 11]])
    assert t["area"].dtype == torch.float32 and t["area"].tolist() == [20.0, 48.0]
    assert targets[1]["area"].tolist() == [300.0] and targets[1]["iscrowd"].tolist() == [0]


def test_voc_difficult_and_iscrowd(tmp_path):
    write_voc_dataset(tmp_path, num_images=3, size=((40, 40), (50, 50)), max_objects=3, image_format="png",
                      splits={"train": 1.0})
    xml = min((tmp_path / "Annotations").glob("*.xml"))
    text = xml.read_text()
    assert text.count("<difficult>0</difficult>") >= 1
    xml.write_text(text.replace("<difficult>0</difficult>", "<difficult>1</difficult>", 1))
    counts = [len(s.boxes) for s in VocSource(tmp_path, "train").samples]
    keep = VocSource(tmp_path, "train")
    crowd = VocSource(tmp_path, "train", difficult="crowd")
    drop = VocSource(tmp_path, "train", difficult="drop")
    no_crowd = VocSource(tmp_path, "train", difficult="crowd", include_iscrowd=False)
    assert list(keep.field_specs) == ["iscrowd", "difficult"]
    first = keep.samples[0].fields
    assert first["difficult"].tolist() == [1] + [0] * (counts[0] - 1) and first["iscrowd"].tolist() == [0] * counts[0]
    assert first["difficult"].dtype == np.int64
    assert crowd.samples[0].fields["iscrowd"].tolist() == first["difficult"].tolist()
    assert np.array_equal(crowd.samples[0].boxes, keep.samples[0].boxes)
    for one in (drop, no_crowd):
        assert one.samples[0].fields["difficult"].tolist() == [0] * (counts[0] - 1)
        np.testing.assert_array_equal(one.samples[0].boxes, keep.samples[0].boxes[1:])
    assert keep.report.conversion.summary() == crowd.report.conversion.summary()


def test_planning_workers_get_the_fields_of_decoded_samples(source):
    """Workers plan decoded arrays from their shapes (DecodedShapes): the fields go with them."""
    from detaug.plan_jobs import planner_payload

    planner = BatchPlanner(source, CROP_FLIP, EpochSpec(n=len(source), batch_size=4, seed=SEED), fields=["iscrowd", "score"])
    worker = pickle.loads(planner_payload(planner))
    assert type(worker.source).__name__ == "DecodedShapes" and worker.fields == ("iscrowd", "score")
    here, there = planner.plan(1, 1), worker.plan(1, 1)
    for a, b in zip(here.fields, there.fields):
        assert list(a) == ["iscrowd", "score"] and all(np.array_equal(a[k], b[k]) for k in a)
    assert all(np.array_equal(a, b) for a, b in zip(here.labels, there.labels))


def test_area_is_in_the_default_targets_of_every_source(tmp_path):
    """``fields="all"`` (the default) gives ``area`` in output pixels from a VOC folder and a
    sample list too (issue 38: only COCO had it), recomputed on the output boxes."""
    write_voc_dataset(tmp_path / "voc", num_images=3, size=(40, 40), max_objects=3, image_format="png")
    voc = VocSource(tmp_path / "voc")
    listed = SampleListSource([Sample(np.zeros((30, 40, 3), np.uint8), [[2, 2, 10, 8], [20, 10, 40, 30]], [1, 2])])
    recipe = T.Compose([T.Resize((20, 20))])
    for source, names in ((voc, ["iscrowd", "difficult", "area"]), (listed, ["area"])):
        assert list(select_fields(source)) == names
        loader = DetectionLoader(source, recipe, 1, device="cpu", num_threads=1)
        for _, (t,) in loader:
            assert list(t) == ["boxes", "labels", "image_id", *names]
            b = t["boxes"]
            assert t["area"].dtype == torch.float32
            torch.testing.assert_close(t["area"], (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1]))
        loader.close()
    loader = DetectionLoader(listed, recipe, 1, device="cpu", num_threads=1)
    _, (t,) = next(iter(loader))
    loader.close()
    assert t["area"].tolist() == pytest.approx([8 * 6 * (20 / 40) * (20 / 30), 20 * 20 * (20 / 40) * (20 / 30)])
