"""Crops: the output canvas is part of the input (boxes outside it are cut or dropped).

Coordinates: pixel ``i`` spans ``[i, i + 1)``; sizes are ``(height, width)``; crop offsets are
whole pixels, so a crop moves pixels without resampling them. A box cut by the crop becomes its
visible part (clipped); a box with no visible part is removed.
"""

from __future__ import annotations

import math

import numpy as np

from detaug.boxes import scale_matrix, translation_matrix
from detaug.plan import PlanState
from detaug.transforms.base import GeometricTransform, Param, register
from detaug.transforms.params import PADDING_DOC, PADDING_MODE, ScalarOrList, padding_ltrb, whole_numbers
from detaug.transforms.schema import REQUIRED

__all__ = ["RandomIoUCrop", "RandomResizedCrop", "RandomCrop", "CenterCrop", "FixedSizeCrop"]

SIZE = Param("size", "size", REQUIRED, "output (height, width); an int for a square")


@register
class RandomIoUCrop(GeometricTransform):
    """SSD random crop (torchvision ``RandomIoUCrop``): a crop whose IoU with some box reaches a
    randomly chosen threshold from ``sampler_options`` (a threshold ``>= 1`` means no crop).

    Each sample tries ``trials`` candidate crops per threshold, for up to 10 thresholds
    (vectorised over the batch); a sample that finds none, or has no boxes, is left
    uncropped. The search is torchvision's: a candidate counts only the boxes whose centre lies
    strictly inside it. Crops are whole pixels (pixel ``i`` spans ``[i, i + 1)``); the output
    canvas is the crop, ``(height, width)``.

    ``drop`` decides which boxes survive the crop:

    * ``"center"`` (default; torchvision, SSD and DALI's ``random_bbox_crop``): a box whose
      centre falls outside the crop is dropped, even when part of its object stays visible;
    * ``"invisible"``: every box that keeps a visible part is kept, clipped to the crop; the
      recipe's ``min_size`` and ``min_visibility`` then decide as for any other transform.

    The crops drawn are the same for both rules (same seed, same crop).
    """

    schema = (
        Param("min_scale", "number", 0.3, "smallest crop side as a fraction of the image side", low=0, high=1),
        Param("max_scale", "number", 1.0, "largest crop side as a fraction of the image side", low=0, high=1),
        Param("min_aspect_ratio", "number", 0.5, "smallest crop width / height", low=0),
        Param("max_aspect_ratio", "number", 2.0, "largest crop width / height", low=0),
        Param("sampler_options", "numbers", (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0),
              "minimal IoU thresholds to draw from (>= 1: no crop)", lengths=tuple(range(1, 33)), low=0),
        Param("trials", "int", 40, "candidate crops per threshold", low=1),
        Param("drop", "choice", "center", "which boxes the crop removes: 'center' (centre outside the crop, as "
              "torchvision) or 'invisible' (only boxes with no visible part)", choices=("center", "invisible")),
    )
    crops = True

    def setup(self) -> None:
        if not 0 < self.min_scale <= self.max_scale:
            raise self.error("min_scale", f"need 0 < min_scale <= max_scale, got {self.min_scale:g}, {self.max_scale:g}")
        if not 0 < self.min_aspect_ratio <= self.max_aspect_ratio:
            raise self.error("min_aspect_ratio", "need 0 < min_aspect_ratio <= max_aspect_ratio, got "
                             f"{self.min_aspect_ratio:g}, {self.max_aspect_ratio:g}")

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
        step = translation_matrix(-crop[:, 0], -crop[:, 1])
        canvas = np.stack([crop[:, 3] - crop[:, 1], crop[:, 2] - crop[:, 0]], -1)
        if self.drop == "invisible":  # boxes are clipped; the plan drops those with nothing visible
            return step, canvas
        centre_x = (boxes[:, 0] + boxes[:, 2]) / 2
        centre_y = (boxes[:, 1] + boxes[:, 3]) / 2
        cs = crop[sample]
        inside = (cs[:, 0] < centre_x) & (centre_x < cs[:, 2]) & (cs[:, 1] < centre_y) & (centre_y < cs[:, 3])
        alive_idx = np.flatnonzero(ok)
        state.alive[alive_idx[~inside]] = False
        return step, canvas


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

    schema = (
        Param("size", "size", REQUIRED, "output (height, width); an int for a square"),
        Param("scale", "range", (0.08, 1.0), "crop area as a fraction of the image area", low=0, high=1),
        Param("ratio", "range", (3 / 4, 4 / 3), "crop aspect ratio (width / height)", low=1e-6),
    )
    crops = True

    def out_size(self, in_size: tuple[int, int] | None) -> tuple[int, int] | None:
        return self.size

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
class RandomCrop(ScalarOrList, GeometricTransform):
    """Crop a ``size`` ``(height, width)`` window at a random whole-pixel position (torchvision
    ``RandomCrop``), after optional constant padding.

    The image is first padded by ``padding`` (as ``Pad``); with ``pad_if_needed`` a side still
    shorter than the crop is padded by the missing length on *both* ends (torchvision's rule).
    Then ``top ~ U{0, ..., H' - h}`` and ``left ~ U{0, ..., W' - w}`` on the padded ``(H', W')``.
    Padding and crop are one translation by ``(pad_left - left, pad_top - top)``. A crop larger
    than the (padded) image is an error, as in torchvision.
    """

    schema = (
        SIZE,
        Param("padding", "numbers", None, PADDING_DOC + "; null: none", lengths=(1, 2, 4), low=0, optional=True),
        Param("pad_if_needed", "bool", False, "pad a side shorter than the crop (on both ends) instead of failing"),
        Param("fill", "number", 0, "grey level (0-255) of the padding", low=0, high=255),
        PADDING_MODE,
    )
    scalar_fields = ("padding",)
    crops = True

    def setup(self) -> None:
        if self.padding is not None:
            self.padding = whole_numbers(self, "padding", self.padding)
        self.ltrb = (0, 0, 0, 0) if self.padding is None else padding_ltrb(self.padding)
        self.reveals = self.pad_if_needed or any(self.ltrb)  # type: ignore[misc]

    def out_size(self, in_size: tuple[int, int] | None) -> tuple[int, int] | None:
        return self.size

    def plan(self, state: PlanState) -> tuple[np.ndarray, np.ndarray]:
        hw = state.canvas_hw
        left, top, right, bottom = (np.full(state.batch_size, float(v)) for v in self.ltrb)
        crop = np.asarray(self.size, dtype=np.float64)
        padded = hw + np.stack([top + bottom, left + right], -1)
        if self.pad_if_needed:
            missing = np.maximum(crop - padded, 0)  # (h, w): added on both ends
            top, left = top + missing[:, 0], left + missing[:, 1]
            padded = padded + 2 * missing
        small = (padded < crop).any(axis=1)
        if small.any():
            k = int(np.argmax(small))
            what = "padded image" if self.padding is not None else "image"
            raise self.error("size", f"the crop {tuple(self.size)} is larger than a sample's {what} "
                             f"{tuple(int(v) for v in padded[k])} (height, width); set pad_if_needed: true")
        pos = np.floor(state.rand.random(2) * (padded - crop + 1))  # (top, left) of the crop
        step = translation_matrix(left - pos[:, 1], top - pos[:, 0])
        return step, np.tile(crop, (state.batch_size, 1))


