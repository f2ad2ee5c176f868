"""The records every source is made of, and the :class:`Source` protocol the loaders read.

* :class:`Sample`: one annotated image (image, xyxy boxes, labels, id, declared size, per-box
  fields); :class:`FieldSpec` and :data:`RESERVED_FIELDS`: per-box fields; :data:`COCO_FIELDS`
  and :data:`VOC_FIELDS`: the fields of the COCO and VOC sources.
* :class:`CheckedSamples`: samples that went through the checks of
  :mod:`detaug.formats.validation`, with their categories, report and field specs: what a
  source is built from (``SampleListSource(checked)``; see docs/sources.md).
* :class:`Source`: what :class:`~detaug.torch.DetectionLoader`, the Keras
  ``DetectionSequence``, the batch planner and ``write_shards`` need of a source. Every source
  of :mod:`detaug.sources` and :mod:`detaug.shards` implements it.

Conventions: boxes float32 ``[N, 4]`` absolute ``xyxy`` in continuous pixel coordinates (pixel
``i`` spans ``[i, i + 1)``), labels int64 ``[N]`` category ids in ``[0, 2**31 - 1]``, image ids
ints that fit int64, unique within a source. No DALI, torch or Keras here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from detaug.formats.report import Report

__all__ = [
    "COCO_FIELDS", "RESERVED_FIELDS", "VOC_FIELDS", "CheckedSamples", "FieldSpec", "ImageLike", "Sample", "Source",
    "field_specs",
]

ImageLike = str | os.PathLike | bytes | bytearray | memoryview | np.ndarray


@dataclass
class Sample:
    """One annotated image.

    Attributes:
        image: a file path; encoded bytes (``bytes``, ``bytearray``, ``memoryview``, or a 1-D
            uint8 array or tensor such as ``np.frombuffer(data, np.uint8)``: 1-D uint8 is always
            encoded); a decoded uint8 ``[H, W, 3]`` RGB or ``[H, W]`` grayscale array; a PIL image
            (its pixels as PIL holds them: EXIF orientation not applied); or a uint8 torch tensor
            ``[3, H, W]`` (CHW), ``[H, W, 3]`` or ``[H, W]`` (PIL images and tensors are kept as
            NumPy arrays; the type rules are :func:`detaug.formats.sample_inputs.image_input`'s).
        boxes: ``[N, 4]`` absolute ``xyxy`` boxes, pixel ``i`` spanning ``[i, i + 1)`` (kept as float32).
        labels: ``[N]`` integer category ids in ``[0, 2**31 - 1]`` (kept as int64).
        image_id: an integer id returned with the sample's target.
        size: the declared ``(height, width)`` the boxes were annotated on, or ``None``; it tells
            the frame of an EXIF-rotated image's boxes (``orientation="auto"``), and boxes are
            clipped to it.
        fields: per-box arrays by name, each ``[N, ...]`` (one row per box, in the boxes'
            order): numbers or bools (bools are kept as int64), e.g. ``{"iscrowd": [0, 1],
            "track_id": [7, 9]}``. Names are strings other than :data:`RESERVED_FIELDS`.
    """

    image: ImageLike
    boxes: Any = field(default_factory=lambda: np.zeros((0, 4), np.float32))
    labels: Any = field(default_factory=lambda: np.zeros(0, np.int64))
    image_id: int = 0
    size: tuple[int, int] | None = None
    fields: dict[str, Any] = field(default_factory=dict)


#: Names a per-box field cannot take: the targets' own keys and the sample's.
RESERVED_FIELDS = ("image", "boxes", "labels", "image_id", "size", "fields")


class FieldSpec(NamedTuple):
    """A per-box field of a source: its arrays are ``dtype [N, *shape]``."""

    dtype: np.dtype
    shape: tuple[int, ...] = ()


_INT64, _FLOAT32 = np.dtype(np.int64), np.dtype(np.float32)

#: The fields of a :class:`~detaug.sources.CocoSource`: ``iscrowd`` (0/1) and ``area`` (the box's, in pixels).
COCO_FIELDS = {"iscrowd": FieldSpec(_INT64), "area": FieldSpec(_FLOAT32)}

#: The fields of a :class:`~detaug.sources.VocSource`: ``iscrowd`` (0/1, 1 for difficult objects with
#: ``difficult="crowd"``) and ``difficult`` (0/1, the XML's flag).
VOC_FIELDS = {"iscrowd": FieldSpec(_INT64), "difficult": FieldSpec(_INT64)}


def field_specs(source: Any) -> dict[str, FieldSpec]:
    """The per-box fields every sample of ``source`` has (``{}`` for a source without any)."""
    return dict(getattr(source, "field_specs", None) or {})


@dataclass
class CheckedSamples:
    """Samples that passed the checks of :mod:`detaug.formats.validation` (boxes float32 xyxy,
    labels int64, unique ids, per-box fields aligned with their boxes): what a source is built
    from. :func:`detaug.sources.check_samples` makes one from any samples; a parser that runs
    the same checks itself (``load_coco``, the shard manifest's columns) makes one directly.

    Attributes:
        samples: the samples, a list or a read-only sequence that builds them on demand (a
            columnar view); all of one kind (encoded or decoded images).
        categories: names by category id (may be empty: the labels are then not checked
            against any).
        report: the checks' findings, finished (errors raised, repairs warned of once) by
            whoever checked them.
        field_specs: the per-box fields every sample carries.
    """

    samples: Sequence[Sample]
    categories: dict[int, str]
    report: Report
    field_specs: Mapping[str, FieldSpec] = field(default_factory=dict)


@runtime_checkable
class Source(Protocol):
    """What the loaders, the batch planner and ``write_shards`` need of a source.

    A source is an indexable, checked list of samples, built once; everything below is read by
    position ``i`` in ``range(len(source))``. The simplest way to implement it is to build a
    :class:`~detaug.sources.SampleListSource` from :class:`CheckedSamples` (docs/sources.md,
    "Adding a source"); any class with these members works.

    Attributes:
        samples: ``samples[i]`` is sample ``i`` (a :class:`Sample`, or an object with its
            attributes), boxes and labels as checked.
        categories: names by category id (``{}`` when the source has none).
        report: the checks' findings (``report.summary()``; errors never get this far).
        decoded: how images are read: ``True`` when ``load`` gives decoded uint8 ``[H, W, 3]``
            arrays, ``False`` when it gives encoded bytes (decoded by DALI).
        orientation: the frame of the boxes of EXIF-rotated images (``"auto"``, ``"apply"``,
            ``"ignore"``; :mod:`detaug.formats.images`).
        field_specs: ``{name: FieldSpec}`` of the per-box fields every sample carries.

    Optional hints, read with ``getattr`` where present: ``shuffle``, ``seed``, ``shard_id``,
    ``num_shards`` (the loaders' defaults when their own arguments are ``None``) and
    ``shard_sizes`` (sizes of groups of consecutive samples stored together, such as a shard
    folder's tar files: shuffling then permutes whole groups first).
    """

    samples: Sequence[Any]
    categories: dict[int, str]
    report: Report
    decoded: bool
    orientation: str
    field_specs: dict[str, FieldSpec]

    def __len__(self) -> int:
        """The number of samples."""

    def load(self, index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """``(data, boxes float32 [N, 4], labels int64 [N], image_id)`` of sample ``index``:
        ``data`` uint8 ``[L]`` encoded bytes (possibly not an image: the loaders probe it, name
        it and skip it) or a decoded uint8 ``[H, W, 3]`` array. ``OSError`` naming the file when
        it cannot be read (the loaders skip it too)."""

    def file_of(self, index: int) -> str:
        """The file of sample ``index`` for messages (a path, a tar member, ``"sample i (...)"``)."""

    def describe(self, index: int) -> str:
        """A short description of sample ``index`` for messages (its file and image id)."""

    def present_labels(self) -> np.ndarray:
        """int64: the distinct labels of the boxes."""

    def max_boxes(self) -> int:
        """The most boxes of one sample."""
