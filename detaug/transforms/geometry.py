"""Geometric transforms: each samples one forward affine matrix per sample for image and boxes.

Parameter names and defaults follow ``torchvision.transforms.v2``. Angles are in degrees, positive
angles rotate counter-clockwise on screen. Sizes are ``(height, width)`` in pixels.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from detaug.boxes import (
    rotation_matrix,
    scale_matrix,
    shear_matrix,
    translation_matrix,
)
from detaug.plan import PlanState
from detaug.seeds import SampleRandom
from detaug.transforms.base import (
    GeometricTransform,
    register,
    validate_probability,
    validate_range,
    validate_size,
)

__all__ = [
    "RandomHorizontalFlip",
    "RandomVerticalFlip",
    "RandomAffine",
    "RandomRotation",
    "RandomZoomOut",
    "RandomIoUCrop",
    "RandomResizedCrop",
    "Resize",
    "LetterBox",
]


def _where_applied(apply: np.ndarray, step: np.ndarray) -> np.ndarray:
    """``step`` where ``apply`` (``[B]`` bool) is set, the identity elsewhere."""
    return np.where(apply[:, None, None], step, np.eye(3))


def _about_center(center: np.ndarray, m: np.ndarray) -> np.ndarray:
    """``T(c) @ m @ T(-c)`` for per-sample centres ``[B, 2]`` (x, y)."""
    return translation_matrix(center[:, 0], center[:, 1]) @ m @ translation_matrix(-center[:, 0], -center[:, 1])


@register
class RandomHorizontalFlip(GeometricTransform):
    """Mirror left-right with probability ``p``: ``x -> W - x``."""

    def __init__(self, p: float = 0.5) -> None:
        self.p = validate_probability(p)

    def plan(self, state: PlanState) -> tuple[np.ndarray, np.ndarray]:
        apply = state.rand.random() < self.p
        w = state.canvas_hw[:, 1]
        step = translation_matrix(w, 0) @ scale_matrix(-1.0, 1.0)
        return _where_applied(apply, step), state.canvas_hw


@register
class RandomVerticalFlip(GeometricTransform):
    """Mirror top-bottom with probability ``p``: ``y -> H - y``."""

    def __init__(self, p: float = 0.5) -> None:
        self.p = validate_probability(p)

    def plan(self, state: PlanState) -> tuple[np.ndarray, np.ndarray]:
        apply = state.rand.random() < self.p
        h = state.canvas_hw[:, 0]
        step = translation_matrix(0, h) @ scale_matrix(1.0, -1.0)
        return _where_applied(apply, step), state.canvas_hw


@register
class RandomAffine(GeometricTransform):
    """Random rotation, translation, scale and shear about the image centre; canvas size kept.

    Args:
        degrees: rotation range; ``d`` means ``(-d, d)``.
        translate: maximal absolute fractions ``(a, b)``: ``tx ~ U(-a W, a W)``, ``ty ~ U(-b H, b H)``.
        scale: ``(min, max)`` scale factor range.
        shear: ``s`` or ``(min, max)``: x-shear in degrees; ``(xmin, xmax, ymin, ymax)`` adds a y-shear.
        fill: grey level (0-255) painted where the output shows no input pixel.
        center: rotation centre ``(x, y)`` in pixels; the canvas centre when ``None``.
        p: probability of applying the transform to a sample.

    The forward matrix is ``T(c + t) R S_h S T(-c)`` (rotation ``R``, shear ``S_h``, scale ``S``).
    """

    crops = True
    reveals = True

    def __init__(
        self,
        degrees: float | Sequence[float] = 0,
        translate: Sequence[float] | None = None,
        scale: Sequence[float] | None = None,
        shear: float | Sequence[float] | None = None,
        fill: float = 0,
        center: Sequence[float] | None = None,
        p: float = 1.0,
    ) -> None:
        self.degrees = validate_range("degrees", degrees, center=0.0)
        if translate is not None:
            translate = tuple(float(t) for t in translate)
            if len(translate) != 2 or not all(0.0 <= t <= 1.0 for t in translate):
                raise ValueError(f"translate must be two fractions between 0 and 1, got {translate!r}")
        self.translate = translate
        self.scale = None if scale is None else validate_range("scale", scale, low=1e-6)
        if shear is None:
            self.shear = None
        elif isinstance(shear, (int, float)) or len(shear) == 2:
            self.shear = validate_range("shear", shear, center=0.0) + (0.0, 0.0)
        elif len(shear) == 4:
            self.shear = validate_range("shear[:2]", shear[:2]) + validate_range("shear[2:]", shear[2:])
        else:
            raise ValueError(f"shear must be a number or 2 or 4 values, got {shear!r}")
        self.fill = float(fill)
        self.center = None if center is None else tuple(float(c) for c in center)
        self.p = validate_probability(p)

    def _linear(self, rand: SampleRandom) -> np.ndarray:
        m = rotation_matrix(rand.uniform(*self.degrees))
        if self.shear is not None:
            m = m @ shear_matrix(rand.uniform(*self.shear[:2]), rand.uniform(*self.shear[2:]))
        if self.scale is not None:
            s = rand.uniform(*self.scale)
            m = m @ scale_matrix(s, s)
        return m

    def plan(self, state: PlanState) -> tuple[np.ndarray, np.ndarray]:
        n, rand = state.batch_size, state.rand
        h, w = state.canvas_hw[:, 0], state.canvas_hw[:, 1]
        apply = rand.random() < self.p
        m = self._linear(rand)
        if self.translate is not None:
            tx = rand.uniform(-1, 1) * self.translate[0] * w
            ty = rand.uniform(-1, 1) * self.translate[1] * h
            m = translation_matrix(tx, ty) @ m
        c = np.stack([w / 2, h / 2], -1) if self.center is None else np.tile(self.center, (n, 1))
        return _where_applied(apply, _about_center(c, m)), state.canvas_hw


@register
class RandomRotation(GeometricTransform):
    """Rotate by an angle drawn from ``degrees`` (``d`` means ``(-d, d)``) about ``center``.

    With ``expand=True`` the canvas grows to hold the whole rotated image (as torchvision).
    """

    reveals = True

    def __init__(
        self,
        degrees: float | Sequence[float],
        expand: bool = False,
        center: Sequence[float] | None = None,
        fill: float = 0,
        p: float = 1.0,
    ) -> None:
        self.degrees = validate_range("degrees", degrees, center=0.0)
        self.expand = bool(expand)
        self.center = None if center is None else tuple(float(c) for c in center)
        self.fill = float(fill)
        self.p = validate_probability(p)
        self.crops = not self.expand  # type: ignore[misc]

    def plan(self, state: PlanState) -> tuple[np.ndarray, np.ndarray]:
        n, rand = state.batch_size, state.rand
        h, w = state.canvas_hw[:, 0], state.canvas_hw[:, 1]
        apply = rand.random() < self.p
        angle = np.where(apply, rand.uniform(*self.degrees), 0.0)
        c = np.stack([w / 2, h / 2], -1) if self.center is None else np.tile(self.center, (n, 1))
        step = _about_center(c, rotation_matrix(angle))
        if not self.expand:
            return step, state.canvas_hw
        corners = np.stack([np.zeros(n), np.zeros(n), w, np.zeros(n), w, h, np.zeros(n), h], -1).reshape(n, 4, 2)
        moved = (step[:, None, :2, :2] @ corners[..., None])[..., 0] + step[:, None, :2, 2]
        lo, hi = moved.min(axis=1), moved.max(axis=1)
        size = np.ceil(hi - lo - 1e-9)  # holds the whole rotated canvas (to 1e-9 px)
        step = translation_matrix(-lo[:, 0] + (size[:, 0] - (hi - lo)[:, 0]) / 2,
                                  -lo[:, 1] + (size[:, 1] - (hi - lo)[:, 1]) / 2) @ step
        return step, np.stack([size[:, 1], size[:, 0]], -1)


@register
class RandomZoomOut(GeometricTransform):
    """Place the image on a larger canvas painted with ``fill`` (SSD "expand").

    The canvas is ``r`` times the image with ``r ~ U(side_range)``; the image lands at a random
    position. Applied with probability ``p`` (torchvision's default 0.5).
    """

    reveals = True

    def __init__(self, fill: float = 0, side_range: Sequence[float] = (1.0, 4.0), p: float = 0.5) -> None:
        self.fill = float(fill)
        self.side_range = validate_range("side_range", side_range, low=1.0)
        self.p = validate_probability(p)

    def plan(self, state: PlanState) -> tuple[np.ndarray, np.ndarray]:
        rand, hw = state.rand, state.canvas_hw
        apply = rand.random() < self.p
        r = np.where(apply, rand.uniform(*self.side_range), 1.0)
        canvas = np.floor(hw * r[:, None])
        offset = np.floor((canvas - hw) * rand.random(2))  # (top, left)
        return translation_matrix(offset[:, 1], offset[:, 0]), canvas


@register
class RandomIoUCrop(GeometricTransform):
    """SSD random crop (torchvision ``RandomIoUCrop``): a crop whose IoU with some box reaches a
    randomly chosen threshold from ``sampler_options`` (a threshold ``>= 1`` means no crop).

    Each sample tries ``trials`` candidate crops per threshold, for up to 10 thresholds
    (vectorised over the batch); a sample that finds none, or has no boxes, is left
    uncropped. Boxes whose centre falls outside the crop
    are dropped, as in torchvision and DALI's ``random_bbox_crop``.
    """

    crops = True

    def __init__(
        self,
        min_scale: float = 0.3,
        max_scale: float = 1.0,
        min_aspect_ratio: float = 0.5,
        max_aspect_ratio: float = 2.0,
        sampler_options: Sequence[float] | None = None,
        trials: int = 40,
    ) -> None:
        if not 0 < min_scale <= max_scale <= 1:
            raise ValueError(f"need 0 < min_scale <= max_scale <= 1, got {min_scale}, {max_scale}")
        if not 0 < min_aspect_ratio <= max_aspect_ratio:
            raise ValueError(f"need 0 < min_aspect_ratio <= max_aspect_ratio, got {min_aspect_ratio}, {max_aspect_ratio}")
        if trials < 1:
            raise ValueError(f"trials must be >= 1, got {trials}")
        self.min_scale, self.max_scale = float(min_scale), float(max_scale)
        self.min_aspect_ratio, self.max_aspect_ratio = float(min_aspect_ratio), float(max_aspect_ratio)
        options = [0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0] if sampler_options is None else sampler_options
        self.sampler_options = tuple(float(o) for o in options)
        if not self.sampler_options:
            raise ValueError("sampler_options must not be empty")
        self.trials = int(trials)

    def plan(self, state: PlanState) -> tuple[np.ndarray, np.ndarray]:
        n, rand, t = state.batch_size, state.rand, self.trials
        hw = state.canvas_hw
        current = state.boxes()
        ok = current.keep
        boxes, sample = current.boxes_xyxy[ok], state.sample[ok]
        boxes32 = np.ascontiguousarray(boxes.T, dtype=np.float32)  # [4, N], planar for speed
        crop = np.stack([np.zeros(n), np.zeros(n), hw[:, 1], hw[:, 0]], -1)  # no crop
        todo = np.bincount(sample, minlength=n) > 0
        options = np.asarray(self.sampler_options)
        active = np.zeros(n, dtype=bool)
        # Each round owns a fixed block of draw positions (1 threshold, 2t scales, 2t positions),
        # drawn only for the samples still searching: a sample's draws never depend on the others.
        start, per_round, rounds = rand.counter, 1 + 4 * t, 10
        for round_ in range(rounds):  # torchvision's outer loop over thresholds, bounded
            rand.advance_to(start + round_ * per_round)
            act = np.flatnonzero(todo)
            if len(act) == 0:
                break
            thr = options[rand.integers(len(options), rows=act)]
            todo[act[thr >= 1.0]] = False  # drew "no crop"
            act, thr = act[thr < 1.0], thr[thr < 1.0]
            a = len(act)
            if a == 0:
                continue
            r = self.min_scale + (self.max_scale - self.min_scale) * rand.random((t, 2), rows=act)
            pos = rand.random((t, 2), rows=act)
            size_w = np.floor(hw[act, None, 1] * r[..., 0])
            size_h = np.floor(hw[act, None, 0] * r[..., 1])
            left = np.floor((hw[act, None, 1] - size_w) * pos[..., 0])
            top = np.floor((hw[act, None, 0] - size_h) * pos[..., 1])
            cand = np.stack([left, top, left + size_w, top + size_h]).astype(np.float32)  # planar [4, A, T]
            with np.errstate(divide="ignore", invalid="ignore"):
                aspect = size_w / size_h
            valid = (size_w > 0) & (size_h > 0) & (aspect >= self.min_aspect_ratio) & (aspect <= self.max_aspect_ratio)
            active[:] = False
            active[act] = True
            in_act = active[sample]
            slot = np.searchsorted(act, sample[in_act])  # boxes are grouped by sample
            iou = _iou_if_centre_inside(boxes32[:, in_act], cand[:, slot])
            best = np.maximum.reduceat(iou, np.searchsorted(slot, np.arange(a)), axis=0)  # [A, T]
            valid &= best >= thr[:, None]
            found = valid.any(axis=1)
            k = valid.argmax(axis=1)
            crop[act[found]] = cand[:, found, k[found]].T
            todo[act[found]] = False
        rand.advance_to(start + rounds * per_round)
        centre_x = (boxes[:, 0] + boxes[:, 2]) / 2
        centre_y = (boxes[:, 1] + boxes[:, 3]) / 2
        cs = crop[sample]
        inside = (cs[:, 0] < centre_x) & (centre_x < cs[:, 2]) & (cs[:, 1] < centre_y) & (centre_y < cs[:, 3])
        alive_idx = np.flatnonzero(ok)
        state.alive[alive_idx[~inside]] = False
        step = translation_matrix(-crop[:, 0], -crop[:, 1])
        return step, np.stack([crop[:, 3] - crop[:, 1], crop[:, 2] - crop[:, 0]], -1)


def _iou_if_centre_inside(boxes: np.ndarray, crops: np.ndarray) -> np.ndarray:
    """IoU ``[M, K]`` of boxes ``[4, M]`` with their candidate crops ``[4, M, K]`` (planar xyxy),
    or -1 where the box centre is not strictly inside the crop (the planner's hot loop)."""
    x0, y0, x1, y1 = (boxes[i][:, None] for i in range(4))
    u0, v0, u1, v1 = crops
    cx, cy = (x0 + x1) * 0.5, (y0 + y1) * 0.5
    inside = (u0 < cx) & (cx < u1) & (v0 < cy) & (cy < v1)
    iw = np.minimum(x1, u1) - np.maximum(x0, u0)
    ih = np.minimum(y1, v1) - np.maximum(y0, v0)
    inter = np.maximum(iw, 0) * np.maximum(ih, 0)
    union = (x1 - x0) * (y1 - y0) + (u1 - u0) * (v1 - v0) - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        iou = inter / union
    return np.where(inside & (union > 0), iou, -1.0)


@register
class RandomResizedCrop(GeometricTransform):
    """Crop a random part of relative area ``scale`` and aspect ratio ``ratio``, resize it to
    ``size`` (torchvision ``RandomResizedCrop``; falls back to a centre crop after 10 tries)."""

    crops = True

    def __init__(
        self,
        size: int | Sequence[int],
        scale: Sequence[float] = (0.08, 1.0),
        ratio: Sequence[float] = (3 / 4, 4 / 3),
    ) -> None:
        self.size = validate_size(size)
        self.scale = validate_range("scale", scale, low=0.0)
        if self.scale[1] > 1.0:
            raise ValueError(f"scale values must be <= 1, got {scale!r}")
        self.ratio = validate_range("ratio", ratio, low=1e-6)

    def plan(self, state: PlanState) -> tuple[np.ndarray, np.ndarray]:
        n, rand, tries = state.batch_size, state.rand, 10
        h, w = state.canvas_hw[:, 0:1], state.canvas_hw[:, 1:2]
        area = h * w * rand.uniform(*self.scale, tries)
        log_r = rand.uniform(math.log(self.ratio[0]), math.log(self.ratio[1]), tries)
        cw = np.round(np.sqrt(area * np.exp(log_r)))
        ch = np.round(np.sqrt(area / np.exp(log_r)))
        pos = rand.random((tries, 2))
        valid = (cw > 0) & (cw <= w) & (ch > 0) & (ch <= h)
        found = valid.any(axis=1)
        k = valid.argmax(axis=1)
        rows = np.arange(n)
        cw, ch, pos = cw[rows, k], ch[rows, k], pos[rows, k]
        left, top = np.floor((w[:, 0] - cw + 1) * pos[:, 0]), np.floor((h[:, 0] - ch + 1) * pos[:, 1])
        # fallback: centre crop with the ratio clamped to the allowed range
        in_ratio = w[:, 0] / h[:, 0]
        fw = np.where(in_ratio < self.ratio[0], w[:, 0], np.where(in_ratio > self.ratio[1], np.round(h[:, 0] * self.ratio[1]), w[:, 0]))
        fh = np.where(in_ratio < self.ratio[0], np.round(w[:, 0] / self.ratio[0]), h[:, 0])
        cw, ch = np.where(found, cw, fw), np.where(found, ch, fh)
        left = np.where(found, left, np.floor((w[:, 0] - cw) / 2))
        top = np.where(found, top, np.floor((h[:, 0] - ch) / 2))
        out_h, out_w = self.size
        step = scale_matrix(out_w / cw, out_h / ch) @ translation_matrix(-left, -top)
        return step, np.tile([float(out_h), float(out_w)], (n, 1))


@register
class Resize(GeometricTransform):
    """Resize to ``size``: ``(height, width)``, or an int for the shorter side (keeping the aspect
    ratio, the longer side capped at ``max_size``), as torchvision. Interpolation is bilinear."""

    def __init__(self, size: int | Sequence[int], max_size: int | None = None) -> None:
        if isinstance(size, int):
            if size <= 0:
                raise ValueError(f"size must be positive, got {size}")
            self.size: int | tuple[int, int] = size
        else:
            self.size = validate_size(size)
        if max_size is not None and not isinstance(size, int):
            raise ValueError("max_size is only allowed when size is a single int (the shorter side)")
        self.max_size = max_size

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

    reveals = True

    def __init__(self, size: int | Sequence[int], fill: float = 114, center: bool = True) -> None:
        self.size = validate_size(size)
        self.fill = float(fill)
        self.center = bool(center)

    def plan(self, state: PlanState) -> tuple[np.ndarray, np.ndarray]:
        hw = state.canvas_hw
        target = np.asarray(self.size, dtype=np.float64)
        s = (target[None, :] / hw).min(axis=1)
        inner = np.maximum(np.floor(hw * s[:, None] + 0.5), 1)
        offset = np.floor((target - inner) / 2) if self.center else np.zeros_like(inner)
        step = translation_matrix(offset[:, 1], offset[:, 0]) @ scale_matrix(inner[:, 1] / hw[:, 1], inner[:, 0] / hw[:, 0])
        return step, np.tile(target, (len(hw), 1))