@register
class CenterCrop(GeometricTransform):
    """Crop the centre ``size`` ``(height, width)`` window (torchvision ``CenterCrop``).

    The window starts at ``round((H - h) / 2)`` (Python's rounding: halves to even) and
    ``round((W - w) / 2)``. A side shorter than the crop is first padded with 0 (black, as
    torchvision), ``(h - H) // 2`` before and the rest after, and then not cropped.
    """

    schema = (SIZE,)
    crops = True
    reveals = True  # pads an image smaller than the crop, with fill 0

    def out_size(self, in_size: tuple[int, int] | None) -> tuple[int, int] | None:
        return self.size

    def plan(self, state: PlanState) -> tuple[np.ndarray, np.ndarray]:
        hw = state.canvas_hw
        crop = np.asarray(self.size, dtype=np.float64)
        before = np.where(crop > hw, (crop - hw) // 2, 0)  # (top, left) padding
        start = np.round((np.maximum(hw, crop) - crop) / 2)  # np.round: halves to even, as round()
        shift = before - start
        return translation_matrix(shift[:, 1], shift[:, 0]), np.tile(crop, (state.batch_size, 1))


@register
class FixedSizeCrop(GeometricTransform):
    """Crop to at most ``size`` at a random position, then pad the bottom and right with ``fill``
    up to ``size`` ``(height, width)`` (torchvision's detection ``FixedSizeCrop``, used after
    ``ScaleJitter`` in its ``lsj`` preset).

    With ``(H, W)`` the input, ``top = int(max(H - h, 0) * r)`` and ``left = int(max(W - w, 0) * r)``
    with *one* ``r ~ U(0, 1)`` for both (torchvision's and detectron2's rule). It crops and pads
    in one translation by ``(-left, -top)``; boxes are clipped, and dropped when nothing is left.
    """

    schema = (
        SIZE,
        Param("fill", "number", 0, "grey level (0-255) of the padding", low=0, high=255),
        PADDING_MODE,
    )
    crops = True
    reveals = True

    def out_size(self, in_size: tuple[int, int] | None) -> tuple[int, int] | None:
        return self.size

    def plan(self, state: PlanState) -> tuple[np.ndarray, np.ndarray]:
        crop = np.asarray(self.size, dtype=np.float64)
        offset = np.maximum(state.canvas_hw - crop, 0)  # (h, w) room for the crop's corner
        pos = np.floor(offset * state.rand.random()[:, None])  # (top, left), one draw for both
        return translation_matrix(-pos[:, 1], -pos[:, 0]), np.tile(crop, (state.batch_size, 1))
