"""Instance masks: per-object masks moved by the same planned geometry as their image and boxes.

A box may carry a mask: the per-box field :data:`MASKS` (``"masks"``), uint8 ``[N, H, W]`` per
image, ``1`` on the object's pixels, ``0`` elsewhere, ``H, W`` the image's size (as
torchvision's Mask R-CNN takes them). :class:`~detaug.sources.CocoSource` reads COCO polygons
and RLE with ``masks=True`` (:class:`CocoMasks`, decoded with pycocotools when an image is read).

**How they move (the route chosen).** Each kept box's mask is resampled on the host, in the
planner, by the very map its outline and its keypoints are mapped with
(:class:`detaug.plan.PointGeometry`: the composition of every warp segment of the recipe, from
the box's own source image, the sample's or a ``Mosaic`` tile's or the ``MixUp`` partner's, to
the output canvas), nearest neighbour: output pixel ``(u, v)`` is ``1`` where the centre
``(u + 0.5, v + 0.5)`` maps back to a source point ``(x, y)`` whose pixel
``(floor(x), floor(y))`` is on the mask and which satisfies every clip constraint of the box's
layer (the crops, the tile's quadrant: the same closed rectangle and half-planes that clip the
box and decide a keypoint's visibility) and lies in front of a projective map's horizon
(:func:`move_masks`). Only the output region the mask's source bounds map to is evaluated.

So the masks are the same on the CPU and the GPU for one seed (they are planned, as the boxes
are), need no second DALI output, and follow crops, pads, Mosaic tiles and the MixUp partner
without a mask graph in the pipeline. The image's pixels are resampled once per warp segment,
bilinear; the mask once, by the composed map, nearest: they agree to the half pixel on an
object's border. The cost is host time proportional to the objects' output area.

Rows follow their boxes (a removed box drops its mask row); a mask that leaves the canvas
becomes all zeros (its box is removed by the usual rules).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from detaug.arrays import numeric_array

__all__ = ["MASKS", "CocoMasks", "PackedMasks", "check_masks", "join_masks", "mask_rows", "masks_to_boxes",
           "move_masks", "orient_masks", "pack_masks", "paste_over", "warp_mask"]

#: The per-box field name of instance masks (sources, targets, eager calls).
MASKS = "masks"


def check_masks(values: Any, count: int | None, hw: tuple[int, int] | None = None) -> tuple[np.ndarray | None, str]:
    """A sample's masks as uint8 ``[count, H, W]`` of 0/1, or ``(None, why)``: an array of
    shape ``[count, H, W]`` (one row per box), bool or integers 0/1 only, ``(H, W)`` the
    image's ``hw`` where it is known. ``count`` ``None``: the boxes are malformed (rows not
    checked)."""
    arr, why = numeric_array(values, "masks", "biuf")
    if arr is None:
        return None, why
    if arr.ndim != 3:
        return None, f"masks of shape {list(arr.shape)} are not [N, H, W]"
    if count is not None and arr.shape[0] != count:
        return None, f"masks have {arr.shape[0]} rows, expected one per box ({count})"
    if hw is not None and tuple(arr.shape[1:]) != tuple(hw):
        return None, f"masks of size (h, w) {tuple(arr.shape[1:])} are not the image's size {tuple(hw)}"
    if arr.dtype.kind != "b" and arr.size and (arr.max() > 1 or arr.min() < 0 or
                                               (arr.dtype.kind == "f" and (arr != np.round(arr)).any())):
        bad = np.unique(arr[(arr != 0) & (arr != 1)])[:3]
        return None, f"mask values {bad.tolist()} are not 0 or 1"
    return arr.astype(np.uint8), ""


@dataclass
class CocoMasks:
    """A COCO image's masks, not yet decoded: each kept annotation's ``segmentation`` (polygons
    ``[[x1, y1, x2, y2, ...], ...]``, uncompressed RLE ``{"counts": [...], "size": [h, w]}`` or
    compressed RLE ``{"counts": "...", "size": [h, w]}``), checked for their form when read;
    decoded with pycocotools for the image's size (:meth:`decode`)."""

    segmentations: list[Any]

    def __len__(self) -> int:
        return len(self.segmentations)

    def __getitem__(self, rows: Any) -> CocoMasks:
        index = np.arange(len(self.segmentations))[rows]
        return CocoMasks([self.segmentations[int(j)] for j in np.atleast_1d(index)])

    def decode(self, hw: tuple[int, int]) -> tuple[np.ndarray | None, str]:
        """uint8 ``[N, H, W]`` for an image of size ``hw``, or ``(None, why)`` naming the row
        (an RLE of another size, a malformed segmentation)."""
        from pycocotools import mask as coco_mask

        h, w = int(hw[0]), int(hw[1])
        out = np.zeros((len(self.segmentations), h, w), dtype=np.uint8)
        for k, seg in enumerate(self.segmentations):
            why = segmentation_problem(seg)
            if why:
                return None, f"box {k}: {why}"
            if isinstance(seg, dict):
                size = [int(x) for x in seg["size"]]
                if size != [h, w]:
                    return None, f"box {k}: an RLE of size {size}, the image is {[h, w]}"
                rle = coco_mask.frPyObjects(seg, h, w) if isinstance(seg["counts"], list) else seg
                if isinstance(rle.get("counts"), str):
                    rle = {"size": rle["size"], "counts": rle["counts"].encode("ascii")}
                out[k] = coco_mask.decode(rle)
            elif seg:
                rles = coco_mask.frPyObjects([list(map(float, p)) for p in seg], h, w)
                out[k] = coco_mask.decode(coco_mask.merge(rles))
        return out, ""


