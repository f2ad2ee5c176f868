"""Box formats: the one module that converts boxes between detaug's internal format and others.

detaug works in absolute ``xyxy`` pixels (pixel ``i`` spans ``[i, i + 1)``). Each format's rule
is written once, as a dtype-preserving function on ``[..., 4]`` arrays (:func:`xywh_to_xyxy`,
:func:`xyxy_to_xywh`, :func:`cxcywh_to_xyxy`, :func:`xyxy_to_cxcywh`); the entry points below
choose the dtype and the order of the steps.

Formats users hand in and get back (:func:`to_xyxy`, :func:`from_xyxy`; float64 arithmetic):

* ``"xyxy"``: ``(x_min, y_min, x_max, y_max)`` pixels (torchvision, Pascal VOC after ``-1``);
* ``"xywh"``: ``(x, y, width, height)`` pixels (COCO's ``bbox``);
* ``"cxcywh"``: ``(centre x, centre y, width, height)`` pixels (torchvision ``CXCYWH``);
* ``"yolo"``: ``(centre x, centre y, width, height)`` as fractions of the image width and height
  (YOLO label files, albumentations ``"yolo"``); needs the image size.

Formats of the Keras targets (:func:`convert_format`, float32 arithmetic; names as in Keras 3):
:data:`BOX_FORMATS`, the ``rel_*`` ones divided by the image width (x) and height (y) first.

Box geometry (areas, IoU, clipping) is :mod:`detaug.boxes`'. No DALI, torch or Keras here.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "BOX_FORMATS", "INPUT_BOX_FORMATS", "check_box_format", "convert_format", "cxcywh_to_xyxy", "from_xyxy",
    "to_xyxy", "xywh_to_xyxy", "xyxy_to_cxcywh", "xyxy_to_xywh",
]

#: The formats :func:`to_xyxy` reads and :func:`from_xyxy` writes.
INPUT_BOX_FORMATS = ("xyxy", "xywh", "cxcywh", "yolo")

#: The formats :func:`convert_format` writes (Keras 3's names; ``rel_*``: fractions of the image).
BOX_FORMATS = ("xyxy", "xywh", "cxcywh", "yxyx", "rel_xyxy", "rel_xywh", "rel_yxyx", "rel_cxcywh")


# -- the rules, one per format (dtype-preserving, [..., 4]) -----------------------------------------

def xywh_to_xyxy(boxes: np.ndarray) -> np.ndarray:
    """``[..., 4]`` ``(x, y, w, h)`` -> ``(x_min, y_min, x_max, y_max)``, in the boxes' dtype."""
    b = np.asarray(boxes)
    return np.concatenate([b[..., :2], b[..., :2] + b[..., 2:]], axis=-1)


def xyxy_to_xywh(boxes: np.ndarray) -> np.ndarray:
    """``[..., 4]`` ``(x_min, y_min, x_max, y_max)`` -> ``(x, y, w, h)``, in the boxes' dtype."""
    b = np.asarray(boxes)
    return np.concatenate([b[..., :2], b[..., 2:] - b[..., :2]], axis=-1)


def cxcywh_to_xyxy(boxes: np.ndarray) -> np.ndarray:
    """``[..., 4]`` ``(cx, cy, w, h)`` -> ``(x_min, y_min, x_max, y_max)``, in the boxes' dtype."""
    b = np.asarray(boxes)
    half = b[..., 2:] / 2
    return np.concatenate([b[..., :2] - half, b[..., :2] + half], axis=-1)


def xyxy_to_cxcywh(boxes: np.ndarray) -> np.ndarray:
    """``[..., 4]`` ``(x_min, y_min, x_max, y_max)`` -> ``(cx, cy, w, h)``, in the boxes' dtype."""
    b = np.asarray(boxes)
    return np.concatenate([(b[..., :2] + b[..., 2:]) / 2, b[..., 2:] - b[..., :2]], axis=-1)


def _per_side(image_hw: tuple[int, int] | None, dtype: type) -> np.ndarray:
    """``[w, h, w, h]`` of ``image_hw`` ``(height, width)``; ``ValueError`` when it is missing."""
    if image_hw is None:
        raise ValueError("box_format='yolo' (normalised) needs the image size")
    h, w = image_hw
    return np.array([w, h, w, h], dtype=dtype)


# -- users' formats ----------------------------------------------------------------------------------

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
        return xywh_to_xyxy(b)
    if box_format == "yolo":
        b = b * _per_side(image_hw, np.float64)
    return cxcywh_to_xyxy(b)


def from_xyxy(boxes_xyxy: np.ndarray, box_format: str, image_hw: tuple[int, int] | None = None) -> np.ndarray:
    """float32 ``[N, 4]`` boxes in ``box_format`` from absolute xyxy boxes ``[N, 4]`` (the inverse
    of :func:`to_xyxy`); ``image_hw`` is the output image's ``(height, width)`` for ``"yolo"``."""
    b = np.asarray(boxes_xyxy, dtype=np.float64).reshape(-1, 4)
    check_box_format(box_format)
    if box_format == "xyxy":
        out = b
    elif box_format == "xywh":
        out = xyxy_to_xywh(b)
    else:
        out = xyxy_to_cxcywh(b)
        if box_format == "yolo":
            out = out / _per_side(image_hw, np.float64)
    return out.astype(np.float32)


# -- the Keras targets' formats ------------------------------------------------------------------------

def convert_format(boxes_xyxy: np.ndarray, fmt: str, canvas_size: tuple[int, int]) -> np.ndarray:
    """Convert absolute ``xyxy`` boxes ``[..., 4]`` to ``fmt`` (:data:`BOX_FORMATS`, names as in
    Keras 3), float32.

    ``canvas_size`` is ``(height, width)`` of the image the boxes live in; it is used by the
    relative (``rel_*``) formats, whose coordinates are divided by the width (x) and height (y).
    """
    if fmt not in BOX_FORMATS:
        raise ValueError(f"unknown box format {fmt!r}; expected one of {', '.join(BOX_FORMATS)}")
    b = np.asarray(boxes_xyxy, dtype=np.float32)
    rel = fmt.startswith("rel_")
    base = fmt[4:] if rel else fmt
    if rel:
        b = b / _per_side(canvas_size, np.float32)
    if base == "xyxy":
        out = b
    elif base == "xywh":
        out = xyxy_to_xywh(b)
    elif base == "cxcywh":
        out = xyxy_to_cxcywh(b)
    else:  # yxyx
        out = b[..., [1, 0, 3, 2]]
    return out.astype(np.float32, copy=False)
