"""The per-file step: one VOC XML -> one COCO image record and its annotations (without ids).

This is what runs in the worker processes. Everything that depends only on the file and the
options happens here (parse, find and probe the image, size, boxes, difficult, known labels);
what needs the whole dataset (ids, category ids, discovered labels, an image file claimed by
two XMLs) is left to :mod:`converters.voc2coco`. Results are plain tuples and lists, cheap to
send between processes.

Order of the checks for one file:

1. read and parse the XML (``malformed XML`` with line and column, ``not a VOC annotation``);
2. find the image by id, then by ``<filename>`` (:mod:`converters.images`); without an images
   folder, ``file_name = <id> + extension of <filename>``;
3. the image is probed (:func:`detaug.formats.images.probe_file`: header and end marker, the
   loader's rules): a file whose header gives no size is skipped with its problem as the
   reason; another problem (truncated, GIF, too large, ...) skips the image with ``verify``
   (``--verify-images``), else it is kept with a warning (the loader will skip it). With
   ``keep_unreadable`` (a loader's source, :class:`detaug.sources.VocSource`) and without
   ``verify``, an image not found or whose header gives no size is still skipped (the same
   report), but its record and boxes are given too, in the ``<size>`` frame (not clipped
   without one), so that the loader meets the file, names it and skips it as it does any
   unreadable image;
4. the annotation frame: :func:`detaug.formats.images.explain_frame` from ``<size>``, the
   image's stored and displayed (EXIF-oriented) sizes and the ``orientation`` option; the COCO
   ``width``/``height`` are that frame's (``<size>`` missing or different is reported), and an
   image with an EXIF orientation gets ``"exif_orientation": k`` and an EXIF note; without an
   images folder the size is ``<size>``;
5. each ``<object>``: name, box, label in the list, difficult mode, then
   :func:`converters.boxes.voc_box_to_coco` (convention, zero size, clip to the frame, outside).
"""

from __future__ import annotations

import math
import os
from typing import Any, NamedTuple

from converters import report as R
from converters.boxes import Coords, voc_box_to_coco
from converters.coco import encode_json
from converters.images import ImageIndex, filename_base
from converters.voc import VocParseError, parse_voc_xml
from detaug.formats.image_info import ImageInfo
from detaug.formats.images import probe_file
from detaug.formats.orientation import describe_orientation, explain_frame

#: ``(kind, reason, detail)``, kind being ``"object"`` (a skipped object), ``"warning"``,
#: ``"exif"`` (an image with an EXIF orientation: reason = frame and why) or ``"kept"`` (an
#: object event of an image skipped but kept for the loader, ``keep_unreadable``: not in the
#: report, whose count of that image's objects is ``image skipped``).
Event = tuple[str, str, str]
#: The head of every annotation's JSON: its ids are filled in by the main process, which alone
#: knows them (``template % (id, image_id, category_id, id, image_id, ...)``).
ANNOTATION_HEAD = '{"id":%d,"image_id":%d,"category_id":%d,'
#: ``(category names, template)``: the converted objects of one file, in order. ``template`` is
#: their COCO JSON texts joined by commas, each ``ANNOTATION_HEAD`` + ``bbox``, ``area``,
#: ``iscrowd``, ``attributes`` (``%`` doubled), to be filled with three ids per annotation.
#: One string per file, not per box: cheaper to send between processes and to fill.
PendingAnnotations = tuple[tuple[str, ...], str]


_NONE: PendingAnnotations = ((), "")


class FileOptions(NamedTuple):
    """What :func:`convert_file` needs besides the file: folders, image index and options.

    ``labels`` is the set of accepted names, or ``None`` when every name is accepted
    (``labels="discover"``). ``index`` is ``None`` when there is no images folder.
    ``verify``: skip images the loader would skip. ``orientation``: ``"auto"``, ``"apply"``
    or ``"ignore"`` (:data:`detaug.formats.images.ORIENTATIONS`). ``boxes``: also give the
    converted boxes as numbers (:attr:`FileResult.boxes`). ``keep_unreadable``: an image
    skipped because its file is not found or its header gives no size still has its record
    and boxes in the result (step 3 of the module docstring; not with ``verify``).
    """

    annotations_dir: str
    images_dir: str
    index: ImageIndex | None
    coords: Coords
    difficult: str
    verify: bool
    labels: frozenset[str] | None
    orientation: str = "auto"
    boxes: bool = False
    keep_unreadable: bool = False


