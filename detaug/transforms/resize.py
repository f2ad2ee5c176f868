"""Resizes: the whole canvas is scaled (and padded for ``LetterBox``); nothing is cut."""

from __future__ import annotations

import numpy as np

from detaug.boxes import scale_matrix, translation_matrix
from detaug.plan import PlanState
from detaug.transforms.base import GeometricTransform, Param, register
from detaug.transforms.schema import REQUIRED

__all__ = ["Resize", "LetterBox"]


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
