"""Box kernels: small vectorised NumPy functions on boxes and box outlines.

Conventions used throughout detaug:

* One internal box format: absolute ``xyxy`` (``x_min, y_min, x_max, y_max``) in continuous pixel
  coordinates, where pixel column ``i`` spans ``[i, i + 1)``. This is DALI's pixel space too, so a
  single affine matrix moves both pixels (``fn.warp_affine(..., inverse_map=False)``) and boxes.
* Matrices are 3x3 homogeneous forward maps acting on column vectors ``(x, y, 1)``.
* A *half-plane* ``(a, b, c)`` is the set ``a * x + b * y <= c``.

Conversions between box formats are :mod:`detaug.formats.box_formats`'.

Geometry of a chain of transforms (see :mod:`detaug.plan`): every canvas the image passes through
is a rectangle ``[0, W_k] x [0, H_k]`` in its own coordinates, i.e. four half-planes; mapped back
to the *source* image they stay half-planes. A box's visible part after the whole chain is its
source rectangle clipped by all those half-planes (a convex polygon), and its output box is the
bounding box of that polygon mapped forward. This is exact: it is not the hull of the transformed
corners clamped to the image, which is loose wherever a rotated box is cut by the border.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "box_area",
    "box_iou",
    "translation_matrix",
    "scale_matrix",
    "rotation_matrix",
    "shear_matrix",
    "canvas_halfplanes",
    "is_affine",
    "homography",
    "boxes_to_polygons",
    "clip_polygons",
    "polygon_area",
    "transform_points",
    "polygon_bounds",
]


def box_area(boxes_xyxy: np.ndarray, dtype: type | np.dtype | None = None) -> np.ndarray:
    """Areas ``[...]`` ``(x2 - x1) * (y2 - y1)`` of ``[..., 4]`` xyxy boxes, in pixels (0 for
    inverted boxes), in the boxes' dtype; ``dtype``: the boxes cast to it first (``np.float32``
    gives the float32 areas of the ``area`` field). The one area rule of detaug."""
    b = np.asarray(boxes_xyxy, dtype=dtype)
    return np.clip(b[..., 2] - b[..., 0], 0, None) * np.clip(b[..., 3] - b[..., 1], 0, None)


def box_iou(a_xyxy: np.ndarray, b_xyxy: np.ndarray) -> np.ndarray:
    """Pairwise IoU of ``a [..., 4]`` and ``b [..., 4]`` broadcast against each other."""
    a = np.asarray(a_xyxy, dtype=np.float64)
    b = np.asarray(b_xyxy, dtype=np.float64)
    iw = np.minimum(a[..., 2], b[..., 2]) - np.maximum(a[..., 0], b[..., 0])
    ih = np.minimum(a[..., 3], b[..., 3]) - np.maximum(a[..., 1], b[..., 1])
    inter = np.clip(iw, 0, None) * np.clip(ih, 0, None)
    union = box_area(a) + box_area(b) - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


# -- matrices ------------------------------------------------------------------------------------
# Each builder takes per-sample parameters of shape [B] and returns float64 [B, 3, 3].


def _eye(n: int) -> np.ndarray:
    return np.broadcast_to(np.eye(3), (n, 3, 3)).copy()


def _with_pair(at: tuple[tuple[int, int], tuple[int, int]], a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``[B, 3, 3]`` identity matrices with ``a`` and ``b`` (per-sample parameters, float64,
    broadcast against each other to ``B`` values) at the entries ``at``, ``((row, col), (row, col))``."""
    a, b = np.broadcast_arrays(np.asarray(a, np.float64), np.asarray(b, np.float64))
    m = _eye(a.size)
    (ra, ca), (rb, cb) = at
    m[:, ra, ca] = a.ravel()
    m[:, rb, cb] = b.ravel()
    return m


def translation_matrix(tx: np.ndarray, ty: np.ndarray) -> np.ndarray:
    """``[B, 3, 3]`` maps ``(x, y)`` to ``(x + tx, y + ty)``."""
    return _with_pair(((0, 2), (1, 2)), tx, ty)


def scale_matrix(sx: np.ndarray, sy: np.ndarray) -> np.ndarray:
    """``[B, 3, 3]`` maps ``(x, y)`` to ``(sx * x, sy * y)`` (negative factors mirror)."""
    return _with_pair(((0, 0), (1, 1)), sx, sy)


def rotation_matrix(degrees: np.ndarray) -> np.ndarray:
    """``[B, 3, 3]`` rotation about the origin, counter-clockwise *as seen on screen* (y points
    down) for positive angles, as in torchvision."""
    t = np.deg2rad(np.asarray(degrees, np.float64)).ravel()
    c, s = np.cos(t), np.sin(t)
    m = _eye(t.size)
    m[:, 0, 0], m[:, 0, 1] = c, s
    m[:, 1, 0], m[:, 1, 1] = -s, c
    return m


