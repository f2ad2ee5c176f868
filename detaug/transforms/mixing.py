"""Samples made of several images: ``Mosaic`` (YOLO's 2x2 or 3x3 tiles), ``MixUp`` (two images
blended), ``CutMix`` (a partner's rectangle pasted in) and ``CopyPaste`` (a partner's objects
pasted in by their masks).

Kind ``"mixing"``: a mixing transform names how many *partner* images a sample needs
(``partners``) and places each on the sample's canvas with an axis-aligned matrix (scale and
translation) and a visible rectangle. It takes part in a plan through the methods of
:class:`MixingTransform`, as a warp does through ``plan``: its ``stage`` says where (``"canvas"``:
it composes the sample's first canvas, ``Mosaic``; ``"blend"``: it blends a partner into the
current canvas between warp segments, ``MixUp``, ``CutMix``), and it declares its plan fields
(:mod:`detaug.plan_layout`), plans them (:mod:`detaug.batch_plan` calls it) and adds its DALI
operators (:mod:`detaug.pipeline` calls it). Nothing about them is written anywhere else: the
recipe, the planner and the pipeline name none of these classes.

**Partners (the rule).** The partners of a sample are dataset positions drawn from the sample's
own random stream (:class:`detaug.seeds.SampleRandom` keyed by ``(seed, epoch, image_id)``):
the stream's first positions, one per partner, each uniform over ``range(len(source))`` (all
the dataset's positions, whatever the shard or the epoch order), then the blend's
(``MixUp``'s or ``CutMix``'s) apply-or-not draw. A partner whose image cannot be read or decoded is replaced by the next
position (``p + 1``, cyclically), named and counted as a skipped image. So a sample's partners,
like its parameters, depend on nothing but its key and the dataset: the same for any batch,
batch size, order, shard, worker count, random access (Keras ``seq[i]``) or device. A partner
may be the sample itself, or appear twice (as in ultralytics, which draws with replacement).

**Partners from the batch (``pool="batch"``, opt-in).** The rule above decodes every partner
image: a YOLO sample costs 4 decodes (4.1 with ``MixUp(p=0.1)``), so its output rate is about a
quarter of the decode limit. With ``pool="batch"`` a slot's partner is instead another sample of
the same batch (drawn from the same stream position, uniform over the batch's positions
``0 .. B - 1``, the sample itself included), and the pipeline decodes each image of the batch
once, in full, and reuses it for the tiles and the blend of its batch-mates (DALI's
``permute_batch``): one decode per sample, as ultralytics reuses the images of its buffer of
recently loaded ones. The price is the seed contract's independence from the batch: a sample's
partners then depend on its batch-mates, which are a pure function of ``(seed, epoch, rank,
batch index)`` (so epochs, resume, DDP ranks and a Keras ``seq[i]`` stay exact and repeatable),
but not of ``(seed, epoch, image_id)`` alone: another batch size, another shard layout or an
eager one-sample call (where the sample is its own partner) gives other partners. A skipped
image is replaced in the batch (by the sample rule) before partners are drawn, so partners are
always images that decoded. ``pool`` is set per transform; ``Mosaic`` and ``MixUp`` may differ.

Restrictions (checked by ``Compose``, :class:`~detaug.errors.RecipeError` otherwise):
``Mosaic`` is the first transform of its recipe (its tiles are whole source images, as in
YOLO); ``MixUp``, ``CutMix`` and ``CopyPaste`` follow transforms that fix the canvas size (``Mosaic``,
``Resize((h, w))``, ``LetterBox``, ``RandomResizedCrop``...); at most one ``Mosaic`` and one
blend (``MixUp``, ``CutMix`` or ``CopyPaste``).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Sequence

import numpy as np

from detaug.boxes import scale_matrix, translation_matrix
from detaug.decode_regions import aligned_roi, mosaic_window, tile_columns, whole_image
from detaug.plan import PlanState
from detaug.plan_layout import PlanFieldSpec
from detaug.seeds import SampleRandom
from detaug.transforms.base import Param, Transform, register
from detaug.transforms.schema import REQUIRED

__all__ = ["POOLS", "MixingTransform", "Mosaic", "MixUp", "CutMix", "CopyPaste"]

_FILL = Param("fill", "number", 114, "grey level (0-255) where no image is", low=0, high=255)
#: where partner images come from (the module docstring): "dataset" (the seed contract's rule) or "batch"
POOLS = ("dataset", "batch")
_POOL = Param("pool", "choice", "dataset", "where partners come from: 'dataset' (drawn over the dataset by the "
              "sample's key, each decoded) or 'batch' (other samples of the batch, decoded once; see "
              "docs/mixing.md)", choices=POOLS)


class MixingTransform(Transform):
    """A transform whose samples are made of several source images (see the module docstring).

    Its partner images fill *slots* of the sample (``slots``: their indices among the recipe's
    partner slots, ``Compose.mixing_slots``). A ``"canvas"`` stage implements
    :meth:`plan_canvas`, :meth:`canvas_values` and :meth:`dali_canvas`; a ``"blend"`` stage
    :meth:`plan_blend` and :meth:`dali_blend`. The DALI methods receive ``graph``, the
    pipeline's parts (:class:`detaug.pipeline.GraphParts`: ``value(field)``, ``decode(data,
    roi_field)``, ``warp(images, matrix_field, size_field, fill)``, ``partner(slot, own,
    roi_field)``, ``data``, ``on_gpu``).
    """

    kind: ClassVar[str] = "mixing"
    #: partner images per sample (besides the sample's own)
    partners: ClassVar[int] = 0
    #: ``"canvas"`` (composes the sample's first canvas from its images, in place of decoding
    #: the sample's image) or ``"blend"`` (blends its partners into the current canvas)
    stage: ClassVar[str] = ""
    #: its DALI operators run under a DALI conditional (``if`` on a DataNode)
    conditional: ClassVar[bool] = False
    #: it pastes objects by their masks: the recipe needs masks, and the planner updates the
    #: targets on the host (:meth:`paste_targets`) once the masks are moved
    pastes_masks: ClassVar[bool] = False

    def misplaced(self, index: int, before: Sequence[Transform], fixed: bool) -> str | None:
        """What is wrong with this transform at ``index`` of its recipe, after the transforms
        ``before`` (``fixed``: they fix the canvas size); ``None`` where it can be planned."""
        return None

    def draw_needed(self, rand: SampleRandom) -> np.ndarray:
        """bool ``[B, partners]``: which partners a sample needs, drawn (the same way for every
        sample) in the partner block after the partner positions (:func:`detaug.batch_plan.partner_block`).
        The default draws nothing: all of them."""
        return np.ones((rand.batch_size, self.partners), dtype=bool)

    def plan_fields(self) -> list[PlanFieldSpec]:
        """Its fields in the recipe's plan layout (:mod:`detaug.plan_layout`), in order."""
        return []

    def plan_canvas(self, state: PlanState, image_hw: np.ndarray, layers: np.ndarray,
                    apply: np.ndarray | None = None) -> Any:
        """Canvas stage: place the sample's image and its partners (``image_hw`` float64
        ``[B, 1 + partners, 2]``, layers ``[B, 1 + partners]`` of ``state``) on a new canvas
        (``state.start_canvas``, ``state.place_layers``); returns what :meth:`canvas_values` needs.
        ``apply`` (bool ``[B]``, :meth:`draw_needed`; ``None``: all): the samples it composes;
        the others' canvas shows their own image alone."""
        raise NotImplementedError

    def canvas_values(self, placed: Any, first: tuple[np.ndarray, np.ndarray] | None,
                      whole: Sequence[bool]) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Canvas stage: ``(its plan field values, origin [B, 2])``: what to decode and where to
        put it, for a first warp ``first`` (``(matrix [B, 3, 3], canvas_hw [B, 2])`` reading the
        canvas; ``None``: the whole canvas is the stage's output); ``whole[k]``: image ``k`` is
        decoded whole (shared by the batch). The composed part starts at ``origin`` (x, y) of
        the canvas: the first warp reads from there."""
        raise NotImplementedError

    def dali_canvas(self, graph: Any, slots: Sequence[int]) -> tuple[Any, Any]:
        """Canvas stage: ``(canvas images, the sample's own decoded image)`` in the DALI graph."""
        raise NotImplementedError

    def plan_blend(self, state: PlanState, apply: np.ndarray, partner_hw: np.ndarray, layers: np.ndarray,
                   whole: bool) -> dict[str, np.ndarray]:
        """Blend stage: place the partner (``partner_hw`` ``[B, 2]``, layers ``[B]`` of ``state``)
        on the current canvas for the samples of ``apply`` (``[B]`` bool, :meth:`draw_needed`);
        its plan field values (``whole``: the partner is decoded whole)."""
        raise NotImplementedError

    def dali_blend(self, graph: Any, images: Any, own: Any, slots: Sequence[int]) -> Any:
        """Blend stage: ``images`` with the partner blended in, in the DALI graph."""
        raise NotImplementedError


@register
class Mosaic(MixingTransform):
    """YOLO's mosaic: the sample's image and 3 partners as 2x2 tiles around a random centre (or 8, 3x3).

    As ultralytics' ``Mosaic(imgsz)``: the canvas is ``(2 h, 2 w)`` for ``size = (h, w)``; its
    centre ``(xc, yc)`` is drawn uniformly (whole pixels) in ``center`` times ``(w, h)`` (the
    default ``(0.5, 1.5)`` is ultralytics' ``border = -imgsz / 2``); each image is scaled (aspect
    kept, to whole pixels: ``min(ceil(W0 r), w)`` by ``min(ceil(H0 r), h)`` with
    ``r = min(h / H0, w / W0)``) and put in its quadrant with a corner at the centre: the
    sample's own image top-left (its bottom-right corner at the centre), then top-right,
    bottom-left, bottom-right. A tile is cut by the centre lines and the canvas border; ``fill``
    paints the rest. Boxes are clipped exactly to their tile's visible rectangle;
    ``min_size`` / ``min_visibility`` apply to the final boxes (visibility: the share of a box's
    area left, in its tile's scale).

    The transforms after it act on the ``(2 h, 2 w)`` canvas. ultralytics then crops the central
    ``(h, w)`` with a random affine about the centre (``RandomPerspective(border=-imgsz/2)``);
    here that is ``RandomAffine(scale=(2 s0, 2 s1), ...)`` followed by ``Resize((h, w))``: halving
    the canvas after an affine about its centre is the same geometry as ultralytics' crop with
    ``scale=(s0, s1)`` (see :func:`detaug.transforms.yolo_recipe`).

    ``grid=(3, 3)``: YOLOv5's 9-image mosaic (ultralytics' ``Mosaic(n=9)``) on the same
    ``(2 h, 2 w)`` canvas, 8 partners: a 3x3 grid of ``(h, w)`` cells around the sample's own
    image (:meth:`plan_tiles9`; the one simplification: each image sits in a cell of the grid,
    where ultralytics chains the images by their own sizes).

    Only the part of the canvas that the next warp reads is composed, and of each tile only the
    part it shows there is decoded.

    ``p`` (ultralytics' ``mosaic``): the probability of composing a mosaic. A sample without one
    gets its own image alone, scaled as a tile and letterboxed to ``size`` (ultralytics'
    ``LetterBox``: ``left = round((w - tw) / 2 - 0.1)``, ``top`` likewise), centred on the same
    ``(2 h, 2 w)`` canvas, ``fill`` around it: the transforms that follow turn it into
    ultralytics' non-mosaic sample (its affine about the centre of the letterboxed image). Its
    partners are not decoded (``pool="dataset"``) and none of their boxes is kept. ``p = 1``
    draws nothing and ``p = 0`` neither (a scheduled ``off_from_epoch`` keeps every other draw
    of the sample); ``0 < p < 1`` draws once per sample, in the partner block. The pipeline is
    the same for every ``p``.
    """

    schema = (
        Param("size", "size", REQUIRED, "output (height, width) of the YOLO recipe; the mosaic canvas is twice that"),
        Param("center", "range", (0.5, 1.5), "range of the centre, as a multiple of (width, height)", low=0, high=2),
        _FILL,
        _POOL,
        Param("grid", "size", (2, 2), "tiles (rows, columns): (2, 2) YOLO's mosaic, (3, 3) its 9-image mosaic "
              "(YOLOv5's mosaic9, ultralytics' Mosaic(n=9)); see docs/mixing.md", pair="rows, columns"),
        Param("p", "probability", 1.0, "probability of composing a mosaic; otherwise the sample's image alone, "
              "letterboxed to size in the canvas centre (ultralytics' mosaic; the 2x2 mosaic only)"),
    )
    partners = 3
    stage = "canvas"

    def setup(self) -> None:
        if self.grid not in ((2, 2), (3, 3)):
            raise self.error("grid", f"must be (2, 2) or (3, 3), got {list(self.grid)}")
        if self.grid == (3, 3) and min(self.size) < 2:
            raise self.error("size", "a 3x3 mosaic needs a size of at least 2 pixels each way")
        if self.grid == (3, 3) and self.p < 1.0:
            raise self.error("p", f"a 3x3 mosaic is always composed (p=1), got {self.p}: p < 1 is for grid=(2, 2)")
        self.partners = self.grid[0] * self.grid[1] - 1  # type: ignore[misc]  # per instance: 3 or 8

    def draw_needed(self, rand: SampleRandom) -> np.ndarray:
        if 0.0 < self.p < 1.0:
            apply = rand.random() < self.p
        else:  # no draw: a recipe written before p plans as it did
            apply = np.full(rand.batch_size, self.p > 0.0)
        return np.repeat(apply[:, None], self.partners, axis=1)

    def out_size(self, in_size: tuple[int, int] | None) -> tuple[int, int] | None:
        return 2 * self.size[0], 2 * self.size[1]

    def misplaced(self, index: int, before: Sequence[Transform], fixed: bool) -> str | None:
        if index != 0:
            return "must be the first transform of a recipe (its tiles are whole source images, as in YOLO)"
        return None

    def plan_fields(self) -> list[PlanFieldSpec]:
        specs: list[PlanFieldSpec] = []
        for k in range(1 + self.partners):
            specs += [(f"mosaic.tile{k}.roi", (4,), "float32", f"decode region (x, y, w, h) of tile {k}'s image"
                       + (" (the sample's own)" if k == 0 else "")),
                      (f"mosaic.tile{k}.matrix", (2, 3), "float32",
                       f"forward map of tile {k} from its decoded region to its part of the window"),
                      (f"mosaic.tile{k}.size", (2,), "float32", f"(h, w) of tile {k}'s part of the window")]
        return specs

    def plan_canvas(self, state: PlanState, image_hw: np.ndarray, layers: np.ndarray,
                    apply: np.ndarray | None = None) -> Any:
        if self.grid == (3, 3):  # always composed (setup)
            maps, rects, canvas, centre, far = self.plan_tiles9(state.rand, image_hw)
            alive = None
        else:
            maps, rects, canvas, centre = self.plan_tiles(state.rand, image_hw, apply)
            far = None
            alive = None if apply is None else np.concatenate([np.ones((len(apply), 1), bool),
                                                               np.repeat(apply[:, None], 3, axis=1)], axis=1).ravel()
        state.start_canvas(canvas)
        state.place_layers(layers.ravel(), maps.reshape(-1, 3, 3), rects.reshape(-1, 4), alive=alive)
        return image_hw, maps, rects, canvas, centre, far

    def canvas_values(self, placed: Any, first: tuple[np.ndarray, np.ndarray] | None,
                      whole: Sequence[bool]) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Only the window of the canvas that the first warp reads is composed (each tile's
        part of it decoded, :func:`detaug.decode_regions.tile_columns`)."""
        image_hw, maps, rects, canvas, centre, far = placed
        window = mosaic_window(canvas, centre, first, far)
        values = {}
        for k in range(1 + self.partners):
            roi, matrix, size = tile_columns(image_hw[:, k], maps[:, k], rects[:, k], window, whole=whole[k])
            values.update({f"mosaic.tile{k}.roi": roi, f"mosaic.tile{k}.matrix": matrix, f"mosaic.tile{k}.size": size})
        return values, window[:, :2]

    def dali_canvas(self, graph: Any, slots: Sequence[int]) -> tuple[Any, Any]:
        """Each tile's image, only the part its quadrant (3x3: its cell) shows of the window,
        placed on that quadrant (``fill`` elsewhere); the quadrants (cells), side by side, are
        the window."""
        from nvidia.dali import fn

        own = graph.decode(graph.data, "mosaic.tile0.roi")
        sources = [own] + [graph.partner(slot, own, f"mosaic.tile{k + 1}.roi") for k, slot in enumerate(slots)]
        quadrants = [graph.warp(src, f"mosaic.tile{k}.matrix", f"mosaic.tile{k}.size", self.fill)
                     for k, src in enumerate(sources)]
        if self.grid == (3, 3):
            rows = [fn.cat(*[quadrants[_CELLS9.index((r, c))] for c in range(3)], axis=1) for r in range(3)]
            return fn.cat(*rows, axis=0), own
        return fn.cat(fn.cat(quadrants[0], quadrants[1], axis=1), fn.cat(quadrants[2], quadrants[3], axis=1), axis=0), own

    def plan_tiles(self, rand: SampleRandom, tile_hw: np.ndarray,
                   apply: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Place the 4 tiles of every sample (2 draws per sample: the centre).

        Args:
            rand: the samples' streams.
            tile_hw: float64 ``[B, 4, 2]`` source ``(height, width)`` of each tile's image.
            apply: bool ``[B]``: the samples composed as a mosaic (``None``: all). The others
                get their own image letterboxed in the canvas centre (tile 0's quadrant: all
                but the last row and column of the canvas), and tiles 1-3 put a canvas size
                beyond it: the one-pixel strips left to their quadrants show ``fill`` only.

        Returns:
            ``(maps [B, 4, 3, 3], rects [B, 4, 4], canvas_hw [B, 2], centre [B, 2])``: each
            tile's forward map from its source to the canvas (scale and translation), its
            quadrant (xyxy, whole canvas pixels: what it may show), the canvas size, and the
            centre ``(xc, yc)``.
        """
        n = len(tile_hw)
        h, w = float(self.size[0]), float(self.size[1])
        u = rand.random(2)
        xc = np.clip(np.floor(w * (self.center[0] + (self.center[1] - self.center[0]) * u[:, 0])), 1, 2 * w - 1)
        yc = np.clip(np.floor(h * (self.center[0] + (self.center[1] - self.center[0]) * u[:, 1])), 1, 2 * h - 1)
        src_h, src_w = tile_hw[..., 0], tile_hw[..., 1]
        r = np.minimum(h / src_h, w / src_w)
        tw = np.maximum(np.minimum(np.ceil(src_w * r - 1e-9), w), 1)  # ultralytics: min(ceil(w0 r), imgsz)
        th = np.maximum(np.minimum(np.ceil(src_h * r - 1e-9), h), 1)
        left = np.stack([xc - tw[:, 0], xc, xc - tw[:, 2], xc], axis=1)  # [B, 4]
        top = np.stack([yc - th[:, 0], yc - th[:, 1], yc, yc], axis=1)
        maps = translation_matrix(left.ravel(), top.ravel()) @ scale_matrix((tw / src_w).ravel(), (th / src_h).ravel())
        zero = np.zeros(n)
        x_lo, x_hi = np.stack([zero, xc, zero, xc], 1), np.stack([xc, np.full(n, 2 * w), xc, np.full(n, 2 * w)], 1)
        y_lo, y_hi = np.stack([zero, zero, yc, yc], 1), np.stack([yc, yc, np.full(n, 2 * h), np.full(n, 2 * h)], 1)
        if apply is not None and not apply.all():
            off = ~apply
            xc, yc = np.where(off, 2 * w - 1, xc), np.where(off, 2 * h - 1, yc)
            letter_x = w / 2 + np.round((w - tw[:, 0]) / 2 - 0.1)  # ultralytics' LetterBox, centred
            letter_y = h / 2 + np.round((h - th[:, 0]) / 2 - 0.1)
            far_x, far_y = np.full(n, 4 * w), np.full(n, 4 * h)  # two tile widths beyond: no bilinear tap reaches
            left = np.where(off[:, None], np.stack([letter_x, far_x, np.zeros(n), far_x], 1), left)
            top = np.where(off[:, None], np.stack([letter_y, np.zeros(n), far_y, far_y], 1), top)
            maps = translation_matrix(left.ravel(), top.ravel()) @ scale_matrix((tw / src_w).ravel(), (th / src_h).ravel())
            x_lo, x_hi = np.stack([zero, xc, zero, xc], 1), np.stack([xc, np.full(n, 2 * w), xc, np.full(n, 2 * w)], 1)
            y_lo, y_hi = np.stack([zero, zero, yc, yc], 1), np.stack([yc, yc, np.full(n, 2 * h), np.full(n, 2 * h)], 1)
        rects = np.stack([x_lo, y_lo, x_hi, y_hi], axis=-1)
        canvas = np.tile([2 * h, 2 * w], (n, 1))
        return maps.reshape(n, 4, 3, 3), rects, canvas, np.stack([xc, yc], -1)

    def plan_tiles9(self, rand: SampleRandom,
                    tile_hw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Place the 9 tiles of every sample of a 3x3 mosaic (2 draws per sample: the centre cell).

        The canvas is ``(2 h, 2 w)``; a grid of 3x3 cells of ``(h, w)`` lies on it with the centre
        cell's top-left corner at ``(x0, y0)``, whole pixels drawn uniformly in
        ``center - 0.5`` times ``(w, h)`` (the default: ``[0, w)``, YOLOv5's mosaic9 offset
        ``uniform(0, s)``) and clipped to ``[1, w - 1]`` by ``[1, h - 1]`` (every cell shows at
        least a pixel). Each image is scaled as in the 2x2 mosaic and put in its cell against the
        centre (left column: right-aligned, right column: left-aligned, middle: centred, whole
        pixels down; rows likewise): the sample's own image in the centre cell, the partners in
        ultralytics' order: top, top-right, right, bottom-right, bottom, bottom-left, left,
        top-left (:data:`_CELLS9`). A tile shows its cell cut by the canvas border.

        Args:
            rand: the samples' streams.
            tile_hw: float64 ``[B, 9, 2]`` source ``(height, width)`` of each tile's image.

        Returns:
            ``(maps [B, 9, 3, 3], rects [B, 9, 4], canvas_hw [B, 2], near [B, 2], far [B, 2])``:
            as :meth:`plan_tiles`, the rectangles being the cells on the canvas, and the centre
            cell's top-left and bottom-right corners.
        """
        n = len(tile_hw)
        h, w = float(self.size[0]), float(self.size[1])
        u = rand.random(2)
        lo, hi = self.center
        x0 = np.clip(np.floor(w * (lo - 0.5 + (hi - lo) * u[:, 0])), 1, w - 1)
        y0 = np.clip(np.floor(h * (lo - 0.5 + (hi - lo) * u[:, 1])), 1, h - 1)
        src_h, src_w = tile_hw[..., 0], tile_hw[..., 1]
        r = np.minimum(h / src_h, w / src_w)
        tw = np.maximum(np.minimum(np.ceil(src_w * r - 1e-9), w), 1)
        th = np.maximum(np.minimum(np.ceil(src_h * r - 1e-9), h), 1)
        row = np.array([cell[0] for cell in _CELLS9], dtype=np.float64)  # [9]
        col = np.array([cell[1] for cell in _CELLS9], dtype=np.float64)
        cell_x = x0[:, None] + (col - 1) * w  # [B, 9] left edge of each tile's cell
        cell_y = y0[:, None] + (row - 1) * h
        left = cell_x + np.where(col == 0, w - tw, np.where(col == 2, 0.0, np.floor((w - tw) / 2)))
        top = cell_y + np.where(row == 0, h - th, np.where(row == 2, 0.0, np.floor((h - th) / 2)))
        maps = translation_matrix(left.ravel(), top.ravel()) @ scale_matrix((tw / src_w).ravel(), (th / src_h).ravel())
        rects = np.stack([np.clip(cell_x, 0, 2 * w), np.clip(cell_y, 0, 2 * h),
                          np.clip(cell_x + w, 0, 2 * w), np.clip(cell_y + h, 0, 2 * h)], axis=-1)
        canvas = np.tile([2 * h, 2 * w], (n, 1))
        return maps.reshape(n, 9, 3, 3), rects, canvas, np.stack([x0, y0], -1), np.stack([x0 + w, y0 + h], -1)


#: (row, column) of each tile of a 3x3 mosaic: the sample's own image in the centre, then its
#: partners in ultralytics' ``_mosaic9`` order (top, top-right, right, bottom-right, bottom,
#: bottom-left, left, top-left)
_CELLS9 = ((1, 1), (0, 1), (0, 2), (1, 2), (2, 2), (2, 1), (2, 0), (1, 0), (0, 0))


class BlendTransform(MixingTransform):
    """A ``"blend"`` stage with one partner a sample, run under a DALI conditional (on the samples
    it applies to only): the canvas keeps its size; it must follow a fixed canvas
    (:func:`_blend_misplaced`). ``MixUp``, ``CutMix`` and ``CopyPaste``."""

    partners = 1
    stage = "blend"
    conditional = True

    def out_size(self, in_size: tuple[int, int] | None) -> tuple[int, int] | None:
        return in_size

    def misplaced(self, index: int, before: Sequence[Transform], fixed: bool) -> str | None:
        return _blend_misplaced(before, fixed)


@register
class MixUp(BlendTransform):
    """Blend the sample with a partner image, keeping the boxes of both (YOLOX / ultralytics MixUp).

    With probability ``p`` a partner image (see the module docstring) is letterboxed into the
    current canvas (fit keeping its aspect ratio, times a factor drawn from ``scale``, at a
    uniformly drawn whole-pixel offset; a factor above 1 crops it), the uncovered area painted
    with ``fill``, and the two are blended: ``r * sample + (1 - r) * partner`` with ``r`` drawn
    from ``Beta(alpha, alpha)`` (ultralytics: ``alpha = 32``: ``r`` near 0.5). The partner's boxes
    are added to the sample's (clipped to the canvas when it is cropped) and both go through the
    transforms that follow. The canvas size before ``MixUp`` must be fixed by the recipe.

    The partner is one image placed by a letterbox, as in YOLOX, not a second mosaic as in
    ultralytics (which costs four more decodes per sample).
    """

    schema = (
        Param("p", "probability", 0.5, "probability of blending a sample with a partner"),
        Param("alpha", "number", 32.0, "the blend ratio is drawn from Beta(alpha, alpha)", low=1e-3, high=1e4),
        Param("scale", "range", (1.0, 1.0), "factor range on the partner's letterbox size", low=1e-3),
        _FILL,
        _POOL,
    )

    def setup(self) -> None:
        self._grid, self._cdf = _beta_table(self.alpha, self.alpha)

    def draw_needed(self, rand: SampleRandom) -> np.ndarray:
        return self.draw_apply(rand)[:, None]

    def plan_fields(self) -> list[PlanFieldSpec]:
        return [("mixup.roi", (4,), "float32", "decode region (x, y, w, h) of the partner"),
                ("mixup.matrix", (2, 3), "float32", "forward map of the partner from its region to the canvas"),
                ("mixup.size", (2,), "float32", "(h, w) of the canvas the partner is placed on"),
                ("mixup.ratio", (), "float32", "the sample's weight r of the blend (1: not blended)")]

    def plan_blend(self, state: PlanState, apply: np.ndarray, partner_hw: np.ndarray, layers: np.ndarray,
                   whole: bool) -> dict[str, np.ndarray]:
        n = state.batch_size
        canvas = state.canvas_hw
        m, ratio = self.plan_partner(state.rand, apply, canvas, partner_hw)
        rects = np.stack([np.zeros(n), np.zeros(n), canvas[:, 1], canvas[:, 0]], axis=1)
        state.place_layers(layers, m, rects, alive=apply)
        roi = whole_image(partner_hw) if whole else aligned_roi(partner_hw, m, rects)
        return {"mixup.roi": roi, "mixup.matrix": (m @ translation_matrix(roi[:, 0], roi[:, 1]))[:, :2, :],
                "mixup.size": canvas, "mixup.ratio": ratio}

    def dali_blend(self, graph: Any, images: Any, own: Any, slots: Sequence[int]) -> Any:
        """``r * images + (1 - r) * partner``, the partner placed on the canvas, for the samples
        it applies to (``r < 1``); DALI's conditional runs the warp and the blend on those only
        (the partner is taken from the whole batch first: ``permute_batch`` indexes the whole
        batch)."""
        from nvidia.dali import fn, types

        mate = graph.partner(slots[0], own, "mixup.roi")
        r = graph.value("mixup.ratio")
        if r < 1.0:
            partner_image = graph.warp(mate, "mixup.matrix", "mixup.size", self.fill)
            weight = r.gpu() if graph.on_gpu else r
            images = fn.cast(images * weight + partner_image * (1.0 - weight), dtype=types.UINT8)
        return images

    def draw_apply(self, rand: SampleRandom) -> np.ndarray:
        """bool ``[B]``: which samples are blended (one draw per sample, in the partner block)."""
        return rand.random() < self.p

    def plan_partner(self, rand: SampleRandom, apply: np.ndarray, canvas_hw: np.ndarray,
                     partner_hw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Place the partner (4 draws per sample: ratio, scale, offset x and y).

        Returns ``(map [B, 3, 3], ratio [B])``: the partner's forward map (scale and translation)
        to the canvas, and the sample's weight ``r`` (1 where ``apply`` is false).
        """
        u = rand.random(4)
        ratio = np.interp(u[:, 0], self._cdf, self._grid)
        ratio = np.where(apply, ratio, 1.0)
        h, w = canvas_hw[:, 0], canvas_hw[:, 1]
        ph, pw = partner_hw[:, 0], partner_hw[:, 1]
        s = np.minimum(h / ph, w / pw) * (self.scale[0] + (self.scale[1] - self.scale[0]) * u[:, 1])
        ih, iw = np.maximum(np.floor(ph * s + 0.5), 1), np.maximum(np.floor(pw * s + 0.5), 1)
        ox = np.minimum(0, w - iw) + np.floor(u[:, 2] * (np.abs(w - iw) + 1))
        oy = np.minimum(0, h - ih) + np.floor(u[:, 3] * (np.abs(h - ih) + 1))
        ox, oy = np.minimum(ox, np.maximum(0, w - iw)), np.minimum(oy, np.maximum(0, h - ih))
        return translation_matrix(ox, oy) @ scale_matrix(iw / pw, ih / ph), ratio


@register
class CutMix(BlendTransform):
    """Paste a rectangle of a partner image into the sample at the same place (CutMix, for boxes).

    With probability ``p`` a partner image (see the module docstring) is resized to the current
    canvas (stretched: a point at the same relative place of both), and a rectangle of it is
    pasted over the sample, as torchvision's ``v2.CutMix`` cuts it: ``lam ~ Beta(alpha, alpha)``,
    a centre ``(rx, ry)`` uniform in whole pixels, half-sides ``int(0.5 sqrt(1 - lam) W)`` by
    ``int(0.5 sqrt(1 - lam) H)``, clipped by the canvas. Boxes (the detection rule; torchvision's
    is classification-only): the sample's boxes lose the pasted rectangle (each becomes the
    bounding box of what is left of it, dropped where nothing is, its visibility the share left,
    so ``min_visibility`` applies: :meth:`detaug.plan.PlanState.occlude`), the partner's boxes are
    clipped to the rectangle; the boxes and labels of both are kept, as ``MixUp`` keeps them. The
    canvas size before ``CutMix`` must be fixed by the recipe; a recipe blends once (``MixUp``,
    ``CutMix`` or ``CopyPaste``).
    """

    schema = (
        Param("p", "probability", 0.5, "probability of pasting a partner's rectangle into a sample"),
        Param("alpha", "number", 1.0, "the sample's kept share of the area, lam, is drawn from Beta(alpha, alpha) "
              "(torchvision's CutMix)", low=1e-3, high=1e4),
        Param("fill", "number", 114, "grey level (0-255) the partner's warp reads beyond its image's edge "
              "(its outer half pixel)", low=0, high=255),
        _POOL,
    )

    def setup(self) -> None:
        self._grid, self._cdf = _beta_table(self.alpha, self.alpha)

    def draw_needed(self, rand: SampleRandom) -> np.ndarray:
        return (rand.random() < self.p)[:, None]

    def plan_fields(self) -> list[PlanFieldSpec]:
        return [("cutmix.roi", (4,), "float32", "decode region (x, y, w, h) of the partner"),
                ("cutmix.matrix", (2, 3), "float32",
                 "forward map of the partner from its region to the pasted rectangle"),
                ("cutmix.size", (2,), "float32", "(h, w) of the pasted rectangle (1 x 1 where not applied)"),
                ("cutmix.corner", (2,), "float32", "(y, x) of the pasted rectangle's top-left corner on the canvas"),
                ("cutmix.canvas", (2,), "float32", "(h, w) of the canvas pasted on"),
                ("cutmix.applied", (), "int32", "1 where a rectangle is pasted, 0 elsewhere")]

    def plan_blend(self, state: PlanState, apply: np.ndarray, partner_hw: np.ndarray, layers: np.ndarray,
                   whole: bool) -> dict[str, np.ndarray]:
        canvas = state.canvas_hw
        m, rect = self.plan_rectangle(state.rand, apply, canvas, partner_hw)
        applied = (rect[:, 2:] > rect[:, :2]).all(axis=1)
        state.occlude(rect, ~np.isin(state.box_layer, layers))  # the sample's boxes under the paste
        state.place_layers(layers, m, rect, alive=applied)  # the partner's, clipped to it
        roi = whole_image(partner_hw) if whole else aligned_roi(partner_hw, m, rect)
        local = translation_matrix(-rect[:, 0], -rect[:, 1]) @ m @ translation_matrix(roi[:, 0], roi[:, 1])
        size = np.where(applied[:, None], np.stack([rect[:, 3] - rect[:, 1], rect[:, 2] - rect[:, 0]], 1), 1.0)
        return {"cutmix.roi": roi, "cutmix.matrix": local[:, :2, :], "cutmix.size": size,
                "cutmix.corner": rect[:, [1, 0]], "cutmix.canvas": canvas, "cutmix.applied": applied.astype(np.int32)}

    def dali_blend(self, graph: Any, images: Any, own: Any, slots: Sequence[int]) -> Any:
        """The partner's rectangle warped to its size, padded with zeros to the canvas at its
        place (``fn.slice``, ``out_of_bounds_policy="pad"``), added to the sample with that
        rectangle erased (``fn.erase``); DALI's conditional runs it on the samples it applies to."""
        from nvidia.dali import fn, types

        mate = graph.partner(slots[0], own, "cutmix.roi")
        applied = graph.value("cutmix.applied")
        if applied > 0:
            patch = graph.warp(mate, "cutmix.matrix", "cutmix.size", self.fill)
            corner, size = graph.value("cutmix.corner"), graph.value("cutmix.size")
            placed = fn.slice(patch, -corner, graph.value("cutmix.canvas"), axes=[0, 1], normalized_anchor=False,
                              normalized_shape=False, out_of_bounds_policy="pad", fill_values=0)
            erased = fn.erase(images, anchor=corner, shape=size, axes=[0, 1], fill_value=0, normalized_anchor=False,
                              normalized_shape=False)
            images = fn.cast(erased + placed, dtype=types.UINT8)
        return images

    def plan_rectangle(self, rand: SampleRandom, apply: np.ndarray, canvas_hw: np.ndarray,
                       partner_hw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The partner's map and the pasted rectangle (3 draws per sample: ``lam``, ``rx``, ``ry``).

        Returns ``(map [B, 3, 3], rect [B, 4])``: the partner's forward map to the canvas (a
        stretch to its size) and the rectangle pasted (xyxy, whole canvas pixels; all zeros
        where not applied or empty).
        """
        u = rand.random(3)
        lam = np.interp(u[:, 0], self._cdf, self._grid)
        h, w = canvas_hw[:, 0], canvas_hw[:, 1]
        rx, ry = np.minimum(np.floor(u[:, 1] * w), w - 1), np.minimum(np.floor(u[:, 2] * h), h - 1)
        r = 0.5 * np.sqrt(np.clip(1.0 - lam, 0.0, 1.0))
        half_w, half_h = np.floor(r * w), np.floor(r * h)
        rect = np.stack([np.maximum(rx - half_w, 0), np.maximum(ry - half_h, 0),
                         np.minimum(rx + half_w, w), np.minimum(ry + half_h, h)], axis=1)
        on = apply & (rect[:, 2:] > rect[:, :2]).all(axis=1)
        rect = np.where(on[:, None], rect, 0.0)
        return scale_matrix(w / partner_hw[:, 1], h / partner_hw[:, 0]), rect


@register
class CopyPaste(BlendTransform):
    """Paste some of a partner's objects, by their masks, onto the sample (Simple Copy-Paste,
    Ghiasi et al. 2021; MMDetection's ``CopyPaste``).

    With probability ``p`` a partner image (see the module docstring) is resized to the current
    canvas (stretched, as ``CutMix`` places it: the objects keep their place relative to the
    image) and a random subset of its objects is pasted: ``ceil(fraction * n)`` of its ``n``
    objects, at most ``max_objects`` (``None``: no limit), chosen uniformly without replacement
    (one draw per sample, in the recipe's order, seeds the choice). The pasted objects lie on
    top: each of the sample's objects loses the pixels of its mask under the pasted masks, its
    box becomes the bounds of what is left of its mask (within its box), and it is dropped where
    less than ``min_visibility`` of its mask's area is left (or nothing); the pasted objects'
    boxes, labels and masks are added. Objects are pasted by their masks, so the recipe's source
    must carry masks (:class:`~detaug.errors.RecipeError` otherwise).

    Pixels: the partner is warped to the canvas (bilinear) and taken where the sample's *paste
    mask* is 1: uint8 ``[H, W, 1]``, the union of the chosen objects' masks moved to the canvas
    (nearest), built on the host by the planner (:meth:`paste_image`) and fed to the pipeline as
    one more input (``PlannedBatch.pasted``), the same on the CPU and the GPU. Targets: updated
    on the host once the masks are moved to the output canvas (:meth:`paste_targets`), so the
    occlusion is decided on the output's pixels, by the pasted objects kept in the output (a
    pasted object dropped later, by a crop or ``min_size``, still covers the others' pixels in
    the image, not in their masks). Keypoints and rotated boxes of an occluded object are not
    changed. The canvas size before ``CopyPaste`` must be fixed by the recipe; a recipe blends
    once (``MixUp``, ``CutMix`` or ``CopyPaste``).
    """

    schema = (
        Param("p", "probability", 0.5, "probability of pasting a partner's objects onto a sample"),
        Param("fraction", "probability", 1.0, "share of the partner's objects pasted (rounded up)"),
        Param("max_objects", "int", None, "most objects pasted per sample (None: no limit)", low=0, optional=True),
        Param("min_visibility", "probability", 0.0, "a sample's object is dropped where less than this share of "
              "its mask's area is left uncovered by the pasted masks (and where nothing is)"),
        Param("fill", "number", 114, "grey level (0-255) the partner's warp reads beyond its image's edge",
              low=0, high=255),
        _POOL,
    )
    pastes_masks = True

    def draw_needed(self, rand: SampleRandom) -> np.ndarray:
        return (rand.random() < self.p)[:, None]

    def plan_fields(self) -> list[PlanFieldSpec]:
        return [("copypaste.roi", (4,), "float32", "decode region (x, y, w, h) of the partner"),
                ("copypaste.matrix", (2, 3), "float32", "forward map of the partner from its region to the canvas"),
                ("copypaste.size", (2,), "float32", "(h, w) of the canvas the partner is placed on"),
                ("copypaste.applied", (), "int32", "1 where the partner's objects are pasted, 0 elsewhere"),
                ("copypaste.choice", (), "float32", "the draw in [0, 1) that chooses the objects pasted")]

    def plan_blend(self, state: PlanState, apply: np.ndarray, partner_hw: np.ndarray, layers: np.ndarray,
                   whole: bool) -> dict[str, np.ndarray]:
        n, canvas = state.batch_size, state.canvas_hw
        # seeds the choice of objects (always drawn: one draw per sample), as the plan carries it
        u = state.rand.random().astype(np.float32).astype(np.float64)
        m = scale_matrix(canvas[:, 1] / partner_hw[:, 1], canvas[:, 0] / partner_hw[:, 0])
        rects = np.stack([np.zeros(n), np.zeros(n), canvas[:, 1], canvas[:, 0]], axis=1)
        state.place_layers(layers, m, rects, alive=apply)
        for i in np.flatnonzero(apply):
            rows = np.flatnonzero(state.box_layer == layers[i])
            state.alive[rows[~self.choose(u[i], len(rows))]] = False
        roi = whole_image(partner_hw) if whole else aligned_roi(partner_hw, m, rects)
        return {"copypaste.roi": roi, "copypaste.matrix": (m @ translation_matrix(roi[:, 0], roi[:, 1]))[:, :2, :],
                "copypaste.size": canvas, "copypaste.applied": np.asarray(apply, dtype=np.int32), "copypaste.choice": u}

    def paste_image(self, masks: Sequence[np.ndarray], partner_hw: Sequence[float], canvas_hw: Sequence[float],
                    choice: float, applied: bool) -> np.ndarray:
        """uint8 ``[H, W, 1]``: where the pixels of the partner's chosen objects land on the
        canvas ``(H, W)`` pasted on (1) or not (0), for one sample; ``masks``: the partner's
        objects' masks (uint8 ``[h, w]`` each, its image's frame), all of them, in order;
        ``choice``, ``applied``: the sample's plan fields. Each chosen mask is moved by the
        partner's stretch to the canvas (:func:`detaug.masks.warp_mask`, nearest): the same
        pixels as its moved mask there. ``[1, 1, 1]`` zeros where nothing is pasted."""
        from detaug.masks import warp_mask

        h, w = int(canvas_hw[0]), int(canvas_hw[1])
        if not applied or not len(masks):
            return np.zeros((1, 1, 1), dtype=np.uint8)
        m = scale_matrix(w / float(partner_hw[1]), h / float(partner_hw[0]))
        m = m[0] if m.ndim == 3 else m
        out = np.zeros((h, w), dtype=np.uint8)
        for k in np.flatnonzero(self.choose(choice, len(masks))):
            out |= warp_mask(masks[k], m, (h, w))
        return out[:, :, None]

    def choose(self, u: float, count: int) -> np.ndarray:
        """bool ``[count]``: which of a partner's ``count`` objects are pasted, for the sample's
        draw ``u`` in ``[0, 1)``: ``min(ceil(fraction * count), max_objects)`` of them, uniformly
        without replacement (NumPy's PCG64 seeded by ``u``: the same on every machine)."""
        k = min(math.ceil(self.fraction * count - 1e-9), count)
        if self.max_objects is not None:
            k = min(k, int(self.max_objects))
        out = np.zeros(count, dtype=bool)
        if k > 0:
            order = np.random.default_rng(int(u * 2.0 ** 53)).permutation(count)
            out[order[:k]] = True
        return out

    def paste_targets(self, boxes: np.ndarray, masks: np.ndarray,
                      pasted: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One output sample's targets after the paste (:func:`detaug.masks.paste_over` with
        this transform's ``min_visibility``): ``(keep bool [N], boxes [N, 4], masks [N, H, W])``
        for its boxes ``[N, 4]`` xyxy and moved masks uint8 ``[N, H, W]``, ``pasted`` bool ``[N]``
        marking the pasted objects."""
        from detaug.masks import paste_over

        return paste_over(boxes, masks, pasted, self.min_visibility)

    def dali_blend(self, graph: Any, images: Any, own: Any, slots: Sequence[int]) -> Any:
        """The partner warped to the canvas, its pixels taken where the sample's paste mask
        (:meth:`paste_image`, the pipeline's ``graph.pasted`` input) is 1:
        ``images * (1 - a) + partner * a``; DALI's conditional runs it on the samples it applies to."""
        from nvidia.dali import fn, types

        mate = graph.partner(slots[0], own, "copypaste.roi")
        applied = graph.value("copypaste.applied")
        if applied > 0:
            partner_image = graph.warp(mate, "copypaste.matrix", "copypaste.size", self.fill)
            a = graph.pasted.gpu() if graph.on_gpu else graph.pasted
            a = fn.cast(a, dtype=types.UINT8)
            images = fn.cast(images * (1 - a) + partner_image * a, dtype=types.UINT8)
        return images


def _blend_misplaced(before: Sequence[Transform], fixed: bool) -> str | None:
    """What keeps a blend stage (``MixUp``, ``CutMix``) from being planned after ``before``."""
    if any(getattr(u, "stage", None) == "blend" for u in before):
        return "a recipe may blend only once (one MixUp, CutMix or CopyPaste)"
    if not fixed:
        return ("needs a fixed canvas size before it: put Mosaic, Resize((h, w)), LetterBox "
                "or another transform with a fixed output size earlier")
    return None


def _beta_table(a: float, b: float, points: int = 4097) -> tuple[np.ndarray, np.ndarray]:
    """``(x [points], cdf [points])``: the ``Beta(a, b)`` distribution function on a regular grid
    of ``[0, 1]`` (regularised incomplete beta function by its continued fraction, Numerical
    Recipes' ``betai``), to draw by inversion (``np.interp(u, cdf, x)``): pure NumPy, the same
    numbers on every machine."""
    x = np.linspace(0.0, 1.0, points)
    inner = x[1:-1]
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * np.log(inner) + b * np.log1p(-inner)
    front = np.exp(log_front)
    low = inner < (a + 1) / (a + b + 2)
    cdf_inner = np.where(low, front * _betacf(a, b, inner) / a, 1.0 - front * _betacf(b, a, 1.0 - inner) / b)
    cdf = np.concatenate([[0.0], np.clip(cdf_inner, 0.0, 1.0), [1.0]])
    return x, np.maximum.accumulate(cdf)


def _betacf(a: float, b: float, x: np.ndarray, iterations: int = 300) -> np.ndarray:
    """The continued fraction of the incomplete beta function (modified Lentz), vectorised."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c = np.ones_like(x)
    d = 1.0 - qab * x / qap
    d = 1.0 / np.where(np.abs(d) < tiny, tiny, d)
    h = d.copy()
    for m in range(1, iterations + 1):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / np.where(np.abs(d) < tiny, tiny, d)
            c = 1.0 + aa / c
            c = np.where(np.abs(c) < tiny, tiny, c)
            h = h * d * c
    return h
