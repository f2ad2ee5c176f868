"""A checked COCO detection dataset as columns (:class:`CocoColumns`) and the samples of
``CocoSource(cache=...)`` read from it (:func:`coco_view`).

The columns are described in :mod:`detaug.formats.columnar`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from detaug.boxes import box_area
from detaug.errors import DatasetError
from detaug.formats.column_store import SampleTable, SampleView, load_columns
from detaug.formats.mask_columns import MaskColumns
from detaug.formats.report import CROWD_LEFT_OUT, EMPTY_IMAGE_LEFT_OUT, MAX_EXAMPLES, NO_IMAGES, Finding, Report


@dataclass
class CocoColumns:
    """A checked COCO detection dataset as columns: what :func:`~detaug.formats.coco.load_coco`
    gives, without an object per image.

    Attributes:
        source: the file (as messages name it).
        table: the images (in the JSON's order) and their boxes (crowd boxes included).
        names: uint8 ``[L]`` the ``file_name`` entries, UTF-8, back to back; ``name_starts``
            int64 ``[n + 1]`` their offsets.
        exif: int8 ``[n]`` the entries' ``exif_orientation``, 0 where absent.
        iscrowd: bool ``[M]``; annotation_ids: int64 ``[M]`` (-1 where an annotation has no id).
        categories: names by category id, in the JSON's order.
        report: the checks' findings.
        keypoints: float32 ``[M, K, 3]`` the boxes' keypoints of a keypoints file
            (:func:`detaug.keypoints.coco_keypoints`: pixel indices + 0.5), else ``None``.
        segments: the boxes' ``segmentation`` values, not decoded
            (:class:`~detaug.formats.mask_columns.MaskColumns`), when read with ``masks=True``,
            else ``None``.
    """

    source: str
    table: SampleTable
    names: np.ndarray
    name_starts: np.ndarray
    exif: np.ndarray
    iscrowd: np.ndarray
    annotation_ids: np.ndarray
    categories: dict[int, str]
    report: Report

    EXTRA = ("names", "name_starts", "exif", "iscrowd", "annotation_ids")
    #: How it was read: "stream" (the fast path), "load_coco" or "cache".
    parsed_by: str = "cache"
    keypoints: np.ndarray | None = None
    segments: MaskColumns | None = None

    def __len__(self) -> int:
        return len(self.table)

    def file_name(self, i: int) -> str:
        """The ``file_name`` of image ``i``."""
        return bytes(self.names[int(self.name_starts[i]):int(self.name_starts[i + 1])]).decode("utf-8")

    def arrays(self) -> dict[str, np.ndarray]:
        """Every column by name (as the cache's ``.npy`` files are named)."""
        out = {**self.table.arrays(), **{name: getattr(self, name) for name in self.EXTRA}}
        if self.keypoints is not None:
            out["keypoints"] = self.keypoints
        if self.segments is not None:
            out.update(self.segments.arrays())
        return out

    def __getstate__(self) -> dict[str, Any]:
        """Columns read from a cache are pickled as its folder (worker processes map it again)."""
        state = dict(self.__dict__)
        if state.get("cache") is not None:
            state["table"] = None
            state.update(dict.fromkeys(self.EXTRA))
            state.update(keypoints=None, segments=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if state.get("cache") is not None:
            arrays, meta = load_columns(state["cache"])
            mapped = CocoColumns.from_columns(arrays, meta)
            self.table, self.keypoints, self.segments = mapped.table, mapped.keypoints, mapped.segments
            for name in self.EXTRA:
                setattr(self, name, arrays[name])

    def meta(self) -> dict[str, Any]:
        return {"source": self.source, "categories": [[k, n] for k, n in self.categories.items()],
                "report": _report_to_json(self.report), "present_labels": self.table.present_labels().tolist(),
                "max_boxes": self.table.max_boxes()}

    @classmethod
    def from_columns(cls, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> CocoColumns:
        table = SampleTable.from_arrays(arrays)
        table.known_labels = np.asarray(meta["present_labels"], dtype=np.int64)  # type: ignore[attr-defined]
        table.known_max_boxes = int(meta["max_boxes"])  # type: ignore[attr-defined]
        return cls(meta["source"], table, *(arrays[n] for n in cls.EXTRA),
                   {int(k): str(n) for k, n in meta["categories"]}, _report_from_json(meta["report"]),
                   keypoints=arrays.get("keypoints"), segments=MaskColumns.from_arrays(arrays))

    @classmethod
    def from_dataset(cls, dataset: Any) -> CocoColumns:
        """The columns of a :class:`~detaug.formats.coco.CocoDataset` (its keypoints and, read
        with ``masks=True``, its segmentations included); ``DatasetError`` for a segmentation
        number beyond int64 (a cache cannot hold it)."""
        images = dataset.images
        counts = np.array([len(im.boxes) for im in images], dtype=np.int64)

        def cat(parts: list[np.ndarray], dtype: Any, shape: tuple[int, ...] = ()) -> np.ndarray:
            return np.concatenate(parts).astype(dtype) if parts else np.zeros((0, *shape), dtype)

        encoded = [im.file_name.encode("utf-8") for im in images]
        table = SampleTable(
            np.array([im.id for im in images], dtype=np.int64).reshape(-1),
            np.array([im.size or (0, 0) for im in images], dtype=np.int32).reshape(-1, 2),
            np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
            cat([im.boxes for im in images], np.float32, (4,)).reshape(-1, 4),
            cat([im.labels for im in images], np.int32),
        )
        keypoints = None
        if any(im.keypoints is not None for im in images):  # a keypoints file: every image has [N, K, 3]
            k = next(im.keypoints.shape[1] for im in images if im.keypoints is not None)
            keypoints = cat([im.keypoints if im.keypoints is not None else np.zeros((0, k, 3), np.float32)
                             for im in images], np.float32, (k, 3)).reshape(-1, k, 3)
        segments = None
        if any(im.masks is not None for im in images):  # read with masks=True
            try:
                segments = MaskColumns.from_segmentations(
                    [seg for im in images for seg in (im.masks.segmentations if im.masks is not None else [])])
            except ValueError as err:
                raise DatasetError(f"{dataset.source}: {err}: the annotation cache cannot hold it; read it with "
                                   "CocoSource(..., cache=False)") from None
        return cls(dataset.source, table, np.frombuffer(b"".join(encoded), np.uint8).copy(),
                   np.concatenate([[0], np.cumsum([len(e) for e in encoded])]).astype(np.int64),
                   np.array([im.exif_orientation or 0 for im in images], dtype=np.int8),
                   cat([im.iscrowd for im in images], bool), cat([im.annotation_ids for im in images], np.int64),
                   dict(dataset.categories), dataset.report, keypoints=keypoints, segments=segments)


def _report_to_json(report: Report) -> dict[str, Any]:
    return {"source": report.source, "images": report.images, "boxes": report.boxes,
            "counts": dict(report.counts),
            "examples": {r: [[f.file, f.image_id, f.annotation, f.detail] for f in fs] for r, fs in report.examples.items()}}


def _report_from_json(data: Mapping[str, Any]) -> Report:
    report = Report(data["source"])
    report.images, report.boxes = int(data["images"]), int(data["boxes"])
    report.counts.update({r: int(n) for r, n in data["counts"].items()})
    report.examples = {r: [Finding(r, *f) for f in fs] for r, fs in data["examples"].items()}
    return report


def _add_many(report: Report, reason: str, count: int, example: Callable[[int], tuple[str, int | None, Any]],
              detail: str = "") -> None:
    """Count ``count`` findings of ``reason``; the first :data:`~detaug.formats.report.MAX_EXAMPLES` with
    their details (``example(k) -> (file, image_id, annotation)``)."""
    if count <= 0:
        return
    shown = min(count, max(0, MAX_EXAMPLES - len(report.examples.get(reason, []))))
    for k in range(shown):
        file, image_id, annotation = example(k)
        report.add(reason, file, image_id=image_id, annotation=annotation, detail=detail)
    report.counts[reason] += count - shown


class _CocoImages:
    """``image_of`` of a COCO view: ``str(images_dir / file_name)``, as ``coco_to_samples``
    (picklable)."""

    def __init__(self, columns: CocoColumns, root: Path) -> None:
        self.columns, self.root = columns, Path(root)

    def __call__(self, row: int) -> str:
        return str(self.root / self.columns.file_name(row))


class _CocoFields:
    """``fields_of`` of a COCO view: :data:`~detaug.sources.COCO_FIELDS`, as ``coco_to_samples``
    gives them: ``iscrowd`` from the columns (zeros where the crowd boxes were left out),
    ``area`` the boxes', and where the columns hold them ``keypoints`` (float32 ``[N, K, 3]``)
    and ``masks`` (:class:`~detaug.masks.CocoMasks`, not decoded). ``rows``: int64 the columns'
    box row of each of the view's table's rows (``None``: the same table). Picklable: the
    columns are pickled as their cache folder."""

    def __init__(self, columns: CocoColumns, rows: np.ndarray | None) -> None:
        self.columns, self.rows = columns, rows

    def __call__(self, start: int, end: int, boxes: np.ndarray) -> dict[str, np.ndarray]:
        from detaug.keypoints import KEYPOINTS
        from detaug.masks import MASKS, CocoMasks

        c = self.columns
        rows = np.arange(start, end) if self.rows is None else np.asarray(self.rows[start:end], dtype=np.int64)
        if self.rows is None:
            crowd = np.asarray(c.iscrowd[start:end], dtype=np.int64)
        else:  # the crowd boxes were left out
            crowd = np.zeros(end - start, np.int64)
        fields: dict[str, Any] = {"iscrowd": crowd, "area": box_area(boxes, np.float32)}
        if c.keypoints is not None:
            points = c.keypoints[start:end] if self.rows is None else c.keypoints[rows]
            fields[KEYPOINTS] = np.array(points, dtype=np.float32).reshape(len(rows), *c.keypoints.shape[1:])
        if c.segments is not None:
            fields[MASKS] = CocoMasks([c.segments.segmentation(int(j)) for j in rows])
        return fields


def coco_view(columns: CocoColumns, images_dir: str | os.PathLike, *, include_iscrowd: bool = True,
              skip_empty: bool = False) -> tuple[SampleView, Report]:
    """The samples of ``columns`` as :func:`~detaug.sources.coco_to_samples` gives them (crowd
    boxes left out with ``include_iscrowd=False``, images without boxes with ``skip_empty``,
    each counted as a note; the per-box fields ``iscrowd`` and ``area``), and the report with
    those notes."""
    report = columns.report
    table = columns.table
    rows = kept_rows = None
    crowd = np.asarray(columns.iscrowd)
    if not include_iscrowd and crowd.any():
        starts = np.asarray(table.box_starts)
        owner = np.repeat(np.arange(len(table)), np.diff(starts))
        left = np.flatnonzero(crowd)
        _add_many(report, CROWD_LEFT_OUT, len(left), lambda k: (
            f"{columns.source}: {columns.file_name(int(owner[left[k]]))}", int(table.image_ids[owner[left[k]]]),
            None if columns.annotation_ids[left[k]] == -1 else int(columns.annotation_ids[left[k]])))
        keep = ~crowd
        kept_rows = np.flatnonzero(keep).astype(np.int64)
        table = SampleTable(table.image_ids, table.sizes,
                            np.concatenate([[0], np.cumsum(np.bincount(owner[keep], minlength=len(table)))]).astype(np.int64),
                            np.asarray(table.boxes)[keep], np.asarray(table.labels)[keep])
    if skip_empty:
        counts = np.diff(np.asarray(table.box_starts))
        empty = np.flatnonzero(counts == 0)
        _add_many(report, EMPTY_IMAGE_LEFT_OUT, len(empty), lambda k: (
            f"{columns.source}: {columns.file_name(int(empty[k]))}", int(table.image_ids[empty[k]]), None))
        rows = np.flatnonzero(counts > 0).astype(np.int64)
    if table is not columns.table:
        columns.cache = None  # type: ignore[attr-defined]  # the view holds its own arrays: pickled as they are
    view = SampleView(table, _CocoImages(columns, Path(images_dir)), rows, _CocoFields(columns, kept_rows))
    report.images = len(view)
    report.boxes = int(table.box_starts[-1]) if rows is None else int(np.diff(np.asarray(table.box_starts))[rows].sum())
    if not len(view):
        report.add(NO_IMAGES, columns.source, detail="every image was left out (skip_empty=True)")
        report.raise_errors()
    return view, report
