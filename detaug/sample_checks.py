"""The checks of every source built from samples: :func:`check_samples`.

One set of checks for every source (the rules themselves, and their names, live in the table of
:mod:`detaug.formats.validation`): boxes converted from their format to float32 xyxy and clipped
to the declared size or dropped (repairs, counted), labels int64 among the categories when given,
image kinds (decoded arrays or encoded paths / bytes, one kind per source), unique ids, files
that exist, and per-box fields aligned with their boxes (:class:`~detaug.formats.samples.FieldSpec`:
one dtype and trailing shape per field; ``keypoints``, ``masks`` and ``rotated_boxes`` checked by
their own modules). Errors raise :class:`~detaug.errors.DatasetError` naming the file and the
image id. :mod:`detaug.sources` builds its sources from the result.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from detaug.arrays import numeric_array
from detaug.formats.box_formats import check_box_format, to_xyxy
from detaug.formats.images import probe_file, probe_image
from detaug.formats.paths import file_key
from detaug.formats.report import (
    BAD_IMAGE_ID, BAD_SIZE, DUPLICATE_FILE, DUPLICATE_IMAGE_ID, IDS_ASSIGNED, MALFORMED_ANNOTATION,
    MALFORMED_BOX, MALFORMED_CATEGORY, MALFORMED_IMAGE, MALFORMED_LABEL, NO_IMAGES, UNKNOWN_CATEGORY, Report,
)
from detaug.formats.sample_inputs import describe_type, image_input, sample_fields
from detaug.formats.samples import (
    RESERVED_FIELDS,
    CheckedSamples,
    FieldSpec,
    Sample,
)
from detaug.formats.validation import check_boxes
from detaug.formats.values import INT64_MAX, INT64_MIN, as_coordinate, as_int, check_size, label_problem
from detaug.keypoints import KEYPOINTS, check_keypoints
from detaug.masks import MASKS, check_masks
from detaug.rotated import ROTATED_BOXES, check_rotated_boxes

__all__ = ["check_samples", "is_decoded"]


def check_samples(samples: Iterable[Sample | Mapping[str, Any] | tuple], categories: Mapping[int, str] | None = None,
                  *, report: Report | None = None, box_format: str = "xyxy") -> CheckedSamples:
    """The one set of checks of every source built from samples (the table of
    :mod:`detaug.formats.validation`): boxes converted from ``box_format`` to float32 xyxy,
    clipped to the declared size or dropped (repairs), labels int64 among ``categories`` when
    given, unique ids (1..n assigned when all are 0), per-box fields aligned with their boxes.

    Args:
        samples, categories, box_format: as :class:`~detaug.sources.SampleListSource`'s.
        report: the report the findings go to (default: a new one named ``"sample list"``); a
            source's own, which may already hold its parser's findings (errors in it are raised
            with those of the checks).

    Returns:
        :class:`~detaug.formats.samples.CheckedSamples` (``report.images`` and
        ``report.boxes`` set). The report is not finished: call ``report.finish()`` (one
        :class:`~detaug.DataWarning` if anything was repaired) once the source's own findings
        are in; ``SampleListSource(samples)`` does.

    Raises:
        DatasetError: the errors of the checks (and those ``report`` already held), naming the
            file and the image id. TypeError: as :class:`~detaug.sources.SampleListSource`'s.
    """
    check_box_format(box_format)
    report = Report("sample list") if report is None else report
    names = _check_categories(categories, report)
    checked, specs = _check_samples(samples, names if categories is not None else None, report, box_format)
    report.images = len(checked)
    report.boxes = sum(len(s.boxes) for s in checked)
    return CheckedSamples(checked, names, report, specs)


def is_decoded(image: Any) -> bool:
    """Whether ``image`` is a decoded array (``[H, W]`` or ``[H, W, C]``), not encoded bytes or a path."""
    return isinstance(image, np.ndarray) and image.ndim >= 2


def _check_categories(categories: Mapping[int, str] | None, report: Report) -> dict[int, str]:
    if categories is None:
        return {}
    if not isinstance(categories, Mapping):
        raise TypeError(f"categories must be a mapping of id to name, got {type(categories).__name__}")
    names: dict[int, str] = {}
    for key, name in categories.items():
        cid = as_int(key)
        if cid is None:
            report.add(MALFORMED_CATEGORY, "categories", detail=f"id {key!r:.60} is not an integer")
        elif problem := label_problem(cid):
            report.add(problem, "categories", detail=f"category id {cid}")
        else:
            names[cid] = str(name)
    return names


def _check_image(image: Any, index: int, report: Report) -> tuple[Any, str]:
    """The image as kept (path str, bytes, or a contiguous uint8 array) and how it is described;
    ``None`` when it is unusable (the error is recorded). ``TypeError`` for an image of another
    type (:func:`~detaug.formats.sample_inputs.image_input`)."""
    file = f"sample {index}"
    given = image
    image = image_input(image, index)  # PIL images and tensors become arrays
    if isinstance(image, (str, os.PathLike)):
        path = os.fspath(image)
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if not path:
            report.add(MALFORMED_IMAGE, file, detail="empty path")
            return None, file
        return path, path
    if isinstance(image, bytes):
        return image, f"{file} ({len(image)} bytes)"
    if isinstance(image, (bytearray, memoryview)):
        data = bytes(image) if isinstance(image, bytearray) else image.tobytes()
        return data, f"{file} ({len(data)} bytes)"
    if isinstance(image, np.ndarray):
        if image.dtype == np.uint8 and image.ndim == 1:
            return np.ascontiguousarray(image), f"{file} ({image.size} bytes)"
        if image.dtype == np.uint8 and (image.ndim == 2 or (image.ndim == 3 and image.shape[2] == 3)) and image.size:
            return image, f"{file} (array {image.shape})"
        what = f"array {image.dtype} {image.shape}" if image is given else (
            f"{describe_type(given)} of {getattr(given, 'dtype', image.dtype)} (as an array {image.dtype} {image.shape})")
        report.add(MALFORMED_IMAGE, file, detail=(
            f"{what}: decoded images are uint8 [H, W, 3] or [H, W], encoded bytes a 1-D uint8 array"))
        return None, file
    raise AssertionError(f"{file}: image_input let {type(image).__name__} through")  # pragma: no cover


def _box_array(boxes: Any) -> tuple[np.ndarray | None, str]:
    """float64 ``[N, 4]`` of ``boxes``, or ``(None, why)``."""
    try:
        raw = np.asarray(boxes)
        if raw.dtype.kind not in "iufO" or (raw.dtype.kind == "O" and raw.size and
                                             not all(as_coordinate(x) is not None for x in raw.reshape(-1))):
            return None, f"boxes of dtype {raw.dtype} are not numbers"
        with np.errstate(over="ignore", invalid="ignore"):
            if raw.dtype.kind == "O":
                table = np.array([as_coordinate(x) for x in raw.reshape(-1)], np.float64).reshape(raw.shape)
            else:
                table = raw.astype(np.float64)
    except (ValueError, TypeError, OverflowError) as err:
        return None, f"boxes are not an array of numbers ({err})"
    if table.size == 0:
        return np.zeros((0, 4), np.float64), ""
    if table.ndim == 1 and table.shape[0] == 4:
        return table.reshape(1, 4), ""
    if table.ndim != 2 or table.shape[1] != 4:
        return None, f"boxes of shape {table.shape} are not [N, 4]"
    return table, ""


def _label_array(labels: Any) -> tuple[np.ndarray | None, str, str]:
    """int64 ``[N]`` of ``labels``, or ``(None, reason, why)``."""
    try:
        raw = np.asarray(labels)
    except (ValueError, TypeError) as err:
        return None, MALFORMED_LABEL, f"labels are not an array ({err})"
    if raw.ndim > 1 and raw.size != max(raw.shape, default=0):
        return None, MALFORMED_LABEL, f"labels of shape {raw.shape} are not [N]"
    flat = raw.reshape(-1)
    if raw.dtype.kind in "iu":
        values = [int(flat.min()), int(flat.max())] if flat.size else []
    elif raw.dtype.kind in "fO":
        values = [as_int(x) for x in flat]
        if None in values:
            bad = next(x for x in flat if as_int(x) is None)
            return None, MALFORMED_LABEL, f"label {bad!r:.40} is not an integer"
    else:
        return None, MALFORMED_LABEL, f"labels of dtype {raw.dtype} are not integers"
    for value in values:
        problem = label_problem(value)  # type: ignore[arg-type]
        if problem:
            return None, problem, f"label {value}"
    return np.array([int(x) for x in flat] if raw.dtype.kind in "fO" else flat, dtype=np.int64), "", ""


def _field_arrays(fields: Any, count: int | None, hw: tuple[int, int] | None = None
                  ) -> tuple[dict[str, np.ndarray] | None, str]:
    """A sample's per-box fields as arrays ``[count, ...]`` (bools as int64), or ``(None, why)``;
    ``count`` ``None``: the boxes are malformed (rows not checked); ``hw``: the image's size
    where it is known (``masks`` must be of it, :mod:`detaug.masks`)."""
    if fields is None:
        return {}, ""
    if not isinstance(fields, Mapping):
        return None, f"fields must be a mapping of name to per-box array, got {type(fields).__name__}"
    arrays = {}
    for name, values in fields.items():
        if not isinstance(name, str) or not name:
            return None, f"field name {name!r:.40} is not a non-empty string"
        if name in RESERVED_FIELDS:
            return None, f"field name {name!r} is reserved ({', '.join(RESERVED_FIELDS)})"
        arr, why = numeric_array(values, f"field {name!r}", "biuf", verb="is")
        if arr is None:
            return None, why
        if arr.ndim == 0 or (count is not None and arr.shape[0] != count):
            rows = "no rows" if arr.ndim == 0 else f"{arr.shape[0]} rows"
            return None, f"field {name!r} has {rows}, expected one per box ({count})"
        if name == KEYPOINTS:  # [N, K, 3] (x, y, v): moved with the boxes (detaug.keypoints)
            arr, why = check_keypoints(arr, count)
            if arr is None:
                return None, why
        if name == ROTATED_BOXES:  # [N, 5] cxcywhr or [N, 8] corners: moved with the boxes (detaug.rotated)
            arr, why = check_rotated_boxes(arr, count)
            if arr is None:
                return None, why
        if name == MASKS:  # uint8 [N, H, W], the image's size: moved with the boxes (detaug.masks)
            arr, why = check_masks(arr, count, hw)
            if arr is None:
                return None, why
        arrays[name] = arr.astype(np.int64) if arr.dtype.kind == "b" else arr
    return arrays, ""


def _check_fields(checked: list[Sample], fields: list[dict[str, np.ndarray]], files: list[str],
                  report: Report) -> dict[str, FieldSpec]:
    """Every sample with boxes carries the same fields, each of one trailing shape (errors in
    ``report``); each field cast to one dtype, and given empty to the samples without boxes that
    left it out. The specs of the fields."""
    names: dict[str, int] = {}  # name -> first sample carrying it
    for k, f in enumerate(fields):
        for name in f:
            names.setdefault(name, k)
    specs: dict[str, FieldSpec] = {}
    for name, first in names.items():
        shape = fields[first][name].shape[1:]
        for k, (s, f) in enumerate(zip(checked, fields)):
            if name not in f:
                if len(s.boxes):
                    report.add(MALFORMED_ANNOTATION, files[k], image_id=s.image_id,
                               detail=f"no field {name!r} (sample {first} has one): every sample with boxes "
                                      "carries the same fields")
                    break
            elif f[name].shape[1:] != shape and name != MASKS:  # masks: each image's size
                report.add(MALFORMED_ANNOTATION, files[k], image_id=s.image_id,
                           detail=f"field {name!r} of shape {f[name].shape}: its rows are not of shape {shape} "
                                  f"as sample {first}'s")
                break
        else:
            dtype = np.result_type(*(f[name] for f in fields if name in f))
            specs[name] = FieldSpec(np.dtype(dtype), () if name == MASKS else tuple(int(d) for d in shape))
    if report.errors:
        return specs
    for f in fields:
        for name, spec in specs.items():
            f[name] = (f[name].astype(spec.dtype, copy=False) if name in f
                       else np.zeros((0, *spec.shape), spec.dtype))
    return specs


def _check_samples(samples: Iterable[Sample | Mapping[str, Any]], categories: dict[int, str] | None,
                   report: Report, box_format: str = "xyxy") -> tuple[list[Sample], dict[str, FieldSpec]]:
    """The samples checked (boxes as float32 xyxy, labels int64, fields aligned with the boxes
    kept) and the specs of their per-box fields; errors raised as :class:`~detaug.errors.DatasetError`."""
    if isinstance(samples, (str, bytes, Mapping)) or not isinstance(samples, Iterable):
        raise TypeError("samples must be a list of Sample, mappings or (image, boxes, labels[, image_id]) "
                        f"tuples, got {type(samples).__name__}")
    items = []
    for i, s in enumerate(samples):
        if not isinstance(s, Sample):
            extra = None
            if isinstance(s, Mapping) and "fields" in s:
                s = dict(s)
                extra = s.pop("fields")
            s = Sample(**sample_fields(s, i))  # TypeError naming i for anything else
            s.fields = extra
        items.append(s)
    if not items:
        report.add(NO_IMAGES, "sample list", detail="the sample list is empty")
        report.raise_errors()

    checked: list[Sample] = []
    checked_fields: list[dict[str, np.ndarray]] = []
    files: list[str] = []
    all_boxes: list[np.ndarray] = []
    clip: list[tuple[float, float]] = []
    for i, s in enumerate(items):
        errors = report.total
        image, file = _check_image(s.image, i, report)
        image_id = as_int(s.image_id)
        if image_id is None or not INT64_MIN <= image_id <= INT64_MAX:
            report.add(BAD_IMAGE_ID, file, annotation=f"sample {i}", detail=f"image_id {s.image_id!r:.60}")
            image_id = None
        size = None
        if s.size is not None:
            try:
                h, w = s.size  # type: ignore[misc]
                size, why = check_size(h, w)
            except (TypeError, ValueError):
                why = f"size {s.size!r:.60} is not (height, width)"
            if size is None:
                report.add(BAD_SIZE, file, image_id=image_id, detail=why)
        clip_hw = size
        if image is not None and is_decoded(image):
            shape = (int(image.shape[0]), int(image.shape[1]))
            if size is not None and size != shape:
                report.add(BAD_SIZE, file, image_id=image_id, detail=f"declared (h, w) {size} but the array is {shape}")
            clip_hw = shape
        boxes, why = _box_array(s.boxes)
        if boxes is not None and box_format != "xyxy":
            boxes, why = _from_format(boxes, box_format, clip_hw, image)
        if boxes is None:
            report.add(MALFORMED_BOX, file, image_id=image_id, detail=why)
        labels, reason, why = _label_array(s.labels)
        if labels is None:
            report.add(reason, file, image_id=image_id, detail=why)
        elif categories is not None:
            unknown = sorted(set(labels.tolist()) - set(categories))
            if unknown:
                report.add(UNKNOWN_CATEGORY, file, image_id=image_id, detail=f"labels {unknown[:5]}")
        if boxes is not None and labels is not None and len(boxes) != len(labels):
            report.add(MALFORMED_BOX, file, image_id=image_id, detail=f"{len(boxes)} boxes but {len(labels)} labels")
        fields, why = _field_arrays(s.fields, None if boxes is None else len(boxes), clip_hw)
        if fields is None:
            report.add(MALFORMED_ANNOTATION, file, image_id=image_id, detail=why)
        if report.total > errors:
            continue
        checked.append(Sample(image, boxes, labels, image_id, size))
        checked_fields.append(fields)
        files.append(file)
        all_boxes.append(boxes)
        clip.append(clip_hw or (np.nan, np.nan))

    if checked and not report.errors:
        kinds = {is_decoded(s.image) for s in checked}
        if len(kinds) > 1:
            first = next(i for i, s in enumerate(checked) if is_decoded(s.image) != is_decoded(checked[0].image))
            report.add(MALFORMED_IMAGE, files[first], image_id=checked[first].image_id,
                       detail="samples mix decoded arrays with encoded images (paths/bytes); use one kind")
        _check_ids(checked, files, report)
        _check_files(checked, files, report)
    specs = _check_fields(checked, checked_fields, files, report) if not report.errors else {}
    report.raise_errors()

    counts = [len(b) for b in all_boxes]
    owner = np.repeat(np.arange(len(checked)), counts)
    table = np.concatenate(all_boxes) if all_boxes else np.zeros((0, 4))
    sizes = np.asarray(clip, dtype=np.float64).reshape(-1, 2)[owner]
    starts = np.concatenate([[0], np.cumsum(counts)])

    def where(j: int) -> tuple[str, int | None, int | str | None]:
        k = int(owner[j])
        return files[k], checked[k].image_id, f"box {j - starts[k]}"

    boxes32, keep = check_boxes(table, sizes, report, where)
    report.raise_errors()
    for k, s in enumerate(checked):
        part = slice(starts[k], starts[k + 1])
        s.boxes, s.labels = boxes32[part][keep[part]], s.labels[keep[part]]
        s.fields = {name: arr[keep[part]] for name, arr in checked_fields[k].items()}
    return checked, specs


def _from_format(boxes: np.ndarray, box_format: str, hw: tuple[int, int] | None, image: Any) -> tuple[np.ndarray | None, str]:
    """``boxes`` in ``box_format`` as float32 xyxy pixels, or ``(None, why)``. ``"yolo"`` takes the
    image size from ``hw`` (a declared size or the array), else from the encoded image's header."""
    if box_format == "yolo" and hw is None and image is not None:
        info = probe_file(image) if isinstance(image, str) else probe_image(image)
        hw = info.displayed_hw if info.problem is None else None
    if box_format == "yolo" and hw is None:
        return None, "box_format 'yolo' is relative to the image size, which cannot be read"
    return to_xyxy(boxes, box_format, hw).astype(np.float32), ""


def _check_ids(samples: list[Sample], files: list[str], report: Report) -> None:
    if all(s.image_id == 0 for s in samples):
        for i, s in enumerate(samples):
            s.image_id = i + 1
        report.add(IDS_ASSIGNED, "sample list", detail=f"1..{len(samples)}")
        return
    seen: dict[int, int] = {}
    for i, s in enumerate(samples):
        if s.image_id in seen:
            report.add(DUPLICATE_IMAGE_ID, files[i], image_id=s.image_id,
                       detail=f"samples {seen[s.image_id]} and {i}")
        else:
            seen[s.image_id] = i


def _check_files(samples: list[Sample], files: list[str], report: Report) -> None:
    seen: dict[str, int] = {}
    for i, s in enumerate(samples):
        if isinstance(s.image, str):
            key = file_key(s.image)
            if key in seen:
                report.add(DUPLICATE_FILE, files[i], image_id=s.image_id,
                           detail=f"also sample {seen[key]} (image_id {samples[seen[key]].image_id})")
            else:
                seen[key] = i
