"""Flips: mirror the canvas (size kept, nothing cropped)."""

from __future__ import annotations

import numpy as np

from detaug.boxes import scale_matrix, translation_matrix
from detaug.plan import PlanState
from detaug.transforms.base import GeometricTransform, Param, register, where_applied

__all__ = ["RandomHorizontalFlip", "RandomVerticalFlip"]

_P = Param("p", "probability", 0.5, "probability of flipping a sample")


class _Flip(GeometricTransform):
    """A mirror of the canvas with probability ``p`` (size kept, nothing cropped); a subclass
    gives the mirror's matrix (``_mirror``)."""

    schema = (_P,)

    def out_size(self, in_size: tuple[int, int] | None) -> tuple[int, int] | None:
        return in_size

    def plan(self, state: PlanState) -> tuple[np.ndarray, np.ndarray]:
        apply = state.rand.random() < self.p
        return where_applied(apply, self._mirror(state.canvas_hw)), state.canvas_hw

    def _mirror(self, canvas_hw: np.ndarray) -> np.ndarray:
        """``[B, 3, 3]`` the mirror of each canvas (float ``[B, 2]`` ``(h, w)``)."""
        raise NotImplementedError


@register
class RandomHorizontalFlip(_Flip):
    """Mirror left-right with probability ``p``: ``x -> W - x``.

    Keypoints named by the recipe's ``keypoint_flip_pairs`` trade places where a sample ends up
    mirrored (:mod:`detaug.keypoints`)."""

    def _mirror(self, canvas_hw: np.ndarray) -> np.ndarray:
        return translation_matrix(canvas_hw[:, 1], 0) @ scale_matrix(-1.0, 1.0)


@register
class RandomVerticalFlip(_Flip):
    """Mirror top-bottom with probability ``p``: ``y -> H - y``.

    A mirror too: keypoint flip pairs swap as for :class:`RandomHorizontalFlip` (both flips
    together, a 180-degree turn, swap none)."""

    def _mirror(self, canvas_hw: np.ndarray) -> np.ndarray:
        return translation_matrix(0, canvas_hw[:, 0]) @ scale_matrix(1.0, -1.0)
