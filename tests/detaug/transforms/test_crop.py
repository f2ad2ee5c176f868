"""Crops (RandomCrop, CenterCrop, FixedSizeCrop, RandomIoUCrop's drop rules): exact boxes from the
planner, boxes on their objects' pixels through the real DALI CPU pipeline, plans independent of
the batch-mates, and the position statistics of torchvision's rules.

The helpers at the top (``pipeline_results``, ``assert_boxes_on_pixels``, ``plan_one``,
``assert_batch_independent``) are shared by the other geometry test modules of this folder.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import detaug.transforms as T
from detaug import RecipeError
from detaug.seeds import sample_keys
from detaug.sources import SampleListSource
from detaug.transforms import Compose
from tests.detaug.consistency import (
    RecordingCompose,
    check_boxes_match_pixels,
    iou,
    mask_box,
    object_masks,
    scene_samples,
)

DEVICE = os.environ.get("DETAUG_TEST_DEVICE", "cpu")
FILL = 114  # the scenes' background grey: padding never looks like an object


# -- shared helpers -----------------------------------------------------------------------------


def pipeline_results(transforms, *, n=12, batch_size=6, seed=0, size=(200, 160), min_size=1.0):
    """Run ``transforms`` through the real DALI pipeline (``DETAUG_TEST_DEVICE``, CPU by default)
    on ``n`` consistency scenes of ``size`` (width, height); per sample ``(image uint8 [H, W, 3],
    target, scene, area scale)``."""
    from detaug.torch import DetectionLoader

    recipe = RecordingCompose(transforms, min_size=min_size)
    samples, scenes = scene_samples(n, seed=seed, size=size)
    loader = DetectionLoader(SampleListSource(samples), recipe, batch_size, device=DEVICE, seed=seed, num_workers=0)
    results = []
    for (images, targets), record in zip(loader, recipe.records):
        scales = recipe.area_scales(record)
        for i, target in enumerate(targets):
            image = images[i].cpu().numpy().transpose(1, 2, 0)
            results.append((image, target, scenes[target["image_id"] - 1], scales[i]))
    assert len(results) == n
    return results


def pixel_ious(results) -> np.ndarray:
    """IoU of every output box with the tight box of its object's visible pixels (0 when the
    object shows no pixel): border boxes included."""
    out = []
    for image, target, scene, _ in results:
        masks = object_masks(image, [o.color for o in scene.objects])
        for box, label in zip(target["boxes"].cpu().numpy(), target["labels"].cpu().numpy()):
            tight = mask_box(masks[int(label) - 1])
            out.append(0.0 if tight is None else iou(np.asarray(box, np.float64), tight))
    return np.asarray(out)


def assert_boxes_on_pixels(results, *, check_missing=True) -> np.ndarray:
    """The geometry target: IoU >= 0.85 for 98% of the boxes, median >= 0.95, and (with
    ``check_missing``) :func:`check_boxes_match_pixels`' checks (no box on an invisible object,
    mostly visible objects keep theirs). Returns the IoUs."""
    ious = pixel_ious(results)
    assert len(ious) >= 10, f"only {len(ious)} boxes: the test sees too little"
    share = float(np.mean(ious >= 0.85))
    assert share >= 0.98 and np.median(ious) >= 0.95, (
        f"{share:.1%} of {len(ious)} boxes have IoU >= 0.85 (need 98%), median {np.median(ious):.3f}; "
        f"lowest {np.sort(ious)[:5].round(3).tolist()}")
    if check_missing:
        problems = []
        for image, target, scene, scale in results:
            found = check_boxes_match_pixels(image, target["boxes"].cpu().numpy(), target["labels"].cpu().numpy(), scene,
                                             area_scale=scale, min_iou=0.85)
            problems += [f"image {target['image_id']}: {p}" for p in found]
        assert not problems, "\n".join(problems)
    return ious


def plan_one(transforms, boxes, hw=(100, 200), seed=0, image_id=7, min_size=0.0):
    """Plan one sample: ``(decode ROI (x, y, w, h), first warp [2, 3] in source pixels, output
    (h, w), boxes [M, 4], labels [M])``. The matrix includes the decode ROI's offset, so it maps
    source pixels to output pixels."""
    recipe = Compose(transforms, min_size=min_size)
    boxes = np.asarray(boxes, np.float32).reshape(-1, 4)
    out = recipe.plan_batch([np.array([hw[0], hw[1], 3])], [boxes], [np.arange(1, len(boxes) + 1)],
                            sample_keys(seed, 0, [image_id]))
    where = recipe.plan_layout
    params = out[0][0].astype(np.float64)
    roi = params[where.slice("roi")]
    m, size = where.slice("warp0.matrix"), where.slice("warp0.size")
    matrix = params[m].reshape(2, 3).copy()
    matrix[:, 2] -= matrix[:, :2] @ roi[:2]  # the warp reads the ROI: back to source pixels
    return roi, matrix, params[size], out[1][0], out[2][0]


def plan_many(transform, hw, n, seed=0):
    """Plan ``n`` samples of one size ``hw`` (no boxes) in one batch: ``(matrices [n, 2, 3] in
    source pixels, output sizes [n, 2])``."""
    recipe = Compose([transform])
    out = recipe.plan_batch([np.array([hw[0], hw[1], 3])] * n, [np.zeros((0, 4))] * n, [np.zeros(0)] * n,
                            sample_keys(seed, 0, np.arange(n)))
    where = recipe.plan_layout
    params = np.stack(out[0]).astype(np.float64)
    m, size = where.slice("warp0.matrix"), where.slice("warp0.size")
    matrix = params[:, m].reshape(n, 2, 3).copy()
    roi = params[:, where.slice("roi")]
    matrix[:, :, 2] -= np.einsum("bij,bj->bi", matrix[:, :, :2], roi[:, :2])
    return matrix, params[:, size]


def assert_batch_independent(transforms, *, seed=3):
    """A sample planned alone equals the same sample planned among batch-mates of other sizes and
    box counts (parameters, boxes and labels, bit for bit)."""
    recipe = Compose(transforms, min_size=0.0)
    shapes = [np.array(s) for s in ([120, 90, 3], [40, 300, 3], [333, 257, 3], [64, 64, 3], [90, 120, 3])]
    boxes = [np.array([[5, 5, 60, 50], [30, 40, 89, 119]], np.float32), np.zeros((0, 4), np.float32),
             np.array([[0, 0, 257, 333], [100, 20, 200, 300], [10, 10, 12, 12]], np.float32),
             np.array([[16, 16, 48, 48]], np.float32), np.array([[70, 0, 120, 90]], np.float32)]
    labels = [np.arange(1, len(b) + 1) for b in boxes]
    keys = sample_keys(seed, 1, [11, 12, 13, 14, 15])
    together = recipe.plan_batch(shapes, boxes, labels, keys)
    for k in range(len(shapes)):
        alone = recipe.plan_batch([shapes[k]], [boxes[k]], [labels[k]], keys[k:k + 1])
        for part in range(3):
            np.testing.assert_array_equal(together[part][k], alone[part][0], err_msg=f"sample {k}, output {part}")


# -- RandomCrop ---------------------------------------------------------------------------------


def test_random_crop_moves_boxes_by_the_crop_offset_and_clips_them():
    box = np.array([10, 20, 150, 60])
    for seed in range(8):
        _, m, size, boxes, labels = plan_one([T.RandomCrop((50, 80))], [box], seed=seed)
        np.testing.assert_array_equal(m[:, :2], np.eye(2))
        left, top = -m[0, 2], -m[1, 2]
        assert left == int(left) and top == int(top) and 0 <= left <= 120 and 0 <= top <= 50
        np.testing.assert_array_equal(size, [50, 80])
        expected = np.clip(box - [left, top, left, top], 0, [80, 50, 80, 50])
        np.testing.assert_allclose(boxes, [expected])
        assert labels.tolist() == [1]


def test_random_crop_positions_are_uniform_over_every_whole_pixel():
    m, size = plan_many(T.RandomCrop((50, 80)), (60, 90), 2200)
    top, left = -m[:, 1, 2], -m[:, 0, 2]
    np.testing.assert_array_equal(size, np.tile([50, 80], (2200, 1)))
    top_counts = np.bincount(top.astype(int), minlength=11)  # torchvision: randint(0, 60 - 50 + 1)
    left_counts = np.bincount(left.astype(int), minlength=11)
    assert len(top_counts) == 11 and len(left_counts) == 11  # never past H - h, W - w
    assert top_counts.min() > 140 and top_counts.max() < 260, top_counts  # ~200 each
    assert left_counts.min() > 140 and left_counts.max() < 260, left_counts


def test_random_crop_padding_and_pad_if_needed_follow_torchvision():
    # padding (l, t, r, b) = (1, 2, 3, 4) on 100x200 gives 106x204: a crop of that size is the
    # padded image itself, a translation by (+1, +2)
    _, m, size, boxes, _ = plan_one([T.RandomCrop((106, 204), padding=[1, 2, 3, 4], fill=FILL)], [[0, 0, 200, 100]])
    np.testing.assert_array_equal(m, [[1, 0, 1], [0, 1, 2]])
    np.testing.assert_allclose(boxes, [[1, 2, 201, 102]])
    np.testing.assert_array_equal(size, [106, 204])
    # [a, b] pads left/right by a and top/bottom by b
    assert T.RandomCrop(10, padding=[3, 5]).ltrb == (3, 5, 3, 5) and T.RandomCrop(10, padding=2).ltrb == (2, 2, 2, 2)
    # pad_if_needed: height 100 < 150 is padded by 50 on both ends, then cropped at top in [0, 50]
    m, size = plan_many(T.RandomCrop((150, 100), pad_if_needed=True), (100, 200), 400)
    shift_y = m[:, 1, 2]
    assert set(np.unique(50 - shift_y)) == set(range(51))
    assert (m[:, 0, 2] <= 0).all() and (m[:, 0, 2] >= -100).all()
    np.testing.assert_array_equal(size, np.tile([150, 100], (400, 1)))


def test_random_crop_errors():
    with pytest.raises(RecipeError, match=r"RandomCrop\.size: the crop \(150, 100\) is larger than a sample's image \(100, 200\)"):
        plan_one([T.RandomCrop((150, 100))], [])
    with pytest.raises(RecipeError, match=r"RandomCrop\.padding: expected whole pixels, got 1\.5"):
        T.RandomCrop(10, padding=[1.5, 2])
    with pytest.raises(RecipeError, match=r"RandomCrop\.padding: expected a list of 1 or 2 or 4 numbers .* got a list \[1, 2, 3\]"):
        T.RandomCrop(10, padding=[1, 2, 3])
    with pytest.raises(RecipeError, match=r"RandomCrop\.padding_mode: expected one of 'constant', got the string 'reflect'"):
        T.RandomCrop(10, padding_mode="reflect")
    assert not T.RandomCrop(10).reveals and T.RandomCrop(10, padding=1).reveals and T.RandomCrop(10, pad_if_needed=True).reveals


# -- CenterCrop ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "size, shift",
    [
        ((50, 100), (-50, -25)),  # (x, y) shift: round(100 / 2), round(50 / 2)
        ((50, 101), (-50, -25)),  # round(49.5) = 50: halves to even, as Python's round()
        ((50, 103), (-48, -25)),  # round(48.5) = 48
        ((49, 100), (-50, -26)),  # round(25.5) = 26
        ((151, 100), (-50, 25)),  # height padded: (151 - 100) // 2 = 25 rows of 0 on top
        ((100, 203), (1, 0)),  # width padded by 1 before, 2 after
        ((100, 200), (0, 0)),
    ],
)
def test_center_crop_offsets_follow_torchvision(size, shift):
    box = [10, 20, 150, 60]
    _, m, out, boxes, _ = plan_one([T.CenterCrop(size)], [box])
    np.testing.assert_array_equal(m, [[1, 0, shift[0]], [0, 1, shift[1]]])
    np.testing.assert_array_equal(out, size)
    moved = np.array(box, np.float64) + [shift[0], shift[1]] * 2
    np.testing.assert_allclose(boxes, [np.clip(moved, 0, [size[1], size[0]] * 2)])


# -- FixedSizeCrop ------------------------------------------------------------------------------


def test_fixed_size_crop_pads_small_images_at_the_bottom_right():
    _, m, size, boxes, _ = plan_one([T.FixedSizeCrop((150, 300), fill=FILL)], [[10, 20, 150, 60]])
    np.testing.assert_array_equal(m, [[1, 0, 0], [0, 1, 0]])  # no crop, image at the top-left
    np.testing.assert_array_equal(size, [150, 300])
    np.testing.assert_allclose(boxes, [[10, 20, 150, 60]])


def test_fixed_size_crop_uses_one_draw_for_both_offsets_and_clips_boxes():
    m, size = plan_many(T.FixedSizeCrop((40, 50)), (100, 200), 3000)  # room: 60 rows, 150 columns
    top, left = -m[:, 1, 2], -m[:, 0, 2]
    np.testing.assert_array_equal(size, np.tile([40, 50], (3000, 1)))
    assert (top == np.floor(top)).all() and top.min() == 0 and top.max() == 59 and left.max() == 149
    # top = int(60 r), left = int(150 r) for one r: their intervals of r overlap
    assert (np.maximum(top / 60, left / 150) < np.minimum((top + 1) / 60, (left + 1) / 150)).all()
    counts = np.bincount((left // 15).astype(int), minlength=10)  # r uniform: 10 bins of ~300
    assert counts.min() > 220 and counts.max() < 380, counts
    # a box straddling the crop is clipped, one outside it is removed
    for seed in range(5):
        _, m, _, boxes, labels = plan_one([T.FixedSizeCrop((40, 50))], [[0, 0, 200, 100], [0, 0, 1, 1]], seed=seed)
        np.testing.assert_allclose(boxes[0], [0, 0, 50, 40])
        assert labels.tolist() == ([1, 2] if m[0, 2] == 0 and m[1, 2] == 0 else [1])


# -- RandomIoUCrop drop rules -------------------------------------------------------------------


def test_iou_crop_drop_rules_keep_the_same_crop():
    boxes = np.array([[10, 10, 60, 60], [150, 40, 190, 90], [80, 0, 130, 30]], np.float32)
    kept_more = 0
    for seed in range(30):
        centre = plan_one([T.RandomIoUCrop(sampler_options=[0.3], trials=50)], boxes, seed=seed)
        visible = plan_one([T.RandomIoUCrop(sampler_options=[0.3], trials=50, drop="invisible")], boxes, seed=seed)
        np.testing.assert_array_equal(centre[1], visible[1])  # same crop ...
        np.testing.assert_array_equal(centre[2], visible[2])
        m, (h, w) = visible[1], visible[2]
        shifted = boxes - np.tile(-m[:, 2], 2)
        clipped = np.clip(shifted, 0, [w, h, w, h])
        seen = ((clipped[:, 2:] - clipped[:, :2]) > 0).all(axis=1)
        assert visible[4].tolist() == (np.flatnonzero(seen) + 1).tolist()  # ... every visible box kept
        np.testing.assert_allclose(visible[3], clipped[seen])
        assert set(centre[4].tolist()) <= set(visible[4].tolist())
        kept_more += len(visible[4]) - len(centre[4])
    assert kept_more > 0  # the centre rule did drop visible boxes


def test_iou_crop_centre_rule_loses_visible_objects_the_visibility_rule_keeps():
    """On consistency scenes, count the objects that still show (>= 16 pixels, >= 2 x 2 px) but
    have no box: the centre rule loses some, ``drop="invisible"`` none."""
    lost = {}
    for drop in ("center", "invisible"):
        results = pipeline_results([T.RandomIoUCrop(drop=drop)], n=24, batch_size=8, seed=1)
        visible_objects, lost[drop] = 0, 0
        for image, target, scene, _ in results:
            labels = set(target["labels"].tolist())
            for k, mask in enumerate(object_masks(image, [o.color for o in scene.objects]), start=1):
                tight = mask_box(mask)
                if mask.sum() >= 16 and tight is not None and (tight[2:] - tight[:2] >= 2).all():
                    visible_objects += 1
                    lost[drop] += k not in labels
        if drop == "invisible":
            assert_boxes_on_pixels(results)
    print(f"visible objects that lose their box: centre rule {lost['center']}, "
          f"drop='invisible' {lost['invisible']} (of {visible_objects})")
    assert lost["invisible"] == 0
    assert lost["center"] > 0


# -- pixels and batch-mates ---------------------------------------------------------------------


CASES = {
    "random_crop": [T.RandomCrop((120, 150))],
    "random_crop_padded": [T.RandomCrop((170, 220), padding=[4, 8], pad_if_needed=True, fill=FILL)],
    "center_crop": [T.CenterCrop((100, 130))],
    "center_crop_padded": [T.CenterCrop((180, 150))],  # taller than the 160 px scenes: 0-padded
    "fixed_size_crop": [T.FixedSizeCrop((120, 240), fill=FILL)],  # crops the height, pads the width
    "lsj": [T.ScaleJitter((160, 200), scale_range=(0.6, 1.6)), T.FixedSizeCrop((160, 200), fill=FILL)],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_boxes_match_object_pixels(name):
    results = pipeline_results(CASES[name])
    assert_boxes_on_pixels(results)
    if name == "center_crop_padded":  # the 0 padding is black, not the fill of the other cases
        image = results[0][0]
        assert (image[:10] == 0).all() and (image[-10:] == 0).all()


@pytest.mark.parametrize("transforms", [
    [T.RandomCrop((64, 64), padding=[2, 3], pad_if_needed=True)],
    [T.CenterCrop((70, 200))],
    [T.FixedSizeCrop((80, 100))],
    [T.RandomIoUCrop(drop="invisible"), T.FixedSizeCrop(64)],
], ids=["random_crop", "center_crop", "fixed_size_crop", "iou_crop_invisible"])
def test_a_sample_plans_the_same_alone_and_among_batch_mates(transforms):
    assert_batch_independent(transforms)
