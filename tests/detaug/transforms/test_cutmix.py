"""CutMix for detection: a partner's rectangle pasted at the same place, the sample's boxes cut
by it and the partner's clipped to it, checked against object pixels after real DALI CPU
pipelines (alone, after Mosaic, followed by warps), the pasted pixels, min_visibility, the
occlusion rule on the plan state, and malformed recipes. DETAUG_TEST_DEVICE=gpu runs them on a GPU."""

from __future__ import annotations

import numpy as np
import pytest

import detaug.transforms as T
from detaug.boxes import rotation_matrix, translation_matrix
from detaug.errors import RecipeError
from detaug.plan import PlanState
from detaug.seeds import SampleRandom, sample_keys
from detaug.sources import SampleListSource
from detaug.transforms import Compose
from tests.detaug.transforms.test_mixing import (
    FILL, assert_iou_targets, assert_same_as_without, drawn_box_problems, dropped_by_min_visibility,
    one_object_images, run, shown_ious, shown_objects,
)

#: CutMix with nothing after it: every box is exact against its object's pixels
CUTMIX_RECIPES = {
    "resize": [T.Resize((96, 96)), T.CutMix(p=1.0)],
    "mosaic": [T.Mosaic((64, 64), fill=FILL), T.CutMix(p=1.0, alpha=0.5)],
    "mosaic9": [T.Mosaic((64, 64), fill=FILL, grid=3), T.RandomAffine(scale=(1.5, 2.0), fill=FILL),
                T.Resize((96, 96)), T.CutMix(p=1.0)],
}

#: CutMix followed by warps: the sample's box cut by the rectangle is moved with them
CUTMIX_WARPED = {
    "resize_rotate": [T.Resize((96, 96)), T.CutMix(p=1.0), T.RandomRotation(30, fill=FILL)],
    "mosaic_affine": [T.Mosaic((64, 64), fill=FILL), T.CutMix(p=1.0),
                      T.RandomAffine(degrees=20, shear=5, scale=(1.0, 2.0), fill=FILL), T.Resize((64, 64))],
    "mosaic9_perspective": [T.Mosaic((64, 64), fill=FILL, grid=3), T.Resize((96, 96)), T.CutMix(p=1.0),
                            T.RandomPerspective(distortion_scale=0.4, p=1.0, fill=FILL)],
}


def colour_problems(results, objects, j: int) -> tuple[list[str], int]:
    """Problems of rendered samples made of their own image and ``j`` partner slots: a box with no
    pixel showing a third of its object's colour, or an object drawn (half its colour, 4 pixels
    or more spanning 2 or more each way) without a box; and how many boxes were checked."""
    problems, checked = [], 0
    for i, image, _, shown in shown_objects(results, objects, j):
        for p, mask, box in shown:
            problems += drawn_box_problems(image, mask, box, objects[p][1], f"sample {i}, image {p}")
            checked += int(box is not None)
    return problems, checked


@pytest.mark.parametrize("name, pool", [(name, "dataset") for name in sorted(CUTMIX_RECIPES)] + [("resize", "batch")])
def test_cutmix_boxes_match_object_pixels(name, pool):
    """Both images' boxes against what is drawn: the sample's cut by the pasted rectangle
    (exact where it cuts a whole side; the whole box where it bites a corner or a hole, whose
    visible pixels span the same box), the partner's clipped to it."""
    samples, objects = one_object_images()
    recipe = Compose([type(t)(**{**{k: v for k, v in t.to_dict().items() if k != "name"}, "pool": pool})
                      if t.kind == "mixing" else t for t in CUTMIX_RECIPES[name]], min_size=1.0)
    results = run(SampleListSource(samples), recipe, 6)
    ious, problems = shown_ious(results, objects, recipe.num_partners)
    assert not problems, "\n".join(problems)
    assert_iou_targets(ious)
    pasted = [planned.plan("cutmix.applied") for planned, _ in results]
    assert np.concatenate(pasted).all()


@pytest.mark.parametrize("name", sorted(CUTMIX_WARPED))
def test_cutmix_then_warps_every_box_holds_its_object(name):
    samples, objects = one_object_images(seed=4)
    recipe = Compose(CUTMIX_WARPED[name], min_size=1.0)
    results = run(SampleListSource(samples), recipe, 6) + run(SampleListSource(samples), recipe, 6, epoch=1)
    problems, checked = colour_problems(results, objects, recipe.num_partners)
    assert checked >= 40, f"too few boxes checked ({checked})"
    assert not problems, "\n".join(problems)


