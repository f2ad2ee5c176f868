"""Erasing: paint rectangles of the output image (``RandomErasing``, ``CoarseDropout``).

Pixels only, but the painted rectangles hide parts of objects: each transform reports them
(:meth:`~detaug.transforms.base.PhotometricTransform.hidden_regions`) and ``Compose`` lowers every
box's visibility by the share of it they cover, so that the recipe's ``min_visibility`` drops boxes
mostly erased, as it drops boxes mostly cropped away. The rectangles are planned on the host in
whole output pixels (their size depends on the output canvas: see ``plan_on``) and painted by one
DALI ``erase`` per transform.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from detaug.seeds import SampleRandom
from detaug.transforms.base import Param, PhotometricTransform, register

__all__ = ["RandomErasing", "CoarseDropout"]

_VALUE_DOC = "grey level (0-255), or [r, g, b], painted over the rectangle"


class _Erasing(PhotometricTransform):
    """Rectangles as parameters ``(top, left, height, width)`` per rectangle, whole output pixels;
    height and width 0 for none (the neutral values)."""

    def plan(self, rand: SampleRandom) -> list[np.ndarray]:
        raise RuntimeError(f"{type(self).__name__} plans on the output canvas: call plan_on(rand, canvas_hw)")

    def rectangles(self, params: list[np.ndarray]) -> np.ndarray:
        """``[B, R, 4]`` float64 ``(top, left, height, width)`` from the planned parameters."""
        return np.stack([np.asarray(p, dtype=np.float64) for p in params], axis=1).reshape(len(params[0]), -1, 4)

    def hidden_regions(self, params: list[np.ndarray], canvas_hw: np.ndarray) -> np.ndarray | None:
        r = self.rectangles(params)
        top, left, h, w = r[..., 0], r[..., 1], r[..., 2], r[..., 3]
        return np.stack([left, top, left + w, top + h], axis=-1)

    def dali(self, images: Any, params: list[Any]) -> Any:
        from nvidia.dali import fn

        anchors = [x for k in range(0, len(params), 4) for x in params[k:k + 2]]
        shapes = [x for k in range(0, len(params), 4) for x in params[k + 2:k + 4]]
        value = self.value if len(self.value) > 1 else self.value[0]
        return fn.erase(images, anchor=fn.stack(*anchors), shape=fn.stack(*shapes), axis_names="HW",
                        fill_value=value, normalized=False)


@register
class RandomErasing(_Erasing):
    """Erase one random rectangle with probability ``p`` (torchvision ``RandomErasing``; Zhong et
    al., "Random Erasing Data Augmentation").

    As torchvision: up to 10 tries draw an area ``scale * H * W`` and an aspect ratio
    ``height / width`` log-uniform in ``ratio``; the first whose rounded size fits (``h < H`` and
    ``w < W``) is placed uniformly; none fitting: nothing is erased. ``value``: a grey level, or
    ``[r, g, b]``, on the 0-255 scale of the uint8 image (torchvision's ``value="random"``,
    per-pixel noise, is not offered). Boxes: see :mod:`detaug.transforms.erasing`.
    """

    schema = (
        Param("p", "probability", 0.5, "probability of erasing a rectangle of a sample"),
        Param("scale", "range", (0.02, 0.33), "erased area as a fraction of the image area", low=0, high=1),
        Param("ratio", "range", (0.3, 3.3), "aspect ratio (height / width) of the rectangle, log-uniform", low=1e-6),
        Param("value", "values", 0, _VALUE_DOC, lengths=(3,), low=0, high=255),
    )
    param_names = ("top", "left", "height", "width")
    neutral = (0.0, 0.0, 0.0, 0.0)

    def plan_on(self, rand: SampleRandom, canvas_hw: np.ndarray | None) -> list[np.ndarray]:
        if canvas_hw is None:
            return self.plan(rand)
        tries = 10
        apply = rand.random() < self.p
        area_share = rand.uniform(*self.scale, tries)
        log_ratio = rand.uniform(math.log(self.ratio[0]), math.log(self.ratio[1]), tries)
        pos = rand.random((tries, 2))
        img_h, img_w = canvas_hw[:, 0:1], canvas_hw[:, 1:2]
        area = img_h * img_w * area_share
        h = np.round(np.sqrt(area * np.exp(log_ratio)))  # np.round: half to even, as Python's round
        w = np.round(np.sqrt(area / np.exp(log_ratio)))
        fits = (h < img_h) & (w < img_w)
        k = fits.argmax(axis=1)
        rows = np.arange(len(k))
        h, w, pos = h[rows, k], w[rows, k], pos[rows, k]
        erase = apply & fits.any(axis=1)
        top = np.floor(pos[:, 0] * (img_h[:, 0] - h + 1))
        left = np.floor(pos[:, 1] * (img_w[:, 0] - w + 1))
        out = [np.where(erase, x, 0.0) for x in (top, left, h, w)]
        return [x.astype(np.float32) for x in out]


@register
class CoarseDropout(_Erasing):
    """Erase several random rectangles ("holes") with probability ``p`` (albumentations
    ``CoarseDropout``, its 2.x arguments; sizes as fractions of the image side only).

    The number of holes is drawn uniformly in ``num_holes_range`` (inclusive); each hole's height
    is ``max(1, ceil(H * U(hole_height_range)))``, its width likewise, its position uniform
    inside the image. Holes may overlap. Boxes: see :mod:`detaug.transforms.erasing` (overlapping
    holes count twice when a box's hidden share is summed: never kept for being hidden twice).
    """

    schema = (
        Param("num_holes_range", "range", (1, 2), "number of holes [min, max] (integers)", low=0, high=64),
        Param("hole_height_range", "range", (0.1, 0.2), "hole height as a fraction of the image height", low=0, high=1),
        Param("hole_width_range", "range", (0.1, 0.2), "hole width as a fraction of the image width", low=0, high=1),
        Param("fill", "values", 0, _VALUE_DOC, lengths=(3,), low=0, high=255),
        Param("p", "probability", 0.5, "probability of erasing holes of a sample"),
    )

    def setup(self) -> None:
        lo, hi = self.num_holes_range
        if lo != int(lo) or hi != int(hi) or hi < 1:
            raise self.error("num_holes_range", f"expected integers [min, max] with max >= 1, got {[lo, hi]!r}")
        self.num_holes_range = (int(lo), int(hi))
        self.value = self.fill
        self.param_names = tuple(f"hole{r}_{x}" for r in range(int(hi)) for x in ("top", "left", "height", "width"))
        self.neutral = (0.0,) * len(self.param_names)

    def plan_on(self, rand: SampleRandom, canvas_hw: np.ndarray | None) -> list[np.ndarray]:
        if canvas_hw is None:
            return self.plan(rand)
        lo, hi = self.num_holes_range
        apply = rand.random() < self.p
        count = lo + rand.integers(hi - lo + 1)
        img_h, img_w = canvas_hw[:, 0:1], canvas_hw[:, 1:2]
        h = np.minimum(np.maximum(1.0, np.ceil(img_h * rand.uniform(*self.hole_height_range, hi))), img_h)
        w = np.minimum(np.maximum(1.0, np.ceil(img_w * rand.uniform(*self.hole_width_range, hi))), img_w)
        pos = rand.random((hi, 2))
        top = np.floor(pos[..., 0] * (img_h - h + 1))
        left = np.floor(pos[..., 1] * (img_w - w + 1))
        used = apply[:, None] & (np.arange(hi)[None, :] < count[:, None])
        holes = np.stack([top, left, np.where(used, h, 0.0), np.where(used, w, 0.0)], axis=-1)  # [B, R, 4]
        holes[..., :2] *= used[..., None]
        return list(holes.reshape(len(holes), -1).T.astype(np.float32))
