"""Samples made of several images: ``Mosaic`` (YOLO's 2x2 tiles) and ``MixUp`` (two images blended).

Kind ``"mixing"``: a mixing transform names how many *partner* images a sample needs
(``partners``) and places each on the sample's canvas with an axis-aligned matrix (scale and
translation) and a visible rectangle; ``Compose`` plans them with the sample's other transforms
and :mod:`detaug.pipeline` renders them. Nothing about them is written anywhere else.

**Partners (the rule).** The partners of a sample are dataset positions drawn from the sample's
own random stream (:class:`detaug.seeds.SampleRandom` keyed by ``(seed, epoch, image_id)``):
the stream's first positions, one per partner, each uniform over ``range(len(source))`` (all
the dataset's positions, whatever the shard or the epoch order), then ``MixUp``'s
apply-or-not draw. A partner whose image cannot be read or decoded is replaced by the next
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
YOLO); ``MixUp`` follows transforms that fix the canvas size (``Mosaic``, ``Resize((h, w))``,
``LetterBox``, ``RandomResizedCrop``...); at most one of each.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from detaug.boxes import scale_matrix, translation_matrix
from detaug.seeds import SampleRandom
from detaug.transforms.base import Param, Transform, register
from detaug.transforms.schema import REQUIRED

__all__ = ["POOLS", "MixingTransform", "Mosaic", "MixUp"]

_FILL = Param("fill", "number", 114, "grey level (0-255) where no image is", low=0, high=255)
#: where partner images come from (the module docstring): "dataset" (the seed contract's rule) or "batch"
POOLS = ("dataset", "batch")
_POOL = Param("pool", "choice", "dataset", "where partners come from: 'dataset' (drawn over the dataset by the "
              "sample's key, each decoded) or 'batch' (other samples of the batch, decoded once; see "
              "docs/mixing.md)", choices=POOLS)


class MixingTransform(Transform):
    """A transform whose samples are made of several source images (see the module docstring)."""

    kind: ClassVar[str] = "mixing"
    #: partner images per sample (besides the sample's own)
    partners: ClassVar[int] = 0


@register
class Mosaic(MixingTransform):
    """YOLO's mosaic: the sample's image and 3 partners as 2x2 tiles around a random centre.

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

    Only the part of the canvas that the next warp reads is composed, and of each tile only the
    part it shows there is decoded.
    """

    schema = (
        Param("size", "size", REQUIRED, "output (height, width) of the YOLO recipe; the mosaic canvas is twice that"),
        Param("center", "range", (0.5, 1.5), "range of the centre, as a multiple of (width, height)", low=0, high=2),
        _FILL,
        _POOL,
    )
    partners = 3

    def out_size(self, in_size: tuple[int, int] | None) -> tuple[int, int] | None:
        return 2 * self.size[0], 2 * self.size[1]

    def plan_tiles(self, rand: SampleRandom, tile_hw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Place the 4 tiles of every sample (2 draws per sample: the centre).

        Args:
            rand: the samples' streams.
            tile_hw: float64 ``[B, 4, 2]`` source ``(height, width)`` of each tile's image.

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
        rects = np.stack([x_lo, y_lo, x_hi, y_hi], axis=-1)
        canvas = np.tile([2 * h, 2 * w], (n, 1))
        return maps.reshape(n, 4, 3, 3), rects, canvas, np.stack([xc, yc], -1)


@register
class MixUp(MixingTransform):
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
    partners = 1

    def setup(self) -> None:
        self._grid, self._cdf = _beta_table(self.alpha, self.alpha)

    def out_size(self, in_size: tuple[int, int] | None) -> tuple[int, int] | None:
        return in_size

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
