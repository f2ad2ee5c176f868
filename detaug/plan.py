"""Per-batch planning: sample every transform's random parameters and compute the output boxes.

A :class:`detaug.transforms.Compose` is executed in two parts:

1. **Planning (this module, NumPy on the host).** Once per batch, before the batch enters the
   DALI pipeline (in worker processes), the planner draws every random parameter of every
   transform for every sample from that sample's own random stream
   (:class:`detaug.seeds.SampleRandom`, keyed by ``(seed, epoch, image_id)``), composes the
   geometric transforms into one forward matrix per *warp segment*, and computes the exact
   output boxes.
2. **Pixels (DALI, GPU or CPU).** The image is decoded (only the region the first warp reads),
   warped once per segment with ``fn.warp_affine(inverse_map=False)``, colour-adjusted and
   normalised, all from the planner's per-sample outputs.

Because the boxes come from the same NumPy code on both devices, ``device="gpu"`` and
``device="cpu"`` give the same boxes and labels for one seed. Every step is computed per sample
(the random draws, the choice between the rectangle and the half-plane clipping, the area
sums), so a sample's plan is bit for bit the same whatever its batch-mates
(see :mod:`detaug.seeds`).

Box processing order (all boxes absolute ``xyxy``, float64 while planning):

1. input boxes are read as given (the sources clip them to the image);
2. each geometric transform maps the current canvas to a new one; a canvas that may miss part of
   the previous one (a crop, a rotation) becomes four half-planes in source coordinates
   (:func:`detaug.boxes.canvas_halfplanes`), kept as one rectangle while the geometry is
   axis-aligned;
3. transforms that need the current boxes (``RandomIoUCrop``) see them exactly as in 4.;
4. at the end, each source box rectangle is clipped by every half-plane, mapped forward, and
   its bounding box is the output box; ``visibility`` = clipped area / original area;
5. boxes dropped by a transform (``RandomIoUCrop`` drops boxes whose centre leaves the crop),
   with zero area, narrower or lower than ``min_size`` or less visible than ``min_visibility``
   are removed together with their labels.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from detaug.boxes import (
    box_area,
    boxes_to_polygons,
    canvas_halfplanes,
    clip_polygons,
    polygon_area,
    polygon_bounds,
    transform_points,
)

from detaug.seeds import SampleRandom

__all__ = ["PlanState", "BoxResult"]


@dataclass
class BoxResult:
    """Output boxes of a batch, flat over all samples."""

    boxes_xyxy: np.ndarray  # float64 [N, 4], output-canvas pixels
    keep: np.ndarray  # bool [N]: survives every filter
    visibility: np.ndarray  # float64 [N]: visible fraction of the source box area


@dataclass
class PlanState:
    """Geometry of a batch while its transforms are planned.

    Attributes:
        rand: the samples' random streams (every draw comes from it, in transform order; row
            ``k`` of a draw depends only on sample ``k``'s key).
        source_hw: float64 ``[B, 2]`` source image ``(height, width)``.
        canvas_hw: float64 ``[B, 2]`` current canvas ``(height, width)`` (whole pixels).
        to_canvas: float64 ``[B, 3, 3]`` forward map from source to current canvas coordinates.
        boxes_src: float64 ``[N, 4]`` xyxy boxes of all samples, in source coordinates.
        sample: int64 ``[N]`` the sample each box belongs to.
        alive: bool ``[N]`` boxes not dropped by a transform so far.
    """

    rand: SampleRandom
    source_hw: np.ndarray
    boxes_src: np.ndarray
    sample: np.ndarray
    canvas_hw: np.ndarray = field(init=False)
    to_canvas: np.ndarray = field(init=False)
    alive: np.ndarray = field(init=False)
    _clip_rect: np.ndarray = field(init=False)
    _planes: list[np.ndarray] = field(init=False)
    _rotated: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        b = len(self.source_hw)
        self.canvas_hw = self.source_hw.astype(np.float64).copy()
        self.to_canvas = np.broadcast_to(np.eye(3), (b, 3, 3)).copy()
        self.alive = np.ones(len(self.boxes_src), dtype=bool)
        # Canvas constraints in source coordinates: while the geometry is axis-aligned they are
        # rectangles, intersected into one ``[B, 4]`` xyxy rectangle (cheap min/max); after a
        # rotation or shear, each cropping canvas adds four general half-planes for that sample
        # (``_rotated``), and "no constraint" for the others.
        zeros = np.zeros(b)
        self._clip_rect = np.stack([zeros, zeros, self.canvas_hw[:, 1], self.canvas_hw[:, 0]], axis=1)
        self._planes = []
        self._rotated = np.zeros(b, dtype=bool)

    @property
    def batch_size(self) -> int:
        return len(self.source_hw)

    def apply(self, step: np.ndarray, canvas_hw: np.ndarray, crops: bool = True) -> None:
        """Move every sample to a new canvas: ``step`` ``[B, 3, 3]``, ``canvas_hw`` ``[B, 2]``.

        ``crops=False`` promises that the new canvas holds the whole previous one (flips,
        resizes, zoom-outs, padding): it then adds no constraint on the boxes.
        """
        self.to_canvas = step @ self.to_canvas
        self.canvas_hw = np.asarray(canvas_hw, dtype=np.float64)
        if not crops:
            return
        m = self.to_canvas
        aligned = (m[:, 0, 1] == 0) & (m[:, 1, 0] == 0)  # decided per sample, never per batch
        if aligned.any():
            # the canvas is the source rectangle between the preimages of its corners
            sx, sy, tx, ty = m[:, 0, 0], m[:, 1, 1], m[:, 0, 2], m[:, 1, 2]
            with np.errstate(divide="ignore", invalid="ignore"):  # rows that are not aligned
                xa, xb = -tx / sx, (self.canvas_hw[:, 1] - tx) / sx
                ya, yb = -ty / sy, (self.canvas_hw[:, 0] - ty) / sy
            rect = np.stack([np.minimum(xa, xb), np.minimum(ya, yb), np.maximum(xa, xb), np.maximum(ya, yb)], axis=1)
            rect = np.concatenate(
                [np.maximum(self._clip_rect[:, :2], rect[:, :2]), np.minimum(self._clip_rect[:, 2:], rect[:, 2:])], axis=1
            )
            self._clip_rect = np.where(aligned[:, None], rect, self._clip_rect)
        if not aligned.all():
            planes = canvas_halfplanes(self.to_canvas, self.canvas_hw)
            planes[aligned] = (0.0, 0.0, np.inf)  # 0 <= inf: no constraint (kept in the rectangle)
            self._planes.append(planes)
            self._rotated |= ~aligned

    def boxes(self) -> BoxResult:
        """Exact boxes on the current canvas (see the module docstring, steps 4-5 without the
        size filters)."""
        b = self.boxes_src
        rect = self._clip_rect[self.sample]
        clipped = np.concatenate([np.maximum(b[:, :2], rect[:, :2]), np.minimum(b[:, 2:], rect[:, 2:])], axis=1)
        full_area = box_area(b)
        poly, count = boxes_to_polygons(clipped)
        count[(clipped[:, 2:] <= clipped[:, :2]).any(axis=1)] = 0
        visible = np.where(count > 0, box_area(clipped), 0.0)
        if self._planes:
            for planes in self._planes:
                for k in range(4):
                    poly, count = clip_polygons(poly, count, planes[self.sample, k])
            rotated = self._rotated[self.sample]
            visible[rotated] = _polygon_areas(poly[rotated], count[rotated])
        out = polygon_bounds(transform_points(self.to_canvas[self.sample], poly), count)
        wh = self.canvas_hw[self.sample, ::-1]
        out = np.clip(out, 0.0, np.concatenate([wh, wh], axis=1))  # float rounding only: 1e-13 px
        visibility = np.where(full_area > 0, visible / np.where(full_area > 0, full_area, 1), 0.0)
        keep = self.alive & (count > 0) & (visible > 0)
        return BoxResult(out, keep, visibility)


def _polygon_areas(poly: np.ndarray, count: np.ndarray) -> np.ndarray:
    """:func:`detaug.boxes.polygon_area` with each polygon summed over exactly its own vertices:
    the padding width of ``poly`` (the batch's largest vertex count) changes the order of
    NumPy's summation, hence the last bits, so it is cut away per vertex count."""
    out = np.zeros(len(count))
    for c in np.unique(count[count > 0]):
        rows = np.flatnonzero(count == c)
        out[rows] = polygon_area(poly[rows, :c], count[rows])
    return out