class FileResult(NamedTuple):
    """Outcome for one XML file.

    ``error``: ``(reason, detail)`` when the image is skipped (then ``image`` is ``None``,
    except for an image kept for the loader with ``FileOptions.keep_unreadable``: ``image``,
    ``annotations`` and ``boxes`` as for a converted image, width and height 0 when the XML
    gives no ``<size>``).
    ``image``: ``(file_name, width, height, JSON of the image after its id)``, the size being
    the annotation frame's. ``n_objects``:
    the ``<object>`` elements in the file (0 when it did not parse). ``annotations``: the
    converted objects (:data:`PendingAnnotations`). ``events``: skipped objects and warnings,
    in file order. ``found_by``: ``"id"``, ``"filename"`` or ``None`` (no image file).
    ``names``: every object name in the file when every name is accepted (label discovery),
    else ``()``. ``boxes``: with ``FileOptions.boxes``, one ``(x1, y1, x2, y2, iscrowd)`` per
    converted annotation, in order: absolute ``xyxy`` in continuous pixels, ``x2 = x + w`` of
    the COCO ``bbox`` computed in float64 as a COCO reader does (``--coords voc``:
    ``x1 = xmin - 1``, ``x2 = xmax``, clipped to the image); else ``()``.
    """

    error: tuple[str, str] | None
    image: tuple[str, int, int, str] | None
    n_objects: int
    annotations: PendingAnnotations
    events: list[Event]
    found_by: str | None
    names: tuple[str, ...]
    boxes: tuple[tuple[float, float, float, float, int], ...] = ()


def convert_file(xml_name: str, options: FileOptions) -> FileResult:
    """Convert ``options.annotations_dir / xml_name`` (see the module docstring for the steps)."""
    voc_id = os.path.splitext(xml_name)[0]
    events: list[Event] = []
    # 1. parse
    try:
        ann = parse_voc_xml(read_bytes(os.path.join(options.annotations_dir, xml_name)))
    except OSError as err:
        return FileResult((R.UNREADABLE_FILE, f"{type(err).__name__}: {err.strerror}"), None,
                          0, _NONE, events, None, ())
    except VocParseError as err:
        return FileResult((err.reason, err.detail), None, 0, _NONE, events, None, ())
    objects = ann.objects
    names = (tuple({o.name for o in objects if o.name is not None})
             if options.labels is None else ())
    n_objects = len(objects)

    # 2. image file, 3. size
    base = filename_base(ann.filename)
    index = options.index
    found_by = None
    if index is None:
        ext = os.path.splitext(base)[1] if base else ""
        file_name = voc_id + (ext or ".jpg")
        if ann.width is None or ann.height is None:
            return FileResult((R.IMAGE_SIZE_UNKNOWN, f"{ann.size_problem} and no images folder "
                               "to read it from"), None, n_objects, _NONE, events, None, names)
        width, height = ann.width, ann.height
    else:
        found, found_by, candidates = index.find(voc_id, ann.filename)
        if found is None:
            also = f" and no {base}" if base else ""
            error = (R.IMAGE_NOT_FOUND, f"no {voc_id}.<image extension>{also} in "
                     f"{options.images_dir}")
            if options.keep_unreadable and not options.verify:
                ext = os.path.splitext(base)[1] if base else ""
                return _kept_unreadable(error, voc_id + (ext or ".jpg"), ann, options, n_objects,
                                        events, None, names)
            return FileResult(error, None, n_objects, _NONE, events, None, names)
        file_name = found
        if candidates > 1:
            events.append(("warning", R.SEVERAL_IMAGE_FILES,
                           f"{', '.join(index.by_stem[voc_id])}; using {file_name}"))
        path = os.path.join(options.images_dir, file_name)
        info = probe_file(path)
        if info.problem is not None:
            if not info.size_known or options.verify:
                error = (info.problem, path)
                if options.keep_unreadable and not options.verify:
                    return _kept_unreadable(error, file_name, ann, options, n_objects, events,
                                            found_by, names)
                return FileResult(error, None, n_objects, _NONE, events, found_by, names)
            events.append(("warning", R.IMAGE_PROBLEM_KEPT, f"{path}: {info.problem}"))
        width, height = _frame_size(ann, info, file_name, options.orientation, events)
    if base is not None and base.lower() not in (file_name.lower(),
                                                 os.path.splitext(file_name)[0].lower()):
        what = "image is" if index is not None else "no images folder: file_name is"
        events.append(("warning", R.FILENAME_MISMATCH, f"<filename> is {base!r}, {what} "
                       f"{file_name!r} (images are identified by the XML's name)"))

    # 5. objects
    boxes: list[tuple[float, float, float, float, int]] | None = [] if options.boxes else None
    annotations = _convert_objects(objects, options, width, height, events, boxes)
    image_json = f'"file_name":{encode_json(file_name)},"width":{width},"height":{height}'
    if index is not None and info.orientation != 1:
        image_json += f',"exif_orientation":{info.orientation}'
    image_json += "}"
    return FileResult(None, (file_name, width, height, image_json), n_objects, annotations,
                      events, found_by, names, tuple(boxes) if boxes else ())


