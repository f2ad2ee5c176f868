"""Resizes: the whole canvas is scaled (and padded for ``LetterBox``); nothing is cut.

Coordinates: pixel ``i`` spans ``[i, i + 1)``, sizes are ``(height, width)``: resizing an
``(H, W)`` canvas to ``(h, w)`` maps ``x -> x * w / W`` and ``y -> y * h / H`` (edges to edges),
bilinear.
"""

from __future__ import annotations

import numpy as np

from detaug.boxes import scale_matrix, translation_matrix
from detaug.plan import PlanState
from detaug.transforms.base import GeometricTransform, Param, register
from detaug.transforms.pad import ScalarOrList, whole_numbers
from detaug.transforms.schema import REQUIRED

__all__ = ["Resize", "LetterBox", "ScaleJitter", "RandomShortestSize"]


def _resize_to(state: PlanState, out_hw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(step, canvas)`` resizing every canvas to ``out_hw`` ``[B, 2]`` (whole pixels, >= 1)."""
    out_hw = np.maximum(out_hw, 1.0)
    hw = state.canvas_hw
    return scale_matrix(out_hw[:, 1] / hw[:, 1], out_hw[:, 0] / hw[:, 0]), out_hw


@register
class Resize(GeometricTransform):
    """Resize to ``size``: ``(height, width)``, or an int for the shorter side (keeping the aspect
    ratio, the longer side capped at ``max_size``), as torchvision. Interpolation is bilinear."""

    schema = (
        Param("size", "size", REQUIRED, "output (height, width), or an int for the shorter side", int_or_size=True),
        Param("max_size", "int", None, "cap on the longer side when size is an int", low=1, optional=True),
    )

    def setup(self) -> None:
        if self.max_size is not None and not isinstance(self.size, int):
            raise self.error("max_size", "only allowed when size is a single int (the shorter side)")

    def out_size(self, in_size: tuple[int, int] | None) -> tuple[int, int] | None:
        if not isinstance(self.size, int):
            return self.size
        if in_size is None:
            return None
        h, w = self.output_size(np.array([in_size], dtype=np.float64))[0]
        return int(h), int(w)

    def output_size(self, canvas_hw: np.ndarray) -> np.ndarray:
        """Output ``(height, width)`` ``[B, 2]`` for input canvases ``[B, 2]``."""
        if not isinstance(self.size, int):
            return np.tile(np.asarray(self.size, dtype=np.float64), (len(canvas_hw), 1))
        short = canvas_hw.min(axis=1, keepdims=True)
        scale = self.size / short
        if self.max_size is not None:
            scale = np.minimum(scale, self.max_size / canvas_hw.max(axis=1, keepdims=True))
        return np.maximum(np.floor(canvas_hw * scale + 0.5), 1)

    def plan(self, state: PlanState) -> tuple[np.ndarray, np.ndarray]:
        out = self.output_size(state.canvas_hw)
        step = scale_matrix(out[:, 1] / state.canvas_hw[:, 1], out[:, 0] / state.canvas_hw[:, 0])
        return step, out


@register
class LetterBox(GeometricTransform):
    """Resize keeping the aspect ratio so the image fits ``size`` ``(height, width)``, and pad the
    rest with ``fill`` (YOLO "letterbox"; albumentations ``LongestMaxSize`` + ``PadIfNeeded``).
    The image is centred when ``center`` is true, else placed at the top-left corner."""

    schema = (
        Param("size", "size", REQUIRED, "output (height, width); an int for a square"),
        Param("fill", "number", 114, "grey level (0-255) of the padding", low=0, high=255),
        Param("center", "bool", True, "centre the image (else top-left)"),
    )
    reveals = True

    def out_size(self, in_size: tuple[int, int] | None) -> tuple[int, int] | None:
        return self.size

    def plan(self, state: PlanState) -> tuple[np.ndarray, np.ndarray]:
        hw = state.canvas_hw
        target = np.asarray(self.size, dtype=np.float64)
        s = (target[None, :] / hw).min(axis=1)
        inner = np.maximum(np.floor(hw * s[:, None] + 0.5), 1)
        offset = np.floor((target - inner) / 2) if self.center else np.zeros_like(inner)
        step = translation_matrix(offset[:, 1], offset[:, 0]) @ scale_matrix(inner[:, 1] / hw[:, 1], inner[:, 0] / hw[:, 0])
        return step, np.tile(target, (len(hw), 1))


@register
class ScaleJitter(GeometricTransform):
    """Large-scale jitter (Simple Copy-Paste; torchvision ``ScaleJitter``, its ``lsj`` preset with
    ``FixedSizeCrop``): resize by a random factor of the size that fits ``target_size``.

    For an ``(H, W)`` canvas, ``r = min(th / H, tw / W) * s`` with ``s ~ U(scale_range)``, and
    the output is ``(int(H * r), int(W * r))`` (truncated as torchvision, at least 1 pixel).
    ``target_size`` is ``(height, width)`` as every size here; torchvision's code pairs its
    first value with the width instead, which is the same for square targets (1024 in ``lsj``).
    """

    schema = (
        Param("target_size", "size", REQUIRED,
              "base size (height, width) the image is fitted into; an int for a square"),
        Param("scale_range", "range", (0.1, 2.0), "range of the random factor on the fitted size", low=1e-6),
    )

    def plan(self, state: PlanState) -> tuple[np.ndarray, np.ndarray]:
        hw = state.canvas_hw
        s = state.rand.uniform(*self.scale_range)
        target = np.asarray(self.target_size, dtype=np.float64)
        r = (target[None, :] / hw).min(axis=1) * s
        return _resize_to(state, np.floor(hw * r[:, None]))


@register
class RandomShortestSize(ScalarOrList, GeometricTransform):
    """Resize so the shorter side is a size drawn from ``min_size`` (torchvision
    ``RandomShortestSize``), the longer side capped at ``max_size``.

    ``m`` is drawn uniformly from the ``min_size`` list, ``r = m / min(H, W)``, with ``max_size``
    ``r = min(r, max_size / max(H, W))``; the output is ``(int(H * r), int(W * r))``, truncated as
    torchvision. It is computed as ``int(H * m / min(H, W))`` so that the shorter side is exactly
    ``m`` (and a capped longer side exactly ``max_size``): torchvision's float product
    ``int(h * (m / h))`` loses a pixel for some sizes (``h = 7, m = 61`` gives 60).
    """

    schema = (
        Param("min_size", "numbers", REQUIRED, "shorter-side sizes to draw from: an int or a list of ints",
              lengths=tuple(range(1, 65)), low=1),
        Param("max_size", "int", None, "cap on the longer side", low=1, optional=True),
    )
    scalar_fields = ("min_size",)

    def setup(self) -> None:
        self.min_size = whole_numbers(self, "min_size", self.min_size)

    def plan(self, state: PlanState) -> tuple[np.ndarray, np.ndarray]:
        hw = state.canvas_hw
        num = np.asarray(self.min_size, dtype=np.float64)[state.rand.integers(len(self.min_size))]
        den = hw.min(axis=1)  # r = num / den, kept as a fraction of whole numbers
        if self.max_size is not None:
            capped = self.max_size * den < num * hw.max(axis=1)  # max_size / long < m / short
            num, den = np.where(capped, float(self.max_size), num), np.where(capped, hw.max(axis=1), den)
        return _resize_to(state, np.floor(hw * num[:, None] / den[:, None]))
