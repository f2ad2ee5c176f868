"""``Mosaic``: YOLO's 2x2 or 3x3 tiles, the sample's image and its partners composing its first canvas
(a ``"canvas"`` stage of the mixing kind; the partners' rule is :mod:`detaug.transforms.mixing`'s)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from detaug.boxes import scale_matrix, translation_matrix
from detaug.decode_regions import mosaic_window, tile_columns
from detaug.plan import PlanState
from detaug.plan_layout import PlanFieldSpec
from detaug.seeds import SampleRandom
from detaug.transforms.base import Param, Transform, register
from detaug.transforms.mixing import _FILL, _POOL, MixingTransform
from detaug.transforms.schema import REQUIRED

__all__ = ["Mosaic"]


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
