"""Rotated boxes: per-object oriented rectangles moved exactly by their box's planned map.

A box may carry an oriented box: the per-box field :data:`ROTATED_BOXES` (``"rotated_boxes"``),
float32 ``[N, 5]`` or ``[N, 8]`` in absolute pixels (continuous coordinates, as the boxes), in the
formats torchvision names (``torchvision.tv_tensors.BoundingBoxFormat``):

* ``[N, 5]`` ``CXCYWHR``: ``(cx, cy, w, h, r)``, the centre, the width and height, and the angle
  ``r`` in degrees, counter-clockwise *as seen on the image* (y points down): the width edge runs
  along ``(cos r, -sin r)``, the height edge along ``(sin r, cos r)``;
* ``[N, 8]`` ``XYXYXYXY``: the 4 corners ``(x1, y1, ..., x4, y4)`` in order around the box (as DOTA
  and Ultralytics OBB write them); torchvision's order is top-left, top-right, bottom-right,
  bottom-left of the unrotated box (clockwise on the image).

The trailing size picks the format, and a box comes back in the format it was given in.

How a rotated box moves (:func:`move_rotated_boxes`; the planner hands over each kept box's
:class:`detaug.plan.PointGeometry`, the map and clip windows its axis-aligned box and its
keypoints go with):

1. its 4 corners, in its layer's source image, are clipped by the windows of its layer (the
   source image, each crop, a Mosaic tile's quadrant: the rectangle and half-planes that clip its
   axis-aligned box) and by the map's horizon (a projective map, ``w > 0``), Sutherland-Hodgman
   (:func:`clip_convex`);
2. the visible polygon is mapped forward (affine, or projective with the division) and clipped by
   the output canvas ``[0, W] x [0, H]``;
3. the output is the minimum-area rectangle of that polygon (:func:`min_area_rect`: every edge
   direction of its convex hull is a candidate, as the rotating calipers visit them), written
   with the width/height assignment and angle that follow the source box's height edge through
   the map (where nothing is clipped and the map is a rotation, scale and translation, the
   rectangle is the source one moved, as torchvision moves it; a flip keeps the height edge and
   reverses the width edge, as torchvision's flips do); angles come out in ``(-180, 180]``;
4. a box whose rotated box has no visible area keeps its row as long as its axis-aligned box
   is kept (the axis-aligned box's rules decide which objects survive): its rotated box is then
   ``w = h = 0`` at the mapped centre (four equal corners in ``XYXYXYXY``).

A non-rectangular ``XYXYXYXY`` quadrilateral (a DOTA polygon) moves as a polygon: the output is
always a rectangle, its minimum-area one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from detaug.arrays import numeric_array
from detaug.boxes import clip_polygons, transform_points

__all__ = [
    "ROTATED_BOXES", "ROTATED_FORMATS", "bounding_boxes", "check_rotated_boxes", "clip_convex", "from_rect",
    "min_area_rect", "move_rotated_boxes", "orient_rotated_boxes", "rotated_format", "to_corners",
]

#: The per-box field name of rotated boxes (sources, targets, eager calls).
ROTATED_BOXES = "rotated_boxes"

#: The formats by trailing size, named as torchvision names them (lower case, like detaug's box formats).
ROTATED_FORMATS = {5: "cxcywhr", 8: "xyxyxyxy"}

#: Below this (pixels), a side of the visible part's rectangle is no side: nothing is visible.
_EMPTY = 1e-9


def rotated_format(values: Any) -> str:
    """``"cxcywhr"`` for ``[..., 5]``, ``"xyxyxyxy"`` for ``[..., 8]`` (``ValueError`` otherwise)."""
    size = int(np.shape(values)[-1]) if np.ndim(values) else 0
    if size not in ROTATED_FORMATS:
        raise ValueError(f"rotated boxes of shape {list(np.shape(values))} are not [N, 5] (cxcywhr) or [N, 8] (xyxyxyxy)")
    return ROTATED_FORMATS[size]


def _axes(degrees: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(width direction, height direction)`` ``[..., 2]`` of angles in degrees (torchvision's)."""
    r = np.deg2rad(degrees)
    c, s = np.cos(r), np.sin(r)
    return np.stack([c, -s], axis=-1), np.stack([s, c], axis=-1)


