"""Rotated boxes (issue 41): per-object oriented rectangles moved exactly by their box's planned
map, checked on the pixels, against brute-force references and against torchvision's formulas.

Synthetic scenes: a black image with a few rotated rectangles, each painted in its own primary
colour (object 0 blue, 1 red, 2 green: orthogonal, so a pixel's share of a colour is its
projection on it) on the pixels whose centres it covers. After a recipe runs (real DALI CPU
pipelines), each output rotated box must cover the pixels of its colour around it: IoU >= 0.95
median between the box (pixel centres inside it) and the painted pixels (share >= 0.5), and the
painted pixels inside the box. ``DETAUG_TEST_DEVICE=gpu`` runs the same checks on a GPU.
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "torch")  # before Keras is imported

import numpy as np
import pytest
import torch

import detaug.transforms as T
from detaug import DatasetError
from detaug.plan import PointGeometry
from detaug.rotated import (
    bounding_boxes, check_rotated_boxes, clip_convex, from_rect, min_area_rect, move_rotated_boxes, to_corners,
)
from detaug.sources import Sample, SampleListSource
from detaug.torch import DetectionLoader
from tests.detaug.geometric import exif_rotated_png, geometric_recipes, keras_padded_field, plan_together_and_alone

DEVICE = os.environ.get("DETAUG_TEST_DEVICE", "cpu")
COLOURS = np.array([[0, 0, 255], [255, 0, 0], [0, 255, 0]], np.float64)


def inside_polygon(corners: np.ndarray, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """bool mask of the points ``(xs, ys)`` inside the convex polygon ``corners`` ``[V, 2]`` (either orientation)."""
    signs = []
    for i in range(len(corners)):
        (ax, ay), (bx, by) = corners[i], corners[(i + 1) % len(corners)]
        signs.append((bx - ax) * (ys - ay) - (by - ay) * (xs - ax))
    s = np.stack(signs)
    return (s >= 0).all(axis=0) | (s <= 0).all(axis=0)


def scene(seed: int, hw: tuple[int, int] = (120, 168), objects: int = 3) -> Sample:
    """A black image with ``objects`` rotated rectangles side by side (labels ``10 seed + 1 ..``),
    each wholly inside its column, painted on the pixels whose centres it covers; the boxes are
    their bounding boxes."""
    rng = np.random.default_rng(seed)
    h, w = hw
    image = np.zeros((h, w, 3), np.uint8)
    column = w // objects
    ys, xs = np.mgrid[0:h, 0:w] + 0.5
    rows = []
    for o in range(objects):
        while True:
            rect = np.array([[o * column + column / 2 + rng.uniform(-4, 4), rng.uniform(0.35, 0.65) * h,
                              rng.uniform(24, 44), rng.uniform(12, 24), rng.uniform(-180, 180)]])
            lo, hi = to_corners(rect)[0].min(axis=0), to_corners(rect)[0].max(axis=0)
            if lo[0] >= o * column + 2 and hi[0] <= (o + 1) * column - 2 and lo[1] >= 2 and hi[1] <= h - 2:
                break
        image[inside_polygon(to_corners(rect)[0], xs, ys)] = COLOURS[o]
        rows.append(rect[0])
    rotated = np.array(rows, np.float32)
    return Sample(image, bounding_boxes(rotated), 10 * seed + np.arange(1, objects + 1), image_id=seed + 1,
                  fields={"rotated_boxes": rotated})


def box_ious(image: np.ndarray, labels: np.ndarray, rotated: np.ndarray, share: float = 0.5) -> list[tuple[float, float]]:
    """Per output rotated box with some area: ``(IoU, coverage)`` between the box (pixel centres
    inside it) and the pixels of its object's colour (share >= ``share``: a ``MixUp`` blend
    halves it) within 3 px of the box's bounding box; coverage: the share of those pixels inside
    the box."""
    h, w = image.shape[:2]
    corners = to_corners(rotated)
    out = []
    for label, row, quad in zip(labels, rotated, corners):
        size = row[2:4] if len(row) == 5 else (np.hypot(*(quad[1] - quad[0])), np.hypot(*(quad[2] - quad[1])))
        if min(size) == 0:
            continue
        lo, hi = np.floor(quad.min(axis=0) - 3).astype(int), np.ceil(quad.max(axis=0) + 3).astype(int)
        x0, y0, x1, y1 = max(lo[0], 0), max(lo[1], 0), min(hi[0], w), min(hi[1], h)
        ys, xs = np.mgrid[y0:y1, x0:x1] + 0.5
        colour = COLOURS[int(label) % 10 - 1]
        painted = np.clip(image[y0:y1, x0:x1].astype(np.float64) @ colour / (colour @ colour), 0, 1) >= share
        box = inside_polygon(quad, xs, ys)
        union = (painted | box).sum()
        if painted.sum() < 20:  # an object cut down to a sliver: too few pixels to measure
            continue
        out.append((float((painted & box).sum() / union), float((painted & box).sum() / painted.sum())))
    return out


def run(recipe: T.Compose, sample: Sample, seed: int, fmt: str = "cxcywhr") -> dict:
    rotated = sample.fields["rotated_boxes"]
    given = rotated if fmt == "cxcywhr" else to_corners(rotated).reshape(-1, 8).astype(np.float32)
    return recipe(image=sample.image, boxes=sample.boxes, labels=sample.labels, rotated_boxes=given,
                  seed=seed, image_id=sample.image_id, device=DEVICE)


GEOMETRIC = geometric_recipes(
    (120, 168), flips="random", perspective=0.3, iou_crop_resize=(100, 140), crop_pad=(90, 120), center_crop=(90, 110),
    zoom_out_resize=((1.0, 1.6), (140, 180)), crop_then_zoom_out=((80, 110), (1.2, 1.5)),
    resize=(84, 118),  # a strong aspect change: test_an_aspect_change_gives_...
    letterbox=160, shortest_size=([100, 140, 180], 260), mosaic=((120, 168), T.RandomRotation(degrees=10)),
    mosaic_affine=T.RandomAffine(degrees=10, scale=(0.9, 1.2), shear=5))


@pytest.mark.parametrize("name", list(GEOMETRIC))
def test_every_geometric_transform_puts_each_rotated_box_on_its_painted_rectangle(name):
    recipe = GEOMETRIC[name]
    scores = []
    for seed in range(3):
        sample = scene(seed)
        fmt = "cxcywhr" if seed % 2 == 0 else "xyxyxyxy"
        out = run(recipe, sample, seed, fmt)
        rotated = out["rotated_boxes"]
        assert rotated.dtype == np.float32 and rotated.shape == (len(out["boxes"]), 5 if fmt == "cxcywhr" else 8)
        scores += box_ious(out["image"], out["labels"], rotated)
    assert len(scores) >= 5, f"{name}: only {len(scores)} boxes measured"
    iou, coverage = np.array(scores).T
    assert np.median(iou) >= 0.95, f"{name}: median IoU {np.median(iou):.3f}"
    assert np.median(coverage) >= 0.97, f"{name}: median coverage {np.median(coverage):.3f}"
    assert coverage.min() >= 0.9, f"{name}: a box leaves {1 - coverage.min():.2f} of its object outside"


def test_a_cut_box_is_the_minimum_rectangle_of_what_is_left():
    sample = scene(4)
    rot = sample.fields["rotated_boxes"]
    left = int(to_corners(rot[:1])[0, :, 0].mean())  # cut object 0 (and 2) through its centre
    out = run(T.Compose([T.CenterCrop((120, 168 - 2 * left))]), sample, 0)
    scores = box_ious(out["image"], out["labels"], out["rotated_boxes"])
    assert len(scores) == 3 and min(s[1] for s in scores) >= 0.97  # what is left of each object lies in its box
    cut = out["rotated_boxes"][out["labels"] == 41]
    assert len(cut) == 1 and cut[0, 2] * cut[0, 3] < 0.75 * rot[0, 2] * rot[0, 3]  # no longer the whole rectangle


def test_an_aspect_change_gives_the_parallelograms_minimum_rectangle():
    """A strong aspect change turns a rotated rectangle into a parallelogram, which no rectangle
    matches (IoU with the pixels about 0.8): the box is its minimum-area rectangle (against a
    brute-force angle search over the exactly scaled corners), and holds the painted pixels."""
    sample = scene(2)
    out = run(T.Compose([T.Resize((90, 200))]), sample, 0)
    scale = np.array([200 / 168, 90 / 120])
    theta = np.deg2rad(np.arange(0, 90, 0.005))
    u, v = np.stack([np.cos(theta), np.sin(theta)], 1), np.stack([-np.sin(theta), np.cos(theta)], 1)
    for label, row in zip(out["labels"], out["rotated_boxes"]):
        p = to_corners(sample.fields["rotated_boxes"][int(label) % 10 - 1:][:1])[0] * scale
        a, c = p @ u.T, p @ v.T
        brute = (np.ptp(a, axis=0) * np.ptp(c, axis=0)).min()
        assert brute * (1 - 1e-3) <= row[2] * row[3] <= brute * (1 + 1e-3)
        assert inside_polygon(to_corners(row[None])[0], *(p + (p.mean(0) - p) * 1e-4).T).all()
    assert min(s[1] for s in box_ious(out["image"], out["labels"], out["rotated_boxes"])) >= 0.97


def test_a_rotated_box_with_nothing_visible_keeps_its_row_with_zero_size():
    """The axis-aligned box decides which rows stay: a rotated box whose bounding box's corner
    is still on the canvas but whose rectangle is not comes out with w = h = 0 at its mapped centre."""
    image = np.zeros((100, 100, 3), np.uint8)
    rot = np.array([[75, 25, 50, 4, -45.0]], np.float32)  # a thin bar down to the right, box ~[56, 6, 94, 44]
    out = T.Compose([T.CenterCrop((20, 20))])(image=image, boxes=bounding_boxes(rot), rotated_boxes=rot, device=DEVICE)
    assert len(out["boxes"]) == 1  # the box's corner [56, 40, 60, 44] is in the crop [40, 60]^2; the bar is not
    np.testing.assert_allclose(out["rotated_boxes"][0, :4], [35, -15, 0, 0], atol=1e-4)


def test_torchvision_reference_where_nothing_is_clipped():
    """Ported from torchvision's rotated-box kernels (``_cxcywhr_to_xywhr``/``_xywhr_to_xyxyxyxy``,
    the affine reference rotating the corners by the matrix, ``horizontal_flip_bounding_boxes``):
    with nothing clipped, detaug's box is the source rectangle moved (angles modulo 360)."""
    image = np.zeros((100, 140, 3), np.uint8)
    rot = np.array([[50, 45, 20, 10, 30.0], [90, 60, 16, 12, -110.0]], np.float32)
    boxes = bounding_boxes(rot)
    h, w = image.shape[:2]

    def corners(b):  # torchvision: (x1, y1) = c - w/2 (cos r, -sin r) - h/2 (sin r, cos r), then around
        r = np.deg2rad(b[:, 4])
        c, s = np.cos(r), np.sin(r)
        x1 = b[:, 0] - b[:, 2] / 2 * c - b[:, 3] / 2 * s
        y1 = b[:, 1] + b[:, 2] / 2 * s - b[:, 3] / 2 * c
        return np.stack([np.stack([x1, y1], 1), np.stack([x1 + b[:, 2] * c, y1 - b[:, 2] * s], 1),
                         np.stack([x1 + b[:, 2] * c + b[:, 3] * s, y1 - b[:, 2] * s + b[:, 3] * c], 1),
                         np.stack([x1 + b[:, 3] * s, y1 + b[:, 3] * c], 1)], 1)

    def cxcywhr(p):  # torchvision's _xyxyxyxy_to_xywhr then _xywhr_to_cxcywhr
        r = np.rad2deg(np.arctan2(p[:, 0, 1] - p[:, 1, 1], p[:, 1, 0] - p[:, 0, 0]))
        return np.concatenate([p.mean(axis=1), np.hypot(*(p[:, 1] - p[:, 0]).T)[:, None],
                               np.hypot(*(p[:, 2] - p[:, 1]).T)[:, None], r[:, None]], axis=1)

    def same(a, b):
        np.testing.assert_allclose(a[:, :4], b[:, :4], atol=2e-3)
        np.testing.assert_allclose((a[:, 4] - b[:, 4] + 180) % 360 - 180, 0, atol=2e-3)

    np.testing.assert_allclose(cxcywhr(corners(rot)), rot, atol=1e-4)
    np.testing.assert_allclose(to_corners(rot), corners(rot), atol=1e-4)
    centre = np.array([w / 2, h / 2])
    for kind, angle, scale in [("affine", 30, 1.0), ("affine", -75, 0.8), ("affine", 140, 1.1), ("rotation", 50, 1.0),
                               ("rotation", -160, 1.0)]:
        if kind == "affine":  # torchvision's F.affine turns clockwise on the image for positive angles
            step = T.RandomAffine(degrees=(angle, angle), scale=(scale, scale))
            a = -np.deg2rad(angle)
        else:  # F.rotate: counter-clockwise
            step = T.RandomRotation(degrees=(angle, angle))
            a = np.deg2rad(angle)
        out = T.Compose([step])(image=image, boxes=boxes, rotated_boxes=rot, device=DEVICE)
        m = scale * np.array([[np.cos(a), np.sin(a)], [-np.sin(a), np.cos(a)]])  # counter-clockwise by a, y down
        moved = (corners(rot) - centre) @ m.T + centre
        same(out["rotated_boxes"], cxcywhr(moved))
    hflip = T.Compose([T.RandomHorizontalFlip(p=1.0)])(image=image, boxes=boxes, rotated_boxes=rot, device=DEVICE)
    same(hflip["rotated_boxes"], np.concatenate([w - rot[:, :1], rot[:, 1:4], -rot[:, 4:]], axis=1))
    vflip = T.Compose([T.RandomVerticalFlip(p=1.0)])(image=image, boxes=boxes, rotated_boxes=rot, device=DEVICE)
    same(vflip["rotated_boxes"], np.concatenate([rot[:, :1], h - rot[:, 1:2], rot[:, 2:4], 180 - rot[:, 4:]], axis=1))
    # torchvision's flip of XYXYXYXY: the corners mirrored and reordered [2, 1, 4, 3]
    quads = to_corners(rot).reshape(-1, 8).astype(np.float32)
    got = T.Compose([T.RandomHorizontalFlip(p=1.0)])(image=image, boxes=boxes, rotated_boxes=quads, device=DEVICE)
    ref = quads.copy()
    ref[:, 0::2] = w - ref[:, 0::2]
    np.testing.assert_allclose(got["rotated_boxes"], ref[:, [2, 3, 0, 1, 6, 7, 4, 5]], atol=2e-3)


