"""Box kernels against float64 references."""

from __future__ import annotations

import numpy as np
import pytest

from detaug.boxes import (
    box_area,
    box_iou,
    boxes_to_polygons,
    canvas_halfplanes,
    clip_polygons,
    polygon_area,
    polygon_bounds,
    rotation_matrix,
    scale_matrix,
    shear_matrix,
    transform_points,
    translation_matrix,
)


def test_box_area_in_the_boxes_dtype_or_the_one_asked():
    boxes = np.array([[0, 0, 10, 5], [4, 4, 2, 9]], np.float64)  # the second is inverted: no area
    assert box_area(boxes).tolist() == [50.0, 0.0] and box_area(boxes).dtype == np.float64
    narrow = box_area(np.array([[0.1, 0.2, 1e7 + 0.3, 0.7]]), np.float32)
    assert narrow.dtype == np.float32
    b = np.float32([0.1, 0.2, 1e7 + 0.3, 0.7])
    assert narrow[0] == (b[2] - b[0]) * (b[3] - b[1])  # cast first, then subtracted in float32


def test_box_iou_matches_hand_computation():
    a = np.array([0, 0, 10, 10.0])
    b = np.array([5, 5, 15, 15.0])
    assert box_iou(a, b) == pytest.approx(25 / 175)
    assert box_iou(a, np.array([20, 20, 30, 30.0])) == 0


def test_rotation_is_counter_clockwise_on_screen():
    # y points down: rotating (1, 0) by +90 degrees on screen gives (0, -1) (up).
    m = rotation_matrix(np.array([90.0]))
    p = transform_points(m, np.array([[[1.0, 0.0]]]))
    np.testing.assert_allclose(p[0, 0], [0.0, -1.0], atol=1e-12)


def test_translation_and_scale_matrices_broadcast_their_two_parameters():
    # one parameter per sample against a scalar: B matrices, float64, the rest the identity
    t = translation_matrix(np.array([1.0, 2.0, 3.0]), 5)
    s = scale_matrix(np.float32(-1.0), np.array([2.0, 0.5, 4.0]))
    assert t.shape == s.shape == (3, 3, 3) and t.dtype == s.dtype == np.float64
    np.testing.assert_array_equal(t[1], [[1, 0, 2], [0, 1, 5], [0, 0, 1]])
    np.testing.assert_array_equal(s[2], [[-1, 0, 0], [0, 4, 0], [0, 0, 1]])
    p = transform_points(t @ s, np.array([[[1.0, 1.0]]] * 3))  # scaled, then moved
    np.testing.assert_array_equal(p[:, 0], [[0.0, 7.0], [1.0, 5.5], [2.0, 9.0]])


def test_shear_matrix_x():
    m = shear_matrix(np.array([45.0]), np.array([0.0]))
    p = transform_points(m, np.array([[[0.0, 2.0]]]))
    np.testing.assert_allclose(p[0, 0], [2.0, 2.0], atol=1e-12)


def reference_clip(poly: np.ndarray, plane: np.ndarray) -> np.ndarray:
    """Textbook Sutherland-Hodgman for one polygon and one half-plane."""
    a, b, c = plane
    out = []
    for i in range(len(poly)):
        p, q = poly[i], poly[(i + 1) % len(poly)]
        dp, dq = a * p[0] + b * p[1] - c, a * q[0] + b * q[1] - c
        if dp <= 0:
            out.append(p)
        if (dp <= 0) != (dq <= 0):
            out.append(p + dp / (dp - dq) * (q - p))
    return np.array(out).reshape(-1, 2)


def test_clip_polygons_matches_reference_on_random_rotated_boxes():
    rng = np.random.default_rng(0)
    boxes = np.concatenate([rng.uniform(0, 50, (200, 2)), rng.uniform(60, 120, (200, 2))], axis=1)
    poly, count = boxes_to_polygons(boxes)
    m = translation_matrix(rng.uniform(-30, 30, 200), 0) @ rotation_matrix(rng.uniform(-180, 180, 200))
    poly = transform_points(m, poly)
    planes = np.stack([rng.normal(size=200), rng.normal(size=200), rng.uniform(-20, 60, 200)], axis=1)
    clipped, new_count = clip_polygons(poly, count, planes)
    for i in range(200):
        ref = reference_clip(poly[i, : count[i]], planes[i])
        assert new_count[i] == len(ref)
        np.testing.assert_allclose(clipped[i, : new_count[i]], ref, atol=1e-9)
        if len(ref) >= 3:
            x, y = ref[:, 0], ref[:, 1]
            area = 0.5 * abs(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1)))
            assert polygon_area(clipped[i : i + 1], new_count[i : i + 1])[0] == pytest.approx(area, abs=1e-9)


def test_clip_to_canvas_gives_visible_bounds_of_a_rotated_square():
    # A 40x40 square centred on the corner (0, 0) of a canvas, rotated 45 degrees: the visible
    # part is the quarter of the diamond inside the canvas, bounded by its edges, not the clamp.
    poly, count = boxes_to_polygons(np.array([[-20.0, -20.0, 20.0, 20.0]]))
    poly = transform_points(rotation_matrix(np.array([45.0])), poly)
    planes = canvas_halfplanes(np.eye(3)[None], np.array([[100.0, 100.0]]))
    for k in range(4):
        poly, count = clip_polygons(poly, count, planes[:, k])
    bounds = polygon_bounds(poly, count)[0]
    r = 20 * np.sqrt(2)
    np.testing.assert_allclose(bounds, [0, 0, r, r], atol=1e-9)
    assert polygon_area(poly, count)[0] == pytest.approx(r * r / 2)


def test_empty_inputs():
    poly, count = boxes_to_polygons(np.zeros((0, 4)))
    clipped, new_count = clip_polygons(poly, count, np.zeros((0, 3)))
    assert clipped.shape[0] == 0 and polygon_bounds(clipped, new_count).shape == (0, 4)