def segmentation_problem(seg: Any) -> str:
    """Why a COCO ``segmentation`` value is malformed (``""``: it is not): polygons must be
    lists of an even number (at least 6) of finite numbers; an RLE a dict with ``counts`` (a
    list of integers or a string) and ``size`` ``[h, w]``."""
    if isinstance(seg, dict):
        size, counts = seg.get("size"), seg.get("counts")
        if not (isinstance(size, (list, tuple)) and len(size) == 2 and all(isinstance(x, int) and x >= 0 for x in size)):
            return f"RLE size {size!r:.40} is not [h, w]"
        if not (isinstance(counts, str) or (isinstance(counts, list) and all(isinstance(x, int) for x in counts))):
            return f"RLE counts {counts!r:.40} are not a list of integers or a string"
        return ""
    if not isinstance(seg, list):
        return f"segmentation {seg!r:.60} is not polygons or an RLE"
    for poly in seg:
        if not isinstance(poly, list) or len(poly) < 6 or len(poly) % 2:
            return f"polygon {poly!r:.60} is not a flat list of at least 3 (x, y) points"
        if not all(isinstance(x, (int, float)) and np.isfinite(x) for x in poly):
            return f"polygon {poly!r:.60} has a coordinate that is not a finite number"
    return ""


def mask_rows(value: Any, hw: tuple[int, int], matrix: np.ndarray | None = None) -> tuple[np.ndarray | None, str]:
    """A sample's masks as the planner carries them: an object array ``[N]`` of uint8 ``[H, W]``
    masks (so that rows of images of different sizes, a sample's and its partners', join), in
    the decoded image's frame ``hw``; or ``(None, why)``. ``value``: uint8 ``[N, h, w]`` or
    :class:`CocoMasks`; ``matrix``: the EXIF map ``[3, 3]`` the boxes were moved by to the
    decoded frame (``None``: none), by which the masks are moved too (:func:`orient_masks`)."""
    given_hw = tuple(hw) if matrix is None else _stored_hw(hw, matrix)
    if not isinstance(value, CocoMasks) and np.size(value) == 0:  # no boxes (a sample may leave the field out)
        return np.empty(0, dtype=object), ""
    if isinstance(value, CocoMasks):
        dense, why = value.decode(given_hw)
    else:
        dense, why = check_masks(value, None, given_hw)
    if dense is None:
        return None, why
    if matrix is not None:
        dense = orient_masks(dense, matrix, hw)
    out = np.empty(len(dense), dtype=object)
    for k in range(len(dense)):
        out[k] = dense[k]
    return out, ""


def _stored_hw(hw: tuple[int, int], matrix: np.ndarray) -> tuple[int, int]:
    """The stored ``(h, w)`` of an image displayed as ``hw`` by the EXIF map ``matrix``."""
    return (int(hw[1]), int(hw[0])) if np.asarray(matrix)[0, 0] == 0 else (int(hw[0]), int(hw[1]))