def _kept_unreadable(error: tuple[str, str], file_name: str, ann: Any, options: FileOptions,
                     n_objects: int, events: list[Event], found_by: str | None,
                     names: tuple[str, ...]) -> FileResult:
    """The result of an image skipped for its file but kept for the loader
    (``keep_unreadable``, step 3): its objects converted in the ``<size>`` frame, or, without
    one, not clipped (width and height 0 in the record: unknown)."""
    known = ann.width is not None and ann.height is not None
    width, height = (ann.width, ann.height) if known else (0, 0)
    boxes: list[tuple[float, float, float, float, int]] | None = [] if options.boxes else None
    objects: list[Event] = []
    annotations = _convert_objects(ann.objects, options, width if known else math.inf,
                                   height if known else math.inf, objects, boxes)
    events.extend(("kept", reason, detail) for _, reason, detail in objects)
    image_json = f'"file_name":{encode_json(file_name)},"width":{width},"height":{height}}}'
    return FileResult(error, (file_name, width, height, image_json), n_objects, annotations,
                      events, found_by, names, tuple(boxes) if boxes else ())


def file_names(xml_name: str, options: FileOptions) -> tuple[str, ...]:
    """The object names of ``options.annotations_dir / xml_name`` (what label discovery reads
    of a file outside the split being converted); ``()`` when it does not parse."""
    try:
        ann = parse_voc_xml(read_bytes(os.path.join(options.annotations_dir, xml_name)))
    except (OSError, VocParseError):
        return ()
    return tuple({o.name for o in ann.objects if o.name is not None})


def _frame_size(ann: Any, info: ImageInfo, file_name: str, orientation: str,
                events: list[Event]) -> tuple[int, int]:
    """``(width, height)`` of the frame the boxes are in (step 4), with its warnings and
    EXIF note."""
    declared = (ann.height, ann.width) if ann.width is not None and ann.height is not None \
        else None
    frame, why = explain_frame(declared, info, orientation)
    height, width = info.stored_hw if frame == "stored" else info.displayed_hw
    k = info.orientation
    in_frame = f" ({frame} frame)" if k != 1 else ""
    if declared is None:
        events.append(("warning", R.SIZE_FROM_IMAGE,
                       f"{ann.size_problem}; image is {width}x{height}{in_frame}"))
    elif declared != (height, width):
        events.append(("warning", R.SIZE_MISMATCH, f"<size> {ann.width}x{ann.height}, image "
                       f"{file_name} is {width}x{height}{in_frame}; using the image's"))
    bands = _BANDS.get(info.mode or "")
    if ann.depth is not None and bands is not None and info.mode != "P" and ann.depth != bands:
        plural = "s" if bands > 1 else ""
        events.append(("warning", R.DEPTH_MISMATCH, f"<depth> {ann.depth}, image {file_name} "
                       f"is {info.mode} ({bands} channel{plural})"))
    if k != 1:
        sh, sw = info.stored_hw
        dh, dw = info.displayed_hw
        size = f"<size> {ann.width}x{ann.height}" if declared is not None else "no <size>"
        events.append(("exif", f"{frame} frame: {why}",
                       f"{file_name}: EXIF orientation {k} ({describe_orientation(k)}); stored "
                       f"{sw}x{sh}, displayed {dw}x{dh}, {size}; boxes taken in the {frame} "
                       f"frame, COCO width x height {width}x{height}"))
    return width, height


