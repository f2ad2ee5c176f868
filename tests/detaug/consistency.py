"""Pixel-consistency check shared by the pipeline, PyTorch and Keras tests.

Synthetic scenes hold solid-coloured, non-overlapping rectangles, one colour per object, on a grey
background. Each sample's label ``k`` (1-based) names its object ``k - 1``, so after augmentation
each output box can be compared with the pixels of its own object:

* a box must match the tight box of its object's visible pixels (IoU >= ``min_iou``), also for
  objects cut by the border after a rotation or shear;
* an object with no visible pixels must have no box;
* an object that is mostly inside the image (at least ``keep_fraction`` of its area visible)
  must keep its box (needs the samples' area scales, the determinant of their geometry).
"""

from __future__ import annotations

import io
import numpy as np
from PIL import Image

from detaug.sources import Sample
from detaug.synthetic import BACKGROUND, SyntheticImage, make_scene
from detaug.transforms import Compose


def scene_samples(
    n: int, *, seed: int = 0, size: tuple[int, int] = (200, 160), max_objects: int = 5, min_size: int = 24
) -> tuple[list[Sample], list[SyntheticImage]]:
    """``n`` PNG-encoded scenes (``size`` is (width, height)) as samples whose labels are
    1-based object indices."""
    rng = np.random.default_rng(seed)
    samples, scenes = [], []
    for i in range(n):
        image, scene = make_scene(rng, size[0], size[1], max_objects, ("obj",), min_size=min_size, margin=3)
        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, format="PNG")
        boxes = np.array([o.box_xyxy for o in scene.objects], dtype=np.float32).reshape(-1, 4)
        labels = np.arange(1, len(scene.objects) + 1, dtype=np.int32)
        samples.append(Sample(buffer.getvalue(), boxes, labels, image_id=i + 1))
        scenes.append(scene)
    return samples, scenes


def object_masks(image: np.ndarray, colors: list[tuple[int, int, int]], coverage: float = 0.5) -> list[np.ndarray]:
    """Per colour, the pixels of ``image`` (uint8 ``[H, W, 3]``) at least ``coverage`` covered by
    it (read as a blend of the colour and the background) and nearer to it than to the other
    colours."""
    pixels = image.astype(np.float32)
    bg = np.asarray(BACKGROUND, dtype=np.float32)
    dist = np.stack([np.linalg.norm(pixels - np.asarray(c, np.float32), axis=-1) for c in colors])
    nearest = dist.argmin(axis=0)
    return [
        (dist[k] < (1.0 - coverage) * np.linalg.norm(np.asarray(c, np.float32) - bg)) & (nearest == k)
        for k, c in enumerate(colors)
    ]


def mask_box(mask: np.ndarray) -> np.ndarray | None:
    """Tight xyxy box (continuous pixels) of a mask, ``None`` when empty."""
    ys, xs = np.nonzero(mask)
    if len(xs) == 0:
        return None
    return np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], dtype=np.float64)


def iou(a: np.ndarray, b: np.ndarray) -> float:
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def check_boxes_match_pixels(
    image: np.ndarray,
    boxes: np.ndarray,
    labels: np.ndarray,
    scene: SyntheticImage,
    *,
    area_scale: float | None = None,
    min_iou: float = 0.9,
    keep_fraction: float = 0.6,
    min_pixels: int = 16,
    edge_tolerance: float = 1.5,
) -> list[str]:
    """Problems found in one augmented sample (empty list: consistent).

    Args:
        image: uint8 ``[H, W, 3]`` augmented image (no colour jitter).
        boxes: ``[M, 4]`` xyxy output boxes; labels: ``[M]`` 1-based object indices.
        scene: the source scene.
        area_scale: output area per source area of this sample's geometry, to check that
            mostly visible objects keep their boxes; skipped when ``None``.
        min_pixels: a box needs this many visible pixels of its object (a quarter of its area
            for a sliver smaller than that).
        edge_tolerance: a box whose edges are all within this many pixels of the visible pixels'
            box also matches: slivers a few pixels wide cannot reach an IoU of 0.9 on a pixel grid,
            and the sharp corner of a rotated object covers less than half of the last pixel or
            so that its exact box includes.
    """
    problems = []
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    labels = np.asarray(labels).reshape(-1)
    if len(set(labels.tolist())) != len(labels):
        problems.append(f"duplicate labels {labels.tolist()}")
    by_label = {int(k): b for k, b in zip(labels, boxes)}
    masks = object_masks(image, [obj.color for obj in scene.objects])
    for k, (obj, mask) in enumerate(zip(scene.objects, masks), start=1):
        visible = int(mask.sum())
        tight = mask_box(mask)
        box = by_label.get(k)
        x0, y0, x1, y1 = obj.box_xyxy
        if box is not None:
            box_area = float((box[2] - box[0]) * (box[3] - box[1]))
            if tight is None or visible < min(min_pixels, box_area / 4):  # slivers hold fewer pixels
                problems.append(f"object {k}: has box {box.round(1).tolist()} but only {visible} visible pixels")
            elif min(box[2] - box[0], box[3] - box[1]) < 2 * edge_tolerance:
                # a sliver thinner than the pixel grid resolves: its visible pixels must lie in
                # the box (the wedge of a sheared sliver's tip covers too little of its pixels)
                if (tight[:2] < box[:2] - edge_tolerance).any() or (tight[2:] > box[2:] + edge_tolerance).any():
                    problems.append(f"object {k}: sliver box {box.round(1).tolist()} misses visible pixels {tight.tolist()}")
            elif iou(box, tight) < min_iou and np.abs(box - tight).max() > edge_tolerance:
                problems.append(
                    f"object {k}: box {box.round(1).tolist()} vs visible pixels {tight.tolist()} "
                    f"(IoU {iou(box, tight):.3f} < {min_iou})"
                )
        elif area_scale is not None:
            full = (x1 - x0) * (y1 - y0) * area_scale
            if visible >= keep_fraction * full:
                problems.append(f"object {k}: {visible} of ~{full:.0f} pixels visible but no box")
    return problems


class RecordingCompose(Compose):
    """A ``Compose`` that records every planned batch (to read the geometry's area scale)."""

    def __init__(self, transforms, **kwargs):  # noqa: D107 - same as Compose
        super().__init__(transforms, **kwargs)
        self.records: list[tuple] = []

    def plan_batch(self, *args):
        out = super().plan_batch(*args)
        self.records.append(out)
        return out

    def area_scales(self, record: tuple) -> np.ndarray:
        """``[B]`` product of the determinants of the batch's warp matrices."""
        params = np.asarray(record[0], dtype=np.float64)
        scale = np.ones(len(params))
        for s in range(len(self.segments)):
            m = params[:, self.plan_layout.slice(f"warp{s}.matrix")].reshape(-1, 2, 3)
            scale *= np.abs(np.linalg.det(m[:, :, :2]))
        return scale