@pytest.mark.parametrize("recipe", [
    T.Compose([T.Resize((120, 168)), T.MixUp(p=1.0, scale=(0.5, 0.7), fill=0), T.RandomRotation(degrees=15)]),
    T.Compose([T.Mosaic(size=(120, 168), fill=0), T.RandomHorizontalFlip(), T.RandomRotation(degrees=30)]),
], ids=["mixup", "mosaic"])
def test_unclipped_rotated_boxes_are_their_corners_moved_as_keypoints(recipe):
    """Each box's corners given as its keypoints too: where all four stay visible (nothing is
    clipped) and the maps keep rectangles (``MixUp``'s partner and ``Mosaic``'s tiles scaled
    uniformly, rotations, flips), the rotated box's corners are those keypoints, for the
    partner's and every tile's boxes as for the sample's (the pixels of a self-blend overlap,
    so this is checked on the keypoints, which test_keypoints.py checks on the pixels). A
    partner or tile is scaled to whole pixels, so its x and y scales differ a little: the box is
    the minimum rectangle of the moved corners (a parallelogram), within 0.15 px of them."""
    compared, partners = 0, 0
    for seed in range(3):
        sample = scene(seed)
        rot = sample.fields["rotated_boxes"]
        points = np.concatenate([to_corners(rot), np.full((len(rot), 4, 1), 2.0)], axis=2).astype(np.float32)
        out = recipe(image=sample.image, boxes=sample.boxes, labels=sample.labels, rotated_boxes=rot, keypoints=points,
                     seed=seed, image_id=sample.image_id, device=DEVICE)
        partners += len(out["labels"]) - len(sample.labels)
        theta = np.deg2rad(np.arange(0, 90, 0.005))
        u, v = np.stack([np.cos(theta), np.sin(theta)], 1), np.stack([-np.sin(theta), np.cos(theta)], 1)
        for box, kp in zip(out["rotated_boxes"], out["keypoints"]):
            if (kp[:, 2] > 0).all():
                got = to_corners(box[None])[0]
                for corner in kp[:, :2]:  # the same four points, whatever their order
                    assert np.hypot(*(got - corner).T).min() <= 0.15, (got, kp)
                a, c = kp[:, :2] @ u.T, kp[:, :2] @ v.T  # the corners' minimum rectangle, by brute force
                brute = (np.ptp(a, axis=0) * np.ptp(c, axis=0)).min()
                assert brute * (1 - 1e-3) <= box[2] * box[3] <= brute * (1 + 1e-3)
                compared += 1
    assert partners > 0 and compared >= 8


