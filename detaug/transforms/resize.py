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
from detaug.transforms.params import ScalarOrList, whole_numbers
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
    ratio, the longer side capped at ``max_size``), as torchvision. Interpolation is bilinear.

    With an int ``size`` the sizes are torchvision's (``_compute_resized_output_size``), truncated:
    the longer side is ``int(size * long / short)``; when that exceeds ``max_size``, the longer
    side is ``max_size`` and the shorter ``int(max_size * size / that)`` (480x640 with
    ``Resize(224)``: 224x298; with ``Resize(800, max_size=1333)``: 800x1066). ``max_size`` must be
    larger than ``size``, as in torchvision.
    """

    schema = (
        Param("size", "size", REQUIRED, "output (height, width), or an int for the shorter side", int_or_size=True),
        Param("max_size", "int", None, "cap on the longer side when size is an int (larger than size)", low=1,
              optional=True),
    )

    def setup(self) -> None:
        if self.max_size is not None and not isinstance(self.size, int):
            raise self.error("max_size", "only allowed when size is a single int (the shorter side)")
        if self.max_size is not None and self.max_size <= self.size:
            raise self.error("max_size", f"must be larger than size ({self.size}), got {self.max_size} (torchvision's "
                             "rule: the shorter side could not reach size)")

    def out_size(self, in_size: tuple[int, int] | None) -> tuple[int, int] | None:
        if not isinstance(self.size, int):
            return self.size
        if in_size is None:
            return None
        h, w = self.output_size(np.array([in_size], dtype=np.float64))[0]
        return int(h), int(w)

    def output_size(self, canvas_hw: np.ndarray) -> np.ndarray:
        """Output ``(height, width)`` ``[B, 2]`` for input canvases ``[B, 2]`` (whole pixels)."""
        if not isinstance(self.size, int):
            return np.tile(np.asarray(self.size, dtype=np.float64), (len(canvas_hw), 1))
        return shorter_side_size(canvas_hw, self.size, self.max_size)

    def plan(self, state: PlanState) -> tuple[np.ndarray, np.ndarray]:
        out = self.output_size(state.canvas_hw)
        step = scale_matrix(out[:, 1] / state.canvas_hw[:, 1], out[:, 0] / state.canvas_hw[:, 0])
        return step, out


def shorter_side_size(canvas_hw: np.ndarray, size: int, max_size: int | None) -> np.ndarray:
    """torchvision's ``_compute_resized_output_size`` for an int ``size``: ``(height, width)``
    float64 ``[B, 2]`` (whole pixels, at least 1) for canvases ``[B, 2]``. The products and
    quotients are those of its Python code, in float64 as there, and truncated as its ``int()``."""
    h, w = canvas_hw[:, 0], canvas_hw[:, 1]
    short, long = np.minimum(h, w), np.maximum(h, w)
    new_short = np.full(len(canvas_hw), float(size))
    new_long = np.floor(size * long / short)  # int(requested_new_short * long / short)
    if max_size is not None:
        over = new_long > max_size
        new_short = np.where(over, np.floor(max_size * new_short / new_long), new_short)
        new_long = np.where(over, float(max_size), new_long)
    tall = w <= h  # torchvision: (new_w, new_h) = (new_short, new_long) if w <= h
    out = np.stack([np.where(tall, new_long, new_short), np.where(tall, new_short, new_long)], -1)
    return np.maximum(out, 1)


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

    ``target_size`` is torchvision's ``(width, height)`` (its code fits ``target_size[0]`` to the
    width, unlike the ``(height, width)`` of the other sizes here; the same for square targets,
    1024 in ``lsj``). For an ``(H, W)`` canvas, ``r = min(tw / W, th / H) * s`` with
    ``s ~ U(scale_range)``, and the output is ``(int(H * r), int(W * r))``: truncated, with ``s``,
    ``r`` and the products in float32 as torchvision's tensors (at least 1 pixel).
    """

    schema = (
        Param("target_size", "size", REQUIRED,
              "base size (width, height) the image is fitted into, as torchvision; an int for a square",
              pair="width, height"),
        Param("scale_range", "range", (0.1, 2.0), "range of the random factor on the fitted size", low=1e-6),
    )

    def plan(self, state: PlanState) -> tuple[np.ndarray, np.ndarray]:
        hw = state.canvas_hw
        s = state.rand.uniform(*self.scale_range).astype(np.float32)
        tw, th = self.target_size
        base = np.minimum(th / hw[:, 0], tw / hw[:, 1])  # float64: torchvision's Python floats
        r = base.astype(np.float32) * s  # float32 tensor times a Python float
        return _resize_to(state, np.floor(hw.astype(np.float32) * r[:, None]).astype(np.float64))


@register
class RandomShortestSize(ScalarOrList, GeometricTransform):
    """Resize so the shorter side is a size drawn from ``min_size`` (torchvision
    ``RandomShortestSize``), the longer side capped at ``max_size``.

    ``m`` is drawn uniformly from the ``min_size`` list, ``r = m / min(H, W)``, with ``max_size``
    ``r = min(r, max_size / max(H, W))``; the output is ``(int(H * r), int(W * r))``: torchvision's
    float64 products, truncated (so a side can come out a pixel short: ``H = 7, m = 61`` gives 60).
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
        m = np.asarray(self.min_size, dtype=np.float64)[state.rand.integers(len(self.min_size))]
        r = m / hw.min(axis=1)
        if self.max_size is not None:
            r = np.minimum(r, self.max_size / hw.max(axis=1))
        return _resize_to(state, np.floor(hw * r[:, None]))