def shear_matrix(shear_x_degrees: np.ndarray, shear_y_degrees: np.ndarray) -> np.ndarray:
    """``[B, 3, 3]`` shear: ``x += tan(sx) * y`` then ``y += tan(sy) * x``."""
    sx, sy = np.broadcast_arrays(
        np.asarray(shear_x_degrees, np.float64), np.asarray(shear_y_degrees, np.float64)
    )
    n = sx.size
    mx = _eye(n)
    mx[:, 0, 1] = np.tan(np.deg2rad(sx.ravel()))
    my = _eye(n)
    my[:, 1, 0] = np.tan(np.deg2rad(sy.ravel()))
    return my @ mx


# -- outlines and clipping -----------------------------------------------------------------------


def canvas_halfplanes(to_canvas: np.ndarray, canvas_hw: np.ndarray) -> np.ndarray:
    """Half-planes ``[B, 4, 3]`` (in source coordinates) of the canvases ``[0, W] x [0, H]``.

    ``to_canvas`` ``[B, 3, 3]`` maps source coordinates to canvas coordinates (affine, or
    projective: ``(u, v, w) = M (x, y, 1)``, the canvas point is ``(u / w, v / w)``);
    ``canvas_hw`` ``[B, 2]`` holds each canvas' ``(height, width)``. A source point ``p`` lies on
    canvas ``k`` iff ``0 <= u <= W w`` and ``0 <= v <= H w``: four linear constraints, which also
    exclude every point behind the horizon (``w < 0``: ``0 <= u <= W w`` has no solution there),
    so a polygon clipped by them can be mapped forward with the perspective division. For an
    affine ``M`` (``w = 1``) these are the usual ``0 <= u <= W``, ``0 <= v <= H``.
    """
    rx, ry, rz = to_canvas[:, 0, :], to_canvas[:, 1, :], to_canvas[:, 2, :]  # rows (a, b, t): u = a x + b y + t
    h, w = canvas_hw[:, 0], canvas_hw[:, 1]
    if not (rz[:, 0].any() or rz[:, 1].any() or (rz[:, 2] != 1).any()):  # affine: as few operations as ever
        hi_x = np.stack([rx[:, 0], rx[:, 1], w - rx[:, 2]], axis=-1)
        hi_y = np.stack([ry[:, 0], ry[:, 1], h - ry[:, 2]], axis=-1)
    else:  # u - W w <= 0
        hi_x = np.stack([rx[:, 0] - w * rz[:, 0], rx[:, 1] - w * rz[:, 1], w * rz[:, 2] - rx[:, 2]], axis=-1)
        hi_y = np.stack([ry[:, 0] - h * rz[:, 0], ry[:, 1] - h * rz[:, 1], h * rz[:, 2] - ry[:, 2]], axis=-1)
    planes = np.stack(
        [
            np.stack([-rx[:, 0], -rx[:, 1], rx[:, 2]], axis=-1),  # u >= 0
            hi_x,  # u <= W (w)
            np.stack([-ry[:, 0], -ry[:, 1], ry[:, 2]], axis=-1),  # v >= 0
            hi_y,  # v <= H (w)
        ],
        axis=1,
    )
    return planes


def is_affine(matrix: np.ndarray) -> np.ndarray:
    """bool ``[...]``: the ``[..., 3, 3]`` matrices whose last row is exactly ``(0, 0, 1)``."""
    m = np.asarray(matrix)
    return (m[..., 2, 0] == 0) & (m[..., 2, 1] == 0) & (m[..., 2, 2] == 1)


