"""RandomErasing and CoarseDropout: torchvision's rectangle rule, the painted pixels, and the box
rule (a box mostly erased is dropped under the recipe's ``min_visibility``, as for crops)."""

from __future__ import annotations

import numpy as np
import pytest

import detaug.transforms as T
from detaug import RecipeError
from detaug.seeds import SampleRandom, sample_keys
from detaug.transforms import Compose
from tests.detaug.transforms.test_color import (
    photometric,
    plan_params,
    random_images,
    run_recipe,
)


def _compose_plans_on_the_canvas() -> bool:
    try:
        Compose([T.RandomErasing()]).plan_batch([np.array([8, 8, 3])], [np.zeros((0, 4))], [np.zeros(0)], sample_keys(0, 0, [1]))
    except RuntimeError as err:
        if "plans on the output canvas" in str(err):
            return False
        raise
    return True


needs_canvas = pytest.mark.skipif(
    not _compose_plans_on_the_canvas(),
    reason="Compose.plan_batch must call t.plan_on(state.rand, state.canvas_hw) (change requested with issue 18)",
)


def test_erasing_rectangles_follow_torchvision():
    t = T.RandomErasing(p=0.5, scale=(0.02, 0.33), ratio=(0.3, 3.3))
    n, (h_img, w_img) = 4000, (60, 90)
    top, left, h, w = plan_params(t, n, canvas=(h_img, w_img))
    erased = h > 0
    assert abs(erased.mean() - 0.5) < 0.04
    top, left, h, w = top[erased], left[erased], h[erased], w[erased]
    assert (h == np.round(h)).all() and (top >= 0).all() and (left >= 0).all()
    assert (top + h <= h_img).all() and (left + w <= w_img).all() and (h < h_img).all() and (w < w_img).all()
    area = h * w / (h_img * w_img)
    assert area.min() >= 0.015 and area.max() <= 0.36  # scale, up to the rounding of each side
    ratio = h / w
    assert ratio.min() >= 0.2 and ratio.max() <= 4.5 and (ratio < 1).mean() > 0.3 and (ratio > 1).mean() > 0.3
    assert top.std() > 5 and left.std() > 10  # placed anywhere


def test_erasing_cannot_be_planned_without_the_canvas():
    with pytest.raises(RuntimeError, match="plans on the output canvas"):
        T.RandomErasing().plan(SampleRandom(sample_keys(0, 0, [1])))


@needs_canvas
def test_erasing_paints_exactly_the_planned_rectangle():
    images = random_images(6, hw=(24, 32))
    recipe = Compose([T.RandomErasing(p=0.7, value=[10, 20, 30])])
    out, _, _, params = run_recipe(recipe, images)
    rects = photometric(recipe, params).astype(int)
    assert (rects[:, 2] > 0).sum() >= 2
    for got, image, (top, left, h, w) in zip(out, images, rects):
        expected = image.copy()
        expected[top:top + h, left:left + w] = [10, 20, 30]
        np.testing.assert_array_equal(got, expected)


@needs_canvas
def test_a_mostly_erased_box_is_dropped_under_min_visibility():
    image = random_images(1, hw=(100, 100))[0]
    erase = T.RandomErasing(p=1.0, scale=(0.3, 0.3), ratio=(1.0, 1.0))
    top, left, h, w = (float(x[0]) for x in plan_params(erase, 1, canvas=(100, 100)))  # the key of image_id 0
    hidden = [left + 2, top + 2, left + w - 2, top + h - 2]  # inside the rectangle
    edge = left if left >= 5 else left + w  # a box across the rectangle's left (or right) edge
    half = [edge - 5, top + 2, edge + 5, top + 12]  # half of it erased: 50 % visible
    clear = [0, 0, 3, 3] if top > 5 or left > 5 else [96, 96, 99, 99]
    boxes = [np.array([hidden, half, clear], np.float32)]
    for min_visibility, kept in ((0.0, [1, 2, 3]), (0.4, [2, 3]), (0.6, [3])):
        recipe = Compose([erase], min_visibility=min_visibility)
        _, out_boxes, labels, params = run_recipe(recipe, [image], ids=[0], boxes=boxes)
        np.testing.assert_array_equal(photometric(recipe, params)[0], [top, left, h, w])
        assert labels[0].tolist() == kept, min_visibility
        np.testing.assert_array_equal(out_boxes[0], boxes[0][np.array(kept) - 1])  # boxes unchanged


def test_coarse_dropout_holes():
    t = T.CoarseDropout(num_holes_range=(1, 3), hole_height_range=(0.1, 0.2), hole_width_range=(0.2, 0.3), p=1.0)
    assert len(t.param_names) == 12 and t.neutral == (0.0,) * 12
    holes = np.stack(plan_params(t, 3000, canvas=(50, 80)), axis=1).reshape(3000, 3, 4)
    count = (holes[..., 2] > 0).sum(axis=1)
    assert set(np.unique(count)) == {1, 2, 3} and all(abs((count == k).mean() - 1 / 3) < 0.04 for k in (1, 2, 3))
    used = holes[holes[..., 2] > 0]
    assert used[:, 2].min() >= 5 and used[:, 2].max() <= 10 and used[:, 3].min() >= 16 and used[:, 3].max() <= 24
    assert (used[:, 0] + used[:, 2] <= 50).all() and (used[:, 1] + used[:, 3] <= 80).all()
    assert (holes[holes[..., 2] == 0] == 0).all()
    with pytest.raises(RecipeError, match=r"CoarseDropout\.num_holes_range: expected integers"):
        T.CoarseDropout(num_holes_range=(1, 2.5))


@needs_canvas
def test_coarse_dropout_paints_its_holes():
    images = random_images(3, hw=(30, 40))
    recipe = Compose([T.CoarseDropout(num_holes_range=(2, 2), fill=7, p=1.0)])
    out, _, _, params = run_recipe(recipe, images)
    for got, image, holes in zip(out, images, photometric(recipe, params).reshape(3, 2, 4).astype(int)):
        expected = image.copy()
        for top, left, h, w in holes:
            expected[top:top + h, left:left + w] = 7
        np.testing.assert_array_equal(got, expected)