def test_cutmix_pastes_the_partner_rectangle_at_the_same_place():
    """Outside the planned rectangle the sample is what the recipe without CutMix gives; inside,
    the partner stretched to the canvas (what Resize to the canvas gives of it; on the canvas'
    outer pixel rim the partner's warp blends its edge with ``fill``, Resize's with 0)."""
    samples, _ = one_object_images(seed=1, decoded=True)
    resize = [T.Resize((80, 96))]
    (planned, images), = run(SampleListSource(samples), Compose(resize + [T.CutMix(p=1.0, alpha=2.0)]), 6, steps=[0])
    (_, plain), = run(SampleListSource(samples), Compose(resize), 6, steps=[0])
    partners = planned.partner_positions[:, 0]
    (_, stretched), = run(SampleListSource([samples[p] for p in partners]), Compose(resize), 6, steps=[0])
    for i, image in enumerate(images):
        y, x = (int(v) for v in planned.plan("cutmix.corner")[i])
        h, w = (int(v) for v in planned.plan("cutmix.size")[i])
        assert h * w > 0 and y + h <= 80 and x + w <= 96
        inside = np.zeros((80, 96), bool)
        inside[y:y + h, x:x + w] = True
        np.testing.assert_array_equal(image[~inside], plain[i][~inside])
        inside[[0, -1], :], inside[:, [0, -1]] = False, False  # the canvas rim: Resize blends with 0, CutMix with 114
        assert np.abs(image[inside].astype(int) - stretched[i][inside]).max() <= 1


def test_cutmix_not_applied_leaves_the_sample_as_it_is():
    samples, _ = one_object_images(seed=2)
    source = SampleListSource(samples)
    results = run(source, Compose([T.Resize((64, 64)), T.CutMix(p=0.0)]), 6)
    assert_same_as_without(results, run(source, Compose([T.Resize((64, 64))]), 6))


def test_cutmix_min_visibility_drops_boxes_mostly_pasted_over():
    samples, _ = one_object_images()
    source = SampleListSource(samples)
    recipe = [T.Resize((96, 96)), T.CutMix(p=1.0, alpha=0.3)]
    loose = run(source, Compose(recipe, min_visibility=0.0), 6)
    strict = run(source, Compose(recipe, min_visibility=0.7), 6)
    assert dropped_by_min_visibility(loose, strict) > 0


def _state(boxes: np.ndarray, hw=(100.0, 100.0)) -> PlanState:
    hw = np.array([hw])
    n = len(boxes)
    state = PlanState(rand=SampleRandom(sample_keys(0, 0, [1])), source_hw=hw, boxes_src=np.asarray(boxes, float),
                      sample=np.zeros(n, np.int64), layer_hw=hw, layer_owner=np.zeros(1, np.int64),
                      box_layer=np.zeros(n, np.int64))
    state.start_canvas(hw)
    state.place_layers(np.array([0]), np.eye(3)[None], np.array([[0.0, 0.0, 100.0, 100.0]]))
    return state


def test_occlude_cuts_whole_sides_keeps_bitten_boxes_and_drops_covered_ones():
    """The rule: a box loses the rectangle where it covers a whole side (the box shrinks exactly),
    keeps its box where it bites a corner or lies inside (its visible pixels span the same box),
    is dropped where covered; the visibility is the share of the area left."""
    boxes = np.array([[10, 10, 50, 30],   # right half covered: [10, 10, 30, 30], visibility 0.5
                      [60, 60, 80, 80],   # corner bitten: same box, visibility 0.75
                      [0, 0, 100, 100],   # the rectangle inside: same box
                      [32, 12, 38, 18]])  # covered: dropped
    state = _state(boxes)
    rect = np.array([[30.0, 0.0, 70.0, 70.0]])
    state.occlude(rect, np.ones(4, bool))
    result = state.boxes()
    np.testing.assert_allclose(result.boxes_xyxy[:3], [[10, 10, 30, 30], [60, 60, 80, 80], [0, 0, 100, 100]])
    np.testing.assert_allclose(result.visibility[:3], [0.5, 0.75, 1 - 40 * 70 / 1e4])
    assert result.keep.tolist() == [True, True, True, False]
    # then a crop that takes the box's left half: what is left of it keeps the painted share
    state.apply(translation_matrix(-20.0, 0.0), np.array([[100.0, 80.0]]))
    after = state.boxes()
    np.testing.assert_allclose(after.boxes_xyxy[0], [0, 10, 10, 30])
    np.testing.assert_allclose(after.visibility[0], 0.25)


