"""RandomRotation: torchvision's canvas for ``expand=True``, the rotated image centred on it, boxes on
their objects' pixels for both ``expand`` values (real DALI CPU pipeline), and plans independent of
the batch-mates. RandomAffine: torchvision's directions (clockwise angles, its shears), one-sided
ranges on the pixels, and plans independent of the batch-mates (its matrices against torchvision's
references: test_torchvision_reference)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import detaug.transforms as T
from detaug.seeds import sample_keys
from detaug.transforms import Compose
from tests.detaug.transforms.test_crop import (
    FILL,
    assert_batch_independent,
    assert_boxes_on_pixels,
    pipeline_results,
    plan_one,
)


def torchvision_expanded_size(angle: float, w: int, h: int) -> tuple[int, int]:
    """``(height, width)`` of ``torchvision.transforms.v2.functional.rotate(expand=True)`` on a
    tensor image, transcribed from its code (``rotate_image``, ``_get_inverse_affine_matrix``,
    ``_compute_affine_output_size``), float32 as there; ``center=None``."""
    angle = angle % 360
    if angle in (0, 180):  # its fast paths: clone, rot90(k=2)
        return h, w
    if angle in (90, 270):  # rot90(k=1 or 3)
        return w, h
    rot = math.radians(-angle)  # rotate_image passes -angle
    a, b, c, d = math.cos(rot), -math.sin(rot), math.sin(rot), math.cos(rot)  # no shear
    matrix = [d, -b, 0.0, -c, a, 0.0]  # inverted=True, centre (0, 0), no translation
    half_w, half_h = 0.5 * w, 0.5 * h
    pts = np.array([[-half_w, -half_h, 1.0], [-half_w, half_h, 1.0], [half_w, half_h, 1.0], [half_w, -half_h, 1.0]],
                   np.float32)
    theta = np.array(matrix, np.float32).reshape(2, 3)
    new_pts = pts @ theta.T
    halfs = np.array([half_w, half_h], np.float32)
    min_vals, max_vals = new_pts.min(axis=0) + halfs, new_pts.max(axis=0) + halfs
    tol, inv_tol = np.float32(1e-4), np.float32(1.0 / 1e-4)
    cmax = np.ceil(np.trunc(max_vals * inv_tol) * tol)
    cmin = np.floor(np.trunc(min_vals * inv_tol) * tol)
    size = cmax - cmin
    return int(size[1]), int(size[0])


def expanded_plans(angle: float, shapes: list[tuple[int, int]]):
    """Plan ``RandomRotation((angle, angle), expand=True)`` for canvases ``shapes`` (h, w):
    ``(matrices [B, 2, 3] in source pixels, sizes [B, 2])``."""
    recipe = Compose([T.RandomRotation((angle, angle), expand=True)])
    n = len(shapes)
    out = recipe.plan_batch([np.array([h, w, 3]) for h, w in shapes], [np.zeros((0, 4))] * n, [np.zeros(0)] * n,
                            sample_keys(0, 0, np.arange(n)))
    where = recipe.plan_layout
    params = np.stack(out[0]).astype(np.float64)
    m, size = where.slice("warp0.matrix"), where.slice("warp0.size")
    matrix = params[:, m].reshape(n, 2, 3)
    matrix[:, :, 2] -= np.einsum("bij,bj->bi", matrix[:, :, :2], params[:, where.slice("roi")][:, :2])
    return matrix, params[:, size]


SHAPES = [(100, 200), (160, 200), (37, 91), (480, 640), (333, 1000), (64, 64), (1, 5)]


def test_expanded_canvas_is_torchvisions():
    mismatches, checked = [], 0
    for angle in np.concatenate([np.linspace(-360, 360, 1441), [0.1, 89.99, 90.01, 44.9999, 1e-7]]):
        _, sizes = expanded_plans(float(angle), SHAPES)
        for (h, w), size in zip(SHAPES, sizes):
            checked += 1
            expected = torchvision_expanded_size(float(angle), w, h)
            if tuple(int(v) for v in size) != expected:
                mismatches.append((float(angle), (h, w), size.tolist(), expected))
    assert checked > 10000
    assert not mismatches, mismatches[:10]


@pytest.mark.parametrize("angle", [30.0, -75.0, 90.0, 180.0, 271.5])
def test_expanded_canvas_holds_the_whole_image_centred(angle):
    h, w = 100, 200
    matrix, sizes = expanded_plans(angle, [(h, w)])
    m, (out_h, out_w) = matrix[0], sizes[0]
    np.testing.assert_allclose(m[:, :2] @ [w / 2, h / 2] + m[:, 2], [out_w / 2, out_h / 2], atol=1e-4)
    corners = np.array([[0, 0], [w, 0], [w, h], [0, h]], np.float64) @ m[:, :2].T + m[:, 2]
    assert (corners >= -1e-4).all() and (corners[:, 0] <= out_w + 1e-4).all() and (corners[:, 1] <= out_h + 1e-4).all()
    # the whole-image box is the rotated canvas' bounding box: nothing is cut
    _, _, size, boxes, _ = plan_one([T.RandomRotation((angle, angle), expand=True)], [[0, 0, w, h]], hw=(h, w))
    np.testing.assert_allclose(boxes[0], [*corners.min(axis=0), *corners.max(axis=0)], atol=1e-3)


def test_quarter_turns_are_exact():
    _, m, size, boxes, _ = plan_one([T.RandomRotation((90, 90), expand=True)], [[10, 20, 150, 60]])
    np.testing.assert_array_equal(m, [[0, 1, 0], [-1, 0, 200]])  # x' = y, y' = W - x
    np.testing.assert_array_equal(size, [200, 100])
    np.testing.assert_array_equal(boxes, [[20, 50, 60, 190]])
    _, m, _, boxes, _ = plan_one([T.RandomRotation((180, 180))], [[10, 20, 150, 60]])
    np.testing.assert_array_equal(m, [[-1, 0, 200], [0, -1, 100]])
    np.testing.assert_array_equal(boxes, [[50, 40, 190, 80]])
    # not applied (p = 0): the identity, and expand keeps the size
    _, m, size, _, _ = plan_one([T.RandomRotation(45, expand=True, p=0.0)], [[10, 20, 150, 60]])
    np.testing.assert_array_equal(m, [[1, 0, 0], [0, 1, 0]])
    np.testing.assert_array_equal(size, [100, 200])


@pytest.mark.parametrize("expand", [False, True])
def test_rotated_boxes_match_object_pixels(expand):
    """The geometry target (IoU >= 0.85 for 98% of the boxes, median >= 0.95), border boxes
    included: without ``expand`` many objects are cut by the border."""
    results = pipeline_results([T.RandomRotation((-60, 60), expand=expand, fill=FILL)], n=18, batch_size=6, seed=2)
    assert_boxes_on_pixels(results)
    border = 0
    for image, target, _, _ in results:
        b = target["boxes"].cpu().numpy()
        h, w = image.shape[:2]
        border += int(((b[:, 0] <= 0.5) | (b[:, 1] <= 0.5) | (b[:, 2] >= w - 0.5) | (b[:, 3] >= h - 0.5)).sum())
    assert (border > 0) != expand  # expand cuts nothing; without it the border cuts boxes


def test_a_sample_plans_the_same_alone_and_among_batch_mates():
    assert_batch_independent([T.RandomRotation(40, expand=True, p=0.7), T.RandomRotation(20)])


# -- RandomAffine -------------------------------------------------------------------------------


def test_affine_turns_clockwise_and_rotation_counter_clockwise_as_torchvision():
    """torchvision's two conventions: ``F.affine`` turns clockwise on screen for positive angles,
    ``F.rotate`` counter-clockwise. A quarter turn about the centre of a 100x200 canvas moves the
    point right of the centre (150, 50) down to (100, 100) for the affine, up to (100, 0) for the
    rotation."""
    _, m, _, _, _ = plan_one([T.RandomAffine(degrees=(90, 90))], [])
    np.testing.assert_allclose(m[:, :2] @ [150, 50] + m[:, 2], [100, 100], atol=1e-4)
    _, m, _, _, _ = plan_one([T.RandomRotation((90, 90))], [])
    np.testing.assert_allclose(m[:, :2] @ [150, 50] + m[:, 2], [100, 0], atol=1e-4)
    # x-shear: the top half moves right (x -= tan(sx) (y - cy)); y-shear: the left half moves down
    _, m, _, _, _ = plan_one([T.RandomAffine(shear=(20, 20))], [])
    np.testing.assert_allclose(m[:, :2] @ [100, 0] + m[:, 2], [100 + 50 * math.tan(math.radians(20)), 0], atol=1e-4)
    _, m, _, _, _ = plan_one([T.RandomAffine(shear=(0, 0, 20, 20))], [])
    np.testing.assert_allclose(m[:, :2] @ [0, 50] + m[:, 2], [0, 50 + 100 * math.tan(math.radians(20))], atol=1e-4)


@pytest.mark.parametrize("degrees, shear", [((15, 35), None), ((-10, 10), (5, 20, -15, -5))])
def test_one_sided_affine_boxes_match_object_pixels(degrees, shear):
    """One-sided ranges through the real DALI CPU pipeline: the image turns and shears the way the
    boxes do (their direction is torchvision's: test_torchvision_reference)."""
    results = pipeline_results([T.RandomAffine(degrees=degrees, shear=shear, scale=(0.7, 0.9), fill=FILL)],
                               n=12, batch_size=6, seed=4)
    assert_boxes_on_pixels(results)


def test_affine_plans_the_same_alone_and_among_batch_mates():
    assert_batch_independent([T.RandomAffine(degrees=(5, 30), translate=(0.2, 0.1), scale=(0.8, 1.2),
                                             shear=(0, 10, -5, 5), p=0.8)])