def to_corners(values: Any) -> np.ndarray:
    """float64 ``[N, 4, 2]`` corners of ``[N, 5]`` cxcywhr or ``[N, 8]`` xyxyxyxy rotated boxes,
    in torchvision's order (``XYXYXYXY`` given: as given)."""
    arr = np.asarray(values, dtype=np.float64)
    if rotated_format(arr) == "xyxyxyxy":
        return arr.reshape(-1, 4, 2).copy()
    arr = arr.reshape(-1, 5)
    return from_rect(arr[:, :2], arr[:, 2:4], arr[:, 4], "xyxyxyxy").reshape(-1, 4, 2)


def from_rect(centre: np.ndarray, size: np.ndarray, degrees: np.ndarray, fmt: str) -> np.ndarray:
    """float64 ``[N, 5]`` (``fmt`` ``"cxcywhr"``) or ``[N, 8]`` (``"xyxyxyxy"``: torchvision's
    corner order) of rectangles: ``centre`` ``[N, 2]``, ``size`` ``[N, 2]`` ``(w, h)``, angle
    ``degrees`` ``[N]``."""
    centre, size, degrees = (np.asarray(a, dtype=np.float64) for a in (centre, size, degrees))
    if fmt == "cxcywhr":
        return np.concatenate([centre, size, degrees[:, None]], axis=1)
    d, e = _axes(degrees)
    half_w, half_h = size[:, :1] / 2 * d, size[:, 1:] / 2 * e
    corners = [centre - half_w - half_h, centre + half_w - half_h, centre + half_w + half_h, centre - half_w + half_h]
    return np.stack(corners, axis=1).reshape(-1, 8)


