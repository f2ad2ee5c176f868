"""Per-batch planning: sample every transform's random parameters and compute the output boxes.

A :class:`detaug.transforms.Compose` is executed in two parts:

1. **Planning (this module, NumPy on the host).** Once per batch, before the batch enters the
   DALI pipeline (in worker processes), the planner draws every random parameter of every
   transform for every sample from that sample's own random stream
   (:class:`detaug.seeds.SampleRandom`, keyed by ``(seed, epoch, image_id)``), composes the
   geometric transforms into one forward matrix per *warp segment*, and computes the exact
   output boxes.
2. **Pixels (DALI, GPU or CPU).** The image is decoded (only the region the first warp reads),
   warped once per segment with ``fn.warp_affine(inverse_map=False)`` (or
   ``fn.experimental.warp_perspective`` for a segment holding a projective step),
   colour-adjusted and normalised, all from the planner's per-sample outputs. ``Mosaic`` tiles
   and the ``MixUp`` partner are further source images of the same sample (*layers*).

Because the boxes come from the same NumPy code on both devices, ``device="gpu"`` and
``device="cpu"`` give the same boxes and labels for one seed. Every step is computed per sample
(the random draws, the choice between the rectangle and the half-plane clipping, the area
sums), so a sample's plan is bit for bit the same whatever its batch-mates
(see :mod:`detaug.seeds`).

Box processing order (all boxes absolute ``xyxy``, float64 while planning):

1. input boxes are read as given (the sources clip them to the image);
2. each geometric transform maps the current canvas to a new one; a canvas that may miss part of
   the previous one (a crop, a rotation) becomes four half-planes in each layer's source
   coordinates (:func:`detaug.boxes.canvas_halfplanes`; still four half-planes under a
   perspective map, and they exclude everything behind its horizon), kept as one rectangle
   while the geometry is axis-aligned; so does the canvas a warp segment draws, for the layers
   that a step which does not crop may have moved partly off it (``RandomPerspective``'s outer
   half-pixel rim; :meth:`PlanState.draw`); a ``Mosaic`` tile or ``MixUp`` partner is placed
   with an axis-aligned map and clipped to its visible rectangle (:meth:`PlanState.place_layers`);
2b. where a canvas is drawn and a later warp moves it (the mosaic canvas, the ``MixUp`` partner
   on its canvas, every warp segment's output but the last), a box of which it draws nothing
   (its box there holds no pixel centre in x or y: a sliver thinner than half a pixel along a
   cut) is dropped (:meth:`PlanState.drop_undrawn`): a later rotation, shear or perspective
   would make its outline a large box over nothing;
3. transforms that need the current boxes (``RandomIoUCrop``) see them exactly as in 4.;
4. at the end, each source box rectangle is clipped by every half-plane of its layer, mapped
   forward (with the perspective division where the map is projective), and its bounding box
   is the output box; ``visibility`` = clipped area / original area (in the box's own image);
5. boxes dropped by a transform (``RandomIoUCrop`` drops boxes whose centre leaves the crop) or
   by 2b., with zero area, narrower or lower than ``min_size`` or less visible than
   ``min_visibility`` are removed together with their labels.

Points of a box (keypoints, :mod:`detaug.keypoints`) go with it: :meth:`PlanState.point_geometry`
gives, per kept box, the map of its layer (the very matrix its outline is mapped with) and its
layer's clip constraints; a point is visible on the output where it satisfies every constraint of
its layer (the same closed half-planes and rectangle that clip the box), is not under a rectangle
pasted over it (``CutMix``, :meth:`PlanState.occlude`) and lands on the output canvas
(:meth:`PointGeometry.apply`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from detaug.boxes import (
    box_area,
    boxes_to_polygons,
    canvas_halfplanes,
    clip_polygons,
    is_affine,
    polygon_area,
    polygon_bounds,
    transform_points,
    translation_matrix,
)

from detaug.seeds import SampleRandom

__all__ = ["PlanState", "BoxResult", "Partners", "PointGeometry"]


@dataclass
class Partners:
    """The partner images of a batch (:meth:`detaug.transforms.Compose.plan_batch`),
    ``J = Compose.num_partners`` slots per sample: ``Mosaic``'s tiles 1-3, then ``MixUp``'s partner.

    Attributes:
        shapes: per slot, per sample, the decoded image shape ``(H, W, C)``.
        boxes: per slot, per sample, float32 ``[N, 4]`` xyxy boxes on that image.
        labels: per slot, per sample, int ``[N]``.
    """

    shapes: list[list[np.ndarray]]
    boxes: list[list[np.ndarray]]
    labels: list[list[np.ndarray]]


@dataclass
class BoxResult:
    """Output boxes of a batch, flat over all samples."""

    boxes_xyxy: np.ndarray  # float64 [N, 4], output-canvas pixels
    keep: np.ndarray  # bool [N]: survives every filter
    visibility: np.ndarray  # float64 [N]: visible fraction of the source box area


@dataclass
class PointGeometry:
    """Where the points of some boxes go: per box, its layer's map and clip constraints.

    Attributes:
        maps: float64 ``[M, 3, 3]`` forward map from the box's layer source (its image) to the
            output canvas (affine, or projective: divide by ``w``), the one its outline is
            mapped with.
        rect: float64 ``[M, 4]`` xyxy rectangle (layer source coordinates) the box is clipped to.
        planes: float64 ``[M, P, 3]`` further half-planes ``(a, b, c)``: keep ``a x + b y <= c``
            (``(0, 0, inf)``: none), in layer source coordinates.
        canvas_hw: float64 ``[M, 2]`` the output canvas ``(height, width)`` of each box's sample.
        anchor: float64 ``[M, 2]`` the centre of each source box (where :attr:`mirrored` reads
            the orientation of a projective map).
        painted: float64 ``[M, 4, 3]`` or ``None``: the half-planes (layer source coordinates)
            of a rectangle pasted over each box (``CutMix``, :meth:`PlanState.occlude`); a point
            inside all four is hidden. A row ``(0, 0, -1)`` paints nothing.
        out_hw: the sample's output canvas ``(height, width)`` where the geometry is one
            sample's (``plan_batch(..., geometry=True)``), also without boxes (masks,
            :mod:`detaug.masks`); else ``None``.
    """

    maps: np.ndarray
    rect: np.ndarray
    planes: np.ndarray
    canvas_hw: np.ndarray
    anchor: np.ndarray
    painted: np.ndarray | None = None
    out_hw: tuple[int, int] | None = None

    def __len__(self) -> int:
        return len(self.maps)

    def take(self, rows: np.ndarray | slice) -> PointGeometry:
        """The geometry of boxes ``rows`` (indices, a boolean mask or a slice)."""
        return PointGeometry(self.maps[rows], self.rect[rows], self.planes[rows], self.canvas_hw[rows], self.anchor[rows],
                             None if self.painted is None else self.painted[rows])

    @property
    def mirrored(self) -> np.ndarray:
        """bool ``[M]``: the map mirrors the box (its Jacobian's determinant is negative: an odd
        number of flips; a rotation by 180 degrees is no mirror)."""
        m = self.maps
        w = m[:, 2, 0] * self.anchor[:, 0] + m[:, 2, 1] * self.anchor[:, 1] + m[:, 2, 2]
        return np.linalg.det(m) * w < 0 if len(m) else np.zeros(0, dtype=bool)

    def apply(self, points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Map points ``[M, K, 2]`` (box ``m``'s points in its layer's source coordinates) to the
        output canvas: ``(float64 [M, K, 2], inside bool [M, K])``. ``inside``: the point
        satisfies every clip constraint of its box's layer (the source image, each crop, a
        Mosaic tile's quadrant: the same closed rectangle and half-planes that clip the box),
        is not under a pasted rectangle (the open one: its border shows both), lies in front of a projective map's horizon, and lands on the canvas ``[0, W] x [0, H]``
        (within ``1e-6`` px of rounding). Points that are not inside are mapped all the same."""
        p = np.asarray(points, dtype=np.float64).reshape(len(self.maps), -1, 2)
        x, y = p[..., 0], p[..., 1]
        r = self.rect[:, None, :]
        inside = (x >= r[..., 0]) & (x <= r[..., 2]) & (y >= r[..., 1]) & (y <= r[..., 3])
        for k in range(self.planes.shape[1]):
            a, b, c = (self.planes[:, k, j][:, None] for j in range(3))
            with np.errstate(invalid="ignore"):  # 0 * x <= inf: no constraint
                inside &= (a * x + b * y <= c) | np.isinf(c)
        if self.painted is not None:
            under = np.ones_like(inside)
            for k in range(4):
                a, b, c = (self.painted[:, k, j][:, None] for j in range(3))
                under &= a * x + b * y < c
            inside &= ~under
        m = self.maps[:, None]  # [M, 1, 3, 3]
        u = m[..., 0, 0] * x + m[..., 0, 1] * y + m[..., 0, 2]
        v = m[..., 1, 0] * x + m[..., 1, 1] * y + m[..., 1, 2]
        w = m[..., 2, 0] * x + m[..., 2, 1] * y + m[..., 2, 2]
        inside &= w > 0
        safe = np.where(w > 0, w, 1.0)
        out = np.stack([u / safe, v / safe], axis=-1)
        tol = 1e-6
        h, wd = self.canvas_hw[:, None, 0], self.canvas_hw[:, None, 1]
        inside &= (out[..., 0] >= -tol) & (out[..., 0] <= wd + tol) & (out[..., 1] >= -tol) & (out[..., 1] <= h + tol)
        return out, inside


