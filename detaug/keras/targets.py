"""Keras' detection targets: box formats and the padded ``{"boxes", "labels", **fields}`` arrays.

Keras 3 and KerasHub detectors take a batch's targets as fixed-size arrays: ``max_boxes`` rows
per sample, rows past a sample's boxes filled with ``-1`` (``keras.layers.MaxNumBoundingBoxes``
pads the same way). Per-box fields (``iscrowd``, ``area``, a track id, ...) are padded the same
way: ``[B, max_boxes, ...]``, float fields as float32 (``-1.0`` padding), the others as int32
like the labels (:func:`keras_field_dtype`); ``masks`` as int8 ``[B, max_boxes, H, W]`` (0/1,
``-1`` rows). No Keras import here: the formats are computed with NumPy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from detaug.formats.box_formats import convert_format
from detaug.masks import MASKS

__all__ = [
    "KERAS_BOX_FORMATS",
    "OVERFLOW_POLICIES",
    "PAD_VALUE",
    "BoxOverflowWarning",
    "check_box_format",
    "keras_field_dtype",
    "keras_field_spec",
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


def keras_field_dtype(dtype: Any) -> np.dtype:
    """The dtype of a per-box field in Keras targets: float32 for floating-point fields, int32
    (as the labels) for integer and boolean ones."""
    return np.dtype(np.float32) if np.dtype(dtype).kind == "f" else np.dtype(np.int32)


def keras_field_spec(name: str, spec: Any, output_size: tuple[int, int] | None) -> tuple[np.dtype, tuple]:
    """``(dtype, trailing shape)`` of a per-box field in Keras targets (``spec``: its
    :class:`~detaug.formats.samples.FieldSpec`): :func:`keras_field_dtype` and the spec's shape;
    ``masks``: int8 ``(H, W)``, the recipe's ``output_size`` (``None`` each where it varies)."""
    if name == MASKS:
        return np.dtype(np.int8), tuple(output_size) if output_size is not None else (None, None)
    return keras_field_dtype(spec.dtype), tuple(spec.shape)


def overflowing(boxes: list[np.ndarray], max_boxes: int) -> list[int]:
    """Indices of the samples with more than ``max_boxes`` boxes (``boxes``: per sample ``[N_k, 4]``)."""
    counts = np.fromiter(map(len, boxes), dtype=np.int64, count=len(boxes))
    return np.flatnonzero(counts > max_boxes).tolist()


def pad_targets(
    columns: tuple[list[int], np.ndarray, np.ndarray, dict[str, np.ndarray]],
    max_boxes: int,
    bounding_box_format: str,
    canvas_size: tuple[int, int],
    label_mapping: Any,
    specs: dict[str, Any] | None = None,
) -> dict[str, np.ndarray]:
    """A batch's targets as Keras takes them: whole-batch array operations, none per sample.

    Args:
        columns: the batch's boxes as columns, :func:`detaug.planned_batch.batch_columns`:
            ``(counts, boxes, labels, fields)``, ``counts[k]`` sample ``k``'s boxes, ``boxes``
            float32 ``[N, 4]`` absolute xyxy on the output image, ``labels`` int64 ``[N]``
            category ids, ``fields`` ``{name: [N, ...]}`` (every field of ``specs``), in
            sample order.
        max_boxes: rows per sample; a sample's boxes past it are cut (in annotation order: the
            caller applies the overflow policy first, see :func:`overflowing`).
        bounding_box_format: a Keras format (:data:`KERAS_BOX_FORMATS`).
        canvas_size: the output image's ``(height, width)``, for the ``rel_*`` formats.
        label_mapping: a :class:`~detaug.labels.LabelMap`: category ids -> class indices.
        specs: ``{name: FieldSpec}`` (:func:`detaug.field_selection.field_outputs`): the fields to
            pad, in order, with their dtype and trailing shape; ``None``: none.

    Returns:
        ``{"boxes": float32 [B, max_boxes, 4], "labels": int32 [B, max_boxes], **fields}``, each
        field ``[B, max_boxes, *shape]`` of :func:`keras_field_dtype`; rows past a sample's boxes
        :data:`PAD_VALUE`. ``masks`` (:mod:`detaug.masks`): int8 ``[B, max_boxes, H, W]``
        (``canvas_size``), 0/1, padded rows all :data:`PAD_VALUE`.

    Raises:
        ValueError: an integer field with a value that does not fit int32 (named).
    """
    counts, boxes, labels, fields = columns
    count = len(counts)
    specs = specs or {}
    out_boxes = np.full((count, max_boxes, 4), PAD_VALUE, dtype=np.float32)
    out_labels = np.full((count, max_boxes), PAD_VALUE, dtype=np.int32)
    out_fields = {name: np.full((count, max_boxes, *canvas_size), PAD_VALUE, dtype=np.int8) if name == MASKS else
                  np.full((count, max_boxes, *spec.shape), PAD_VALUE, dtype=keras_field_dtype(spec.dtype))
                  for name, spec in specs.items()}
    counts = np.asarray(counts, dtype=np.int64)
    rows = np.repeat(np.arange(count), counts)
    slots = np.arange(len(rows)) - np.repeat(np.cumsum(counts) - counts, counts)
    keep = slots < max_boxes  # each sample's first max_boxes boxes
    if not keep.all():
        rows, slots, boxes, labels = rows[keep], slots[keep], boxes[keep], labels[keep]
        fields = {name: values[keep] for name, values in fields.items()}
    if rows.size:
        out_boxes[rows, slots] = to_keras_boxes(boxes, bounding_box_format, canvas_size)
        out_labels[rows, slots] = label_mapping.map(labels)
        for name, out in out_fields.items():
            values = fields[name]
            if out.dtype.kind == "i" and values.size and values.dtype.kind in "iu" and (
                    values.min() < np.iinfo(np.int32).min or values.max() > np.iinfo(np.int32).max):
                raise ValueError(f"per-box field {name!r} has values beyond int32 ({values.min()}..{values.max()}), "
                                 "the dtype of integer fields in Keras targets")
            out[rows, slots] = values
    return {"boxes": out_boxes, "labels": out_labels, **out_fields}
