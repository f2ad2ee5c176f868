"""``MixUp`` (a partner image blended in by a Beta-drawn ratio) and ``CutMix`` (a Beta-sized rectangle
of a partner pasted in): ``"blend"`` stages of the mixing kind (the partners' rule is
:mod:`detaug.transforms.mixing`'s), and the Beta distribution they draw from."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from detaug.boxes import scale_matrix, translation_matrix
from detaug.decode_regions import aligned_roi, whole_image
from detaug.plan import PlanState
from detaug.plan_layout import PlanFieldSpec
from detaug.seeds import SampleRandom
from detaug.transforms.base import Param, register
from detaug.transforms.mixing import _FILL, _POOL, BlendTransform

__all__ = ["MixUp", "CutMix"]


@register
class MixUp(BlendTransform):
    """Blend the sample with a partner image, keeping the boxes of both (YOLOX / ultralytics MixUp).

    With probability ``p`` a partner image (see :mod:`detaug.transforms.mixing`) is letterboxed into the
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

    With probability ``p`` a partner image (see :mod:`detaug.transforms.mixing`) is resized to the current
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