def test_batches_planned_together_move_rotated_boxes_as_alone():
    source = SampleListSource([scene(s) for s in range(8)])
    recipe = T.Compose([T.Mosaic(size=(96, 128), fill=0), T.RandomHorizontalFlip(), T.RandomAffine(degrees=20)])
    together = plan_together_and_alone(source, recipe, "rotated_boxes", steps=4)
    assert sum(len(f["rotated_boxes"]) for g in together for f in g.fields) > 8


# -- kernels against brute-force references -----------------------------------------------------------

def test_clip_convex_matches_a_brute_force_point_test():
    rng = np.random.default_rng(0)
    n = 40
    rot = np.stack([rng.uniform(20, 80, n), rng.uniform(20, 80, n), rng.uniform(5, 60, n), rng.uniform(5, 60, n),
                    rng.uniform(-180, 180, n)], axis=1)
    angles = rng.uniform(0, 2 * np.pi, (n, 3))
    planes = np.stack([np.cos(angles), np.sin(angles), rng.uniform(-10, 60, (n, 3))], axis=2)  # a x + b y <= c
    planes[0, 0] = (0, 0, np.inf)  # no constraint
    poly, count = clip_convex(to_corners(rot), np.full(n, 4), planes)
    ys, xs = np.mgrid[-20:120:0.25, -20:120:0.25] + 0.125
    for k in range(n):
        truth = inside_polygon(to_corners(rot[k:k + 1])[0], xs, ys)
        for a, b, c in planes[k]:
            truth &= (a * xs + b * ys <= c) | np.isinf(c)
        got = inside_polygon(poly[k, :count[k]], xs, ys) if count[k] >= 3 else np.zeros_like(truth)
        assert (got != truth).sum() * 0.0625 <= 0.02 * max(truth.sum() * 0.0625, 1) + 2, f"row {k}"


