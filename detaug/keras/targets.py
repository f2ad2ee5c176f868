"""Keras' detection targets: box formats and the padded ``{"boxes", "labels"}`` arrays.

Keras 3 and KerasHub detectors take a batch's targets as fixed-size arrays: ``max_boxes`` rows
per sample, rows past a sample's boxes filled with ``-1`` (``keras.layers.MaxNumBoundingBoxes``
pads the same way). No Keras import here: the formats are computed with NumPy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from detaug.boxes import convert_format

__all__ = [
    "KERAS_BOX_FORMATS",
    "OVERFLOW_POLICIES",
    "PAD_VALUE",
    "BoxOverflowWarning",
    "check_box_format",
    "overflowing",
    "pad_targets",
    "to_keras_boxes",
]

#: ``bounding_box_format`` names, as in ``keras.utils.bounding_boxes.convert_format``.
KERAS_BOX_FORMATS = (
    "xyxy",
    "yxyx",
    "xywh",
    "center_xywh",
    "center_yxhw",
    "rel_xyxy",
    "rel_yxyx",
    "rel_xywh",
    "rel_center_xywh",
)

#: ``overflow`` policies for samples with more than ``max_boxes`` boxes.
OVERFLOW_POLICIES = ("raise", "warn", "truncate")

#: The value of padded rows, in both ``boxes`` and ``labels``.
PAD_VALUE = -1


class BoxOverflowWarning(UserWarning):
    """Boxes beyond ``max_boxes`` were cut from a batch (``overflow="warn"``)."""


def check_box_format(bounding_box_format: str) -> str:
    """The lower-case name of a Keras box format, or a ``ValueError`` listing them."""
    fmt = str(bounding_box_format).lower()
    if fmt not in KERAS_BOX_FORMATS:
        raise ValueError(
            f"unknown bounding_box_format {bounding_box_format!r}; expected one of Keras' "
            f"{', '.join(KERAS_BOX_FORMATS)}"
        )
    return fmt


def to_keras_boxes(boxes_xyxy: np.ndarray, bounding_box_format: str, canvas_size: tuple[int, int]) -> np.ndarray:
    """Absolute ``xyxy`` boxes ``[..., 4]`` in a Keras format (see :data:`KERAS_BOX_FORMATS`);
    ``canvas_size`` is the image's ``(height, width)``, used by the ``rel_*`` formats."""
    fmt = check_box_format(bounding_box_format)
    rel = "rel_" if fmt.startswith("rel_") else ""
    base = fmt[len(rel) :]
    if base == "center_yxhw":
        return convert_format(boxes_xyxy, "cxcywh", canvas_size)[..., [1, 0, 3, 2]]
    return convert_format(boxes_xyxy, rel + ("cxcywh" if base == "center_xywh" else base), canvas_size)


def overflowing(boxes: list[np.ndarray], max_boxes: int) -> list[int]:
    """Indices of the samples with more than ``max_boxes`` boxes (``boxes``: per sample ``[N_k, 4]``)."""
    counts = np.fromiter(map(len, boxes), dtype=np.int64, count=len(boxes))
    return np.flatnonzero(counts > max_boxes).tolist()


def pad_targets(
    boxes: list[np.ndarray],
    labels: list[np.ndarray],
    max_boxes: int,
    bounding_box_format: str,
    canvas_size: tuple[int, int],
    label_mapping: Any,
) -> dict[str, np.ndarray]:
    """A batch's targets as Keras takes them: whole-batch array operations, none per sample.

    Args:
        boxes: per sample float32 ``[N_k, 4]`` absolute xyxy boxes on the output image.
        labels: per sample int64 ``[N_k]`` category ids.
        max_boxes: rows per sample; a sample's boxes past it are cut (in annotation order: the
            caller applies the overflow policy first, see :func:`overflowing`).
        bounding_box_format: a Keras format (:data:`KERAS_BOX_FORMATS`).
        canvas_size: the output image's ``(height, width)``, for the ``rel_*`` formats.
        label_mapping: a :class:`~detaug.labels.LabelMap`: category ids -> class indices.

    Returns:
        ``{"boxes": float32 [B, max_boxes, 4], "labels": int32 [B, max_boxes]}``, rows past a
        sample's boxes :data:`PAD_VALUE`.
    """
    count = len(boxes)
    out_boxes = np.full((count, max_boxes, 4), PAD_VALUE, dtype=np.float32)
    out_labels = np.full((count, max_boxes), PAD_VALUE, dtype=np.int32)
    counts = np.fromiter(map(len, boxes), dtype=np.int64, count=count)
    if (counts > max_boxes).any():
        boxes = [b[:max_boxes] for b in boxes]
        labels = [lab[:max_boxes] for lab in labels]
        counts = np.minimum(counts, max_boxes)
    total = int(counts.sum())
    if total:
        rows = np.repeat(np.arange(count), counts)
        slots = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
        every = np.concatenate(boxes).reshape(-1, 4).astype(np.float32, copy=False)
        out_boxes[rows, slots] = to_keras_boxes(every, bounding_box_format, canvas_size)
        out_labels[rows, slots] = label_mapping.map(np.concatenate(labels).reshape(-1))
    return {"boxes": out_boxes, "labels": out_labels}