def _height_axis(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(centre [N, 2], unit height direction [N, 2])`` of rotated boxes (xyxyxyxy: the mean of
    its edges 2-3 and 1-4, torchvision's height edges)."""
    if rotated_format(values) == "cxcywhr":
        return values[:, :2].copy(), _axes(values[:, 4])[1]
    p = values.reshape(-1, 4, 2)
    e = (p[:, 2] - p[:, 1]) + (p[:, 3] - p[:, 0])
    norm = np.hypot(e[:, 0], e[:, 1])[:, None]
    return p.mean(axis=1), e / np.where(norm > 0, norm, 1.0)


def check_rotated_boxes(values: Any, count: int | None) -> tuple[np.ndarray | None, str]:
    """A sample's rotated boxes as float32 ``[count, 5]`` or ``[count, 8]``, or ``(None, why)``:
    numbers, one row per box, finite; cxcywhr with ``w > 0`` and ``h > 0``; xyxyxyxy four
    corners in order around a quadrilateral of positive area (its edges do not cross).
    ``count`` ``None``: the boxes are malformed (rows not checked)."""
    arr, why = numeric_array(values, "rotated boxes")
    if arr is None:
        return None, why
    if arr.ndim != 2 or arr.shape[1] not in ROTATED_FORMATS:
        return None, (f"rotated boxes of shape {list(arr.shape)} are not [N, 5] (cx, cy, w, h, angle in degrees) "
                      "or [N, 8] (x1, y1, ..., x4, y4)")
    if count is not None and arr.shape[0] != count:
        return None, f"rotated boxes have {arr.shape[0]} rows, expected one per box ({count})"
    a = arr.astype(np.float64)
    bad = ~np.isfinite(a).all(axis=1) | (np.abs(a) > np.finfo(np.float32).max).any(axis=1)
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        return None, f"rotated box {k}: non-finite value {a[k].tolist()}"
    if arr.shape[1] == 5:
        bad = ~((a[:, 2] > 0) & (a[:, 3] > 0))
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            return None, f"rotated box {k}: width {a[k, 2]:g} and height {a[k, 3]:g} must be positive"
    else:
        p = a.reshape(-1, 4, 2)
        edge = np.roll(p, -1, axis=1) - p
        turn = edge[:, :, 0] * np.roll(edge, -1, axis=1)[:, :, 1] - edge[:, :, 1] * np.roll(edge, -1, axis=1)[:, :, 0]
        area = 0.5 * np.abs((p[:, :, 0] * np.roll(p, -1, axis=1)[:, :, 1]
                             - p[:, :, 1] * np.roll(p, -1, axis=1)[:, :, 0]).sum(axis=1))
        crossed = ((turn > 0).sum(axis=1) == 2) & ((turn < 0).sum(axis=1) == 2)  # a bow tie
        bad = ~(area > 0) | crossed
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            why = "its edges cross (give the corners in order around the box)" if crossed[k] else "it has no area"
            return None, f"rotated box {k}: corners {a[k].tolist()} are not a quadrilateral: {why}"
    return a.astype(np.float32), ""


def bounding_boxes(values: Any) -> np.ndarray:
    """float32 ``[N, 4]`` xyxy boxes around rotated boxes ``[N, 5]`` or ``[N, 8]`` (the axis-aligned
    boxes to give with them where a dataset has none)."""
    p = to_corners(values)
    if not len(p):
        return np.zeros((0, 4), np.float32)
    return np.concatenate([p.min(axis=1), p.max(axis=1)], axis=1).astype(np.float32)


def clip_convex(poly: np.ndarray, count: np.ndarray, planes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Polygons ``[N, V, 2]`` (``count`` ``[N]`` vertices each) clipped by the half-planes
    ``planes`` ``[N, P, 3]`` ``(a, b, c)``: keep ``a x + b y <= c`` (``c = inf``: none), one after
    the other (Sutherland-Hodgman, :func:`detaug.boxes.clip_polygons`). The intersection of the
    half-planes is a convex window; the subject may be any simple polygon (its clipped vertices then
    span the visible part's convex hull)."""
    poly, count = np.asarray(poly, dtype=np.float64), np.asarray(count, dtype=np.int64).copy()
    for k in range(planes.shape[1]):
        poly, count = clip_polygons(poly, count, planes[:, k])
    return poly, count


def min_area_rect(poly: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Minimum-area enclosing rectangles of polygons ``[N, V, 2]`` (the first ``count[n]`` vertices of row ``n``).

    The smallest rectangle around a point set has a side along an edge of its convex hull (the
    directions the rotating calipers visit), and the rectangle around the points along any
    direction encloses them: the smallest over a set of directions that holds the hull's edges
    is the answer. For a convex polygon (what clipping a rectangle gives) those are its own
    edges; for any other row (a concave quadrilateral given as corners), every direction between
    two of its vertices is tried, which holds them too.

    Returns:
        ``(centre [N, 2], axes [N, 2, 2], extent [N, 2])``: the rectangle's centre, its two unit
        side directions ``u`` and ``v = (-u_y, u_x)``, and its extents along them; zeros (and
        the x and y axes) for rows without vertices.
    """
    poly = np.asarray(poly, dtype=np.float64)
    n, v = poly.shape[:2]
    count = np.asarray(count, dtype=np.int64)
    centre, axes, extent = np.zeros((n, 2)), np.zeros((n, 2, 2)), np.zeros((n, 2))
    axes[:, 0, 0] = axes[:, 1, 1] = 1.0
    if n == 0 or v == 0:
        return centre, axes, extent
    idx = np.arange(v)
    valid = idx[None, :] < count[:, None]  # [N, V]
    nxt = np.where(idx[None, :] + 1 < count[:, None], idx[None, :] + 1, 0)
    edges = np.take_along_axis(poly, nxt[:, :, None], axis=1) - poly  # [N, V, 2]: vertex i to i + 1
    turn = edges[:, :, 0] * np.take_along_axis(edges, nxt[:, :, None], axis=1)[:, :, 1] \
        - edges[:, :, 1] * np.take_along_axis(edges, nxt[:, :, None], axis=1)[:, :, 0]
    tol = 1e-9 * np.maximum(np.where(valid[..., None], np.abs(poly), 0).max(axis=(1, 2)), 1.0) ** 2
    turn = np.where(valid, turn, 0.0)
    convex = ~((turn > tol[:, None]).any(axis=1) & (turn < -tol[:, None]).any(axis=1))
    some = count > 0
    for rows, every_pair in ((np.flatnonzero(some & convex), False), (np.flatnonzero(some & ~convex), True)):
        if not len(rows):
            continue
        p, ok = poly[rows], valid[rows]
        if every_pair:
            d = (p[:, None, :, :] - p[:, :, None, :]).reshape(len(rows), v * v, 2)
            usable = (ok[:, :, None] & ok[:, None, :]).reshape(len(rows), -1)
        else:
            d, usable = edges[rows], ok
        length = np.hypot(d[..., 0], d[..., 1])
        usable = usable & (length > 0)
        u = np.where(usable[..., None], d / np.where(length > 0, length, 1.0)[..., None], 0.0)
        u[~usable] = (1.0, 0.0)  # no edge: the x axis (a valid enclosing direction all the same)
        w = np.stack([-u[..., 1], u[..., 0]], axis=-1)
        mask = ok[:, None, :]
        along, across = np.einsum("ncd,nvd->ncv", u, p), np.einsum("ncd,nvd->ncv", w, p)  # [R, C, V]
        lo_a, hi_a = np.where(mask, along, np.inf).min(-1), np.where(mask, along, -np.inf).max(-1)
        lo_c, hi_c = np.where(mask, across, np.inf).min(-1), np.where(mask, across, -np.inf).max(-1)
        best = np.argmin((hi_a - lo_a) * (hi_c - lo_c), axis=1)
        r = np.arange(len(rows))
        ub, wb = u[r, best], w[r, best]
        mid_a, mid_c = (lo_a[r, best] + hi_a[r, best]) / 2, (lo_c[r, best] + hi_c[r, best]) / 2
        centre[rows] = mid_a[:, None] * ub + mid_c[:, None] * wb
        axes[rows] = np.stack([ub, wb], axis=1)
        extent[rows] = np.stack([hi_a[r, best] - lo_a[r, best], hi_c[r, best] - lo_c[r, best]], axis=1)
    return centre, axes, extent


def _map_points(maps: np.ndarray, xy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(mapped [M, 2], w [M])`` of one point per map (``w``: the projective weight)."""
    x, y = xy[:, 0], xy[:, 1]
    u = maps[:, 0, 0] * x + maps[:, 0, 1] * y + maps[:, 0, 2]
    v = maps[:, 1, 0] * x + maps[:, 1, 1] * y + maps[:, 1, 2]
    w = maps[:, 2, 0] * x + maps[:, 2, 1] * y + maps[:, 2, 2]
    safe = np.where(np.abs(w) > 1e-12, w, 1e-12)
    return np.stack([u / safe, v / safe], axis=1), w


def _jacobian_apply(maps: np.ndarray, at: np.ndarray, vec: np.ndarray) -> np.ndarray:
    """The maps' derivative at points ``at`` ``[M, 2]`` applied to vectors ``vec`` ``[M, 2]``."""
    mapped, w = _map_points(maps, at)
    safe = np.where(np.abs(w) > 1e-12, w, 1e-12)
    dx = (maps[:, 0, 0] - mapped[:, 0] * maps[:, 2, 0]) * vec[:, 0] + (maps[:, 0, 1] - mapped[:, 0] * maps[:, 2, 1]) * vec[:, 1]
    dy = (maps[:, 1, 0] - mapped[:, 1] * maps[:, 2, 0]) * vec[:, 0] + (maps[:, 1, 1] - mapped[:, 1] * maps[:, 2, 1]) * vec[:, 1]
    return np.stack([dx, dy], axis=1) / safe[:, None]


def _write(centre: np.ndarray, axes: np.ndarray, extent: np.ndarray, height: np.ndarray, fmt: str) -> np.ndarray:
    """Rectangles (:func:`min_area_rect`'s) in ``fmt``: of the four ways to name a rectangle's
    sides, the one whose height direction is closest to ``height`` ``[M, 2]`` (the source box's
    height edge carried through its map); angles in ``(-180, 180]``."""
    u, v = axes[:, 0], axes[:, 1]
    candidates = np.stack([u, -u, v, -v], axis=1)  # height directions
    sizes = np.stack([extent[:, ::-1], extent[:, ::-1], extent, extent], axis=1)  # (w, h) for each
    pick = np.argmax(np.einsum("mkd,md->mk", candidates, height), axis=1)
    rows = np.arange(len(u))
    e = candidates[rows, pick]
    d = np.stack([e[:, 1], -e[:, 0]], axis=1)  # torchvision: e = (-d_y, d_x)
    degrees = np.rad2deg(np.arctan2(-d[:, 1], d[:, 0]))
    degrees = np.where(degrees <= -180.0, degrees + 360.0, degrees)
    return from_rect(centre, sizes[rows, pick], degrees, fmt)


def move_rotated_boxes(values: np.ndarray, geometry: Any) -> np.ndarray:
    """Rotated boxes of kept boxes moved to the output canvas (the module docstring's steps).

    Args:
        values: ``[M, 5]`` cxcywhr or ``[M, 8]`` xyxyxyxy, each in its box's source image (its layer).
        geometry: the boxes' :class:`detaug.plan.PointGeometry` (``M`` rows, same order).

    Returns:
        float32 ``[M, 5]`` or ``[M, 8]`` (the format given): the minimum-area rectangle of each
        box's visible part on the output canvas; ``w = h = 0`` at its mapped centre where nothing
        of it is visible.
    """
    values = np.asarray(values, dtype=np.float64)
    fmt = rotated_format(values)
    m = len(values)
    if m == 0:
        return np.zeros(values.shape, dtype=np.float32)
    maps = np.asarray(geometry.maps, dtype=np.float64)
    poly, count = to_corners(values), np.full(m, 4, dtype=np.int64)
    r = geometry.rect
    windows = [np.stack([-np.ones(m), np.zeros(m), -r[:, 0]], axis=1), np.stack([np.ones(m), np.zeros(m), r[:, 2]], axis=1),
               np.stack([np.zeros(m), -np.ones(m), -r[:, 1]], axis=1), np.stack([np.zeros(m), np.ones(m), r[:, 3]], axis=1)]
    windows += [geometry.planes[:, k] for k in range(geometry.planes.shape[1])]
    windows.append(np.stack([-maps[:, 2, 0], -maps[:, 2, 1], maps[:, 2, 2] - 1e-9], axis=1))  # in front: w >= 1e-9
    poly, count = clip_convex(poly, count, np.stack(windows, axis=1))
    poly = transform_points(maps, poly)
    h, w = geometry.canvas_hw[:, 0], geometry.canvas_hw[:, 1]
    zero, one = np.zeros(m), np.ones(m)
    canvas = np.stack([np.stack([-one, zero, zero], 1), np.stack([one, zero, w], 1),
                       np.stack([zero, -one, zero], 1), np.stack([zero, one, h], 1)], axis=1)
    poly, count = clip_convex(poly, count, canvas)
    centre, axes, extent = min_area_rect(poly, count)
    source_centre, source_height = _height_axis(values)
    height = _jacobian_apply(maps, source_centre, source_height)
    empty = (count < 3) | (extent <= _EMPTY).any(axis=1)
    if empty.any():
        centre[empty] = _map_points(maps[empty], source_centre[empty])[0]
        extent[empty] = 0.0
        axes[empty] = np.eye(2)
    out = _write(centre, axes, extent, height, fmt)
    return out.astype(np.float32) + np.float32(0.0)  # no -0.0


def orient_rotated_boxes(values: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """float32 rotated boxes of the stored pixels of an EXIF-rotated image moved to the displayed
    frame by ``matrix`` ``[3, 3]`` (:func:`detaug.formats.images.exif_matrix`), as their boxes
    are (the whole image stays in view: nothing is clipped)."""
    values = np.asarray(values, dtype=np.float64)
    fmt = rotated_format(values)
    if not len(values):
        return values.astype(np.float32)
    maps = np.broadcast_to(np.asarray(matrix, dtype=np.float64), (len(values), 3, 3))
    poly = transform_points(np.ascontiguousarray(maps), to_corners(values))
    centre, axes, extent = min_area_rect(poly, np.full(len(values), 4))
    source_centre, source_height = _height_axis(values)
    return _write(centre, axes, extent, _jacobian_apply(maps, source_centre, source_height), fmt).astype(np.float32)
