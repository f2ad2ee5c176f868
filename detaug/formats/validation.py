"""The checks every source runs once, when it is built, and the :class:`Report` of what they found.

One module for every source (:class:`~detaug.sources.SampleListSource`,
:class:`~detaug.sources.CocoSource`, :class:`~detaug.sources.VocSource` through the converter's
output) so that one dataset gives the same samples whichever way it is read. Each finding is
either an **error** (nothing is built: :class:`~detaug.errors.DatasetError`, whose message names
the file and the image or annotation id, and lists every problem by reason), a **repair** (the
box is changed or dropped, counted in ``source.report`` and said once with a
:class:`~detaug.errors.DataWarning`) or a **note** (an option or a documented default did
something; counted, no warning). Nothing is changed silently.

Boxes are absolute ``xyxy`` in continuous pixel coordinates (pixel ``i`` spans ``[i, i + 1)``),
checked in float32, the dtype they are kept in. "The image" is the declared size (COCO
``width``/``height``, VOC ``<size>``, ``Sample.size``; for a decoded array, its shape): the frame
the boxes are annotated in. Encoded samples without a declared size are not checked against an
image size here (planning clips to the decoded image).

=====================================  ======  ===========================================================
reason                                 kind    what is checked, and what happens
=====================================  ======  ===========================================================
not valid JSON                         error   the annotation file does not parse (message: line, column)
not a COCO detection file              error   top level not an object; ``images`` missing or not a list;
                                               ``annotations``/``categories`` not lists; annotations
                                               without ``categories``
no images                              error   nothing to read (empty list, or all left out)
malformed image entry                  error   not an object; ``file_name`` missing, empty or not a
                                               string; ``exif_orientation`` not 1..8; a sample whose
                                               image is an array that is not uint8 ``[H, W, 3]``/``[H, W]``
                                               (or 1-D uint8 encoded bytes); decoded and encoded mixed
image id not an int64 integer          error   missing, a string, a bool, fractional, or beyond int64
invalid image size                     error   declared width/height not a positive integer <= 2**31-1
                                               (zero, negative, NaN, inf, string, only one of the two), or
                                               a declared size that differs from a decoded array's shape
duplicate image id                     error   two images with one id
duplicate file name                    error   two images with one file (``file_name``, or sample path,
                                               compared after ``os.path.normpath``)
path outside the dataset folder        error   a path the dataset names (COCO ``file_name``, a shard
                                               folder's tar and index files) is absolute, leaves its
                                               folder with ``..`` (after ``os.path.normpath``) or holds
                                               a NUL byte (:func:`path_problem`); accepted with
                                               ``allow_paths_outside=True`` (docs/security.md)
malformed category                     error   not an object; ``id`` not an integer; ``name`` not a string
duplicate category id                  error   two categories with one id
malformed annotation                   error   not an object; ``id`` / ``image_id`` / ``category_id`` not
                                               integers; ``iscrowd`` not 0/1/true/false
annotation of an unknown image         error   ``image_id`` names no image
annotation without a box               error   no ``bbox`` (or ``null``)
malformed box                          error   ``bbox`` not 4 numbers; sample boxes not ``[N, 4]``
                                               numbers; as many boxes as labels
non-finite coordinate                  error   NaN, +-inf, or beyond float32 (also ``x + w``)
unknown category id                    error   a category id / label not among the categories (when the
                                               source has categories)
label does not fit int32               error   category id or label > 2**31 - 1 (Keras targets are int32)
negative label                         error   category id or label < 0 (Keras targets pad with -1)
malformed label                        error   labels not integers (strings, bools, fractions, NaN)
empty box dropped                      repair  width or height <= 0 (COCO ``w``/``h`` <= 0, or
                                               ``x2 <= x1``/``y2 <= y1``): the box and its label dropped
box clipped to the image               repair  part of the box outside ``[0, w] x [0, h]``: clipped
box outside the image dropped          repair  no area inside the image: the box and its label dropped
image size not declared                note    COCO image without ``width``/``height``: its boxes are not
                                               checked against the image here
crowd box left out                     note    ``iscrowd=1`` with ``include_iscrowd=False``
image without boxes left out           note    with ``skip_empty=True``
image ids assigned 1..n                note    every sample's ``image_id`` was 0: ids are positions + 1
image without a label file             note    YOLO: no label file for an image: it has no boxes
label file without an image            note    YOLO: a label file no image has: left out
boxes of an unreadable image left out  note    YOLO: the image's header gives no size, so its boxes
                                               (fractions of it) cannot be placed: left out (the
                                               loaders skip the image itself, naming it)
=====================================  ======  ===========================================================

Python objects of the wrong kind handed to a source's constructor raise ``TypeError`` naming the
sample's index and what it got (the type rules: :mod:`detaug.formats.sample_inputs`); everything
about the values raises ``DatasetError``.

The checks live in parts, each with one job, and every public name of theirs is importable from
here: :mod:`~detaug.formats.report` (:class:`Report`, :class:`Finding`, the reasons and
:data:`RULES`), :mod:`~detaug.formats.values` (the value rules: :func:`as_int`,
:func:`as_coordinate`, :func:`check_size`, :func:`label_problem`),
:mod:`~detaug.formats.sample_inputs` (the type rules) and :mod:`~detaug.formats.paths` (paths a
dataset names). This module holds the box checks: :func:`check_boxes` and, for the columns of a
whole dataset, :func:`check_columns`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from detaug.errors import DatasetError
from detaug.formats.paths import file_key, outside_paths, path_problem
from detaug.formats.report import (  # the reasons and the report, re-exported
    MAX_EXAMPLES, RULES, NOT_JSON, NOT_COCO, NO_IMAGES, MALFORMED_IMAGE, BAD_IMAGE_ID, BAD_SIZE,
    DUPLICATE_IMAGE_ID, DUPLICATE_FILE, PATH_OUTSIDE, MALFORMED_CATEGORY, DUPLICATE_CATEGORY,
    MALFORMED_ANNOTATION, UNKNOWN_IMAGE, NO_BOX, MALFORMED_BOX, NON_FINITE, UNKNOWN_CATEGORY, LABEL_RANGE,
    NEGATIVE_LABEL, MALFORMED_LABEL, EMPTY_BOX, BOX_CLIPPED, BOX_OUTSIDE, SIZE_NOT_DECLARED, CROWD_LEFT_OUT,
    EMPTY_IMAGE_LEFT_OUT, IDS_ASSIGNED, IMAGE_WITHOUT_LABELS, LABELS_WITHOUT_IMAGE, BOXES_NOT_PLACED, Finding,
    Kind, Report,
)
from detaug.formats.sample_inputs import IMAGE_TYPES, SAMPLE_FIELDS, describe_type, image_input, sample_fields
from detaug.formats.values import INT32_MAX, INT64_MAX, INT64_MIN, as_coordinate, as_int, check_size, label_problem

__all__ = [
    "IMAGE_TYPES",
    "INT32_MAX",
    "INT64_MAX",
    "INT64_MIN",
    "MAX_EXAMPLES",
    "RULES",
    "SAMPLE_FIELDS",
    "Finding",
    "Report",
    "as_coordinate",
    "as_int",
    "check_boxes",
    "check_columns",
    "check_size",
    "describe_type",
    "file_key",
    "image_input",
    "label_problem",
    "outside_paths",
    "path_problem",
    "sample_fields",
]


def check_boxes(
    boxes: np.ndarray,
    sizes: np.ndarray,
    report: Report,
    where: Callable[[int], tuple[str, int | None, int | str | None]],
) -> tuple[np.ndarray, np.ndarray]:
    """Check and repair boxes (every source's boxes go through here).

    Args:
        boxes: float64 ``[N, 4]`` absolute ``xyxy``.
        sizes: float64 ``[N, 2]``: each box's image ``(h, w)``, NaN where not known.
        report: receives the findings.
        where: box index -> ``(file, image_id, annotation)`` for the findings' messages.

    Returns:
        float32 ``[N, 4]`` boxes (clipped where they were partly outside) and bool ``[N]``: the
        boxes kept (not empty, not outside). Non-finite boxes are errors and are not kept.
    """
    given = np.asarray(boxes)
    with np.errstate(over="ignore", invalid="ignore"):
        b = given.reshape(-1, 4).astype(np.float32)  # a copy (beyond float32: inf)
    finite = np.isfinite(b).all(axis=1)
    _add_rows(report, NON_FINITE, where, np.flatnonzero(~finite),
              lambda j: f"xyxy {given.reshape(-1, 4)[j].tolist()} (float32)")
    empty = finite & ((b[:, 2] <= b[:, 0]) | (b[:, 3] <= b[:, 1]))
    _add_rows(report, EMPTY_BOX, where, np.flatnonzero(empty), lambda j: f"xyxy {b[j].tolist()}")
    keep = finite & ~empty
    sizes = np.asarray(sizes).reshape(-1, 2)
    known = keep & np.isfinite(sizes).all(axis=1)
    if known.any():
        rows = np.flatnonzero(known)
        hw = sizes[rows].astype(np.float32)
        part = b[rows]
        limit = np.stack([hw[:, 1], hw[:, 0], hw[:, 1], hw[:, 0]], axis=1)
        inside = np.clip(part, np.float32(0), limit)
        outside = (inside[:, 2] <= inside[:, 0]) | (inside[:, 3] <= inside[:, 1])
        clipped = ~outside & (inside != part).any(axis=1)
        out_rows = rows[outside]
        _add_rows(report, BOX_OUTSIDE, where, out_rows, lambda j: (
            f"xyxy {b[j].tolist()}, image (h, w) ({int(sizes[j][0])}, {int(sizes[j][1])})"))
        clip_at = np.flatnonzero(clipped)
        _add_rows(report, BOX_CLIPPED, where, rows[clip_at],
                  lambda j: f"xyxy {b[j].tolist()} -> {inside[np.searchsorted(rows, j)].tolist()}")
        if clip_at.size:
            b[rows[clip_at]] = inside[clip_at]
        keep[out_rows] = False
    return b, keep


def _add_rows(report: Report, reason: str, where: Callable[[int], tuple[str, int | None, int | str | None]],
              rows: np.ndarray, detail: Callable[[int], str]) -> None:
    """Count a finding of ``reason`` for each box of ``rows``: the first ones (up to
    :data:`MAX_EXAMPLES` examples of the reason) with their messages, the rest counted at once."""
    if not len(rows):
        return
    room = max(0, MAX_EXAMPLES - len(report.examples.get(reason, [])))
    if RULES[reason] == "error" and report._first_error is None:
        room = max(room, 1)
    for j in rows[:room]:
        file, image_id, annotation = where(int(j))
        report.add(reason, file, image_id=image_id, annotation=annotation, detail=detail(int(j)))
    if len(rows) > room:
        report.counts[reason] += len(rows) - room

# -- columns of a whole dataset (shard manifests, caches) ------------------------------------------

#: Boxes checked at once by :func:`check_columns`.
_BLOCK_ROWS = 1 << 21


def _more(report: Report, reason: str, count: int) -> None:
    """Count the findings of ``reason`` beyond the :data:`MAX_EXAMPLES` added one by one."""
    if count > MAX_EXAMPLES:
        report.counts[reason] += count - MAX_EXAMPLES


def check_columns(
    image_ids: np.ndarray,
    sizes: np.ndarray,
    box_starts: np.ndarray,
    boxes: np.ndarray,
    labels: np.ndarray,
    categories: Mapping[int, str] | None,
    report: Report,
    file_of: Callable[[int], str],
) -> tuple[np.ndarray, np.ndarray]:
    """Check the columns of a whole dataset (:class:`~detaug.formats.columnar.SampleTable`'s
    layout) by the rules a freshly parsed COCO file passes, vectorised: the arrays fit together
    (else :class:`DatasetError` naming ``report.source``), image ids are unique, declared sizes
    valid, labels fit int32, are not negative and are among ``categories`` (when given), and
    the boxes pass :func:`check_boxes` (non-finite: an error; empty, outside: dropped; partly
    outside: clipped; each counted).

    Args:
        image_ids: int ``[n]``. sizes: int ``[n, 2]`` (``(0, 0)``: not declared).
        box_starts: int ``[n + 1]``. boxes: float32 ``[M, 4]`` xyxy. labels: int ``[M]``.
        categories: the category ids allowed, ``None``: any.
        report: receives the findings (the caller raises / finishes it).
        file_of: image row -> the file the messages name.

    Returns:
        float32 ``[M, 4]`` boxes (clipped) and bool ``[M]``: the boxes kept.
    """
    where_src = report.source or "the columns"
    image_ids, sizes = np.asarray(image_ids), np.asarray(sizes)
    box_starts, boxes, labels = np.asarray(box_starts), np.asarray(boxes), np.asarray(labels)
    n = len(image_ids)
    problems = []
    if image_ids.ndim != 1 or image_ids.dtype.kind not in "iu":
        problems.append(f"image_ids: {image_ids.dtype} {image_ids.shape}, not int [n]")
    if sizes.shape != (n, 2) or sizes.dtype.kind not in "iu":
        problems.append(f"sizes: {sizes.dtype} {sizes.shape}, not int [{n}, 2]")
    if box_starts.shape != (n + 1,) or box_starts.dtype.kind not in "iu":
        problems.append(f"box_starts: {box_starts.dtype} {box_starts.shape}, not int [{n + 1}]")
    elif n >= 0 and (box_starts[0] != 0 or (np.diff(box_starts) < 0).any() or box_starts[-1] != len(boxes)):
        problems.append(f"box_starts do not run from 0 up to the {len(boxes)} boxes")
    if boxes.ndim != 2 or boxes.shape[1:] != (4,) or boxes.dtype.kind != "f":
        problems.append(f"boxes: {boxes.dtype} {boxes.shape}, not float [M, 4]")
    if labels.shape != (len(boxes),) or labels.dtype.kind not in "iu":
        problems.append(f"labels: {labels.dtype} {labels.shape}, not int [{len(boxes)}]")
    if problems:
        raise DatasetError(f"{where_src}: the columns do not fit together: " + "; ".join(problems))
    if n == 0:
        report.add(NO_IMAGES, where_src, detail="no samples")
        return np.zeros((0, 4), np.float32), np.zeros(0, bool)
    ids = image_ids.astype(np.int64, copy=False)
    if n < 2 or (ids[1:] > ids[:-1]).all():  # ids written in order: unique without a sort
        order, same = None, np.zeros(0, np.int64)
    else:
        order = np.argsort(ids, kind="stable")
        same = np.flatnonzero(ids[order][1:] == ids[order][:-1])
    for k in same[:MAX_EXAMPLES]:
        row = int(order[k + 1])
        report.add(DUPLICATE_IMAGE_ID, file_of(row), image_id=int(ids[row]), detail=f"also the id of row {int(order[k])}")
    _more(report, DUPLICATE_IMAGE_ID, len(same))
    hw = sizes.astype(np.int64, copy=False)
    declared = (hw != 0).any(axis=1)
    bad = np.flatnonzero(declared & ((hw <= 0) | (hw > INT32_MAX)).any(axis=1))
    for row in bad[:MAX_EXAMPLES]:
        report.add(BAD_SIZE, file_of(int(row)), image_id=int(ids[row]), detail=f"(h, w) {hw[row].tolist()}")
    _more(report, BAD_SIZE, len(bad))
    lab = labels.astype(np.int64, copy=False)

    def owner_of(j: int) -> int:
        return int(np.searchsorted(box_starts, j, side="right") - 1)

    def where(j: int) -> tuple[str, int | None, int | str | None]:
        i = owner_of(j)
        return file_of(i), int(ids[i]), f"box {int(j - box_starts[i])}"

    def label_error(reason: str, rows: np.ndarray) -> None:
        for j in rows[:MAX_EXAMPLES]:
            file, image_id, box = where(int(j))
            report.add(reason, file, image_id=image_id, annotation=box, detail=f"label {int(lab[j])}")
        _more(report, reason, len(rows))

    label_error(NEGATIVE_LABEL, np.flatnonzero(lab < 0))
    label_error(LABEL_RANGE, np.flatnonzero(lab > INT32_MAX))
    if categories is not None:
        known = np.fromiter(categories, np.int64, len(categories))
        top = int(lab.max(initial=0))
        if len(lab) and int(lab.min()) >= 0 and top < 1 << 24:  # a lookup table: one pass
            table = np.zeros(top + 1, bool)
            table[known[(known >= 0) & (known <= top)]] = True
            unknown = ~table[lab]
        else:
            unknown = (lab >= 0) & (lab <= INT32_MAX) & ~np.isin(lab, known)
        label_error(UNKNOWN_CATEGORY, np.flatnonzero(unknown))
    # the boxes, a block of rows at a time (bounded memory for 10M images)
    out = np.empty((len(boxes), 4), np.float32)
    keep = np.empty(len(boxes), bool)
    for a in range(0, len(boxes), _BLOCK_ROWS):
        b = min(len(boxes), a + _BLOCK_ROWS)
        owner = np.searchsorted(box_starts, np.arange(a, b), side="right") - 1
        box_hw = hw[owner].astype(np.float64)
        box_hw[~declared[owner]] = np.nan
        out[a:b], keep[a:b] = check_boxes(boxes[a:b], box_hw, report, lambda j, a=a: where(j + a))
    return out, keep