def homography(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """``[B, 3, 3]`` projective maps taking the 4 points ``src`` ``[B, 4, 2]`` to ``dst``
    ``[B, 4, 2]`` (normalised to ``M[2, 2] = 1``; the direct linear transform, exact for 4 points
    no three of which are collinear)."""
    src = np.asarray(src, dtype=np.float64)
    dst = np.asarray(dst, dtype=np.float64)
    n = len(src)
    x, y = src[..., 0], src[..., 1]
    u, v = dst[..., 0], dst[..., 1]
    zeros, ones = np.zeros_like(x), np.ones_like(x)
    rows_u = np.stack([x, y, ones, zeros, zeros, zeros, -u * x, -u * y], axis=-1)  # [B, 4, 8]
    rows_v = np.stack([zeros, zeros, zeros, x, y, ones, -v * x, -v * y], axis=-1)
    a = np.concatenate([rows_u, rows_v], axis=1)  # [B, 8, 8]
    b = np.concatenate([u, v], axis=1)  # [B, 8]
    h = np.linalg.solve(a, b[..., None])[..., 0] if n else np.zeros((0, 8))
    return np.concatenate([h, np.ones((n, 1))], axis=1).reshape(n, 3, 3)


def boxes_to_polygons(boxes_xyxy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Outlines of ``[N, 4]`` boxes as ``([N, 4, 2] vertices, [N] vertex counts)``."""
    b = np.asarray(boxes_xyxy, dtype=np.float64).reshape(-1, 4)
    x0, y0, x1, y1 = b[:, 0], b[:, 1], b[:, 2], b[:, 3]
    poly = np.stack(
        [np.stack([x0, y0], -1), np.stack([x1, y0], -1), np.stack([x1, y1], -1), np.stack([x0, y1], -1)],
        axis=1,
    )
    return poly, np.full(len(b), 4, dtype=np.int64)


def clip_polygons(
    poly: np.ndarray, count: np.ndarray, planes: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Clip convex polygons by one half-plane each (Sutherland-Hodgman, vectorised).

    Args:
        poly: ``[N, V, 2]`` vertices; only the first ``count[n]`` of row ``n`` are used.
        count: ``[N]`` vertex counts (0 = empty polygon).
        planes: ``[N, 3]`` half-plane ``(a, b, c)`` for each polygon: keep ``a x + b y <= c``.

    Returns:
        ``([N, V', 2], [N])`` the clipped polygons and their vertex counts (``V' <= V + 1``).
        Rows entirely inside their half-plane are returned unchanged (and cost one test).
    """
    n, v = poly.shape[:2]
    if n == 0:
        return poly, count
    valid = np.arange(v)[None, :] < count[:, None]
    d = poly[:, :, 0] * planes[:, 0:1] + poly[:, :, 1] * planes[:, 1:2] - planes[:, 2:3]  # <= 0 inside
    rows = np.flatnonzero((valid & (d > 0)).any(axis=1))
    if len(rows) == 0:
        return poly, count
    sub, sub_count = _clip_rows(poly[rows], count[rows], valid[rows], d[rows])
    width = max(v, sub.shape[1])
    out = np.zeros((n, width, 2))
    out[:, :v] = poly
    out[rows] = 0.0
    out[rows, : sub.shape[1]] = sub
    new_count = count.copy()
    new_count[rows] = sub_count
    return out, new_count


def _clip_rows(
    poly: np.ndarray, count: np.ndarray, valid: np.ndarray, dp: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Sutherland-Hodgman step for rows with signed distances ``dp`` (``<= 0`` inside)."""
    n, v = poly.shape[:2]
    idx = np.arange(v)
    nxt = np.where(idx[None, :] + 1 < count[:, None], idx[None, :] + 1, 0)
    q = np.take_along_axis(poly, nxt[:, :, None], axis=1)
    dq = np.take_along_axis(dp, nxt, axis=1)
    p_in, q_in = dp <= 0, dq <= 0
    denom = np.where(dp == dq, 1.0, dp - dq)
    cross = poly + (dp / denom)[:, :, None] * (q - poly)
    # Output slots: for edge i, slot 2i holds p_i (if inside), slot 2i+1 the crossing (if any).
    cand = np.stack([poly, cross], axis=2).reshape(n, 2 * v, 2)
    keep = np.stack([valid & p_in, valid & (p_in != q_in)], axis=2).reshape(n, 2 * v)
    order = np.argsort(~keep, axis=1, kind="stable")
    out = np.take_along_axis(cand, order[:, :, None], axis=1)
    new_count = keep.sum(axis=1)
    return out[:, : max(int(new_count.max()), 1)], new_count


def polygon_area(poly: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Shoelace areas ``[N]`` of convex polygons ``[N, V, 2]`` with ``count`` vertices each."""
    n, v = poly.shape[:2]
    if n == 0:
        return np.zeros(0)
    idx = np.arange(v)
    valid = idx[None, :] < count[:, None]
    nxt = np.where(idx[None, :] + 1 < count[:, None], idx[None, :] + 1, 0)
    q = np.take_along_axis(poly, nxt[:, :, None], axis=1)
    cross = poly[:, :, 0] * q[:, :, 1] - poly[:, :, 1] * q[:, :, 0]
    return 0.5 * np.abs(np.where(valid, cross, 0.0).sum(axis=1))


def transform_points(matrix: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Apply ``[N, 3, 3]`` matrices to ``[N, V, 2]`` points: affine ones directly, projective ones
    with the perspective division (callers keep the points in front of the horizon, ``w > 0``;
    see :func:`canvas_halfplanes`)."""
    x, y = points[..., 0], points[..., 1]
    m = matrix[:, :, :, None]  # [N, 3, 3, 1]: broadcast over vertices, no tiny matmuls
    u = m[:, 0, 0] * x + m[:, 0, 1] * y + m[:, 0, 2]
    v = m[:, 1, 0] * x + m[:, 1, 1] * y + m[:, 1, 2]
    if len(matrix) and not is_affine(matrix).all():
        w = m[:, 2, 0] * x + m[:, 2, 1] * y + m[:, 2, 2]
        w = np.where(w > 0, w, 1.0)  # only padding vertices (beyond a polygon's count) can be behind
        u, v = u / w, v / w
    return np.stack([u, v], axis=-1)


def polygon_bounds(poly: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Bounding boxes ``[N, 4]`` xyxy of polygons (zeros for empty ones)."""
    n, v = poly.shape[:2]
    if n == 0:
        return np.zeros((0, 4))
    valid = (np.arange(v)[None, :] < count[:, None])[:, :, None]
    lo = np.where(valid, poly, np.inf).min(axis=1)
    hi = np.where(valid, poly, -np.inf).max(axis=1)
    out = np.concatenate([lo, hi], axis=1)
    return np.where(count[:, None] > 0, out, 0.0)
