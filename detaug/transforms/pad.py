"""Transforms that put the image on a larger canvas painted with ``fill`` (nothing is cut).

Coordinates: pixel ``i`` spans ``[i, i + 1)``; sizes are ``(height, width)``; padding is in whole
pixels. Padding is constant only (one grey level, ``fill``): the pixels are painted by the same
affine warp that moves the image, which has no ``edge``/``reflect``/``symmetric`` modes.
"""

from __future__ import annotations

import numpy as np

from detaug.boxes import translation_matrix
from detaug.plan import PlanState
from detaug.transforms.base import GeometricTransform, Param, register
from detaug.transforms.params import FILL, PADDING_DOC, PADDING_MODE, ScalarOrList, padding_ltrb, whole_numbers
from detaug.transforms.schema import REQUIRED

__all__ = ["RandomZoomOut", "Pad", "padding_ltrb"]


@register
class RandomZoomOut(GeometricTransform):
    """Place the image on a larger canvas painted with ``fill`` (SSD "expand").

    The canvas is ``(int(H * r), int(W * r))`` with ``r ~ U(side_range)`` (torchvision's
    ``RandomZoomOut``: ``r`` and the products in float32 as its tensors, truncated); the image
    lands at a random whole-pixel position. Applied with probability ``p`` (torchvision's default 0.5).
    """

    schema = (
        FILL,
        Param("side_range", "range", (1.0, 4.0), "canvas side as a multiple of the image side", low=1.0),
        Param("p", "probability", 0.5, "probability of zooming out a sample"),
    )
    reveals = True

    def plan(self, state: PlanState) -> tuple[np.ndarray, np.ndarray]:
        rand, hw = state.rand, state.canvas_hw
        apply = rand.random() < self.p
        r = np.where(apply, rand.uniform(*self.side_range), 1.0).astype(np.float32)
        canvas = np.floor(hw.astype(np.float32) * r[:, None]).astype(np.float64)  # torchvision's float32
        offset = np.floor((canvas - hw) * rand.random(2))  # (top, left)
        return translation_matrix(offset[:, 1], offset[:, 0]), canvas


@register
class Pad(ScalarOrList, GeometricTransform):
    """Pad every side by a fixed number of pixels painted with ``fill`` (torchvision ``Pad``,
    constant mode only).

    ``padding``: ``p`` pads every side by ``p``; ``[a, b]`` pads left and right by ``a``, top and
    bottom by ``b``; ``[l, t, r, b]`` each side on its own. An ``(H, W)`` canvas becomes
    ``(H + t + b, W + l + r)`` and a box moves by ``(+l, +t)``. Negative padding (torchvision's
    crop) is not allowed: use ``CenterCrop``/``RandomCrop``.
    """

    schema = (
        Param("padding", "numbers", REQUIRED, PADDING_DOC, lengths=(1, 2, 4), low=0),
        Param("fill", "number", 0, "grey level (0-255) of the padding", low=0, high=255),
        PADDING_MODE,
    )
    scalar_fields = ("padding",)
    reveals = True

    def setup(self) -> None:
        self.padding = whole_numbers(self, "padding", self.padding)
        self.ltrb = padding_ltrb(self.padding)

    def out_size(self, in_size: tuple[int, int] | None) -> tuple[int, int] | None:
        if in_size is None:
            return None
        left, top, right, bottom = self.ltrb
        return in_size[0] + top + bottom, in_size[1] + left + right

    def plan(self, state: PlanState) -> tuple[np.ndarray, np.ndarray]:
        left, top, right, bottom = self.ltrb
        n = state.batch_size
        step = translation_matrix(np.full(n, float(left)), np.full(n, float(top)))
        return step, state.canvas_hw + np.array([top + bottom, left + right], dtype=np.float64)
