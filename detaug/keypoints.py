"""Keypoints: per-object points moved by the same planned geometry as their image and boxes.

A box may carry ``K`` keypoints: the per-box field :data:`KEYPOINTS` (``"keypoints"``), float32
``[N, K, 3]`` rows ``(x, y, v)`` per object, ``K`` the same for every object of a source:

* ``x, y`` in continuous pixel coordinates, as the boxes (pixel ``i`` spans ``[i, i + 1)``: the
  centre of pixel ``(3, 5)`` is ``(3.5, 5.5)``);
* ``v`` COCO's visibility flag: ``0`` not labelled (or not on the image), ``1`` labelled but not
  visible, ``2`` labelled and visible.

The planner (:mod:`detaug.planning`) moves them with the exact matrix their box's outline is
mapped with (:class:`detaug.plan.PointGeometry`: flips, crops, pads, resizes, rotations,
shears, perspective, Mosaic tiles, the MixUp partner), so a point painted on the image lands on
its pixel (:func:`move_keypoints`). On the way:

* a point that leaves the image (cut by a crop, outside its Mosaic tile's quadrant, off the
  canvas) keeps its mapped coordinates and gets ``v = 0``; a point outside its source image to
  begin with is treated the same way (the source image is the first canvas);
* the rows of a removed box (``min_size``, ``min_visibility``, dropped by a crop) go with it;
* where a sample is mirrored (an odd number of flips, :attr:`detaug.plan.PointGeometry.mirrored`)
  the points named by the recipe's ``keypoint_flip_pairs`` trade places
  (:func:`flip_permutation`): after a horizontal flip the point at index "left eye" is the
  mirrored right eye, as in torchvision's Keypoint R-CNN reference and detectron2.

COCO's ``keypoints`` (flat ``[x1, y1, v1, x2, ...]`` per annotation) are pixel indices of the
labelled pixel: :class:`~detaug.sources.CocoSource` adds :data:`COCO_KEYPOINT_OFFSET` (0.5,
detectron2's convention) to put them at the pixel's centre, so that a flip sends pixel ``i`` to
pixel ``W - 1 - i``; :func:`to_coco_keypoints` takes it off again for COCO results files.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from detaug.arrays import numeric_array
from detaug.errors import RecipeError

__all__ = [
    "COCO_KEYPOINT_OFFSET", "COCO_PERSON_FLIP_PAIRS", "KEYPOINTS", "check_flip_pairs", "check_keypoints",
    "coco_keypoints", "flip_pairs_from_names", "flip_permutation", "move_keypoints", "orient_keypoints",
    "to_coco_keypoints",
]

#: The per-box field name of keypoints (sources, targets, eager calls).
KEYPOINTS = "keypoints"

#: Added to COCO's keypoint pixel indices when read (their pixel's centre).
COCO_KEYPOINT_OFFSET = 0.5

#: The left/right pairs of COCO's 17 person keypoints (nose, eyes, ears, shoulders, elbows,
#: wrists, hips, knees, ankles), 0-based.
COCO_PERSON_FLIP_PAIRS = ((1, 2), (3, 4), (5, 6), (7, 8), (9, 10), (11, 12), (13, 14), (15, 16))


def check_flip_pairs(pairs: Any) -> tuple[tuple[int, int], ...]:
    """``pairs`` as a tuple of ``(i, j)`` int pairs, or a :class:`~detaug.errors.RecipeError`
    (field ``keypoint_flip_pairs``) for anything but pairs of distinct non-negative integers
    with each index in at most one pair."""

    def fail(problem: str) -> RecipeError:
        return RecipeError(problem, field="keypoint_flip_pairs")

    if pairs is None:
        return ()
    if isinstance(pairs, (str, bytes)) or not isinstance(pairs, Sequence | np.ndarray):
        raise fail(f"expected a list of [i, j] pairs of keypoint indices, got {pairs!r:.60}")
    out: list[tuple[int, int]] = []
    seen: set[int] = set()
    for pair in pairs:
        values = list(pair) if isinstance(pair, Sequence | np.ndarray) and not isinstance(pair, str) else None
        if values is None or len(values) != 2 or not all(
                isinstance(x, int | np.integer) and not isinstance(x, bool | np.bool_) for x in values):
            raise fail(f"expected pairs [i, j] of keypoint indices (integers), got {pair!r:.60}")
        i, j = int(values[0]), int(values[1])
        if i < 0 or j < 0 or i == j:
            raise fail(f"pair {[i, j]}: indices must be distinct and >= 0")
        for x in (i, j):
            if x in seen:
                raise fail(f"keypoint {x} is in two pairs")
            seen.add(x)
        out.append((i, j))
    return tuple(out)


def flip_permutation(pairs: Sequence[tuple[int, int]], k: int) -> np.ndarray:
    """int64 ``[K]``: ``points[:, perm]`` swaps each pair (``ValueError`` for an index ``>= K``)."""
    perm = np.arange(k, dtype=np.int64)
    for i, j in pairs:
        if max(i, j) >= k:
            raise ValueError(f"keypoint_flip_pairs names keypoint {max(i, j)}, but the objects have {k} "
                             f"keypoints (0..{k - 1})")
        perm[i], perm[j] = j, i
    return perm


def flip_pairs_from_names(names: Sequence[str]) -> tuple[tuple[int, int], ...]:
    """The flip pairs of keypoint ``names`` (a COCO category's ``keypoints`` list): each
    ``left_X`` with its ``right_X`` (also ``left-``, ``l_``/``r_`` prefixes and ``_left``/
    ``_right`` suffixes), in the order of the left ones."""
    index = {str(n).lower(): k for k, n in enumerate(names)}
    pairs = []
    for name, k in index.items():
        for left, right in (("left_", "right_"), ("left-", "right-"), ("l_", "r_")):
            if name.startswith(left) and right + name[len(left):] in index:
                pairs.append((k, index[right + name[len(left):]]))
                break
        else:
            for left, right in (("_left", "_right"), ("-left", "-right")):
                if name.endswith(left) and name[: -len(left)] + right in index:
                    pairs.append((k, index[name[: -len(left)] + right]))
                    break
    return tuple(pairs)


def check_keypoints(values: Any, count: int | None) -> tuple[np.ndarray | None, str]:
    """A sample's keypoints as float32 ``[count, K, 3]``, or ``(None, why)``: an array of
    numbers of shape ``[count, K, 3]`` (``K >= 1``; one row per box), finite coordinates, every
    visibility 0, 1 or 2. ``count`` ``None``: the boxes are malformed (rows not checked)."""
    arr, why = numeric_array(values, "keypoints")
    if arr is None:
        return None, why
    if arr.size == 0 and count == 0 and arr.ndim != 3:
        return None, f"keypoints of shape {list(arr.shape)} are not [N, K, 3]"
    if arr.ndim != 3 or arr.shape[2] != 3 or arr.shape[1] < 1:
        return None, f"keypoints of shape {list(arr.shape)} are not [N, K, 3] (x, y, visibility per point)"
    if count is not None and arr.shape[0] != count:
        return None, f"keypoints have {arr.shape[0]} rows, expected one per box ({count})"
    arr64 = arr.astype(np.float64)
    bad = ~np.isfinite(arr64).all(axis=2) | (np.abs(arr64[..., :2]) > np.finfo(np.float32).max).any(axis=2)
    if bad.any():
        box, point = (int(x) for x in np.argwhere(bad)[0])
        return None, f"box {box}, keypoint {point}: non-finite coordinate {arr64[box, point].tolist()}"
    vis = arr64[..., 2]
    bad = ~np.isin(vis, (0.0, 1.0, 2.0))
    if bad.any():
        box, point = (int(x) for x in np.argwhere(bad)[0])
        return None, f"box {box}, keypoint {point}: visibility {vis[box, point]:g} is not 0, 1 or 2"
    return arr64.astype(np.float32), ""


def coco_keypoints(raw: Sequence[Any], rows: np.ndarray,
                   report_error: Callable[[int, str], None]) -> np.ndarray | None:
    """The keypoints of COCO annotations, for the kept boxes ``rows`` (indices into ``raw``).

    Args:
        raw: per well-formed annotation, its ``keypoints`` value (``None`` where absent).
        rows: int ``[M]`` the annotations kept as boxes, in the order of the output.
        report_error: ``(annotation index into raw, detail)`` -> records a "malformed
            annotation" (or "non-finite coordinate") error naming the file and annotation id.

    Returns:
        float32 ``[M, K, 3]``: ``(x + 0.5, y + 0.5, v)`` (:data:`COCO_KEYPOINT_OFFSET`); ``K``
        points of ``v = 0`` (not labelled) for an annotation without ``keypoints``; ``None``
        when no annotation has any (a detection file). Errors: a value that is not a flat list
        of ``3 K`` numbers, ``K`` not the same for every annotation, a coordinate that is not
        finite, a visibility other than 0, 1, 2 (each reported, the row then zeros).
    """
    if not any(value is not None for value in raw):
        return None
    k = None
    parsed: dict[int, np.ndarray] = {}
    for j in np.asarray(rows, dtype=np.int64).tolist():
        value = raw[j]
        if value is None:
            continue
        try:
            flat = np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError, OverflowError):
            report_error(j, f"keypoints {value!r:.60} are not a list of numbers")
            continue
        if isinstance(value, (str, bytes)) or flat.ndim != 1 or len(flat) % 3 or not len(flat):
            report_error(j, f"keypoints {value!r:.60} are not a flat list [x1, y1, v1, ...] of 3 K numbers")
            continue
        if k is None:
            k = len(flat) // 3
        elif len(flat) // 3 != k:
            report_error(j, f"{len(flat) // 3} keypoints, others have {k}: K is the same for every object")
            continue
        points, why = check_keypoints(flat.reshape(1, -1, 3), 1)
        if points is None:
            report_error(j, why.replace("box 0, ", ""))
            continue
        parsed[j] = points[0]
    if k is None:  # no kept box has keypoints: K from any annotation that has them
        k = next((len(v) // 3 for v in raw if isinstance(v, list) and len(v) >= 3), 1)
    out = np.zeros((len(rows), k, 3), dtype=np.float32)
    for r, j in enumerate(np.asarray(rows, dtype=np.int64).tolist()):
        if j in parsed and parsed[j].shape[0] == k:
            out[r] = parsed[j]
    out[..., :2] += np.float32(COCO_KEYPOINT_OFFSET)
    return out


def move_keypoints(points: np.ndarray, geometry: Any, flip_pairs: Sequence[tuple[int, int]] = ()) -> np.ndarray:
    """Keypoints of kept boxes moved to the output canvas.

    Args:
        points: ``[M, K, 3]`` ``(x, y, v)`` in each box's source image (its layer).
        geometry: the boxes' :class:`detaug.plan.PointGeometry` (``M`` rows, same order).
        flip_pairs: the recipe's ``keypoint_flip_pairs``: swapped in rows that are mirrored.

    Returns:
        float32 ``[M, K, 3]``: mapped ``(x, y)``; ``v`` kept where the point is inside
        (:meth:`~detaug.plan.PointGeometry.apply`), else 0.
    """
    p = np.asarray(points, dtype=np.float64)
    m, k = p.shape[0], (p.shape[1] if p.ndim == 3 else 0)
    if m == 0:
        return np.zeros((0, k, 3), dtype=np.float32)
    xy, inside = geometry.apply(p[..., :2])
    v = np.where(inside, p[..., 2], 0.0)
    out = np.concatenate([xy, v[..., None]], axis=-1)
    if flip_pairs:
        mirrored = geometry.mirrored
        if mirrored.any():
            out[mirrored] = out[mirrored][:, flip_permutation(flip_pairs, k)]
    return (out.astype(np.float32) + np.float32(0.0))  # no -0.0


def orient_keypoints(points: np.ndarray, matrix: np.ndarray, flip_pairs: Sequence[tuple[int, int]] = ()) -> np.ndarray:
    """float32 ``[N, K, 3]``: keypoints of the stored pixels of an EXIF-rotated image moved to the
    displayed frame by ``matrix`` ``[3, 3]`` (:func:`detaug.formats.images.exif_matrix`), as
    their boxes are; ``v`` kept (the whole image stays in view); ``flip_pairs`` swapped where
    the map mirrors (orientations 2, 4, 5, 7)."""
    p = np.asarray(points, dtype=np.float64).copy()
    m = np.asarray(matrix, dtype=np.float64)
    p[..., :2] = p[..., :2] @ m[:2, :2].T + m[:2, 2]
    if flip_pairs and np.linalg.det(m[:2, :2]) < 0 and p.shape[0]:
        p = p[:, flip_permutation(flip_pairs, p.shape[1])]
    return p.astype(np.float32)


def to_coco_keypoints(points: Any) -> list[list[float]]:
    """``[N, K, 3]`` keypoints (detaug's continuous coordinates) as COCO writes them: per object a
    flat ``[x1, y1, v1, ...]`` list of pixel indices (:data:`COCO_KEYPOINT_OFFSET` taken off;
    ``v`` as an integer)."""
    p = np.asarray(points, dtype=np.float64).reshape(-1, np.asarray(points).shape[-2] if np.ndim(points) == 3 else 0, 3)
    out = []
    for row in p:
        flat: list[float] = []
        for x, y, v in row:
            flat += [float(x - COCO_KEYPOINT_OFFSET), float(y - COCO_KEYPOINT_OFFSET), int(v)]
        out.append(flat)
    return out
