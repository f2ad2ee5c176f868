"""Keypoints (issue 41): per-object ``[K, 3]`` points moved by the same planned geometry as their
image and boxes, checked on the pixels.

Synthetic scenes: a black image, a few objects (boxes) each with ``K = 3`` keypoints at pixel
centres, each painted as a 5 x 5 dot of its own primary colour (keypoint 0 blue, 1 red, 2 green:
the colours are orthogonal, so a pixel's share of one colour is its projection on it). After a
recipe runs (real DALI CPU pipelines), every visible output keypoint must sit on the dot of its
colour (the share-weighted centroid of the dot, within 0.5 px median), inside its object's box;
a point that left the image is ``v = 0`` and its dot is not (whole) on the output. With
``keypoint_flip_pairs=[(1, 2)]`` a mirrored sample's keypoint 1 sits on the green dot.
DALI runs on the CPU; ``DETAUG_TEST_DEVICE=gpu`` runs the same checks on a GPU.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("KERAS_BACKEND", "torch")  # before Keras is imported

import numpy as np
import pytest
import torch

import detaug.transforms as T
from detaug import DatasetError
from detaug.errors import RecipeError
from detaug.keypoints import (
    COCO_KEYPOINT_OFFSET, COCO_PERSON_FLIP_PAIRS, check_flip_pairs, flip_pairs_from_names, flip_permutation,
    to_coco_keypoints,
)
from detaug.epochs import EpochSpec
from detaug.planning import BatchPlanner
from detaug.sources import CocoSource, Sample, SampleListSource
from detaug.torch import DetectionLoader
from tests.detaug.geometric import exif_rotated_png, geometric_recipes, keras_padded_field, plan_together_and_alone

DEVICE = os.environ.get("DETAUG_TEST_DEVICE", "cpu")  # DETAUG_TEST_DEVICE=gpu: the same checks on a GPU
K = 3
COLOURS = np.array([[0, 0, 255], [255, 0, 0], [0, 255, 0]], np.float64)  # keypoint 0 blue, 1 red, 2 green
DOT = 2  # a dot covers pixels i - 2 .. i + 2 around the keypoint's pixel i: 5 x 5
PAIRS = [(1, 2)]


def scene(seed: int, hw: tuple[int, int] = (96, 128), objects: int = 3) -> Sample:
    """A black image with ``objects`` boxes side by side (labels ``10 seed + 1 ..``, unique over
    scenes), each with K keypoints at pixel centres painted as dots; keypoint 0 of object 0 is
    ``v = 1`` (labelled, not visible), the rest ``v = 2``."""
    rng = np.random.default_rng(seed)
    h, w = hw
    image = np.zeros((h, w, 3), np.uint8)
    width = w // objects
    boxes, points = [], []
    for o in range(objects):
        x0, x1 = o * width + 2, (o + 1) * width - 2
        y0 = int(rng.integers(2, h // 3))
        y1 = int(rng.integers(2 * h // 3, h - 2))
        boxes.append([x0, y0, x1, y1])
        row = []
        while len(row) < K:  # whole pixels at least 3 px inside the box, dots 9 px apart
            px, py = int(rng.integers(x0 + 3 + DOT, x1 - 3 - DOT)), int(rng.integers(y0 + 3 + DOT, y1 - 3 - DOT))
            if all(max(abs(px - qx), abs(py - qy)) >= 9 for qx, qy in row):
                row.append((px, py))
        for k, (px, py) in enumerate(row):
            image[py - DOT:py + DOT + 1, px - DOT:px + DOT + 1] = COLOURS[k]
        points.append([[px + 0.5, py + 0.5, 2.0] for px, py in row])
    points = np.array(points, np.float32)
    points[0, 0, 2] = 1
    return Sample(image, np.array(boxes, np.float32), 10 * seed + np.arange(1, objects + 1), image_id=seed + 1,
                  fields={"keypoints": points})


def dot_at(image: np.ndarray, xy: np.ndarray, colour: np.ndarray, radius: float) -> tuple[np.ndarray, float]:
    """``(centroid (x, y), mass)`` of ``colour``'s share in the pixels whose centres lie within
    ``radius`` (a square) of ``xy``: the share of a pixel is its projection on the colour."""
    h, w = image.shape[:2]
    x0, x1 = int(np.floor(xy[0] - radius)), int(np.ceil(xy[0] + radius))
    y0, y1 = int(np.floor(xy[1] - radius)), int(np.ceil(xy[1] + radius))
    x0, y0, x1, y1 = max(x0, 0), max(y0, 0), min(x1, w), min(y1, h)
    if x1 <= x0 or y1 <= y0:
        return np.array([np.nan, np.nan]), 0.0
    patch = image[y0:y1, x0:x1].astype(np.float64)
    share = np.clip(patch @ colour / (colour @ colour), 0, 1)
    mass = float(share.sum())
    if mass == 0:
        return np.array([np.nan, np.nan]), 0.0
    ys, xs = np.mgrid[y0:y1, x0:x1] + 0.5
    return np.array([(share * xs).sum() / mass, (share * ys).sum() / mass]), mass


def area_scale(src: np.ndarray, out: np.ndarray) -> float:
    """The local area scale of an object's map: the area of its output keypoint triangle over its
    source one (exact for affine maps, close for a small object under a perspective)."""
    def area(p: np.ndarray) -> float:
        (ax, ay), (bx, by) = p[1, :2] - p[0, :2], p[2, :2] - p[0, :2]
        return abs(float(ax * by - ay * bx)) / 2

    return area(out) / area(src)


def check_pixels(image: np.ndarray, boxes: np.ndarray, labels: np.ndarray, points: np.ndarray,
                 sources: dict[int, np.ndarray], mirrored: bool | None = None, share: float = 1.0) -> list[float]:
    """Every visible keypoint on its dot (of its colour, or of its pair partner's where
    ``mirrored``; ``None``: either, the same for all the sample's objects), inside its box;
    points off the canvas ``v = 0``; an invisible point's dot not whole on the canvas. ``share``:
    the least weight of a dot's image in the output (a ``MixUp`` blend's). Returns the centroid
    errors of the whole dots (px)."""
    h, w = image.shape[:2]
    assert points.shape == (len(boxes), K, 3) and points.dtype == np.float32
    errors: list[float] = []
    perm = flip_permutation(PAIRS, K)
    seen_mirror = set()
    for box, label, row in zip(boxes, labels, points):
        src = sources[int(label)]
        scale = area_scale(src, row)
        whole = (2 * DOT + 1) ** 2 * scale
        radius = (DOT + 1.5) * np.sqrt(scale) + 1.5
        for k, (x, y, v) in enumerate(row):
            off = not (0 <= x <= w and 0 <= y <= h)
            assert v in (0, 1, 2)
            if off:
                assert v == 0, f"keypoint {k} at {(x, y)} off the {w}x{h} canvas is visible"
            if v == 0:
                inside = radius <= x <= w - radius and radius <= y <= h - radius
                if inside:  # on the canvas but cut away (a crop, then a zoom-out): no whole dot
                    for colour in COLOURS:
                        assert dot_at(image, np.array([x, y]), colour, radius)[1] < 0.8 * whole
                continue
            assert v == src[k, 2], "a visible point keeps its flag"
            assert box[0] - 1e-3 <= x <= box[2] + 1e-3 and box[1] - 1e-3 <= y <= box[3] + 1e-3, \
                f"keypoint {k} {(x, y)} outside its box {box}"
            masses = [dot_at(image, np.array([x, y]), c, radius)[1] for c in COLOURS]
            if mirrored is None:
                which = int(np.argmax(masses))
                assert which in (k, perm[k])
                if k != perm[k]:
                    seen_mirror.add(which != k)
            else:
                which = int(perm[k]) if mirrored else k
            centroid, mass = dot_at(image, np.array([x, y]), COLOURS[which], radius)
            assert mass >= 0.25 * share * whole, \
                f"keypoint {k} {(x, y)}: no dot of colour {which} there ({mass:.1f} of {whole:.1f})"
            if mass >= 0.9 * share * whole:
                errors.append(float(np.hypot(*(centroid - [x, y]))))
    assert len(seen_mirror) <= 1, "a sample is mirrored for all its objects or for none"
    return errors


def by_label(samples: list[Sample]) -> dict[int, np.ndarray]:
    """The source keypoints ``[K, 3]`` of every object, by its (unique) label."""
    return {int(lab): p for s in samples for lab, p in zip(s.labels, s.fields["keypoints"])}


def run_eager(recipe: T.Compose, sample: Sample, seed: int) -> tuple[dict, dict[int, np.ndarray]]:
    out = recipe(image=sample.image, boxes=sample.boxes, labels=sample.labels, keypoints=sample.fields["keypoints"],
                 seed=seed, image_id=sample.image_id, device=DEVICE)
    return out, by_label([sample])


GEOMETRIC = geometric_recipes(
    (96, 128), perspective=0.4, iou_crop_resize=(80, 112), crop_pad=(72, 100), center_crop=(70, 90),
    zoom_out_resize=((1.0, 2.0), (112, 144)), crop_then_zoom_out=((60, 80), (1.2, 1.8)), letterbox=128,
    shortest_size=([64, 80, 120], 200), mosaic=((96, 128), T.RandomAffine(degrees=10, scale=(0.8, 1.2))))


@pytest.mark.parametrize("name", list(GEOMETRIC))
def test_every_geometric_transform_puts_each_visible_keypoint_on_its_dot(name):
    recipe = GEOMETRIC[name]
    errors, visible, hidden = [], 0, 0
    for seed in range(4):
        sample = scene(seed)
        out, sources = run_eager(recipe, sample, seed)
        errors += check_pixels(out["image"], out["boxes"], out["labels"], out["keypoints"], sources)
        visible += int((out["keypoints"][..., 2] > 0).sum())
        hidden += int((out["keypoints"][..., 2] == 0).sum())
    assert visible >= 8 and len(errors) >= 4
    assert np.median(errors) <= 0.5, f"{name}: median {np.median(errors):.3f} px"
    assert max(errors) <= 1.0, f"{name}: worst whole dot {max(errors):.3f} px off"


def test_mixup_moves_the_partners_keypoints_with_its_own_map():
    """``MixUp`` (the eager call's image is its own partner, letterboxed smaller at an offset):
    the sample's and the partner's keypoints each on their dots, blended at about one half."""
    recipe = T.Compose([T.Resize((96, 128)), T.MixUp(p=1.0, scale=(0.5, 0.7), fill=0),
                        T.RandomAffine(degrees=15)])
    errors, rows = [], 0
    for seed in range(4):
        sample = scene(seed)
        out, sources = run_eager(recipe, sample, seed)
        assert len(out["labels"]) > len(sample.labels)  # the partner's objects too
        rows += len(out["labels"])
        errors += check_pixels(out["image"], out["boxes"], out["labels"], out["keypoints"], sources, mirrored=False, share=0.35)
    assert rows >= 16 and len(errors) >= 8 and np.median(errors) <= 0.5


def test_a_crop_marks_the_points_it_cuts_away_invisible_and_keeps_them():
    sample = scene(5)
    recipe = T.Compose([T.CenterCrop((96, 60))])  # keeps x in [34, 94): the outer objects are cut
    out, sources = run_eager(recipe, sample, 0)
    check_pixels(out["image"], out["boxes"], out["labels"], out["keypoints"], sources)
    before = sample.fields["keypoints"]
    for label, row in zip(out["labels"], out["keypoints"]):
        src = before[int(label) - 51]
        np.testing.assert_allclose(row[:, 0], src[:, 0] - 34)  # moved, kept, whatever their flag
        inside = (src[:, 0] >= 34) & (src[:, 0] <= 94)
        np.testing.assert_array_equal(row[:, 2], np.where(inside, src[:, 2], 0))
    assert (out["keypoints"][..., 2] == 0).any() and (out["keypoints"][..., 2] > 0).any()


def test_a_removed_box_takes_its_keypoints_row_with_it():
    sample = scene(6)
    recipe = T.Compose([T.CenterCrop((96, 40))], min_visibility=0.5)  # only the middle object stays
    out, _ = run_eager(recipe, sample, 0)
    assert out["labels"].tolist() == [62]
    assert out["keypoints"].shape == (1, K, 3)


@pytest.mark.parametrize("flips, mirrored", [
    ([T.RandomHorizontalFlip(p=1.0)], True),
    ([T.RandomVerticalFlip(p=1.0)], True),
    ([T.RandomHorizontalFlip(p=1.0), T.RandomVerticalFlip(p=1.0)], False),  # a rotation by 180 degrees
    ([T.RandomRotation(degrees=(180, 180))], False),
])
def test_flip_pairs_swap_where_the_sample_is_mirrored(flips, mirrored):
    recipe = T.Compose(flips + [T.RandomAffine(degrees=20)], keypoint_flip_pairs=PAIRS)
    plain = T.Compose(flips + [T.RandomAffine(degrees=20)])
    sample = scene(7)
    out, sources = run_eager(recipe, sample, 1)
    errors = check_pixels(out["image"], out["boxes"], out["labels"], out["keypoints"], sources, mirrored=mirrored)
    assert np.median(errors) <= 0.5
    ref, _ = run_eager(plain, sample, 1)
    check_pixels(ref["image"], ref["boxes"], ref["labels"], ref["keypoints"], sources, mirrored=False)
    swapped = ref["keypoints"][:, flip_permutation(PAIRS, K)] if mirrored else ref["keypoints"]
    np.testing.assert_array_equal(out["keypoints"], swapped)


def test_a_random_flip_swaps_exactly_the_samples_it_mirrors():
    recipe = T.Compose([T.RandomHorizontalFlip(), T.RandomResizedCrop((96, 128), scale=(0.5, 1))],
                       keypoint_flip_pairs=PAIRS)
    for seed in range(6):
        sample = scene(seed)
        out, sources = run_eager(recipe, sample, seed)
        check_pixels(out["image"], out["boxes"], out["labels"], out["keypoints"], sources, mirrored=None)


def test_torch_loader_targets_with_mosaic_carry_keypoints_of_every_tile():
    samples = [scene(s) for s in range(6)]
    source = SampleListSource(samples)
    recipe = T.Compose([T.Mosaic(size=(96, 128), fill=0), T.RandomHorizontalFlip(), T.Resize((96, 128))],
                       keypoint_flip_pairs=PAIRS)
    loader = DetectionLoader(source, recipe, 3, device=DEVICE, seed=4, num_threads=1, shuffle=True)
    errors, tiles = [], set()
    for images, targets in loader:
        for image, t in zip(images, targets):
            assert t["keypoints"].dtype == torch.float32 and t["keypoints"].shape == (len(t["boxes"]), K, 3)
            errors += check_pixels(image.permute(1, 2, 0).cpu().numpy(), t["boxes"].cpu().numpy(), t["labels"].cpu().numpy(),
                                   t["keypoints"].cpu().numpy(), by_label(samples), mirrored=None)
            tiles |= {(int(t["image_id"]), int(lab) // 10) for lab in t["labels"]}
    loader.close()
    assert len({scene for _, scene in tiles}) >= 4 and np.median(errors) <= 0.5  # objects of several tiles


def test_batches_planned_together_move_keypoints_as_alone():
    """``plan_many`` (one ``plan_batch`` call for several batches, as the planning workers do)
    gives every batch's keypoints exactly as ``plan`` does."""
    source = SampleListSource([scene(s) for s in range(8)])
    recipe = T.Compose([T.Mosaic(size=(64, 96), fill=0), T.RandomHorizontalFlip(), T.RandomAffine(degrees=20)],
                       keypoint_flip_pairs=PAIRS)
    together = plan_together_and_alone(source, recipe, "keypoints", steps=4)
    assert sum(len(f["keypoints"]) for g in together for f in g.fields) > 8


def test_keras_targets_pad_keypoints_with_minus_one():
    pytest.importorskip("keras", reason="Keras 3 is not installed")
    source = SampleListSource([scene(s) for s in range(4)])
    padded, _ = keras_padded_field(source, T.Compose([T.RandomHorizontalFlip(), T.Resize((48, 64))]), "keypoints", DEVICE)
    assert padded.shape == (2, 5, K, 3) and padded.dtype == np.float32


@pytest.mark.parametrize("orientation", [6, 2, 5])
def test_keypoints_of_an_exif_rotated_image_follow_its_pixels(tmp_path, orientation):
    """Keypoints annotated on the stored pixels (no declared size: the stored frame) are moved to
    the displayed frame the decoder delivers, as their boxes; a mirroring orientation (2, 5)
    swaps the flip pairs."""
    sample = scene(8)
    path = exif_rotated_png(tmp_path / "rotated.png", sample.image, orientation)
    displayed = (128, 96) if orientation in (5, 6, 7, 8) else (96, 128)
    recipe = T.Compose([T.Resize(displayed)], keypoint_flip_pairs=PAIRS)
    stored = Sample(str(path), sample.boxes, sample.labels, image_id=3, fields=sample.fields)
    loader = DetectionLoader(SampleListSource([stored]), recipe, 1, device=DEVICE, num_threads=1)
    images, targets = next(iter(loader))
    loader.close()
    image = images[0].permute(1, 2, 0).cpu().numpy()
    assert image.shape[:2] == displayed
    errors = check_pixels(image, targets[0]["boxes"].cpu().numpy(), targets[0]["labels"].cpu().numpy(),
                          targets[0]["keypoints"].cpu().numpy(), by_label([sample]), mirrored=orientation in (2, 5))
    assert len(errors) >= 6 and np.median(errors) <= 0.5


# -- sources and validation --------------------------------------------------------------------------

def test_sample_list_keypoints_are_checked_with_named_errors():
    good = scene(1)
    bad = [
        (np.zeros((3, 2, 2)), r"keypoints of shape \[3, 2, 2\] are not \[N, K, 3\]"),
        (np.zeros((2, 2, 3)), "field 'keypoints' has 2 rows, expected one per box"),
        (np.array([[[1, 2, 2]], [[np.nan, 1, 2]], [[1, 1, 2]]]), r"box 1, keypoint 0: non-finite coordinate"),
        (np.array([[[1, 2, 2]], [[1, 1, 3]], [[1, 1, 2]]]), "box 1, keypoint 0: visibility 3 is not 0, 1 or 2"),
        (np.array([["a", "b", "c"]] * 3), "field 'keypoints' of dtype <U1 is not numbers"),
    ]
    for points, message in bad:
        s = Sample(good.image, good.boxes, good.labels, image_id=9, fields={"keypoints": points})
        with pytest.raises(DatasetError, match=message) as err:
            SampleListSource([s])
        assert "image_id 9" in str(err.value)
    other = Sample(good.image, good.boxes, good.labels, image_id=3, fields={"keypoints": np.zeros((3, 4, 3))})
    with pytest.raises(DatasetError, match=r"field 'keypoints' of shape \(3, 4, 3\): its rows are not of shape \(3, 3\)"):
        SampleListSource([good, other])
    source = SampleListSource([good, Sample(good.image[:, ::-1].copy(), image_id=5)])  # one without boxes
    assert source.field_specs["keypoints"] == (np.dtype(np.float32), (K, 3))
    assert source.samples[1].fields["keypoints"].shape == (0, K, 3)


def coco_doc(tmp_path, keypoints_of) -> tuple[dict, np.ndarray]:
    sample = scene(2)
    from PIL import Image

    Image.fromarray(sample.image).save(tmp_path / "a.png")
    annotations = []
    for j, (box, row) in enumerate(zip(sample.boxes, sample.fields["keypoints"])):
        flat = [float(c) for p in row for c in (p[0] - 0.5, p[1] - 0.5, int(p[2]))]  # COCO: pixel indices
        annotations.append({"id": 10 + j, "image_id": 1, "category_id": 1, "iscrowd": 0,
                            "bbox": [float(box[0]), float(box[1]), float(box[2] - box[0]), float(box[3] - box[1])],
                            **keypoints_of(j, flat)})
    doc = {"images": [{"id": 1, "file_name": "a.png", "width": 128, "height": 96},
                      {"id": 2, "file_name": "b.png", "width": 10, "height": 10}],
           "annotations": annotations,
           "categories": [{"id": 1, "name": "thing", "keypoints": ["nose", "left_eye", "right_eye"]}]}
    return doc, sample.fields["keypoints"]


def test_coco_keypoints_are_read_at_their_pixel_centres_and_moved(tmp_path):
    doc, points = coco_doc(tmp_path, lambda j, flat: {"keypoints": flat, "num_keypoints": 3})
    source = CocoSource(doc, tmp_path)
    assert source.field_specs["keypoints"] == (np.dtype(np.float32), (K, 3))
    np.testing.assert_array_equal(source.samples[0].fields["keypoints"], points)
    assert source.samples[1].fields["keypoints"].shape == (0, K, 3)
    np.testing.assert_allclose(to_coco_keypoints(points)[0],
                               [c for p in points[0] for c in (p[0] - COCO_KEYPOINT_OFFSET, p[1] - 0.5, p[2])])
    recipe = T.Compose([T.RandomHorizontalFlip(p=1.0), T.RandomAffine(degrees=10)], keypoint_flip_pairs=PAIRS)
    loader = DetectionLoader(source, recipe, 1, device=DEVICE, num_threads=1, fields=["keypoints"])
    images, targets = next(iter(loader))
    loader.close()
    assert list(targets[0]) == ["boxes", "labels", "image_id", "keypoints"]
    assert len(targets[0]["boxes"]) == len(points)  # every box kept, in order (one category: labels all 1)
    errors = check_pixels(images[0].permute(1, 2, 0).cpu().numpy(), targets[0]["boxes"].cpu().numpy(), np.arange(len(points)),
                          targets[0]["keypoints"].cpu().numpy(), dict(enumerate(points)), mirrored=True)
    assert np.median(errors) <= 0.5


@pytest.mark.parametrize("named", [True, False], ids=["categories name keypoints", "annotations only"])
def test_a_cached_coco_keypoints_file_keeps_its_keypoints(tmp_path, named):
    """The annotation cache holds keypoints (tests/detaug/formats/test_coco_cache_fields.py
    compares every sample with the fresh parse): cache=True never reads a keypoints file
    without them, however the file is parsed."""
    import json

    doc, points = coco_doc(tmp_path, lambda j, flat: {"keypoints": flat})
    if not named:  # only the annotations carry them: the streaming parser hands the file to load_coco
        del doc["categories"][0]["keypoints"]
    path = tmp_path / "keypoints.json"
    path.write_text(json.dumps(doc))
    for _ in range(2):  # built, then opened
        cached = CocoSource(path, tmp_path, cache=True)
        assert cached.field_specs["keypoints"][1] == (K, 3)
        np.testing.assert_array_equal(cached.samples[0].fields["keypoints"], points)


def test_keypoints_go_through_shards_as_any_per_box_field(tmp_path):
    from detaug.shards import ShardSource, write_shards

    doc, points = coco_doc(tmp_path, lambda j, flat: {"keypoints": flat})
    doc["images"] = doc["images"][:1]
    coco = CocoSource(doc, tmp_path)
    write_shards(coco, tmp_path / "shards", progress=False)
    shards = ShardSource(tmp_path / "shards")
    assert shards.field_specs["keypoints"] == (np.dtype(np.float32), (K, 3))
    recipe = T.Compose([T.RandomHorizontalFlip(p=1.0), T.Resize((48, 64))], keypoint_flip_pairs=PAIRS)
    ours = DetectionLoader(shards, recipe, 1, device=DEVICE, num_threads=1, fields=["keypoints"])
    theirs = DetectionLoader(coco, recipe, 1, device=DEVICE, num_threads=1, fields=["keypoints"])
    (_, a), (_, b) = next(iter(ours)), next(iter(theirs))
    ours.close()
    theirs.close()
    np.testing.assert_array_equal(a[0]["keypoints"].cpu().numpy(), b[0]["keypoints"].cpu().numpy())
    assert (a[0]["keypoints"][..., 2] > 0).sum() == (points[..., 2] > 0).sum()


def test_a_shard_manifest_with_keypoints_that_fail_the_checks_is_named(tmp_path):
    """The manifest's keypoints column is checked as a sample's keypoints are (an edited one is
    a DatasetError naming the manifest and the field), as its boxes are."""
    from detaug.shards import ShardSource, write_shards

    doc, _ = coco_doc(tmp_path, lambda j, flat: {"keypoints": flat})
    doc["images"] = doc["images"][:1]
    write_shards(CocoSource(doc, tmp_path), tmp_path / "shards", progress=False)
    names = [f[0] for f in json.loads((tmp_path / "shards" / "dataset.json").read_text())["fields"]]
    column = tmp_path / "shards" / "manifest" / f"field_{names.index('keypoints')}.npy"
    points = np.load(column)
    ShardSource(tmp_path / "shards")  # as written: passes
    points[0, 1, 2] = 5
    np.save(column, points)
    with pytest.raises(DatasetError, match=r"manifest: field 'keypoints' does not pass the checks.*visibility 5"):
        ShardSource(tmp_path / "shards")


def test_coco_keypoint_errors_name_the_annotation(tmp_path):
    doc, _ = coco_doc(tmp_path, lambda j, flat: {"keypoints": flat[:-3] if j == 1 else flat})
    with pytest.raises(DatasetError, match=r"annotation_id 11.*2 keypoints, others have 3"):
        CocoSource(doc, tmp_path)
    doc, _ = coco_doc(tmp_path, lambda j, flat: {"keypoints": flat[:2] + [5] + flat[3:] if j == 2 else flat})
    with pytest.raises(DatasetError, match=r"annotation_id 12.*visibility 5 is not 0, 1 or 2"):
        CocoSource(doc, tmp_path)
    doc, _ = coco_doc(tmp_path, lambda j, flat: {"keypoints": "x" if j == 0 else flat})
    with pytest.raises(DatasetError, match=r"annotation_id 10.*not a list of numbers"):
        CocoSource(doc, tmp_path)
    doc, _ = coco_doc(tmp_path, lambda j, flat: {"keypoints": flat} if j else {})  # a box without keypoints
    source = CocoSource(doc, tmp_path)
    np.testing.assert_array_equal(source.samples[0].fields["keypoints"][0], np.full((K, 3), [0.5, 0.5, 0]))
    doc, _ = coco_doc(tmp_path, lambda j, flat: {})  # a detection file: no keypoints field
    assert "keypoints" not in CocoSource(doc, tmp_path).field_specs


# -- the recipe's flip pairs ---------------------------------------------------------------------------

def test_flip_pairs_are_checked_serialised_and_matched_to_k():
    recipe = T.Compose([T.RandomHorizontalFlip()], keypoint_flip_pairs=COCO_PERSON_FLIP_PAIRS)
    again = T.Compose.from_json(recipe.to_json())
    assert again == recipe and again.keypoint_flip_pairs == COCO_PERSON_FLIP_PAIRS
    assert "keypoint_flip_pairs" not in T.Compose([T.RandomHorizontalFlip()]).to_dict()
    for pairs, message in [([(1, 1)], "distinct"), ([(1, 2), (2, 3)], "keypoint 2 is in two pairs"),
                           ([(1,)], "pairs"), ("ab", "list of"), ([(1, -2)], ">= 0"), ([(1.5, 2)], "integers")]:
        with pytest.raises(RecipeError, match=message):
            check_flip_pairs(pairs)
    text = json.dumps({"transforms": [{"name": "RandomHorizontalFlip"}], "keypoint_flip_pairs": [[0, 0]]})
    with pytest.raises(RecipeError, match="keypoint_flip_pairs"):
        T.Compose.from_json(text)
    source = SampleListSource([scene(0)])
    with pytest.raises(RecipeError, match=r"names keypoint 3, but the objects have 3 keypoints"):
        BatchPlanner(source, T.Compose([T.RandomHorizontalFlip()], keypoint_flip_pairs=[(1, 3)]), EpochSpec(n=1, batch_size=1))
    assert flip_pairs_from_names(["nose", "left_eye", "right_eye", "left_ear", "right_ear", "left_shoulder",
                                  "right_shoulder", "left_elbow", "right_elbow", "left_wrist", "right_wrist",
                                  "left_hip", "right_hip", "left_knee", "right_knee", "left_ankle",
                                  "right_ankle"]) == COCO_PERSON_FLIP_PAIRS


# -- torchvision's keypoint reference, ported ---------------------------------------------------------

def reference_affine_keypoints_helper(points: np.ndarray, *, affine_matrix: np.ndarray,
                                      canvas_size: tuple[int, int], clamp: bool = True) -> np.ndarray:
    """torchvision's keypoint reference of ``test/test_transforms_v2.py`` (0.23+): each point
    ``(x, y, 1)`` times the 2x3 ``affine_matrix`` in float64; clamped as ``clamp_keypoints`` does
    (to ``[0, W - 1] x [0, H - 1]``: torchvision's keypoints are pixel indices) when ``clamp``.
    Compared here only where nothing is clamped."""
    p = np.asarray(points, np.float64).reshape(-1, 2)
    out = np.concatenate([p, np.ones((len(p), 1))], axis=1) @ np.asarray(affine_matrix, np.float64).T
    if clamp:
        out[:, 0] = out[:, 0].clip(0, canvas_size[1] - 1)
        out[:, 1] = out[:, 1].clip(0, canvas_size[0] - 1)
    return out


def planned_keypoints(transforms, boxes: np.ndarray, points: np.ndarray, hw: tuple[int, int], seed: int = 0):
    """``(labels [M], keypoints [M, K, 3])`` of one sample planned by the loaders' planner."""
    sample = Sample(np.zeros((*hw, 3), np.uint8), boxes, np.arange(1, len(boxes) + 1), image_id=7,
                    fields={"keypoints": points})
    planner = BatchPlanner(SampleListSource([sample]), T.Compose(transforms, min_size=0.0),
                           EpochSpec(n=1, batch_size=1, seed=seed))
    planned = planner.plan(0, 0)
    return planned.labels[0], planned.fields[0]["keypoints"]


def _cases(n: int, seed: int):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        hw = (int(rng.integers(24, 400)), int(rng.integers(24, 400)))
        lo = np.array([hw[1], hw[0]]) * 0.3
        boxes = np.concatenate([lo, np.array([hw[1], hw[0]]) * 0.7])[None].repeat(4, 0).astype(np.float32)
        xy = rng.uniform(boxes[:, None, :2], boxes[:, None, 2:], (4, 5, 2))
        points = np.concatenate([xy, np.full((4, 5, 1), 2.0)], axis=2).astype(np.float32)
        yield rng, hw, boxes, points


def test_affine_and_rotation_keypoints_are_torchvisions_where_nothing_is_clamped():
    from tests.detaug.transforms.test_torchvision_reference import compute_affine_matrix, rotate_matrix

    checked = 0
    for k, (rng, hw, boxes, points) in enumerate(_cases(60, seed=11)):
        angle, scale = float(rng.uniform(-180, 180)), float(rng.uniform(0.5, 1.5))
        shear = (float(rng.uniform(-30, 30)), float(rng.uniform(-30, 30)))
        centre = (hw[1] * 0.5, hw[0] * 0.5)
        for t, matrix in (
            (T.RandomAffine(degrees=(angle, angle), scale=(scale, scale), shear=(shear[0], shear[0], shear[1], shear[1])),
             compute_affine_matrix(angle=angle, translate=(0, 0), scale=scale, shear=shear, center=centre)),
            (T.RandomRotation((angle, angle)), rotate_matrix(angle=angle, center=centre)),
            (T.RandomHorizontalFlip(p=1.0), np.array([[-1.0, 0, hw[1]], [0, 1, 0]])),
            (T.RandomVerticalFlip(p=1.0), np.array([[1.0, 0, 0], [0, -1, hw[0]]])),
        ):
            labels, out = planned_keypoints([t], boxes, points, hw, seed=k)
            src = points[labels - 1]
            expected = reference_affine_keypoints_helper(src[..., :2], affine_matrix=matrix, canvas_size=hw,
                                                         clamp=False).reshape(src.shape[0], -1, 2)
            on = (expected[..., 0] > 0.01) & (expected[..., 0] < hw[1] - 1.01) & \
                 (expected[..., 1] > 0.01) & (expected[..., 1] < hw[0] - 1.01)  # clamp_keypoints changes nothing
            np.testing.assert_allclose(out[..., :2][on], expected[on], rtol=2e-6, atol=2e-3, err_msg=f"{t} case {k}")
            assert (out[..., 2][on] == 2).all(), f"{t} case {k}: a point on the canvas was hidden"
            checked += int(on.sum())
    assert checked > 3000
