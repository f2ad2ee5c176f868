"""Transforms: validation, planning (NumPy only, no DALI), segments and recipes."""

from __future__ import annotations

import json

import numpy as np
import pytest

import detaug.transforms as T
from detaug.seeds import sample_keys
from detaug.transforms import Compose


def plan(recipe: Compose, boxes, hw=(100, 200), seed=0, labels=None):
    boxes = np.asarray(boxes, np.float32).reshape(-1, 4)
    labels = np.arange(1, len(boxes) + 1, dtype=np.int32) if labels is None else labels
    keys = sample_keys(seed, 0, [7])
    return recipe.plan_batch([np.array([hw[0], hw[1], 3])], [boxes], [labels], keys)


def out_boxes(out):
    return out[-2][0], out[-1][0]


def warp(recipe, out, segment=0):
    """(decode ROI (x, y, w, h), warp matrix [2, 3], output size (h, w)) of sample 0."""
    where = recipe.plan_layout
    params = out[0][0]
    m, size = where.slice(f"warp{segment}.matrix"), where.slice(f"warp{segment}.size")
    return params[where.slice("roi")], params[m].reshape(2, 3), params[size]


def test_horizontal_flip_moves_boxes():
    recipe = Compose([T.RandomHorizontalFlip(p=1.0)])
    boxes, labels = out_boxes(plan(recipe, [[10, 20, 50, 60]]))
    np.testing.assert_allclose(boxes, [[150, 20, 190, 60]])
    assert labels.tolist() == [1]


def test_resize_scales_boxes_and_sets_size():
    recipe = Compose([T.Resize((50, 400))])
    out = plan(recipe, [[10, 20, 50, 60]])
    np.testing.assert_allclose(out_boxes(out)[0], [[20, 10, 100, 30]])
    np.testing.assert_allclose(warp(recipe, out)[2], [50, 400])  # output size (h, w)


def test_resize_short_side_keeps_ratio_and_respects_max_size():
    r = T.Resize(50)
    np.testing.assert_allclose(r.output_size(np.array([[100.0, 200.0]])), [[50, 100]])
    r = T.Resize(50, max_size=80)
    np.testing.assert_allclose(r.output_size(np.array([[100.0, 200.0]])), [[40, 80]])


def test_letterbox_pads_and_centres():
    recipe = Compose([T.LetterBox((200, 200))])
    boxes, _ = out_boxes(plan(recipe, [[0, 0, 200, 100]]))  # the whole 200x100 image
    np.testing.assert_allclose(boxes, [[0, 50, 200, 150]])


def test_zoom_out_keeps_box_size_and_places_inside_canvas():
    recipe = Compose([T.RandomZoomOut(side_range=(2.0, 2.0), p=1.0)])
    out = plan(recipe, [[10, 20, 50, 60]])
    boxes, _ = out_boxes(out)
    np.testing.assert_allclose(boxes[0, 2:] - boxes[0, :2], [40, 40])
    np.testing.assert_allclose(warp(recipe, out)[2], [200, 400])


def test_iou_crop_respects_threshold_and_drops_boxes_with_centre_outside():
    recipe = Compose([T.RandomIoUCrop(sampler_options=[0.5], trials=50)])
    boxes = np.array([[10, 10, 60, 60], [150, 40, 190, 90]], np.float32)
    for seed in range(20):
        out = plan(recipe, boxes, seed=seed)
        roi, matrix, crop_hw = warp(recipe, out)
        x0, y0 = roi[:2] - matrix[:, 2]  # the matrix maps ROI-local pixels to the crop
        crop = np.array([x0, y0, x0 + crop_hw[1], y0 + crop_hw[0]])
        kept, labels = out_boxes(out)
        ious = []
        for i, b in enumerate(boxes):
            c = (b[:2] + b[2:]) / 2
            inside = crop[0] < c[0] < crop[2] and crop[1] < c[1] < crop[3]
            assert (i + 1 in labels.tolist()) == inside
            if inside:
                iw = min(b[2], crop[2]) - max(b[0], crop[0])
                ih = min(b[3], crop[3]) - max(b[1], crop[1])
                inter = iw * ih
                ious.append(inter / ((b[2] - b[0]) * (b[3] - b[1]) + crop_hw.prod() - inter))
        is_full = np.allclose(crop, [0, 0, 200, 100])
        assert is_full or max(ious) >= 0.5


def test_iou_crop_without_boxes_does_not_crop():
    recipe = Compose([T.RandomIoUCrop()])
    np.testing.assert_allclose(warp(recipe, plan(recipe, np.zeros((0, 4))))[2], [100, 200])


def test_min_visibility_and_min_size_filter_boxes():
    recipe = Compose([T.Resize((10, 20))], min_size=2.0)
    boxes, labels = out_boxes(plan(recipe, [[0, 0, 100, 100], [0, 0, 10, 10]]))
    assert labels.tolist() == [1]  # the second box became 1x1 px < min_size
    recipe = Compose([T.RandomAffine(translate=(0.5, 0.0))], min_visibility=0.75)
    for seed in range(10):
        out = plan(recipe, [[0, 0, 100, 100]], seed=seed)
        roi, matrix, _ = warp(recipe, out)
        tx = matrix[0, 2] - roi[0]  # warp translation minus the decode ROI's x
        boxes, labels = out_boxes(out)
        visible = (min(100 + tx, 200) - max(tx, 0)) / 100
        assert (len(labels) == 1) == (visible >= 0.75)