#: Channels of the Pillow modes an image can have (``P``, a palette, is not compared).
_BANDS = {"1": 1, "L": 1, "I": 1, "I;16": 1, "F": 1, "LA": 2, "RGB": 3, "YCbCr": 3,
          "LAB": 3, "HSV": 3, "RGBA": 4, "RGBX": 4, "CMYK": 4}


def read_bytes(path: str) -> bytes:
    """The whole file, with ``os.read``: half the cost of ``open().read()`` (no buffered reader),
    which counts at 20,000 small files. Reads until ``os.read`` returns nothing (a read may
    return less than asked before the end, e.g. on network file systems)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while chunk := os.read(fd, _READ_SIZE):
            chunks.append(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    finally:
        os.close(fd)


_READ_SIZE = 1 << 16


def _convert_objects(objects: list[Any], options: FileOptions, width: int, height: int,
                     events: list[Event],
                     boxes: list[tuple[float, float, float, float, int]] | None = None,
                     ) -> PendingAnnotations:
    coords = options.coords
    labels = options.labels
    difficult_mode = options.difficult
    warned_non_integer = False
    names: list[str] = []
    texts: list[str] = []
    for number, obj in enumerate(objects, 1):
        name, box_voc, problem, attributes, attribute_problems = obj
        for text in attribute_problems:
            events.append(("warning", R.BAD_ATTRIBUTE, f"object {number}: {text}; left out"))
        if problem is not None:
            events.append(("object", problem[0],
                           f"object {number}: {problem[1]}" if problem[1] else f"object {number}"))
            continue
        if labels is not None and name not in labels:
            events.append(("object", R.UNKNOWN_LABEL, f"object {number}: {name!r}"))
            continue
        difficult = attributes.get("difficult", 0)
        if difficult and difficult_mode == "drop":
            events.append(("object", R.DIFFICULT_DROPPED, f"object {number}: {name!r}"))
            continue
        if coords == "voc" and not warned_non_integer and obj.has_non_integer_coords:
            warned_non_integer = True
            events.append(("warning", R.NON_INTEGER_VOC_COORDS,
                           f"object {number}: {_fmt_box(box_voc)}; if the file holds "
                           "continuous coordinates, use --coords raw"))
        box = voc_box_to_coco(box_voc, coords, width, height)
        if box.skip_reason is not None:
            events.append(("object", box.skip_reason, f"object {number}: {name!r} "
                           f"{_fmt_box(box_voc)} in a {width}x{height} image (--coords {coords})"))
            continue
        if box.clipped:
            events.append(("warning", R.BOX_CLIPPED, f"object {number}: {name!r} "
                           f"{_fmt_box(box_voc)} -> [x, y, w, h] {box.bbox} in a "
                           f"{width}x{height} image"))
        iscrowd = 1 if difficult and difficult_mode == "crowd" else 0
        x, y, w, h = box.bbox
        if boxes is not None:
            boxes.append((x, y, x + w, y + h, iscrowd))
        names.append(name)
        texts.append(f'{ANNOTATION_HEAD}"bbox":[{x!r},{y!r},{w!r},{h!r}],"area":{box.area!r},'
                     f'"iscrowd":{iscrowd},"attributes":{_attributes_json(attributes)}}}')
    return tuple(names), ",".join(texts)


_attribute_texts: dict[tuple[tuple[str, Any], ...], str] = {}


def _attributes_json(attributes: dict[str, Any]) -> str:
    """The JSON of an annotation's COCO ``attributes`` for an object's VOC attributes, ``%``
    doubled for the template: ``difficult`` first (0 when absent), then ``truncated``,
    ``occluded``, ``pose`` when the XML states them. Cached: a dataset has few kinds.

    (Numbers elsewhere in the template are written with ``repr``, which is what ``json``
    writes for ints and finite floats; the tests compare the document with ``json.dumps``.)
    """
    key = tuple(attributes.items())
    text = _attribute_texts.get(key)
    if text is None:
        coco = {"difficult": attributes.get("difficult", 0)}
        coco.update((k, attributes[k]) for k in ("truncated", "occluded", "pose")
                    if k in attributes)
        if len(_attribute_texts) > 4096:
            _attribute_texts.clear()
        text = _attribute_texts[key] = encode_json(coco).replace("%", "%%")
    return text


def _fmt_box(box: tuple[float, float, float, float]) -> str:
    return "(xmin, ymin, xmax, ymax) = ({})".format(", ".join(f"{v:g}" for v in box))
