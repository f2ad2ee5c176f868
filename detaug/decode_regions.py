"""Where to decode: the whole-pixel regions of source images that a plan's first warps read.

DALI decodes only part of an image (``fn.decoders.image_slice``); the batch planner
(:mod:`detaug.batch_plan`) asks these functions which part: the region an affine or projective
first warp reads, the region of a tile or partner placed by an axis-aligned map of which a
rectangle is shown, and the window of a ``Mosaic`` canvas that the first warp reads. Regions are
float64 ``[B, 4]`` ``(x, y, w, h)`` in source pixels, grown by one pixel for bilinear taps and
clipped to their image; sizes are ``(height, width)``.
"""

from __future__ import annotations

import numpy as np

from detaug.boxes import boxes_to_polygons, canvas_halfplanes, clip_polygons, polygon_bounds, translation_matrix

__all__ = ["aligned_roi", "decode_roi", "mosaic_window", "read_bounds", "region_roi", "tile_columns", "whole_image",
           "whole_pixels"]


def decode_roi(hw: np.ndarray, first: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
    """``[B, 4]`` (x, y, w, h) whole-pixel region of the sources ``hw`` ``[B, 2]`` that an
    affine first warp ``first`` (``(matrix [B, 3, 3], canvas_hw [B, 2])``) reads; the whole
    image without one."""
    n = len(hw)
    full = whole_image(hw)
    if first is None:
        return full
    m, canvas = first
    inv = np.linalg.inv(m)
    h, w = canvas[:, 0], canvas[:, 1]
    corners = np.stack([np.zeros(n), np.zeros(n), w, np.zeros(n), w, h, np.zeros(n), h], -1).reshape(n, 4, 2)
    src = (inv[:, None, :2, :2] @ corners[..., None])[..., 0] + inv[:, None, :2, 2]
    lo = np.clip(np.floor(src.min(axis=1)) - 1, 0, hw[:, ::-1])  # one pixel for bilinear taps
    hi = np.clip(np.ceil(src.max(axis=1)) + 1, 0, hw[:, ::-1])
    empty = (hi <= lo).any(axis=1)
    lo[empty], hi[empty] = 0, np.minimum(hw[empty, ::-1], 1)
    return np.concatenate([lo, hi - lo], axis=1)


def whole_pixels(lo: np.ndarray, hi: np.ndarray, hw: np.ndarray) -> np.ndarray:
    """``[B, 4]`` (x, y, w, h): the float region ``lo``-``hi`` ``[B, 2]`` (x, y) grown to whole
    pixels plus one for bilinear taps, clipped to images ``hw`` ``[B, 2]``; a region that misses
    its image becomes its first pixel."""
    size = hw[:, ::-1]
    lo = np.clip(np.floor(lo) - 1, 0, size)
    hi = np.clip(np.ceil(hi) + 1, 0, size)
    empty = (hi <= lo).any(axis=1)
    lo[empty], hi[empty] = 0, np.minimum(size[empty], 1)
    return np.concatenate([lo, hi - lo], axis=1)


def read_bounds(in_hw: np.ndarray, m: np.ndarray, out_hw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The part of inputs ``[0, W] x [0, H]`` (``in_hw`` ``[B, 2]``) that maps (``m`` ``[B, 3, 3]``,
    affine or projective) into the canvases ``out_hw``: the input rectangle clipped by the
    canvas' half-planes. Returns ``(lo [B, 2], hi [B, 2], empty [B])`` of its bounding box."""
    n = len(in_hw)
    poly, count = boxes_to_polygons(np.stack([np.zeros(n), np.zeros(n), in_hw[:, 1], in_hw[:, 0]], 1))
    planes = canvas_halfplanes(m, out_hw)
    for k in range(4):
        poly, count = clip_polygons(poly, count, planes[:, k])
    bounds = polygon_bounds(poly, count)
    return bounds[:, :2], bounds[:, 2:], count == 0


def region_roi(hw: np.ndarray, m: np.ndarray, canvas: np.ndarray) -> np.ndarray:
    """``[B, 4]`` decode ROI for a first warp ``m`` that may be projective (its canvas corners
    may have no preimage in front of the horizon, so the corners' preimages cannot bound it)."""
    lo, hi, empty = read_bounds(hw, m, canvas)
    lo[empty], hi[empty] = 0, 0
    return whole_pixels(lo, hi, hw)


def aligned_roi(hw: np.ndarray, m: np.ndarray, rects: np.ndarray) -> np.ndarray:
    """``[B, 4]`` decode ROI of images ``hw`` placed by axis-aligned maps ``m`` ``[B, 3, 3]`` of
    which only canvas rectangles ``rects`` ``[B, 4]`` (xyxy) are shown."""
    sx, sy, tx, ty = m[:, 0, 0], m[:, 1, 1], m[:, 0, 2], m[:, 1, 2]
    xa, xb = (rects[:, 0] - tx) / sx, (rects[:, 2] - tx) / sx
    ya, yb = (rects[:, 1] - ty) / sy, (rects[:, 3] - ty) / sy
    lo = np.stack([np.minimum(xa, xb), np.minimum(ya, yb)], 1)
    hi = np.stack([np.maximum(xa, xb), np.maximum(ya, yb)], 1)
    return whole_pixels(lo, hi, hw)


def mosaic_window(canvas_hw: np.ndarray, centre: np.ndarray, first: tuple[np.ndarray, np.ndarray] | None,
                  far: np.ndarray | None = None) -> np.ndarray:
    """``[B, 4]`` xyxy whole-pixel part of the mosaic canvases that is composed: what the first
    warp reads (the whole canvas when none follows), grown to hold one pixel of every quadrant
    around the centre ``[B, 2]`` (so that no tile is empty); with ``far`` ``[B, 2]`` (a 3x3
    mosaic: ``centre`` and ``far`` are the top-left and bottom-right corners of its centre
    cell), one pixel of every cell: from ``centre - 1`` to ``far + 1``."""
    n = len(canvas_hw)
    size = canvas_hw[:, ::-1]
    if first is None:
        lo, hi = np.zeros((n, 2)), size.copy()
    else:
        lo, hi, empty = read_bounds(canvas_hw, first[0], first[1])
        lo = np.clip(np.floor(lo) - 1, 0, size)
        hi = np.clip(np.ceil(hi) + 1, 0, size)
        lo[empty], hi[empty] = centre[empty], centre[empty]
    lo = np.minimum(lo, centre - 1)
    hi = np.maximum(hi, (centre if far is None else far) + 1)
    return np.concatenate([lo, hi], axis=1)


def whole_image(hw: np.ndarray) -> np.ndarray:
    """``[B, 4]`` (x, y, w, h): the whole of images ``hw`` ``[B, 2]`` as a decode region."""
    n = len(hw)
    return np.stack([np.zeros(n), np.zeros(n), hw[:, 1], hw[:, 0]], -1)


def tile_columns(hw: np.ndarray, m: np.ndarray, quadrant: np.ndarray, window: np.ndarray,
                 whole: bool = False) -> list[np.ndarray]:
    """Parameter columns of one Mosaic tile: the decode ROI ``[B, 4]`` of its image (``hw``; the
    whole image when ``whole``: a batch's image shared by ``pool="batch"``), the matrix ``[B, 6]``
    from that ROI to its quadrant's part of the window, and that part's size ``[B, 2]`` (h, w; at
    least one pixel each)."""
    n = len(hw)
    rect = np.concatenate([np.maximum(quadrant[:, :2], window[:, :2]), np.minimum(quadrant[:, 2:], window[:, 2:])], 1)
    roi = whole_image(hw) if whole else aligned_roi(hw, m, rect)
    local = translation_matrix(-rect[:, 0], -rect[:, 1]) @ m @ translation_matrix(roi[:, 0], roi[:, 1])
    size = np.stack([rect[:, 3] - rect[:, 1], rect[:, 2] - rect[:, 0]], 1)
    return [roi, local[:, :2, :].reshape(n, 6), size]