def test_same_seed_same_plan_and_different_seed_differs():
    recipe = T.default_detection_recipe(size=64)
    boxes = [[10, 10, 80, 60], [100, 20, 180, 90]]
    a, b, c = plan(recipe, boxes, seed=1), plan(recipe, boxes, seed=1), plan(recipe, boxes, seed=2)
    for x, y in zip(a, b):
        for u, v in zip(x, y):
            np.testing.assert_array_equal(u, v)
    assert any(not np.array_equal(u, v) for x, y in zip(a, c) for u, v in zip(x, y))


def test_segments_split_where_reveal_follows_crop():
    recipe = T.default_detection_recipe()
    names = [[type(t).__name__ for t in seg] for seg in recipe.segments]
    assert names == [["RandomIoUCrop", "RandomHorizontalFlip"], ["RandomAffine", "Resize"]]
    ssd = Compose([T.RandomZoomOut(), T.RandomIoUCrop(), T.RandomHorizontalFlip(), T.Resize(300)])
    assert len(ssd.segments) == 1
    fills = Compose([T.RandomZoomOut(fill=0), T.RandomRotation(10, fill=255)])
    assert len(fills.segments) == 2 and fills.segment_fills == [0, 255]


def test_output_size():
    assert T.default_detection_recipe(size=(300, 400)).output_size() == (300, 400)
    assert Compose([T.RandomAffine(10)]).output_size() is None
    assert Compose([T.Resize(300), T.RandomHorizontalFlip()]).output_size() is None
    assert Compose([T.LetterBox(256), T.RandomHorizontalFlip(), T.ColorJitter(0.1)]).output_size() == (256, 256)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: T.RandomHorizontalFlip(p=1.5), r"RandomHorizontalFlip.p: expected a probability in \[0, 1\], got 1.5"),
        (lambda: T.RandomAffine(degrees=-5), "must be >= 0, got -5"),
        (lambda: T.RandomAffine(translate=(0.2, 1.2)), r"translate: 1.2 is out of range"),
        (lambda: T.RandomAffine(scale=(1.2, 0.8)), "range reversed"),
        (lambda: T.RandomIoUCrop(min_scale=0.0), "0 < min_scale"),
        (lambda: T.Resize((0, 10)), "Resize.size: a size must be positive"),
        (lambda: T.ColorJitter(hue=0.7), r"ColorJitter.hue: -0.7 is out of range"),
        (lambda: T.Normalize(std=(0.1, 0.0, 0.1)), "Normalize.std: values must be positive"),
        (lambda: Compose([T.Normalize(), T.RandomHorizontalFlip()]), "Normalize: must be the last"),
        (lambda: Compose([T.RandomHorizontalFlip()], min_visibility=2), r"min_visibility: expected a probability"),
    ],
)
def test_invalid_arguments_raise_precise_errors(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_recipe_round_trips_through_dict_json_yaml(tmp_path):
    recipe = Compose(
        [
            T.RandomZoomOut(fill=114, side_range=(1.0, 3.0)),
            T.RandomIoUCrop(sampler_options=[0.1, 0.5]),
            T.RandomRotation(15, expand=True),
            T.RandomResizedCrop(128, scale=(0.5, 1.0)),
            T.LetterBox((256, 320)),
            T.ColorJitter(0.1, 0.2, 0.3, 0.05, p=0.8),
            T.Normalize(),
        ],
        min_size=2.0,
        min_visibility=0.3,
    )
    assert Compose.from_dict(recipe.to_dict()) == recipe
    assert Compose.from_dict(json.loads(json.dumps(recipe.to_dict()))) == recipe
    assert Compose.from_yaml(recipe.to_yaml()) == recipe
    for name in ("r.yaml", "r.json"):
        recipe.save(tmp_path / name)
        assert Compose.load(tmp_path / name) == recipe
    boxes = [[10, 10, 80, 60]]
    a, b = plan(recipe, boxes, seed=3), plan(Compose.from_yaml(recipe.to_yaml()), boxes, seed=3)
    np.testing.assert_array_equal(a[-2][0], b[-2][0])


def test_recipe_errors_name_the_transform(tmp_path):
    with pytest.raises(ValueError, match=r"transforms\[1\]: unknown transform 'Blur'"):
        Compose.from_dict({"transforms": [{"name": "Resize", "size": 10}, {"name": "Blur"}]})
    with pytest.raises(ValueError, match=r"transforms\[0\] RandomAffine\.degrees: .*must be >= 0"):
        Compose.from_dict([{"name": "RandomAffine", "degrees": -3}])
    bad = tmp_path / "bad.yaml"
    bad.write_text("transforms:\n  - name: Resize\n    size: [0, 3]\n")
    with pytest.raises(ValueError, match="bad.yaml"):
        Compose.load(bad)
