"""A VOC split read straight into per-image ``xyxy`` arrays (:func:`read_voc_boxes`), without the
COCO detour: what the loader's VOC source holds. The same images, ids, boxes, labels and report as
:func:`converters.voc2coco.convert`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any

from converters import report as R
from converters.boxes import Coords
from converters.convert_file import FileResult
from converters.labels import LabelsSpec
from converters.report import Report
from converters.voc_inputs import Difficult, Orientation
from converters.voc_plan import _Plan

__all__ = ["BOX_REPAIRS", "VocBoxes", "VocImageBoxes", "read_voc_boxes"]

@dataclass
class VocImageBoxes:
    """One converted image, as the loader's sources hold it.

    ``image_id``: the COCO image id the converter would give it (1, 2, ... in split order).
    ``file_name``: relative to the images folder. ``size``: ``(height, width)`` of the frame
    its boxes are in. ``exif_orientation``: 1..8, ``None`` when the image has none (or there is
    no images folder). ``boxes``: float32 ``[N, 4]`` absolute ``xyxy``, continuous pixels
    (``coords="voc"``: ``x1 = xmin - 1``, ``x2 = xmax``; clipped to the image), the same
    numbers a COCO reader gets from the converter's ``bbox`` (``x2 = x + w`` in float64).
    ``labels``: int64 ``[N]`` category ids (1-based positions in the category list).
    ``iscrowd``: bool ``[N]``. ``repairs``: ``(reason, detail)`` of each box the conversion
    changed or left out for its geometry (``box clipped to the image``, ``zero-size box``,
    ``box outside the image``), in object order. ``problem``: ``None`` for a converted image;
    for one kept for the loader (``keep_unreadable``), the reason :func:`convert` skips it
    (``size`` is then ``None`` when the XML gives no ``<size>``: the boxes are not clipped).
    """

    image_id: int
    file_name: str
    size: tuple[int, int] | None
    exif_orientation: int | None
    boxes: Any
    labels: Any
    iscrowd: Any
    repairs: tuple[tuple[str, str], ...] = ()
    problem: str | None = None


@dataclass
class VocBoxes:
    """A VOC split read straight into per-image arrays (:func:`read_voc_boxes`):
    ``images`` (:class:`VocImageBoxes`), ``categories`` (``{id: name}``), ``image_root``
    and the conversion ``report``."""

    images: list[VocImageBoxes]
    categories: dict[int, str]
    image_root: Path
    report: Report


def read_voc_boxes(voc_root: str | PathLike | None = None, *, split: str | None = None,
                   annotations_dir: str | PathLike | None = None,
                   images_dir: str | PathLike | None = None,
                   labels: LabelsSpec = "discover", coords: Coords = "voc",
                   difficult: Difficult = "keep", verify_images: bool = False,
                   orientation: Orientation = "auto", workers: int | None = None,
                   progress: bool | None = None, keep_unreadable: bool = False) -> VocBoxes:
    """Read one split of a VOC folder into per-image ``xyxy`` arrays, without the COCO detour
    (no JSON text, no ``[x, y, w, h]`` round trip): the same images, ids, boxes, labels and
    report as :func:`convert` (arguments and errors as there).

    ``keep_unreadable`` (not with ``verify_images``): the images :func:`convert` skips because
    their file is not found or its header gives no size are returned too, in split order, with
    their boxes in the ``<size>`` frame and their reason in ``problem`` (a loader then meets the
    file, names it and skips it, as it does any unreadable image); their ids follow the last
    converted image's, so that every converted image keeps :func:`convert`'s id. The report is
    :func:`convert`'s (they are counted as skipped)."""
    import numpy as np

    plan = _Plan.make(voc_root, [split], annotations_dir, images_dir, labels, coords, difficult,
                      verify_images, orientation, workers, boxes=True,
                      keep_unreadable=keep_unreadable)
    sink = _BoxesSink()
    reports, names = plan.run({split: sink}, progress)
    category_ids = {name: i for i, name in enumerate(names, 1)}
    images = []
    next_id = reports[split].images_converted + 1
    for image_id, file_name, size, orientation_k, names_in_file, boxes, repairs, problem in sink.records:
        if image_id is None:  # kept for the loader: after the converted images
            image_id, next_id = next_id, next_id + 1
        table = np.array(boxes, dtype=np.float64).reshape(-1, 5)
        images.append(VocImageBoxes(
            image_id, file_name, size, orientation_k, table[:, :4].astype(np.float32),
            np.array([category_ids[n] for n in names_in_file], dtype=np.int64),
            table[:, 4].astype(bool), repairs, problem))
    return VocBoxes(images, dict(enumerate(names, 1)), plan.layout.images, reports[split])


#: The conversion's events that change or leave out a box for its geometry (``VocImageBoxes.repairs``).
BOX_REPAIRS = frozenset({R.BOX_CLIPPED, R.ZERO_SIZE_BOX, R.BOX_OUTSIDE_IMAGE})


class _BoxesSink:
    """Keeps each converted image's numbers (:func:`read_voc_boxes`), and those of the images
    kept for the loader (``keep``: no id yet)."""

    def __init__(self) -> None:
        self.records: list[tuple[Any, ...]] = []

    def add(self, image_id: int | None, result: FileResult) -> None:
        assert result.image is not None
        file_name, width, height, image_json = result.image
        k = json.loads("{" + image_json).get("exif_orientation")
        repairs = tuple((reason, detail) for kind, reason, detail in result.events
                        if kind in ("object", "warning", "kept") and reason in BOX_REPAIRS)
        size = (height, width) if width and height else None
        self.records.append((image_id, file_name, size, k, result.annotations[0], result.boxes,
                             repairs, None if result.error is None else result.error[0]))

    def keep(self, result: FileResult) -> None:
        self.add(None, result)
