"""Transforms that put the image on a larger canvas painted with ``fill`` (nothing is cut)."""

from __future__ import annotations

import numpy as np

from detaug.boxes import translation_matrix
from detaug.plan import PlanState
from detaug.transforms.affine import FILL
from detaug.transforms.base import GeometricTransform, Param, register

__all__ = ["RandomZoomOut"]


@register
class RandomZoomOut(GeometricTransform):
    """Place the image on a larger canvas painted with ``fill`` (SSD "expand").

    The canvas is ``r`` times the image with ``r ~ U(side_range)``; the image lands at a random
    position. Applied with probability ``p`` (torchvision's default 0.5).
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
        r = np.where(apply, rand.uniform(*self.side_range), 1.0)
        canvas = np.floor(hw * r[:, None])
        offset = np.floor((canvas - hw) * rand.random(2))  # (top, left)
        return translation_matrix(offset[:, 1], offset[:, 0]), canvas