def orient_masks(masks: np.ndarray, matrix: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
    """uint8 ``[N, H, W]`` masks of the stored pixels of an EXIF-rotated image moved to the
    displayed frame ``hw`` by ``matrix`` ``[3, 3]`` (:func:`detaug.formats.images.exif_matrix`)."""
    out = np.zeros((len(masks), int(hw[0]), int(hw[1])), dtype=np.uint8)
    for k, mask in enumerate(masks):
        out[k] = warp_mask(mask, np.asarray(matrix, dtype=np.float64), hw)
    return out


def warp_mask(mask: np.ndarray, matrix: np.ndarray, hw: tuple[int, int], rect: np.ndarray | None = None,
              planes: np.ndarray | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """One mask ``[h, w]`` on a canvas ``hw`` by the forward map ``matrix`` ``[3, 3]`` (continuous
    pixel coordinates; affine or projective), nearest neighbour: uint8 ``[H, W]``. Pixels whose
    source point breaks a constraint (``rect`` xyxy, ``planes`` ``[P, 3]`` ``a x + b y <= c``,
    in source coordinates) or lies behind the horizon are 0 (see the module docstring). ``out``:
    a zeroed uint8 ``[H, W]`` array to write into (returned), else a new one."""
    height, width = int(hw[0]), int(hw[1])
    if out is None:
        out = np.zeros((height, width), dtype=np.uint8)
    cols, rows = np.flatnonzero(mask.any(axis=0)), np.flatnonzero(mask.any(axis=1))
    if not len(cols):
        return out
    m = np.asarray(matrix, dtype=np.float64)
    x0, x1, y0, y1 = cols[0], cols[-1] + 1.0, rows[0], rows[-1] + 1.0
    corners = np.array([[x0, y0, 1], [x1, y0, 1], [x0, y1, 1], [x1, y1, 1]], dtype=np.float64) @ m.T
    u0, v0, u1, v1 = 0, 0, width, height
    if (corners[:, 2] > 0).all():  # in front of any horizon: the region its bounds map to
        uv = corners[:, :2] / corners[:, 2:]
        u0, v0 = max(0, int(np.floor(uv[:, 0].min())) - 1), max(0, int(np.floor(uv[:, 1].min())) - 1)
        u1, v1 = min(width, int(np.ceil(uv[:, 0].max())) + 1), min(height, int(np.ceil(uv[:, 1].max())) + 1)
    if u1 <= u0 or v1 <= v0:
        return out
    inv = np.linalg.inv(m)
    u, v = np.arange(u0, u1) + 0.5, np.arange(v0, v1) + 0.5
    sample = _sample_affine if _is_affine(m, inv) else _sample_projective
    ok, ix, iy = sample(inv, m, u, v, mask.shape, rect, planes)
    out[v0:v1, u0:u1][ok] = mask[iy, ix] != 0
    return out


def _is_affine(m: np.ndarray, inv: np.ndarray) -> bool:
    """Whether the map and its inverse have the last row ``(0, 0, 1)`` exactly: then the
    projective sampling's division and horizon test change nothing (:func:`_sample_affine`)."""
    return bool(m[2, 0] == 0 and m[2, 1] == 0 and m[2, 2] > 0 and inv[2, 0] == 0 and inv[2, 1] == 0
                and inv[2, 2] == 1 and np.isfinite(inv).all())


def _sample_projective(inv: np.ndarray, m: np.ndarray, u: np.ndarray, v: np.ndarray, shape: tuple[int, ...],
                       rect: np.ndarray | None, planes: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The source pixel of each output pixel centre ``(u, v)`` (grid of ``v`` rows by ``u``
    columns) under the inverse map ``inv``: ``ok`` bool ``[V, U]`` where it exists (in front of the
    horizon, inside ``rect`` and ``planes``, inside the mask of ``shape``), and the column and row
    indices ``ix``, ``iy`` of the ``ok`` ones, in ``ok``'s order."""
    u, v = u[None, :], v[:, None]
    sx = inv[0, 0] * u + inv[0, 1] * v + inv[0, 2]
    sy = inv[1, 0] * u + inv[1, 1] * v + inv[1, 2]
    sw = inv[2, 0] * u + inv[2, 1] * v + inv[2, 2]
    with np.errstate(divide="ignore", invalid="ignore"):
        x, y = sx / sw, sy / sw
        ok = np.isfinite(x) & np.isfinite(y) & (m[2, 0] * x + m[2, 1] * y + m[2, 2] > 0)
    x, y = np.where(ok, x, -1.0), np.where(ok, y, -1.0)
    if rect is not None:
        ok &= (x >= rect[0]) & (x <= rect[2]) & (y >= rect[1]) & (y <= rect[3])
    for a, b, c in (planes if planes is not None else ()):
        if np.isfinite(c):
            ok &= a * x + b * y <= c
    ix, iy = np.floor(x).astype(np.int64), np.floor(y).astype(np.int64)
    ok &= (ix >= 0) & (ix < shape[1]) & (iy >= 0) & (iy < shape[0])
    return ok, ix[ok], iy[ok]


def _sample_affine(inv: np.ndarray, m: np.ndarray, u: np.ndarray, v: np.ndarray, shape: tuple[int, ...],
                   rect: np.ndarray | None, planes: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_sample_projective` for an affine ``inv`` (last row ``(0, 0, 1)``): the same ``ok``
    and indices (source points are finite, in front of no horizon, divided by 1), with fewer
    passes over the grid: the mask's bounds are tested on ``x``, ``y`` (``0 <= floor(x) < w``
    is ``0 <= x < w``) and only the ``ok`` points are floored."""
    u, v = u[None, :], v[:, None]
    x = inv[0, 0] * u + inv[0, 1] * v + inv[0, 2]
    y = inv[1, 0] * u + inv[1, 1] * v + inv[1, 2]
    ok = (x >= 0) & (x < shape[1]) & (y >= 0) & (y < shape[0])
    if rect is not None:
        ok &= (x >= rect[0]) & (x <= rect[2]) & (y >= rect[1]) & (y <= rect[3])
    for a, b, c in (planes if planes is not None else ()):
        if np.isfinite(c):
            ok &= a * x + b * y <= c
    return ok, np.floor(x[ok]).astype(np.int64), np.floor(y[ok]).astype(np.int64)


def move_masks(rows: Sequence[np.ndarray], geometry: Any, out_hw: tuple[int, int]) -> np.ndarray:
    """Masks of kept boxes moved to the output canvas.

    Args:
        rows: ``[M]`` masks (uint8 ``[h, w]`` each, its box's source image's size), in the order
            of the boxes.
        geometry: the boxes' :class:`detaug.plan.PointGeometry` (``M`` rows, same order).
        out_hw: the sample's output ``(height, width)``.

    Returns:
        uint8 ``[M, H, W]`` (see the module docstring).
    """
    out = np.zeros((len(rows), int(out_hw[0]), int(out_hw[1])), dtype=np.uint8)
    for k, mask in enumerate(rows):
        warp_mask(mask, geometry.maps[k], out_hw, geometry.rect[k], geometry.planes[k], out=out[k])
    return out


def join_masks(per_sample: Sequence[np.ndarray]) -> np.ndarray:
    """uint8 ``[N, H, W]``: the samples' masks (``[M_i, h_i, w_i]``) in order, each padded with
    zeros at the bottom and right to the batch's largest ``(H, W)`` where the sizes differ (as
    torchvision's detection models pad a batch of images); the PyTorch loader's per-image targets
    are cut back to their image's size."""
    arrays = [np.asarray(m, dtype=np.uint8) for m in per_sample]
    if len({a.shape[1:] for a in arrays}) <= 1:
        return np.concatenate(arrays)
    h, w = max(a.shape[1] for a in arrays), max(a.shape[2] for a in arrays)
    out = np.zeros((sum(len(a) for a in arrays), h, w), dtype=np.uint8)
    start = 0
    for a in arrays:
        out[start:start + len(a), :a.shape[1], :a.shape[2]] = a
        start += len(a)
    return out


@dataclass
class PackedMasks:
    """uint8 ``[N, H, W]`` 0/1 masks packed for the trip from a planning worker (:func:`pack_masks`):
    each row cut to the rectangle around its pixels, eight pixels a byte. A batch of 64 images at
    512x512 with 436 masks: 109 MB as arrays, under 1 MB packed (unpickling the arrays took the
    loader's process 40-70 ms a batch on a 2-core machine, in the one process that takes every
    worker's plans).

    Attributes:
        shape: ``(N, H, W)``.
        rects: int64 ``[N, 4]`` ``(y0, y1, x0, x1)`` of each row's pixels (``y0 == y1``: none).
        bits: uint8 ``[L]``: each row's rectangle, row-major, :func:`numpy.packbits`, one after
            the other.
    """

    shape: tuple[int, int, int]
    rects: np.ndarray
    bits: np.ndarray

    def unpack(self) -> np.ndarray:
        """The masks, uint8 ``[N, H, W]``, exactly as packed."""
        out = np.zeros(self.shape, dtype=np.uint8)
        start = 0
        for k, (y0, y1, x0, x1) in enumerate(self.rects.tolist()):
            size = (y1 - y0) * (x1 - x0)
            if size:
                end = start + (size + 7) // 8
                out[k, y0:y1, x0:x1] = np.unpackbits(self.bits[start:end], count=size).reshape(y1 - y0, x1 - x0)
                start = end
        return out


def pack_masks(masks: Any) -> PackedMasks | Any:
    """``masks`` (uint8 ``[N, H, W]`` of 0 and 1) as :class:`PackedMasks`; anything else (another
    dtype or shape, a value other than 0 or 1) as it is."""
    if not (isinstance(masks, np.ndarray) and masks.dtype == np.uint8 and masks.ndim == 3):
        return masks
    if masks.size and masks.max() > 1:
        return masks
    rects = np.zeros((len(masks), 4), dtype=np.int64)
    chunks = []
    for k, mask in enumerate(masks):
        rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
        if len(rows):
            y0, y1, x0, x1 = rows[0], rows[-1] + 1, cols[0], cols[-1] + 1
            rects[k] = (y0, y1, x0, x1)
            chunks.append(np.packbits(mask[y0:y1, x0:x1], axis=None))
    bits = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.uint8)
    return PackedMasks(tuple(int(n) for n in masks.shape), rects, bits)


def masks_to_boxes(masks: np.ndarray) -> np.ndarray:
    """float32 ``[N, 4]`` xyxy: the bounds of each mask's pixels (``x2 = last column + 1``: a
    pixel spans ``[i, i + 1)``); zeros for an empty mask."""
    m = np.asarray(masks) != 0
    out = np.zeros((len(m), 4), dtype=np.float32)
    for k in range(len(m)):
        cols, rows = np.flatnonzero(m[k].any(axis=0)), np.flatnonzero(m[k].any(axis=1))
        if len(cols):
            out[k] = (cols[0], rows[0], cols[-1] + 1, rows[-1] + 1)
    return out


def paste_over(boxes: np.ndarray, masks: np.ndarray, pasted: np.ndarray,
               min_visibility: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One sample's targets after objects were pasted on top of it (``CopyPaste``).

    Args:
        boxes: float ``[N, 4]`` xyxy, output canvas.
        masks: uint8 ``[N, H, W]`` the moved masks, rows aligned with ``boxes``.
        pasted: bool ``[N]``: the pasted objects (on top); the others are the sample's own.
        min_visibility: an own object is dropped where less than this share of its mask's area
            is left outside the pasted masks (and where nothing is left).

    Returns:
        ``(keep bool [N], boxes float32 [N, 4], masks uint8 [N, H, W])``: each own object's mask
        loses the pixels under the union of the pasted masks; where it lost some, its box becomes
        the bounds of what is left (:func:`masks_to_boxes`) within its box. An own object whose
        mask was empty already keeps its box and mask (it is not judged). Pasted rows are unchanged.
    """
    masks = np.asarray(masks, dtype=np.uint8)
    boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, 4).copy()
    pasted = np.asarray(pasted, dtype=bool)
    keep = np.ones(len(masks), dtype=bool)
    if not pasted.any() or pasted.all():
        return keep, boxes, masks
    cover = masks[pasted].any(axis=0)
    own = np.flatnonzero(~pasted)
    before = masks[own].reshape(len(own), -1).sum(axis=1)
    left = masks[own] & ~cover[None]
    after = left.reshape(len(own), -1).sum(axis=1)
    judged = before > 0
    lost = judged & (after < before)
    share = np.where(judged, after / np.maximum(before, 1), 1.0)
    keep[own] = ~judged | ((after > 0) & (share >= min_visibility))
    out = masks.copy()
    out[own] = left
    tight = masks_to_boxes(left[lost])
    b = boxes[own[lost]]
    boxes[own[lost]] = np.concatenate([np.maximum(b[:, :2], tight[:, :2]), np.minimum(b[:, 2:], tight[:, 2:])], axis=1)
    return keep, boxes, out