def clipped_rectangles(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Convex polygons: random rotated rectangles cut by three random half-planes each."""
    rng = np.random.default_rng(seed)
    rot = np.stack([rng.uniform(30, 70, n), rng.uniform(30, 70, n), rng.uniform(5, 60, n), rng.uniform(1, 60, n),
                    rng.uniform(-180, 180, n)], axis=1)
    angles = rng.uniform(0, 2 * np.pi, (n, 3))
    planes = np.stack([np.cos(angles), np.sin(angles), rng.uniform(0, 30, (n, 3)) + 50 * np.cos(angles)
                       + 50 * np.sin(angles)], axis=2)  # through points near the centre (50, 50)
    return clip_convex(to_corners(rot), np.full(n, 4), planes)


@pytest.mark.parametrize("kind", ["random points", "clipped rectangles", "concave quadrilaterals"])
def test_min_area_rect_matches_a_brute_force_angle_search(kind):
    rng = np.random.default_rng(1)
    n, v = 30, 9
    if kind == "random points":  # neither convex nor in order: every pair of points is tried
        poly = rng.normal(0, 20, (n, v, 2)) * rng.uniform(0.2, 1, (n, 1, 2)) + 50
        count = rng.integers(3, v + 1, n)
    elif kind == "clipped rectangles":  # convex: their edges are tried
        poly, count = clipped_rectangles(n, 2)
        assert (count >= 3).sum() >= 20 and (count > 4).any()
    else:  # a dart: one reflex corner, the hull's edge bridges it
        tip = rng.uniform(20, 80, (n, 2))
        base = tip + rng.uniform(10, 40, (n, 1)) * np.stack([np.cos(a := rng.uniform(0, 6.3, n)), np.sin(a)], 1)
        side = np.stack([-np.sin(a), np.cos(a)], 1) * rng.uniform(5, 20, (n, 1))
        notch = tip + (base - tip) * rng.uniform(0.3, 0.8, (n, 1))
        poly, count = np.stack([tip, base + side, notch, base - side], axis=1), np.full(n, 4)
    centre, axes, extent = min_area_rect(poly, count)
    theta = np.deg2rad(np.arange(0, 180, 0.01))
    u = np.stack([np.cos(theta), np.sin(theta)], 1)
    vv = np.stack([-np.sin(theta), np.cos(theta)], 1)
    for k in np.flatnonzero(count > 0):
        p = poly[k, :count[k]]
        a, c = p @ u.T, p @ vv.T
        brute = ((a.max(0) - a.min(0)) * (c.max(0) - c.min(0))).min()
        got = extent[k, 0] * extent[k, 1]
        assert got <= brute + 1e-9 and got >= brute * (1 - 1e-3), (k, got, brute)  # the grid's step: 0.01 degrees
        offsets = (p - centre[k]) @ axes[k].T  # along u and v: every point within the half extents
        assert (np.abs(offsets) <= extent[k] / 2 + 1e-9).all()
        assert np.isclose(axes[k, 0] @ axes[k, 1], 0) and np.allclose(np.linalg.norm(axes[k], axis=1), 1)


def test_move_with_an_identity_map_gives_back_the_boxes_and_cuts_at_the_window():
    rot = np.array([[50, 40, 30, 10, 30.0], [20, 20, 10, 8, 179.0], [95, 40, 20, 20, 0.0]])
    geometry = PointGeometry(np.broadcast_to(np.eye(3), (3, 3, 3)).copy(), np.tile([0.0, 0, 100, 80], (3, 1)),
                             np.zeros((3, 0, 3)), np.tile([80.0, 100], (3, 1)), rot[:, :2].copy())
    out = move_rotated_boxes(rot, geometry)
    np.testing.assert_allclose(out[:2], rot[:2], atol=1e-4)
    np.testing.assert_allclose(out[2], [92.5, 40, 15, 20, 0], atol=1e-4)  # half of it beyond x = 100
    corners = move_rotated_boxes(to_corners(rot).reshape(-1, 8), geometry)
    np.testing.assert_allclose(corners[:2], to_corners(rot[:2]).reshape(-1, 8), atol=1e-4)


# -- sources, validation, targets ---------------------------------------------------------------------

def test_rotated_boxes_are_checked_with_named_errors():
    good = scene(1)
    bad = [
        (np.zeros((3, 4)), r"rotated boxes of shape \[3, 4\] are not \[N, 5\]"),
        (np.zeros((2, 5)), "field 'rotated_boxes' has 2 rows, expected one per box"),
        (np.array([[1, 2, 3, 4, 0], [np.nan, 1, 2, 2, 0], [1, 1, 2, 2, 0]]), "rotated box 1: non-finite value"),
        (np.array([[1, 2, 3, 4, 0], [1, 1, 0, 2, 0], [1, 1, 2, 2, 0]]), "rotated box 1: width 0 and height 2 must be positive"),
        (np.array([[0, 0, 1, 0, 1, 1, 0, 1]] * 2 + [[0, 0, 1, 1, 1, 0, 0, 1]]), "rotated box 2: .* its edges cross"),
        (np.array([[0, 0, 1, 0, 1, 1, 0, 1]] * 2 + [[0, 0, 1, 1, 2, 2, 3, 3]]), "rotated box 2: .* it has no area"),
    ]
    for values, message in bad:
        s = Sample(good.image, good.boxes, good.labels, image_id=9, fields={"rotated_boxes": values})
        with pytest.raises(DatasetError, match=message) as err:
            SampleListSource([s])
        assert "image_id 9" in str(err.value)
    assert check_rotated_boxes(np.zeros((0, 5)), 0)[0].shape == (0, 5)
    with pytest.raises(ValueError, match=r"field .rotated_boxes. has 2 rows, expected one per box \(3\)"):
        T.Compose([T.Resize((10, 10))])(image=good.image, boxes=good.boxes, rotated_boxes=np.zeros((2, 5)))


def test_torch_loader_targets_with_mosaic_carry_rotated_boxes_of_every_tile():
    samples = [scene(s) for s in range(6)]
    source = SampleListSource(samples)
    assert source.field_specs["rotated_boxes"] == (np.dtype(np.float32), (5,))
    recipe = T.Compose([T.Mosaic(size=(120, 168), fill=0), T.RandomHorizontalFlip(), T.RandomRotation(degrees=15)])
    loader = DetectionLoader(source, recipe, 3, device=DEVICE, seed=4, num_threads=1, shuffle=True)
    scores = []
    for images, targets in loader:
        for image, t in zip(images, targets):
            r = t["rotated_boxes"]
            assert r.dtype == torch.float32 and r.shape == (len(t["boxes"]), 5)
            scores += box_ious(image.permute(1, 2, 0).cpu().numpy(), t["labels"].cpu().numpy(), r.cpu().numpy())
    loader.close()
    assert len(scores) >= 10 and np.median([s[0] for s in scores]) >= 0.95


def test_keras_targets_pad_rotated_boxes_with_minus_one():
    pytest.importorskip("keras", reason="Keras 3 is not installed")
    samples = [scene(s) for s in range(4)]
    quads = [Sample(s.image, s.boxes, s.labels, image_id=s.image_id,
                    fields={"rotated_boxes": to_corners(s.fields["rotated_boxes"]).reshape(-1, 8)}) for s in samples]
    padded, _ = keras_padded_field(SampleListSource(quads), T.Compose([T.RandomHorizontalFlip(), T.Resize((60, 84))]),
                                   "rotated_boxes", DEVICE)
    assert padded.shape == (2, 5, 8) and padded.dtype == np.float32


def test_rotated_boxes_of_an_exif_rotated_image_follow_its_pixels(tmp_path):
    sample = scene(8)
    path = exif_rotated_png(tmp_path / "rotated.png", sample.image, 6)
    stored = Sample(str(path), sample.boxes, sample.labels, image_id=3, fields=sample.fields)
    loader = DetectionLoader(SampleListSource([stored]), T.Compose([T.Resize((168, 120))]), 1, device=DEVICE,
                             num_threads=1)
    images, targets = next(iter(loader))
    loader.close()
    scores = box_ious(images[0].permute(1, 2, 0).cpu().numpy(), targets[0]["labels"].cpu().numpy(),
                      targets[0]["rotated_boxes"].cpu().numpy())
    assert len(scores) == 3 and min(s[0] for s in scores) >= 0.9


def test_rotated_boxes_go_through_shards_as_any_per_box_field(tmp_path):
    from detaug.shards import ShardSource, write_shards

    import io

    from PIL import Image

    samples = []
    for s in range(2):
        sample, buffer = scene(s), io.BytesIO()
        Image.fromarray(sample.image).save(buffer, "PNG")  # shards hold encoded images
        samples.append(Sample(buffer.getvalue(), sample.boxes, sample.labels, image_id=sample.image_id, fields=sample.fields))
    source = SampleListSource(samples, categories={int(lab): f"c{lab}" for s in samples for lab in s.labels})
    write_shards(source, tmp_path / "shards", progress=False)
    shards = ShardSource(tmp_path / "shards")
    assert shards.field_specs["rotated_boxes"] == (np.dtype(np.float32), (5,))
    recipe = T.Compose([T.RandomHorizontalFlip(p=1.0), T.RandomRotation(degrees=20)])
    ours = DetectionLoader(shards, recipe, 2, device=DEVICE, num_threads=1, fields=["rotated_boxes"])
    theirs = DetectionLoader(source, recipe, 2, device=DEVICE, num_threads=1, fields=["rotated_boxes"])
    (_, a), (_, b) = next(iter(ours)), next(iter(theirs))
    ours.close()
    theirs.close()
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x["rotated_boxes"].cpu().numpy(), y["rotated_boxes"].cpu().numpy())
    assert sum(len(x["rotated_boxes"]) for x in a) >= 4
