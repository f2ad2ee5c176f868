"""Flips: mirror the canvas (size kept, nothing cropped)."""

from __future__ import annotations

import numpy as np

from detaug.boxes import scale_matrix, translation_matrix
from detaug.plan import PlanState
from detaug.transforms.base import GeometricTransform, Param, register, where_applied

__all__ = ["RandomHorizontalFlip", "RandomVerticalFlip"]

_P = Param("p", "probability", 0.5, "probability of flipping a sample")


@register
class RandomHorizontalFlip(GeometricTransform):
    """Mirror left-right with probability ``p``: ``x -> W - x``.

    Keypoints named by the recipe's ``keypoint_flip_pairs`` trade places where a sample ends up
    mirrored (:mod:`detaug.keypoints`)."""

    schema = (_P,)

    def out_size(self, in_size: tuple[int, int] | None) -> tuple[int, int] | None:
        return in_size

    def plan(self, state: PlanState) -> tuple[np.ndarray, np.ndarray]:
        apply = state.rand.random() < self.p
        w = state.canvas_hw[:, 1]
        step = translation_matrix(w, 0) @ scale_matrix(-1.0, 1.0)
        return where_applied(apply, step), state.canvas_hw


@register
class RandomVerticalFlip(GeometricTransform):
    """Mirror top-bottom with probability ``p``: ``y -> H - y``.

    A mirror too: keypoint flip pairs swap as for :class:`RandomHorizontalFlip` (both flips
    together, a 180-degree turn, swap none)."""

    schema = (_P,)

    def out_size(self, in_size: tuple[int, int] | None) -> tuple[int, int] | None:
        return in_size

    def plan(self, state: PlanState) -> tuple[np.ndarray, np.ndarray]:
        apply = state.rand.random() < self.p
        h = state.canvas_hw[:, 0]
        step = translation_matrix(0, h) @ scale_matrix(1.0, -1.0)
        return where_applied(apply, step), state.canvas_hw
