"""RandomPerspective: the projective box kernels against NumPy references, torchvision's
parameter rule, and boxes against object pixels after real DALI CPU pipelines (alone and
fused with crops and rotations). DETAUG_TEST_DEVICE=gpu runs them on a GPU."""

from __future__ import annotations

import os

import numpy as np
import pytest

import detaug.transforms as T
from detaug.boxes import canvas_halfplanes, clip_polygons, homography, is_affine, transform_points
from detaug.errors import RecipeError
from detaug.plan import PlanState
from detaug.seeds import SampleRandom, sample_keys
from detaug.sources import SampleListSource
from detaug.torch import DetectionLoader
from detaug.transforms import Compose
from tests.detaug.consistency import check_boxes_match_pixels, iou, mask_box, object_masks, scene_samples

DEVICE = os.environ.get("DETAUG_TEST_DEVICE", "cpu")
FILL = 114


def test_homography_maps_the_four_points():
    rng = np.random.default_rng(0)
    src = np.array([[[0, 0], [100, 0], [100, 80], [0, 80]]], float) + rng.uniform(-3, 3, (5, 4, 2))
    dst = src + rng.uniform(-20, 20, (5, 4, 2))
    m = homography(src, dst)
    np.testing.assert_allclose(transform_points(m, src), dst, atol=1e-9)
    assert not is_affine(m).any()
    np.testing.assert_allclose(homography(src, src), np.broadcast_to(np.eye(3), (5, 3, 3)), atol=1e-12)


def test_transform_points_divides_by_w():
    m = np.array([[[2.0, 0, 1], [0, 1, 0], [0.01, 0, 1]]])
    p = np.array([[[10.0, 5.0]]])
    w = 0.01 * 10 + 1
    np.testing.assert_allclose(transform_points(m, p), [[[21 / w, 5 / w]]])


def test_projective_halfplanes_keep_exactly_the_points_that_land_on_the_canvas():
    """The four linear constraints of a projective map hold exactly for the points with a positive
    denominator whose image is on the canvas (points behind the horizon never pass)."""
    rng = np.random.default_rng(1)
    m = np.array([[[1.0, 0.2, 3], [0.1, 0.9, -2], [0.004, -0.003, 1]]])
    canvas = np.array([[80.0, 120.0]])
    pts = rng.uniform(-600, 600, (4000, 2))
    planes = canvas_halfplanes(m, canvas)[0]
    inside = (pts @ planes[:, :2].T <= planes[:, 2]).all(axis=1)
    h = np.c_[pts, np.ones(len(pts))] @ m[0].T
    on_canvas = (h[:, 2] > 0) & (h[:, 0] / h[:, 2] >= 0) & (h[:, 0] / h[:, 2] <= 120) & (h[:, 1] / h[:, 2] >= 0) & (h[:, 1] / h[:, 2] <= 80)
    np.testing.assert_array_equal(inside, on_canvas)
    assert (h[:, 2] < 0).any() and on_canvas.any()
    # a clipped polygon maps into the canvas
    poly = np.array([[[-500.0, -500.0], [500, -500], [500, 500], [-500, 500]]])
    count = np.array([4])
    for k in range(4):
        poly, count = clip_polygons(poly, count, planes[None, k])
    out = transform_points(m, poly[:, : count[0]])
    assert (out >= -1e-9).all() and (out[..., 0] <= 120 + 1e-9).all() and (out[..., 1] <= 80 + 1e-9).all()


def plan_perspective(t: T.RandomPerspective, hw=(90, 120), n=64, keys=None):
    keys = sample_keys(3, 0, np.arange(n)) if keys is None else keys
    state = PlanState(rand=SampleRandom(keys), source_hw=np.tile(np.asarray(hw, float), (n, 1)),
                      boxes_src=np.zeros((0, 4)), sample=np.zeros(0, np.int64))
    return t.plan(state)


