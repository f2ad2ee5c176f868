"""Projective geometry: ``RandomPerspective`` (a full 3x3 matrix per sample).

Boxes stay exact under a perspective map: lines stay lines, so the canvas is still four
half-planes in source coordinates (:func:`detaug.boxes.canvas_halfplanes`), a box's visible part
is still a convex polygon, and its output box is the bounding box of that polygon mapped forward
with the perspective division. The pixels of a warp segment that holds a perspective step are
moved by DALI's ``fn.experimental.warp_perspective`` (CPU and GPU in DALI 2.x); segments without
one keep ``fn.warp_affine``.
"""

from __future__ import annotations

import numpy as np

from detaug.boxes import homography
from detaug.plan import PlanState
from detaug.transforms.base import GeometricTransform, Param, register, where_applied
from detaug.transforms.params import FILL

__all__ = ["RandomPerspective"]


@register
class RandomPerspective(GeometricTransform):
    """Random perspective with probability ``p`` (torchvision ``v2.RandomPerspective``).

    Each corner of the canvas moves inwards by a whole number of pixels drawn uniformly from
    ``[0, int(distortion_scale * W / 2)]`` horizontally and ``[0, int(distortion_scale * H / 2)]``
    vertically (torchvision's draws, on pixel centres), and the map taking the corners' pixel
    centres to the moved ones is applied; the canvas keeps its size and the area the image no
    longer covers is painted with ``fill``. The corners' pixel centres stay on the canvas, but the
    image's outer half-pixel rim may land just off it: boxes there are clipped exactly by the
    canvas where the warp is drawn (not clamped; within one warp, a later zoom-out shows that rim
    and keeps it in the boxes). A draw whose corners would not make a convex quadrilateral (only
    possible near ``distortion_scale = 1``) leaves that sample unchanged.

    By construction the whole input canvas lies in front of the map's horizon (its corners go to
    a convex quadrilateral of the same orientation): every point of it, and so every box, is
    mapped forward with a positive perspective denominator.
    """

    schema = (
        Param("distortion_scale", "number", 0.5, "how far corners may move inwards, as a fraction of half the side", low=0, high=1),
        Param("p", "probability", 0.5, "probability of applying the transform to a sample"),
        FILL,
    )
    reveals = True
    #: the step is projective: its warp segment uses DALI's perspective warp
    projective = True

    def out_size(self, in_size: tuple[int, int] | None) -> tuple[int, int] | None:
        return in_size

    def plan(self, state: PlanState) -> tuple[np.ndarray, np.ndarray]:
        rand, hw = state.rand, state.canvas_hw
        h, w = hw[:, 0], hw[:, 1]
        apply = rand.random() < self.p
        bound_w = np.floor(self.distortion_scale * np.floor(w / 2)) + 1  # torchvision: int(d * (W // 2)) + 1
        bound_h = np.floor(self.distortion_scale * np.floor(h / 2)) + 1
        u = rand.random((4, 2))  # per corner (tl, tr, br, bl): x and y inward shifts
        dx = np.floor(u[..., 0] * bound_w[:, None])
        dy = np.floor(u[..., 1] * bound_h[:, None])
        # corner pixel centres (continuous pixels: the centre of pixel i is i + 0.5)
        x0, x1 = np.full_like(w, 0.5), w - 0.5
        y0, y1 = np.full_like(h, 0.5), h - 0.5
        src = np.stack([np.stack([x0, y0], -1), np.stack([x1, y0], -1), np.stack([x1, y1], -1), np.stack([x0, y1], -1)], 1)
        sign = np.array([[1.0, 1.0], [-1.0, 1.0], [-1.0, -1.0], [1.0, -1.0]])  # inwards
        dst = src + sign[None] * np.stack([dx, dy], -1)
        convex = _strictly_convex(dst) & (w > 1) & (h > 1)
        apply &= convex
        safe_dst = np.where(apply[:, None, None], dst, src)  # no singular solve for samples left alone
        step = homography(src, safe_dst)
        return where_applied(apply, step), hw


def _strictly_convex(quad: np.ndarray) -> np.ndarray:
    """bool ``[B]``: the quadrilaterals ``[B, 4, 2]`` (clockwise on screen, y down) turn the same
    way at every corner (strictly convex, orientation kept)."""
    edge = np.roll(quad, -1, axis=1) - quad
    nxt = np.roll(edge, -1, axis=1)
    cross = edge[..., 0] * nxt[..., 1] - edge[..., 1] * nxt[..., 0]
    return (cross > 1e-9).all(axis=1)
