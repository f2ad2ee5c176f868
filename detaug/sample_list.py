"""An in-memory list of checked samples: :class:`SampleListSource`, the base of every source.

A :class:`SampleListSource` holds samples checked once by :func:`detaug.sample_checks.check_samples`
(or :class:`~detaug.formats.samples.CheckedSamples` a parser checked itself) and reads them by
position: ``load(i)`` gives the encoded bytes or the decoded array, xyxy boxes, labels and the
image id. The sources of files (:class:`~detaug.sources.CocoSource`, :class:`~detaug.sources.VocSource`,
:class:`~detaug.sources.YoloSource`) build one from their parsed samples; :mod:`detaug.sources`
describes the conventions and exports this class too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from detaug.formats.images import ORIENTATIONS, read_bytes
from detaug.formats.report import Report
from detaug.formats.samples import CheckedSamples, FieldSpec, Sample
from detaug.sample_checks import check_samples, is_decoded

__all__ = ["SampleListSource", "check_orientation"]


def check_orientation(orientation: str) -> str:
    """``orientation`` if it is one of :data:`ORIENTATIONS`, else ``ValueError``."""
    if not isinstance(orientation, str) or orientation not in ORIENTATIONS:
        raise ValueError(f"orientation must be one of {', '.join(map(repr, ORIENTATIONS))}, got {orientation!r}")
    return orientation


class SampleListSource:
    """An in-memory list of samples, checked once: a :class:`~detaug.formats.samples.Source`.

    All images must be of one kind: encoded (paths, bytes; decoded by DALI) or decoded (arrays,
    PIL images, tensors).

    Args:
        samples: the samples, each a :class:`Sample`, a mapping with its field names (per-box
            fields under the key ``"fields"``: ``{"image": ..., "boxes": ..., "labels": ...,
            "fields": {"track_id": [...]}}``), or a tuple ``(image, boxes, labels)`` /
            ``(image, boxes, labels, image_id)``; ``image_id`` defaults to the 1-based
            position when all are 0. Every sample with boxes must carry the same per-box fields
            (a sample without boxes may leave them out), each of one trailing shape; a field's
            arrays are cast to one dtype (NumPy's promotion; bools become int64).
            Or :class:`~detaug.formats.samples.CheckedSamples` (from :func:`check_samples`, or
            from a parser that ran the checks itself), taken as they are: the way a new source
            is built (docs/sources.md, "Adding a source").
        categories: optional names by category id; when given, every label must be one of them.
        orientation: the frame of the boxes of EXIF-rotated images (:data:`ORIENTATIONS`; see
            :mod:`detaug.formats.images`).
        box_format: the format of the given boxes: ``"xyxy"`` (default), ``"xywh"``, ``"cxcywh"``
            (pixels) or ``"yolo"`` (cxcywh as fractions of the image size, read from the array or
            the image header); converted once to xyxy pixels (:mod:`detaug.formats.box_formats`).

    Raises:
        DatasetError: any error of the :mod:`detaug.formats.validation` table; a per-box field
            whose rows are not one per box, that is not numbers, has a reserved name, or that
            some samples with boxes lack ("malformed annotation", naming the sample).
        TypeError: naming the sample's index and what it got: a sample that is not a
            :class:`Sample`, mapping or tuple of 3 or 4 items, an unknown key, an image of
            another type (see :class:`Sample`).

    Attributes:
        field_specs: ``{name: FieldSpec}`` of the per-box fields every sample has.
    """

    samples: Sequence[Sample]
    decoded: bool
    categories: dict[int, str]
    orientation: str
    report: Report
    field_specs: dict[str, FieldSpec]

    def __init__(self, samples: CheckedSamples | Iterable[Sample | Mapping[str, Any] | tuple],
                 categories: Mapping[int, str] | None = None, *, orientation: str = "auto",
                 box_format: str = "xyxy") -> None:
        orientation = check_orientation(orientation)
        if isinstance(samples, CheckedSamples):
            if categories is not None or box_format != "xyxy":
                raise TypeError("CheckedSamples carry their categories and xyxy boxes: give neither categories "
                                "nor box_format with them")
            checked = samples
        else:
            checked = check_samples(samples, categories, box_format=box_format)
            checked.report.finish()
        self.samples = checked.samples
        self.categories = checked.categories
        self.report = checked.report
        self.orientation = orientation
        self.decoded = bool(len(checked.samples)) and is_decoded(checked.samples[0].image)
        self.field_specs = dict(checked.field_specs)

    def __len__(self) -> int:
        return len(self.samples)

    def file_of(self, index: int) -> str:
        """The image file of sample ``index``, or ``"sample i (array (H, W, 3))"`` /
        ``"sample i (N bytes)"`` for in-memory images."""
        image = self.samples[index].image
        if isinstance(image, str):
            return image
        if isinstance(image, np.ndarray) and image.ndim == 1:
            return f"sample {index} ({image.size} bytes)"
        if isinstance(image, np.ndarray):
            return f"sample {index} (array {image.shape})"
        return f"sample {index} ({len(image)} bytes)"

    def describe(self, index: int) -> str:
        """A short description of sample ``index`` for messages."""
        return f"sample {index} ({self.file_of(index)}, image_id {self.samples[index].image_id})"

    def load(self, index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """``(data, boxes float32 [N, 4], labels int64 [N], image_id)`` of sample ``index``.

        ``data`` is uint8 ``[L]`` encoded bytes (read from the file for a path; possibly empty:
        the image probe tells) or a decoded uint8 ``[H, W, 3]`` array (grayscale repeated).
        ``OSError`` naming the file when it cannot be read.
        """
        s = self.samples[index]
        image = s.image
        if isinstance(image, np.ndarray):
            data = np.repeat(image[..., None], 3, axis=2) if image.ndim == 2 else image
        elif isinstance(image, bytes):
            data = np.frombuffer(image, dtype=np.uint8)
        else:
            try:
                data = read_bytes(image)
            except OSError as err:
                raise OSError(err.errno, f"{image}: cannot read the image file: {err.strerror or err}") from err
        return data, s.boxes, s.labels, s.image_id

    def present_labels(self) -> np.ndarray:
        """int64: the distinct labels of the boxes (read from the columns of a cached source)."""
        table = getattr(self.samples, "table", None)
        if table is not None:
            return np.asarray(table.present_labels(), dtype=np.int64)
        labels = [np.asarray(s.labels).reshape(-1) for s in self.samples]
        return np.unique(np.concatenate(labels)).astype(np.int64) if labels else np.zeros(0, np.int64)

    def max_boxes(self) -> int:
        """The most boxes of one sample."""
        table = getattr(self.samples, "table", None)
        if table is not None:
            return int(table.max_boxes())
        return max((len(s.boxes) for s in self.samples), default=0)

    def to_sample_list(self) -> SampleListSource:
        """This source (it is one)."""
        return self