@dataclass
class PlanState:
    """Geometry of a batch while its transforms are planned.

    A sample's pixels may come from several source images (*layers*: the tiles of ``Mosaic``,
    the partner of ``MixUp``); without mixing transforms every sample is one layer. Each layer
    has its own map to the sample's current canvas and its own clip constraints, in its own
    source coordinates; boxes belong to one layer each and are grouped by sample.

    Attributes:
        rand: the samples' random streams (every draw comes from it, in transform order; row
            ``k`` of a draw depends only on sample ``k``'s key).
        source_hw: float64 ``[B, 2]`` source image ``(height, width)`` (of layer 0 when a
            sample has several).
        boxes_src: float64 ``[N, 4]`` xyxy boxes of all samples, each in its layer's source
            coordinates, grouped by sample.
        sample: int64 ``[N]`` the sample each box belongs to (non-decreasing).
        layer_hw: float64 ``[L, 2]`` each layer's source ``(height, width)``; ``None``: one layer
            per sample (``source_hw``).
        layer_owner: int64 ``[L]`` the sample of each layer (``None``: ``arange(B)``).
        box_layer: int64 ``[N]`` the layer of each box (``None``: ``sample``).
        canvas_hw: float64 ``[B, 2]`` current canvas ``(height, width)`` (whole pixels).
        to_canvas: float64 ``[B, 3, 3]`` forward map from the sample's *base frame* to its current
            canvas: the source image, or the canvas a ``Mosaic`` composed (:meth:`start_canvas`).
        layer_to_canvas: float64 ``[L, 3, 3]`` forward map from each layer's source to the
            current canvas (affine, or projective after ``RandomPerspective``).
        alive: bool ``[N]`` boxes not dropped by a transform so far (boxes of layers not placed
            yet, a ``MixUp`` partner before the blend, are not alive).
    """

    rand: SampleRandom
    source_hw: np.ndarray
    boxes_src: np.ndarray
    sample: np.ndarray
    layer_hw: np.ndarray | None = None
    layer_owner: np.ndarray | None = None
    box_layer: np.ndarray | None = None
    canvas_hw: np.ndarray = field(init=False)
    to_canvas: np.ndarray = field(init=False)
    layer_to_canvas: np.ndarray = field(init=False)
    alive: np.ndarray = field(init=False)
    _clip_rect: np.ndarray = field(init=False)
    _planes: list[np.ndarray] = field(init=False)
    _rotated: np.ndarray = field(init=False)
    _leaky: np.ndarray = field(init=False)
    _area0: np.ndarray = field(init=False)
    _shown: np.ndarray = field(init=False)
    _painted: np.ndarray | None = field(init=False)

    def __post_init__(self) -> None:
        b = len(self.source_hw)
        self._single = self.layer_hw is None  # one layer per sample: layer maps are the sample maps
        if self._single:
            self.layer_hw = self.source_hw.astype(np.float64)
            self.layer_owner = np.arange(b)
            self.box_layer = self.sample
        self.layer_owner = np.asarray(self.layer_owner, dtype=np.int64)
        self.box_layer = np.asarray(self.box_layer, dtype=np.int64)
        n_layers = len(self.layer_hw)
        self.canvas_hw = self.source_hw.astype(np.float64).copy()
        self.to_canvas = np.broadcast_to(np.eye(3), (b, 3, 3)).copy()
        self.layer_to_canvas = self.to_canvas if self._single else np.broadcast_to(np.eye(3), (n_layers, 3, 3)).copy()
        self.alive = np.ones(len(self.boxes_src), dtype=bool)
        # Canvas constraints in layer source coordinates: while the geometry is axis-aligned they
        # are rectangles, intersected into one ``[L, 4]`` xyxy rectangle (cheap min/max); after a
        # rotation, shear or perspective, each cropping canvas adds four general half-planes for
        # that layer (``_rotated``), and "no constraint" for the others.
        zeros = np.zeros(n_layers)
        self._clip_rect = np.stack([zeros, zeros, self.layer_hw[:, 1], self.layer_hw[:, 0]], axis=1)
        self._planes = []
        self._rotated = np.zeros(n_layers, dtype=bool)
        # layers whose image may have left the canvas by a step that promised not to crop but is
        # not axis-aligned (RandomPerspective moves the corners' pixel centres: the outer
        # half-pixel rim can land off the canvas); :meth:`draw` clips them where pixels are drawn
        self._leaky = np.zeros(n_layers, dtype=bool)
        # each box's area in its own image (visibility's denominator), and the share of what its
        # box still holds that is not painted over (:meth:`occlude`; 1: nothing painted)
        self._area0 = box_area(self.boxes_src)
        self._shown = np.ones(len(self.boxes_src))
        self._painted = None  # [N, 4, 3] once a rectangle is pasted (occlude): its half-planes per box

    @property
    def batch_size(self) -> int:
        return len(self.source_hw)

    def apply(self, step: np.ndarray, canvas_hw: np.ndarray, crops: bool = True) -> None:
        """Move every sample to a new canvas: ``step`` ``[B, 3, 3]``, ``canvas_hw`` ``[B, 2]``.

        ``crops=False`` promises that the new canvas holds the whole previous one (flips,
        resizes, zoom-outs, padding, ``RandomPerspective``): it then adds no constraint on the
        boxes, except that a step that is not axis-aligned (``RandomPerspective``, whose
        image's outer half-pixel rim may land off the canvas) leaves its layers to be cut by the
        canvas where it is drawn (:meth:`draw`; within a warp segment a later zoom-out shows
        that rim again).
        """
        self.to_canvas = step @ self.to_canvas
        if self._single:
            self.layer_to_canvas = self.to_canvas
        else:
            self.layer_to_canvas = step[self.layer_owner] @ self.layer_to_canvas
        self.canvas_hw = np.asarray(canvas_hw, dtype=np.float64)
        if crops:
            self._constrain(np.ones(len(self.layer_hw), dtype=bool))
            self._leaky[:] = False
        else:
            tilted = (step[:, 0, 1] != 0) | (step[:, 1, 0] != 0) | ~is_affine(step)  # per sample
            self._leaky |= tilted[self.layer_owner]

    def draw(self) -> None:
        """The current canvas is drawn (a warp segment ends): its border cuts exactly the layers
        that a non-cropping step may have moved partly off it (see ``apply``); no constraint for
        the others, whose images lie inside it already."""
        if self._leaky.any():
            self._constrain(self._leaky.copy())
            self._leaky[:] = False

    def drop_undrawn(self) -> None:
        """Drop the boxes of which the current canvas draws nothing, where it is drawn and a later
        warp follows (the mosaic canvas, the ``MixUp`` partner on its canvas, a warp segment's
        output): those whose box on it holds no pixel centre in x or in y (a sliver thinner than
        half a pixel along a cut; pixels are sampled at their centres, so a pixel whose centre
        lies inside an object shows it at least half, bilinear, and no other pixel does). A later
        rotation, shear or perspective would turn such a sliver's outline into a large box over
        nothing; ``min_size`` on the output cannot see it."""
        if not self.alive.any():
            return
        m = self.layer_to_canvas
        if not self._planes and not ((m[:, 0, 1] != 0) | (m[:, 1, 0] != 0) | ~is_affine(m)).any():
            # axis-aligned throughout (a mosaic's tiles): the visible part is a rectangle
            b, rect, m = self.boxes_src, self._clip_rect[self.box_layer], m[self.box_layer]
            lo = np.maximum(b[:, :2], rect[:, :2])
            hi = np.minimum(b[:, 2:], rect[:, 2:])
            keep = self.alive & (hi > lo).all(axis=1)
            scale, shift = np.stack([m[:, 0, 0], m[:, 1, 1]], 1), np.stack([m[:, 0, 2], m[:, 1, 2]], 1)
            lo, hi = np.minimum(lo * scale, hi * scale) + shift, np.maximum(lo * scale, hi * scale) + shift
        else:
            result = self.boxes()
            keep, lo, hi = result.keep, result.boxes_xyxy[:, :2], result.boxes_xyxy[:, 2:]
        centre = (np.ceil(lo - 0.5) <= np.floor(hi - 0.5)).all(axis=1)  # some i + 0.5 in [lo, hi], x and y
        self.alive &= keep & centre

    def start_canvas(self, canvas_hw: np.ndarray) -> None:
        """Make a new canvas ``[B, 2]`` the samples' base frame (``to_canvas`` = identity); the
        layers are then placed on it with :meth:`place_layers` (``Mosaic``)."""
        self.to_canvas = np.broadcast_to(np.eye(3), (self.batch_size, 3, 3)).copy()
        self.canvas_hw = np.asarray(canvas_hw, dtype=np.float64)
        if self._single:
            self.layer_to_canvas = self.to_canvas

    def place_layers(self, layers: np.ndarray, maps: np.ndarray, rects: np.ndarray, alive: np.ndarray | None = None) -> None:
        """Put layers ``[M]`` on their samples' current canvas with axis-aligned maps ``[M, 3, 3]``
        (scale and translation), showing only the rectangles ``rects`` ``[M, 4]`` (xyxy, canvas
        pixels; a ``Mosaic`` tile's quadrant, a ``MixUp`` partner's canvas). The layers' earlier
        constraints are forgotten; their boxes are alive where ``alive`` ``[M]`` (default: all).
        """
        if self._single:
            raise RuntimeError("place_layers needs a PlanState built with layers")
        layers = np.asarray(layers, dtype=np.int64)
        m = np.asarray(maps, dtype=np.float64)
        if ((m[:, 0, 1] != 0) | (m[:, 1, 0] != 0) | ~is_affine(m)).any():
            raise ValueError("place_layers takes axis-aligned maps (scale and translation) only")
        self.layer_to_canvas[layers] = m
        hw = self.layer_hw[layers]
        sx, sy, tx, ty = m[:, 0, 0], m[:, 1, 1], m[:, 0, 2], m[:, 1, 2]
        xa, xb = (rects[:, 0] - tx) / sx, (rects[:, 2] - tx) / sx
        ya, yb = (rects[:, 1] - ty) / sy, (rects[:, 3] - ty) / sy
        self._clip_rect[layers] = np.stack([
            np.maximum(np.minimum(xa, xb), 0), np.maximum(np.minimum(ya, yb), 0),
            np.minimum(np.maximum(xa, xb), hw[:, 1]), np.minimum(np.maximum(ya, yb), hw[:, 0]),
        ], axis=1)
        for planes in self._planes:
            planes[layers] = (0.0, 0.0, np.inf)
        self._rotated[layers] = False
        self._leaky[layers] = False
        mine = np.zeros(len(self.layer_hw), dtype=bool)
        mine[layers] = True if alive is None else np.asarray(alive, dtype=bool)
        in_layers = np.isin(self.box_layer, layers)
        self.alive[in_layers] = mine[self.box_layer[in_layers]]

    def occlude(self, rects: np.ndarray, rows: np.ndarray) -> None:
        """Paint rectangles ``rects`` ``[B, 4]`` (xyxy, current canvas; an empty one paints
        nothing) over the boxes ``rows`` ``[N]`` bool (``CutMix``: the sample's own boxes, under
        the pasted rectangle). A box's visible part ``P`` (its rectangle clipped by its layer's
        constraints, in its source coordinates) loses ``P ∩ R``: the box becomes the bounding
        box, in source coordinates, of ``P \\ R`` (the union of ``P`` clipped by each outer
        side of ``R``'s four half-planes, leaving out a part of which the canvas draws nothing:
        one holding no pixel centre across, the rule of :meth:`drop_undrawn`): exact where ``R``
        cuts a whole side of an axis-aligned box, the whole box where ``R`` lies inside it or
        cuts a corner (the box still holds its object's visible pixels), dropped where ``R``
        covers it. Its visibility becomes ``area(P \\ R) / area(P)`` times what it was, a share
        kept through later crops. ``boxes_src`` is replaced (a copy), never written into."""
        r = np.asarray(rects, dtype=np.float64)[self.sample]
        idx = np.flatnonzero(rows & self.alive & (r[:, 2:] > r[:, :2]).all(axis=1))
        if not len(idx):
            return
        layer, r = self.box_layer[idx], r[idx]
        poly, count = self._visible_polygons(self.boxes_src[idx], layer)
        to_rect = translation_matrix(-r[:, 0], -r[:, 1]) @ self.layer_to_canvas[layer]
        paint = canvas_halfplanes(to_rect, np.stack([r[:, 3] - r[:, 1], r[:, 2] - r[:, 0]], axis=1))
        under, under_count = poly, count
        for k in range(4):
            under, under_count = clip_polygons(under, under_count, paint[:, k])
        area, hidden = _polygon_areas(poly, count), _polygon_areas(under, under_count)
        if self._painted is None:
            self._painted = np.broadcast_to(np.array([0.0, 0.0, -1.0]), (len(self.boxes_src), 4, 3)).copy()
        self._painted[idx] = paint
        lo, hi = np.full((len(idx), 2), np.inf), np.full((len(idx), 2), -np.inf)
        for k in range(4):  # P minus R: P beyond each side of R, where the canvas draws some of it
            part, part_count = clip_polygons(poly, count, -paint[:, k])
            bounds = polygon_bounds(part, part_count)
            shown = polygon_bounds(transform_points(self.layer_to_canvas[layer], part), part_count)
            some = (part_count > 0) & (np.ceil(shown[:, :2] - 0.5) <= np.floor(shown[:, 2:] - 0.5)).all(axis=1)
            lo[some] = np.minimum(lo[some], bounds[some, :2])
            hi[some] = np.maximum(hi[some], bounds[some, 2:])
        left = (hi > lo).all(axis=1) & (area - hidden > 0)
        self.alive[idx[~left]] = False
        rows_left, b = idx[left], self.boxes_src[idx[left]]
        self.boxes_src = self.boxes_src.copy()  # the caller's array stays as it was
        self.boxes_src[rows_left] = np.concatenate([np.maximum(b[:, :2], lo[left]), np.minimum(b[:, 2:], hi[left])], 1)
        # what the shrunk box holds now (its visible polygon), of which area(P \ R) shows
        new_poly, new_count = self._visible_polygons(self.boxes_src[rows_left], layer[left])
        held = _polygon_areas(new_poly, new_count)
        share = np.where(held > 0, (area[left] - hidden[left]) / np.where(held > 0, held, 1), 0.0)
        self._shown[rows_left] *= np.clip(share, 0.0, 1.0)

    def _visible_polygons(self, b: np.ndarray, layer: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(poly, count)``: boxes ``b`` ``[M, 4]`` of layers ``layer`` ``[M]`` clipped by their
        layers' constraints, as polygons in source coordinates."""
        rect = self._clip_rect[layer]
        clipped = np.concatenate([np.maximum(b[:, :2], rect[:, :2]), np.minimum(b[:, 2:], rect[:, 2:])], axis=1)
        poly, count = boxes_to_polygons(clipped)
        count[(clipped[:, 2:] <= clipped[:, :2]).any(axis=1)] = 0
        for planes in self._planes:
            for k in range(4):
                poly, count = clip_polygons(poly, count, planes[layer, k])
        return poly, count

    def _constrain(self, rows: np.ndarray) -> None:
        """Add the current canvas as a constraint on the layers where ``rows`` ``[L]`` is set."""
        m = self.layer_to_canvas
        canvas = self.canvas_hw[self.layer_owner]
        aligned = rows & (m[:, 0, 1] == 0) & (m[:, 1, 0] == 0) & is_affine(m)  # per layer, never per batch
        if aligned.any():
            # the canvas is the source rectangle between the preimages of its corners
            sx, sy, tx, ty = m[:, 0, 0], m[:, 1, 1], m[:, 0, 2], m[:, 1, 2]
            with np.errstate(divide="ignore", invalid="ignore"):  # rows that are not aligned
                xa, xb = -tx / sx, (canvas[:, 1] - tx) / sx
                ya, yb = -ty / sy, (canvas[:, 0] - ty) / sy
            rect = np.stack([np.minimum(xa, xb), np.minimum(ya, yb), np.maximum(xa, xb), np.maximum(ya, yb)], axis=1)
            rect = np.concatenate(
                [np.maximum(self._clip_rect[:, :2], rect[:, :2]), np.minimum(self._clip_rect[:, 2:], rect[:, 2:])], axis=1
            )
            self._clip_rect = np.where(aligned[:, None], rect, self._clip_rect)
        general = rows & ~aligned
        if general.any():
            planes = canvas_halfplanes(m, canvas)
            planes[~general] = (0.0, 0.0, np.inf)  # 0 <= inf: no constraint (kept in the rectangle)
            self._planes.append(planes)
            self._rotated |= general

    def point_geometry(self, rows: np.ndarray) -> PointGeometry:
        """The :class:`PointGeometry` of boxes ``rows`` (indices into ``boxes_src``) on the
        current canvas: their layers' maps and clip constraints (see the module docstring)."""
        rows = np.asarray(rows, dtype=np.int64)
        layer = self.box_layer[rows]
        if self._planes:
            planes = np.concatenate([p[layer] for p in self._planes], axis=1)
        else:
            planes = np.zeros((len(rows), 0, 3))
        b = self.boxes_src[rows]
        anchor = (b[:, :2] + b[:, 2:]) / 2
        return PointGeometry(self.layer_to_canvas[layer].copy(), self._clip_rect[layer].copy(), planes,
                             self.canvas_hw[self.sample[rows]].copy(), anchor,
                             None if self._painted is None else self._painted[rows].copy())

    def boxes(self) -> BoxResult:
        """Exact boxes on the current canvas (see the module docstring, steps 4-5 without the
        size filters)."""
        b = self.boxes_src
        layer = self.box_layer
        rect = self._clip_rect[layer]
        clipped = np.concatenate([np.maximum(b[:, :2], rect[:, :2]), np.minimum(b[:, 2:], rect[:, 2:])], axis=1)
        full_area = self._area0
        poly, count = boxes_to_polygons(clipped)
        count[(clipped[:, 2:] <= clipped[:, :2]).any(axis=1)] = 0
        visible = np.where(count > 0, box_area(clipped), 0.0)
        if self._planes:
            for planes in self._planes:
                for k in range(4):
                    poly, count = clip_polygons(poly, count, planes[layer, k])
            rotated = self._rotated[layer]
            visible[rotated] = _polygon_areas(poly[rotated], count[rotated])
        out = polygon_bounds(transform_points(self.layer_to_canvas[layer], poly), count)
        wh = self.canvas_hw[self.sample, ::-1]
        out = np.clip(out, 0.0, np.concatenate([wh, wh], axis=1))  # float rounding only: 1e-13 px
        visible = visible * self._shown
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
