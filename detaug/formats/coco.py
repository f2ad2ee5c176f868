"""The one COCO detection parser: :func:`load_coco` reads and checks a COCO JSON (or dict).

Every COCO input of detaug goes through here (``CocoSource``, and ``VocSource`` through the
converter's output), checked by :mod:`detaug.formats.validation` (see its table for what is an
error, a repair or a note). What it gives back, per image, is columnar: float32 ``[N, 4]``
absolute ``xyxy`` boxes (COCO's ``[x, y, w, h]`` converted, continuous pixel coordinates, pixel
``i`` spanning ``[i, i + 1)``), int64 ``[N]`` category ids, bool ``[N]`` crowd flags and int64
``[N]`` annotation ids, in the order of the ``annotations`` list.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from detaug.errors import DatasetError
from detaug.formats import validation as v
from detaug.formats.box_formats import xywh_to_xyxy

__all__ = ["CocoDataset", "CocoImage", "load_coco", "read_json"]

#: ``annotation_ids`` entry of an annotation without an ``id``.
NO_ANNOTATION_ID = -1


@dataclass
class CocoImage:
    """One COCO image and its (checked, repaired) annotations.

    Attributes:
        id: the image id.
        file_name: as in the JSON (relative to the images folder).
        size: the declared ``(height, width)``, ``None`` when the entry has neither.
        exif_orientation: the entry's ``exif_orientation`` (1..8), ``None`` when absent.
        boxes: float32 ``[N, 4]`` absolute ``xyxy``.
        labels: int64 ``[N]`` category ids.
        iscrowd: bool ``[N]``.
        annotation_ids: int64 ``[N]`` (:data:`NO_ANNOTATION_ID` where the annotation has no id).
    """

    id: int
    file_name: str
    size: tuple[int, int] | None = None
    exif_orientation: int | None = None
    boxes: np.ndarray = field(default_factory=lambda: np.zeros((0, 4), np.float32))
    labels: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    iscrowd: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    annotation_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    #: float32 ``[N, K, 3]`` keypoints of a keypoints file (:func:`detaug.keypoints.coco_keypoints`), else ``None``
    keypoints: np.ndarray | None = None
    #: the boxes' ``segmentation`` values, not decoded (:class:`detaug.masks.CocoMasks`), read with ``masks=True``
    masks: Any = None


@dataclass
class CocoDataset:
    """A checked COCO detection dataset.

    Attributes:
        source: the file it was read from (or the name given for a dict).
        images: in the JSON's order.
        categories: names by category id, in the JSON's order.
        report: the checks' findings (:class:`~detaug.formats.validation.Report`).
    """

    source: str
    images: list[CocoImage]
    categories: dict[int, str]
    report: v.Report


def read_json(path: str | os.PathLike) -> Any:
    """The parsed JSON file; :class:`DatasetError` naming the file (and line, column) when it is
    not JSON, or not a regular file (a link to ``/dev/zero``). ``OSError`` (e.g.
    ``FileNotFoundError``) passes through."""
    if not stat.S_ISREG(os.stat(path).st_mode):  # a device or a pipe planted as a file (opening a pipe blocks)
        raise DatasetError(f"{path}: {v.NOT_JSON}: not a regular file")
    with open(path, "rb") as f:
        data = f.read()
    try:
        return json.loads(data)
    except json.JSONDecodeError as err:
        raise DatasetError(f"{path}: {v.NOT_JSON}: {err.msg} (line {err.lineno}, column {err.colno})") from None
    except UnicodeDecodeError as err:
        raise DatasetError(f"{path}: {v.NOT_JSON}: not UTF-8/16/32 text ({err.reason} at byte {err.start})") from None
    except RecursionError:
        raise DatasetError(f"{path}: {v.NOT_JSON}: nested too deeply") from None
    except ValueError as err:  # e.g. an integer of more than 4300 digits
        raise DatasetError(f"{path}: {v.NOT_JSON}: {err}") from None


def load_coco(path_or_dict: str | os.PathLike | Mapping[str, Any], *, name: str | None = None,
              allow_paths_outside: bool = False, masks: bool = False) -> CocoDataset:
    """Read and check a COCO detection JSON file, or a dict of one.

    Args:
        path_or_dict: the file, or the parsed dict.
        name: how messages name the data (default: the path, or ``"<COCO dict>"``).
        allow_paths_outside: accept a ``file_name`` that is absolute or leaves the images
            folder with ``..`` (default: an error, "path outside the dataset folder";
            :func:`~detaug.formats.validation.path_problem`, docs/security.md).
        masks: also read each annotation's ``segmentation`` (polygons or RLE, checked for their
            form; ``CocoImage.masks``, decoded when an image is read: :mod:`detaug.masks`); an
            annotation without one is a "malformed annotation".

    Returns:
        The dataset, repairs applied and counted in its ``report`` (a :class:`DataWarning` says
        when there were any).

    Raises:
        DatasetError: the file is not JSON, or any error of the validation table; the message
            names the file and the image or annotation id.
        TypeError: ``path_or_dict`` is neither a path nor a mapping.
    """
    if isinstance(path_or_dict, Mapping):
        doc, source = path_or_dict, name or "<COCO dict>"
    elif isinstance(path_or_dict, (str, os.PathLike)):
        doc, source = read_json(path_or_dict), name or str(path_or_dict)
    else:
        raise TypeError(f"load_coco takes a path or a dict, got {type(path_or_dict).__name__}")
    return _Parser(source, allow_paths_outside=allow_paths_outside, masks=masks).parse(doc)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class _Parser:
    def __init__(self, source: str, *, allow_paths_outside: bool = False, masks: bool = False) -> None:
        self.source = source
        self.masks = masks
        self.allow_paths_outside = allow_paths_outside
        self.report = v.Report(source)

    def error(self, reason: str, *, image_id: int | None = None, annotation: int | str | None = None,
              detail: str = "", file: str | None = None) -> None:
        self.report.add(reason, file or self.source, image_id=image_id, annotation=annotation, detail=detail)

    # -- top level -------------------------------------------------------------------------
    def parse(self, doc: Any) -> CocoDataset:
        if not isinstance(doc, Mapping):
            self.error(v.NOT_COCO, detail=f"the top level is a {type(doc).__name__}, not an object")
            self.report.raise_errors()
        images_raw = doc.get("images")
        annotations_raw = doc.get("annotations", [])
        categories_raw = doc.get("categories")
        if not isinstance(images_raw, list):
            self.error(v.NOT_COCO, detail=f'"images" is {_short(images_raw)}, not a list')
        if not isinstance(annotations_raw, list):
            self.error(v.NOT_COCO, detail=f'"annotations" is {_short(annotations_raw)}, not a list')
        if categories_raw is None and isinstance(annotations_raw, list) and annotations_raw:
            self.error(v.NOT_COCO, detail='no "categories": the category ids cannot be checked')
        elif categories_raw is not None and not isinstance(categories_raw, list):
            self.error(v.NOT_COCO, detail=f'"categories" is {_short(categories_raw)}, not a list')
        self.report.raise_errors()

        categories = self.categories(categories_raw or [])
        images, unusable = self.images(images_raw)
        if not images_raw:
            self.error(v.NO_IMAGES, detail='"images" is empty')
        columns = self.annotations(annotations_raw, images, unusable, categories)
        self.boxes(images, columns)
        self.report.images = len(images)
        self.report.boxes = sum(len(im.boxes) for im in images.values())
        self.report.finish()
        return CocoDataset(self.source, list(images.values()), categories, self.report)

    def objects(self, raw: list[Any], key: str, reason: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
        """``(where, entry)`` of each entry of the list ``key`` that is an object, ``where`` its
        place (``"images[3]"``); any other entry is reported as ``reason`` and passed over."""
        for k, entry in enumerate(raw):
            where = f"{key}[{k}]"
            if not isinstance(entry, Mapping):
                self.error(reason, annotation=where, detail=f"{_short(entry)} is not an object")
                continue
            yield where, entry

    # -- categories ------------------------------------------------------------------------
    def categories(self, raw: list[Any]) -> dict[int, str]:
        categories: dict[int, str] = {}
        for where, c in self.objects(raw, "categories", v.MALFORMED_CATEGORY):
            cid = v.as_int(c.get("id"))
            if cid is None:
                self.error(v.MALFORMED_CATEGORY, annotation=where, detail=f"id {_short(c.get('id'))} is not an integer")
                continue
            problem = v.label_problem(cid)
            if problem:
                self.error(problem, annotation=where, detail=f"category id {cid}")
                continue
            name = c.get("name")
            if not isinstance(name, str):
                self.error(v.MALFORMED_CATEGORY, annotation=where, detail=f"category {cid}: name {_short(name)} is not a string")
                continue
            if cid in categories:
                self.error(v.DUPLICATE_CATEGORY, annotation=where, detail=f"id {cid} ({categories[cid]!r} and {name!r})")
                continue
            categories[cid] = name
        return categories

    # -- images ----------------------------------------------------------------------------
    def images(self, raw: list[Any]) -> tuple[dict[int, CocoImage], set[int]]:
        """Good images by id, and ids of images with errors (their annotations are not
        reported again as of an unknown image)."""
        images: dict[int, CocoImage] = {}
        unusable: set[int] = set()
        by_file: dict[str, int] = {}
        for where, im in self.objects(raw, "images", v.MALFORMED_IMAGE):
            iid = v.as_int(im.get("id"))
            if iid is None or not v.INT64_MIN <= iid <= v.INT64_MAX:
                self.error(v.BAD_IMAGE_ID, annotation=where, detail=f"id {_short(im.get('id'))}")
                continue
            errors = self.report.total
            file_name = im.get("file_name")
            if not isinstance(file_name, str) or not file_name:
                self.error(v.MALFORMED_IMAGE, image_id=iid, detail=f"file_name {_short(file_name)} is not a file name")
                file_name = None
            elif not self.allow_paths_outside:
                why = v.path_problem(file_name)
                if why is not None:
                    self.error(v.PATH_OUTSIDE, image_id=iid, detail=f"file_name {_short(file_name)} {why} "
                               "(allow_paths_outside=True accepts it)")
                    file_name = None
            file = f"{self.source}: {file_name}" if file_name else self.source
            size = None
            height, width = im.get("height"), im.get("width")
            if height is not None or width is not None:
                size, why = v.check_size(height, width)
                if size is None:
                    self.error(v.BAD_SIZE, image_id=iid, detail=why, file=file)
            orientation = im.get("exif_orientation")
            if orientation is not None:
                orientation = v.as_int(orientation)
                if orientation is None or not 1 <= orientation <= 8:
                    self.error(v.MALFORMED_IMAGE, image_id=iid, file=file,
                               detail=f"exif_orientation {_short(im.get('exif_orientation'))} is not 1..8")
            if iid in images or iid in unusable:
                other = images[iid].file_name if iid in images else "?"
                self.error(v.DUPLICATE_IMAGE_ID, image_id=iid, file=file, detail=f"also the id of {other!r}")
            if file_name is not None:
                key = v.file_key(file_name)
                if key in by_file:
                    self.error(v.DUPLICATE_FILE, image_id=iid, file=file,
                               detail=f"{file_name!r} is also image_id {by_file[key]}")
                else:
                    by_file[key] = iid
            if self.report.total > errors:  # this entry had errors
                unusable.add(iid)
                images.pop(iid, None)
                continue
            if size is None:
                self.report.add(v.SIZE_NOT_DECLARED, file, image_id=iid, detail="no width/height")
            images[iid] = CocoImage(iid, file_name, size, orientation)
        return images, unusable

    # -- annotations -----------------------------------------------------------------------
    def annotations(self, raw: list[Any], images: dict[int, CocoImage], unusable: set[int],
                    categories: dict[int, str]) -> _Columns:
        """The well-formed annotations, as columns (the hot loop: plain types take fast paths)."""
        cols = _Columns()
        for k, ann in enumerate(raw):  # the check of objects() inline: no place string made per entry
            if type(ann) is not dict and not isinstance(ann, Mapping):
                self.error(v.MALFORMED_ANNOTATION, annotation=f"annotations[{k}]", detail=f"{_short(ann)} is not an object")
                continue
            aid = ann.get("id", _MISSING)
            if aid is _MISSING:
                aid, where = NO_ANNOTATION_ID, f"annotations[{k}]"
            else:
                aid = aid if type(aid) is int else v.as_int(aid)
                if aid is None or not v.INT64_MIN <= aid <= v.INT64_MAX:
                    self.error(v.MALFORMED_ANNOTATION, annotation=f"annotations[{k}]",
                               detail=f"id {_short(ann['id'])} is not an int64 integer")
                    continue
                where = aid
            iid = ann.get("image_id")
            iid = iid if type(iid) is int else v.as_int(iid)
            if iid is None:
                self.error(v.MALFORMED_ANNOTATION, annotation=where, detail=f"image_id {_short(ann.get('image_id'))} is not an integer")
                continue
            if iid not in images:
                if iid not in unusable:
                    self.error(v.UNKNOWN_IMAGE, image_id=iid, annotation=where)
                continue
            cid = ann.get("category_id")
            cid = cid if type(cid) is int else v.as_int(cid)
            if cid is None or cid not in categories:  # categories hold valid ids only
                if cid is None:
                    reason, detail = v.MALFORMED_ANNOTATION, f"category_id {_short(ann.get('category_id'))} is not an integer"
                else:
                    reason, detail = v.label_problem(cid) or v.UNKNOWN_CATEGORY, f"category_id {cid}"
                self.error(reason, image_id=iid, annotation=where, file=self.file_of(images[iid]), detail=detail)
                continue
            crowd = ann.get("iscrowd", 0)
            if not (isinstance(crowd, (int, float, np.integer, np.floating)) and crowd in (0, 1)):
                self.error(v.MALFORMED_ANNOTATION, image_id=iid, annotation=where, file=self.file_of(images[iid]),
                           detail=f"iscrowd {_short(crowd)} is not 0 or 1")
                continue
            bbox = ann.get("bbox")
            if bbox is None:
                self.error(v.NO_BOX, image_id=iid, annotation=where, file=self.file_of(images[iid]))
                continue
            xywh = None
            if (type(bbox) is list or isinstance(bbox, (list, tuple))) and len(bbox) == 4:
                x, y, w, h = bbox
                if _NUMBER.issuperset((type(x), type(y), type(w), type(h))):
                    xywh = (x, y, w, h)
                else:
                    xywh = tuple(v.as_coordinate(c) for c in bbox)
                    if None in xywh:
                        xywh = None
            if xywh is None:
                self.error(v.MALFORMED_BOX, image_id=iid, annotation=where, file=self.file_of(images[iid]),
                           detail=f"bbox {_short(bbox)} is not [x, y, w, h] numbers")
                continue
            cols.xywh.append(xywh)
            cols.image_ids.append(iid)
            cols.labels.append(cid)
            cols.crowd.append(crowd == 1)
            cols.ids.append(aid)
            cols.positions.append(k)
            cols.keypoints.append(ann.get("keypoints"))
            if self.masks:
                cols.segmentations.append(ann.get("segmentation"))
        return cols

    def file_of(self, image: CocoImage) -> str:
        return f"{self.source}: {image.file_name}"

    # -- boxes -----------------------------------------------------------------------------
    def boxes(self, images: dict[int, CocoImage], cols: _Columns) -> None:
        """Convert to xyxy, check and repair all boxes at once, and give each image its own
        (in the order of the annotations list)."""
        if not cols.xywh:
            return
        order = list(images)
        index = {iid: i for i, iid in enumerate(order)}
        owner = np.array([index[iid] for iid in cols.image_ids], dtype=np.int64)
        try:
            table = np.array(cols.xywh, dtype=np.float64).reshape(-1, 4)
        except OverflowError:  # an integer beyond float64: as_coordinate makes it inf
            table = np.array([[v.as_coordinate(c) for c in row] for row in cols.xywh], dtype=np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            xyxy = xywh_to_xyxy(table)
        sizes = np.array([im.size or (np.nan, np.nan) for im in images.values()], dtype=np.float64).reshape(-1, 2)
        ids = np.array(cols.ids, dtype=np.int64)

        def where(j: int) -> tuple[str, int | None, int | str | None]:
            image = images[order[owner[j]]]
            annotation = int(ids[j]) if ids[j] != NO_ANNOTATION_ID else f"annotations[{cols.positions[j]}]"
            return self.file_of(image), image.id, annotation

        boxes, keep = v.check_boxes(xyxy, sizes[owner], self.report, where)
        rank = np.argsort(owner[keep], kind="stable")
        boxes, owner = boxes[keep][rank], owner[keep][rank]
        labels = np.array(cols.labels, dtype=np.int64)[keep][rank]
        crowd = np.array(cols.crowd, dtype=bool)[keep][rank]
        ids = ids[keep][rank]
        bounds = np.concatenate([[0], np.cumsum(np.bincount(owner, minlength=len(order)))]).tolist()
        points = self.keypoints(cols, np.flatnonzero(keep)[rank], where)
        segmentations = self.segmentations(cols, np.flatnonzero(keep)[rank], images) if self.masks else None
        for i, image in enumerate(images.values()):
            a, b = bounds[i], bounds[i + 1]
            if b > a:
                image.boxes, image.labels, image.iscrowd, image.annotation_ids = boxes[a:b], labels[a:b], crowd[a:b], ids[a:b]
            if points is not None:
                image.keypoints = points[a:b]
            if segmentations is not None:
                image.masks = segmentations[a:b]

    def segmentations(self, cols: _Columns, rows: np.ndarray, images: dict[int, CocoImage]) -> Any:
        """The ``segmentation`` of the kept annotations ``rows``, not decoded
        (:class:`detaug.masks.CocoMasks`); a missing or malformed one recorded as a "malformed
        annotation" naming the file and annotation (:func:`detaug.masks.segmentation_problem`)."""
        from detaug.masks import CocoMasks, segmentation_problem

        for j in np.asarray(rows, dtype=np.int64).tolist():
            seg = cols.segmentations[j]
            why = "no segmentation (masks=True)" if seg is None else segmentation_problem(seg)
            if why:
                iid, aid = cols.image_ids[j], cols.ids[j]
                annotation = aid if aid != NO_ANNOTATION_ID else f"annotations[{cols.positions[j]}]"
                self.report.add(v.MALFORMED_ANNOTATION, self.file_of(images[iid]), image_id=iid, annotation=annotation,
                                detail=why)
        return CocoMasks([cols.segmentations[j] for j in np.asarray(rows, dtype=np.int64).tolist()])

    def keypoints(self, cols: _Columns, rows: np.ndarray, where: Any) -> np.ndarray | None:
        """float32 ``[M, K, 3]`` keypoints of the kept annotations ``rows`` (``None``: none has
        any), errors recorded naming the file and annotation (:func:`detaug.keypoints.coco_keypoints`)."""
        from detaug.keypoints import coco_keypoints

        def error(j: int, detail: str) -> None:
            file, image_id, annotation = where(j)
            reason = v.NON_FINITE if "non-finite" in detail else v.MALFORMED_ANNOTATION
            self.report.add(reason, file, image_id=image_id, annotation=annotation, detail=detail)

        return coco_keypoints(cols.keypoints, rows, error)


_MISSING = object()
_NUMBER = frozenset((int, float))


@dataclass
class _Columns:
    """Well-formed annotations, one entry each, in the order of the annotations list."""

    xywh: list[tuple[float, float, float, float]] = field(default_factory=list)
    image_ids: list[int] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    crowd: list[bool] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    keypoints: list[Any] = field(default_factory=list)  # each annotation's "keypoints" (None: absent)
    segmentations: list[Any] = field(default_factory=list)  # each annotation's "segmentation" (masks=True only)