def test_corners_move_inwards_by_torchvision_bounds():
    h, w = 90, 120
    step, canvas = plan_perspective(T.RandomPerspective(distortion_scale=0.5, p=1.0))
    np.testing.assert_array_equal(canvas, np.tile([h, w], (64, 1)))
    centres = np.array([[[0.5, 0.5], [w - 0.5, 0.5], [w - 0.5, h - 0.5], [0.5, h - 0.5]]])
    moved = transform_points(step, np.repeat(centres, 64, axis=0)) - centres
    inward = moved * np.array([[1, 1], [-1, 1], [-1, -1], [1, -1]])
    shift = np.round(inward, 6)
    assert (shift >= 0).all() and (shift[..., 0] <= int(0.5 * (w // 2))).all() and (shift[..., 1] <= int(0.5 * (h // 2))).all()
    np.testing.assert_allclose(shift, np.round(shift), atol=1e-6)  # whole pixels, as torchvision
    assert shift.max() >= 20  # the range is used
    # the whole canvas stays in front of the horizon
    corners = np.array([[0, 0, 1], [w, 0, 1], [w, h, 1], [0, h, 1]], float)
    assert ((step @ corners.T)[:, 2] > 0).all()


def test_p_and_zero_distortion_leave_samples_alone():
    step, _ = plan_perspective(T.RandomPerspective(distortion_scale=0.6, p=0.0))
    np.testing.assert_array_equal(step, np.broadcast_to(np.eye(3), step.shape))
    step, _ = plan_perspective(T.RandomPerspective(distortion_scale=0.0, p=1.0))
    np.testing.assert_allclose(step, np.broadcast_to(np.eye(3), step.shape), atol=1e-12)
    step, _ = plan_perspective(T.RandomPerspective(distortion_scale=0.6, p=0.5))
    applied = ~is_affine(step)
    assert 0.25 < applied.mean() < 0.75


@pytest.mark.parametrize("spec, match", [
    ({"distortion_scale": 1.5}, "distortion_scale"),
    ({"distortion_scale": "big"}, "distortion_scale"),
    ({"p": -0.1}, "RandomPerspective.p"),
    ({"fill": 300}, "fill"),
])
def test_malformed_fields(spec, match):
    with pytest.raises(RecipeError, match=match):
        Compose.from_dict([{"name": "RandomPerspective", **spec}])


CASES = {
    "perspective": [T.RandomPerspective(distortion_scale=0.6, p=1.0, fill=FILL)],
    "perspective_then_rotation": [  # a projective segment, then the half-planes of a rotated crop
        T.RandomPerspective(distortion_scale=0.7, p=1.0, fill=FILL),
        T.RandomAffine(degrees=30, scale=(1.1, 1.4), fill=FILL),
    ],
    "crop_rotate_perspective_crop": [  # perspective after a crop: its own segment; then cropped
        T.RandomIoUCrop(),
        T.RandomRotation(25, fill=FILL),
        T.RandomPerspective(distortion_scale=0.5, p=1.0, fill=FILL),
        T.RandomResizedCrop((150, 170), scale=(0.4, 0.9)),
    ],
    "perspective_letterbox_flip": [
        T.RandomPerspective(distortion_scale=0.4, p=0.7, fill=FILL),
        T.RandomHorizontalFlip(),
        T.LetterBox((160, 160), fill=FILL),
    ],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_boxes_match_object_pixels(name):
    recipe = Compose(CASES[name], min_size=1.0)
    samples, scenes = scene_samples(12, seed=2)
    loader = DetectionLoader(SampleListSource(samples), recipe, 6, device=DEVICE, seed=0, num_workers=0)
    ious, problems = [], []
    for images, targets in loader:
        for image, target in zip(images, targets):
            image = image.cpu().numpy().transpose(1, 2, 0)
            scene = scenes[target["image_id"] - 1]
            boxes, labels = target["boxes"].cpu().numpy(), target["labels"].cpu().numpy()
            problems += [f"image {target['image_id']}: {p}" for p in check_boxes_match_pixels(image, boxes, labels, scene, min_iou=0.85)]
            masks = object_masks(image, [o.color for o in scene.objects])
            for box, label in zip(boxes, labels):
                tight = mask_box(masks[int(label) - 1])
                if tight is not None:
                    ious.append(iou(box, tight))
    a = np.asarray(ious)
    assert not problems, "\n".join(problems)
    assert len(a) >= 20
    assert np.mean(a >= 0.85) >= 0.98 and np.median(a) >= 0.95, (np.sort(a)[:5], np.median(a))


def test_projective_segments_use_nine_floats_and_affine_ones_six():
    recipe = Compose([T.RandomRotation(20), T.RandomResizedCrop(64), T.RandomPerspective(p=1.0), T.Resize((32, 32))])
    assert recipe.segment_projective == [False, True]
    m0, m1 = recipe.plan_layout.field("warp0.matrix"), recipe.plan_layout.field("warp1.matrix")
    assert (m0.shape, m0.size, m1.shape, m1.size) == ((2, 3), 6, (3, 3), 9)
    assert recipe.num_params == 4 + 8 + 11


def _clip_to_canvas(quad: np.ndarray, w: float, h: float) -> np.ndarray | None:
    """Bounding box (xyxy) of the convex polygon ``quad`` ``[V, 2]`` clipped to ``[0, w] x [0, h]``
    (Sutherland-Hodgman in output pixels, one edge of the canvas at a time), ``None`` when
    nothing is left."""
    poly = [tuple(p) for p in quad]
    for axis, bound, keep_below in ((0, 0.0, False), (0, w, True), (1, 0.0, False), (1, h, True)):
        out = []
        for k, p in enumerate(poly):
            q = poly[(k + 1) % len(poly)]
            p_in = p[axis] <= bound if keep_below else p[axis] >= bound
            q_in = q[axis] <= bound if keep_below else q[axis] >= bound
            if p_in:
                out.append(p)
            if p_in != q_in:
                t = (bound - p[axis]) / (q[axis] - p[axis])
                out.append((p[0] + t * (q[0] - p[0]), p[1] + t * (q[1] - p[1])))
        poly = out
        if not poly:
            return None
    a = np.asarray(poly)
    return np.concatenate([a.min(axis=0), a.max(axis=0)])


@pytest.mark.parametrize("resize", [False, True])
def test_border_boxes_are_clipped_exactly_by_the_canvas(resize):
    """RandomPerspective moves the corners' pixel centres, so the image's outer half-pixel rim
    can land off the canvas: boxes at the border are clipped there exactly (the box of the
    visible part of the mapped box), not clamped, alone and fused with a Resize. The reference
    maps each box's corners forward and clips the quadrilateral in output pixels."""
    h, w, n = 90, 120, 400
    t = T.RandomPerspective(distortion_scale=0.6, p=1.0)
    recipe = Compose([t] + ([T.Resize((45, 80))] if resize else []), min_size=0.0)
    rng = np.random.default_rng(5)
    # boxes at each border and corner of the image, some a pixel or less from it
    x0 = rng.choice([0.0, 0.3, 1.0, 40.0], (n, 16))
    y0 = rng.choice([0.0, 0.4, 1.0, 30.0], (n, 16))
    x1 = np.where(rng.random((n, 16)) < 0.5, w - rng.choice([0.0, 0.2, 1.0], (n, 16)), x0 + 25)
    y1 = np.where(rng.random((n, 16)) < 0.5, h - rng.choice([0.0, 0.3, 1.0], (n, 16)), y0 + 20)
    boxes = np.stack([x0, y0, x1, y1], -1)
    keys = sample_keys(11, 0, np.arange(n))
    _, out, labels = recipe.plan_batch([np.array([h, w, 3])] * n, list(boxes), [np.arange(16)] * n, keys)
    step, _ = plan_perspective(t, (h, w), n, keys)  # the recipe's draws: the same stream
    scale = np.diag([80 / w, 45 / h, 1.0]) if resize else np.eye(3)
    out_w, out_h = (80, 45) if resize else (w, h)
    moved = 0
    for i in range(n):
        m = scale @ step[i]
        expected, kept = [], []
        for k, (a, b, c, d) in enumerate(boxes[i]):
            corners = np.array([[a, b, 1], [c, b, 1], [c, d, 1], [a, d, 1]]) @ m.T
            assert (corners[:, 2] > 0).all()
            quad = corners[:, :2] / corners[:, 2:]
            moved += bool((quad < -1e-9).any() or (quad[:, 0] > out_w + 1e-9).any() or (quad[:, 1] > out_h + 1e-9).any())
            box = _clip_to_canvas(quad, out_w, out_h)
            if box is not None and (box[2:] > box[:2]).all():
                expected.append(box)
                kept.append(k)
        np.testing.assert_array_equal(labels[i], kept)
        np.testing.assert_allclose(out[i], np.array(expected).reshape(-1, 4), atol=1e-4, rtol=0)
    assert moved >= 50, f"only {moved} boxes reach past the canvas: the test does not exercise the rim"
