"""Box formats users hand in and get back, converted to and from detaug's one internal format.

detaug works in absolute ``xyxy`` pixels (pixel ``i`` spans ``[i, i + 1)``). Accepted elsewhere:

* ``"xyxy"``: ``(x_min, y_min, x_max, y_max)`` pixels (torchvision, Pascal VOC after ``-1``);
* ``"xywh"``: ``(x, y, width, height)`` pixels (COCO's ``bbox``);
* ``"cxcywh"``: ``(centre x, centre y, width, height)`` pixels (torchvision ``CXCYWH``);
* ``"yolo"``: ``(centre x, centre y, width, height)`` as fractions of the image width and height
  (YOLO label files, albumentations ``"yolo"``); needs the image size.

No DALI, torch or Keras here.
"""

from __future__ import annotations

import numpy as np

__all__ = ["INPUT_BOX_FORMATS", "check_box_format", "to_xyxy", "from_xyxy"]

INPUT_BOX_FORMATS = ("xyxy", "xywh", "cxcywh", "yolo")


def check_box_format(box_format: str) -> str:
    """``box_format`` if it is one of :data:`INPUT_BOX_FORMATS`, else ``ValueError`` listing them."""
    if box_format not in INPUT_BOX_FORMATS:
        raise ValueError(f"box_format must be one of {', '.join(map(repr, INPUT_BOX_FORMATS))}, got {box_format!r}")
    return box_format


def to_xyxy(boxes: np.ndarray, box_format: str, image_hw: tuple[int, int] | None = None) -> np.ndarray:
    """float64 ``[N, 4]`` absolute xyxy boxes from ``boxes`` ``[N, 4]`` in ``box_format``;
    ``image_hw`` ``(height, width)`` is needed for ``"yolo"``."""
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    check_box_format(box_format)
    if box_format == "xyxy":
        return b.copy()
    if box_format == "xywh":
        return np.concatenate([b[:, :2], b[:, :2] + b[:, 2:]], axis=1)
    if box_format == "yolo":
        if image_hw is None:
            raise ValueError("box_format='yolo' (normalised) needs the image size")
        h, w = image_hw
        b = b * np.array([w, h, w, h], dtype=np.float64)
    half = b[:, 2:] / 2
    return np.concatenate([b[:, :2] - half, b[:, :2] + half], axis=1)


def from_xyxy(boxes_xyxy: np.ndarray, box_format: str, image_hw: tuple[int, int] | None = None) -> np.ndarray:
    """float32 ``[N, 4]`` boxes in ``box_format`` from absolute xyxy boxes ``[N, 4]`` (the inverse
    of :func:`to_xyxy`); ``image_hw`` is the output image's ``(height, width)`` for ``"yolo"``."""
    b = np.asarray(boxes_xyxy, dtype=np.float64).reshape(-1, 4)
    check_box_format(box_format)
    if box_format == "xyxy":
        out = b
    elif box_format == "xywh":
        out = np.concatenate([b[:, :2], b[:, 2:] - b[:, :2]], axis=1)
    else:
        out = np.concatenate([(b[:, :2] + b[:, 2:]) / 2, b[:, 2:] - b[:, :2]], axis=1)
        if box_format == "yolo":
            if image_hw is None:
                raise ValueError("box_format='yolo' (normalised) needs the image size")
            h, w = image_hw
            out = out / np.array([w, h, w, h], dtype=np.float64)
    return out.astype(np.float32)