def test_occlude_after_a_rotation_keeps_what_is_left_in_the_box():
    """After a rotation the box's visible part is a polygon: what is left beyond the rectangle is
    bounded in the box's own coordinates (every pixel left of it stays in its box)."""
    state = _state(np.array([[20.0, 40.0, 80.0, 60.0]]))
    turn = translation_matrix(50, 50) @ rotation_matrix(30.0) @ translation_matrix(-50, -50)
    state.apply(turn, np.array([[100.0, 100.0]]))
    before = state.boxes().boxes_xyxy[0]
    rect = np.array([[0.0, 0.0, 50.0, 100.0]])  # the left half of the canvas
    state.occlude(rect, np.ones(1, bool))
    after = state.boxes()
    corners = (np.array([[20, 40, 1], [80, 40, 1], [80, 60, 1], [20, 60, 1]]) @ turn[0].T)[:, :2]
    right = corners[corners[:, 0] > 50]
    assert after.keep[0] and after.boxes_xyxy[0, 0] < 50 + 1e-9 <= before[2]
    assert (after.boxes_xyxy[0, 2:] >= right.max(axis=0) - 1e-9).all()  # what is left is held
    assert after.boxes_xyxy[0, 0] > before[0] + 5  # and the box lost what was pasted over
    assert 0.3 < after.visibility[0] < 0.7


def test_points_under_the_pasted_rectangle_are_hidden():
    """A box's points (keypoints) under the pasted rectangle are not visible; beside it, and on
    its border (which shows both images), they are."""
    state = _state(np.array([[10.0, 10.0, 50.0, 30.0], [60.0, 60.0, 80.0, 80.0]]))
    state.occlude(np.array([[30.0, 0.0, 70.0, 70.0]]), np.ones(2, bool))
    where = state.point_geometry(np.array([0, 1]))
    points = np.array([[[20, 20], [40, 20], [30, 20]],    # beside, under, on the border
                       [[65, 65], [75, 75], [65, 75]]])  # under, beside, beside
    out, inside = where.apply(points.astype(float))
    np.testing.assert_allclose(out, points)
    assert inside.tolist() == [[True, False, True], [False, True, True]]
    assert where.take(np.array([1])).painted.shape == (1, 4, 3)


@pytest.mark.parametrize("recipe, match", [
    ([T.CutMix()], "CutMix.*fixed canvas size"),
    ([T.Resize((64, 64)), T.MixUp(), T.CutMix()], "CutMix.*only once"),
    ([T.Resize((64, 64)), T.CutMix(), T.MixUp()], "MixUp.*only once"),
])
def test_malformed_cutmix_recipes(recipe, match):
    with pytest.raises(RecipeError, match=match):
        Compose(recipe)


@pytest.mark.parametrize("spec, match", [
    ({"name": "CutMix", "alpha": -1}, "CutMix.alpha"),
    ({"name": "CutMix", "p": 2}, "CutMix.p"),
    ({"name": "CutMix", "pool": "shard"}, "CutMix.pool"),
])
def test_malformed_cutmix_fields(spec, match):
    with pytest.raises(RecipeError, match=match):
        Compose.from_dict({"transforms": [{"name": "Resize", "size": [32, 32]}, spec]})


def test_cutmix_round_trips_and_owns_its_fields():
    recipe = Compose([T.Resize((64, 64)), T.CutMix(p=0.4, alpha=0.5, pool="batch")], min_visibility=0.3)
    assert Compose.from_yaml(recipe.to_yaml()) == recipe
    assert recipe.blend_stage is recipe.transforms[1] and recipe.batch_slots == (0,)
    assert [n for n in recipe.plan_layout.names if n.startswith("cutmix.")] == [
        "cutmix.roi", "cutmix.matrix", "cutmix.size", "cutmix.corner", "cutmix.canvas", "cutmix.applied"]
