"""Data sources: indexable lists of checked samples (image, boxes, labels, id, declared size).

Every source is built once, checked once (:mod:`detaug.formats.validation`: errors raise
:class:`~detaug.errors.DatasetError` naming the file and the image or annotation id, repairs are
counted in ``source.report``), and then read by position:

* :class:`SampleListSource`: an in-memory list of samples (file paths, encoded bytes, decoded
  arrays, PIL images or torch tensors; given as :class:`Sample`, mappings or tuples).
* :class:`CocoSource`: a COCO detection JSON, parsed by :func:`detaug.formats.coco.load_coco`.
* :class:`VocSource`: a Pascal VOC folder through the ``voc2coco`` converter, in memory.
* :class:`YoloSource`: a YOLO-txt folder (``images/``, ``labels/``, ``classes.txt``), parsed by
  :mod:`detaug.formats.yolo` (docs/sources.md builds it step by step).

Per-box fields (``Sample.fields``): arrays of one row per box, such as COCO's ``iscrowd`` and
``area``, VOC's ``difficult``, or a user's track id column. The checks keep them aligned with
their boxes (a box dropped drops its row), and the loaders carry them through every transform
and filter (:mod:`detaug.planning`); ``source.field_specs`` says which fields every sample of a
source has (:class:`FieldSpec`: dtype and trailing shape). ``area`` is always recomputed from
the boxes it goes out with.

Every source implements :class:`~detaug.formats.samples.Source` (what the loaders, the planner
and ``write_shards`` read: ``samples``, ``len``, ``categories``, ``report``, ``decoded``,
``orientation``, ``field_specs``, ``load(i)``, ``file_of(i)``, ``describe(i)``,
``present_labels()``, ``max_boxes()``). A new source parses its files into
:class:`~detaug.formats.samples.Sample` records, checks them with :func:`check_samples` (or
hands over :class:`~detaug.formats.samples.CheckedSamples` it checked itself) and builds a
:class:`SampleListSource` from them; docs/sources.md walks through one (a YOLO-txt folder).
:func:`detaug.source_args.source_from_args` chooses one from command-line arguments.

Boxes are float32 ``[N, 4]`` absolute ``xyxy`` in continuous pixel coordinates (pixel ``i`` spans
``[i, i + 1)``), labels int64 ``[N]`` category ids in ``[0, 2**31 - 1]``, image ids ints that fit
int64, unique within a source.
"""

from __future__ import annotations

import os
import warnings
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from detaug.boxes import box_area
from detaug.errors import DatasetError, DataWarning
from detaug.formats import validation as v
from detaug.formats.coco import NO_ANNOTATION_ID, CocoDataset, load_coco
from detaug.formats.box_formats import check_box_format, to_xyxy
from detaug.formats.images import ORIENTATIONS, probe_file, probe_image, read_bytes
from detaug.formats.samples import (
    COCO_FIELDS,
    RESERVED_FIELDS,
    VOC_FIELDS,
    CheckedSamples,
    FieldSpec,
    Sample,
    Source,
    field_specs,
)
from detaug.formats.yolo import read_yolo_folder
from detaug.keypoints import KEYPOINTS, check_keypoints
from detaug.masks import MASKS, CocoMasks, check_masks
from detaug.rotated import ROTATED_BOXES, check_rotated_boxes

__all__ = [
    "COCO_FIELDS", "ORIENTATIONS", "RESERVED_FIELDS", "VOC_FIELDS", "CheckedSamples", "CocoSource", "FieldSpec",
    "Sample", "SampleListSource", "Source", "VocSource", "YoloSource", "box_area", "check_samples", "coco_to_samples",
    "field_specs",
]


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
    report: v.Report
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
        self.decoded = bool(len(checked.samples)) and _is_decoded(checked.samples[0].image)
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


class CocoSource(SampleListSource):
    """A COCO detection dataset (``bbox`` as ``[x, y, w, h]`` absolute pixels), parsed and checked
    by :func:`detaug.formats.coco.load_coco`; sample ``i`` is the ``i``-th kept image of the JSON,
    its image ``images_dir / file_name``.

    Args:
        annotations_file: the COCO JSON (or its parsed dict).
        images_dir: folder the images' ``file_name`` are relative to.
        shuffle, seed, shard_id, num_shards: kept as attributes for the loaders (which use them
            when their own arguments are ``None``).
        skip_empty: leave out images without boxes (after ``include_iscrowd``; counted).
        include_iscrowd: keep ``iscrowd=1`` annotations as boxes (else left out, counted).
        orientation: see :class:`SampleListSource`.
        cache: parse the JSON once into columns and keep them on disk (``True``: in
            ``<json>.detaug-cache/``, or ``$DETAUG_CACHE_DIR``; a path: under that folder): later
            start-ups open the cache instead of parsing (10M images: 0.35 s and 0.56 GB against
            minutes and tens of GB; see docs/shards.md). The samples, ids, boxes and report are
            those of the uncached source. ``False`` (default): parse in memory. A cache is used
            only when it provably belongs to this very file (else rebuilt, with a warning;
            docs/security.md).
        allow_paths_outside: accept ``file_name`` entries that are absolute or leave
            ``images_dir`` with ``..`` (default: a :class:`~detaug.errors.DatasetError` naming
            the file, the image id and the path). Symbolic links inside ``images_dir`` are
            followed either way (docs/security.md).
        masks: also read each annotation's ``segmentation`` (polygons or RLE): the per-box
            field ``masks``, uint8 ``[N, H, W]``, decoded with pycocotools when an image is read
            and moved with its box (:mod:`detaug.masks`, docs/masks.md); an annotation without
            one, or a malformed one, is a "malformed annotation" naming it. Not with ``cache``
            (a :class:`~detaug.errors.DatasetError` says so).

    Attributes:
        categories: names by category id. report: the checks' findings.
        field_specs: :data:`COCO_FIELDS`: each sample's ``fields`` hold ``iscrowd`` (int64
            ``[N]``, the annotations' flag) and ``area`` (float32 ``[N]``, the box's area in
            pixels; the loaders recompute it on the output boxes); ``keypoints`` for a keypoints
            file, ``masks`` with ``masks=True``.
    """

    def __init__(
        self,
        annotations_file: str | os.PathLike | Mapping[str, Any],
        images_dir: str | os.PathLike,
        *,
        shuffle: bool = False,
        seed: int | None = None,
        skip_empty: bool = False,
        include_iscrowd: bool = True,
        shard_id: int | None = None,
        num_shards: int | None = None,
        orientation: str = "auto",
        cache: bool | str | os.PathLike = False,
        allow_paths_outside: bool = False,
        masks: bool = False,
    ) -> None:
        orientation = check_orientation(orientation)
        self.allow_paths_outside = allow_paths_outside
        if isinstance(annotations_file, Mapping):
            self.annotations_file: Path | None = None
        else:
            self.annotations_file = Path(annotations_file)
            if not self.annotations_file.is_file():
                raise FileNotFoundError(f"{self.annotations_file}: COCO annotations file not found")
        self.images_dir = Path(images_dir)
        if not self.images_dir.is_dir():
            raise FileNotFoundError(f"{self.images_dir}: images folder not found")
        self.shuffle = shuffle
        self.seed = seed
        self.skip_empty = skip_empty
        self.include_iscrowd = include_iscrowd
        self.shard_id = shard_id
        self.num_shards = num_shards
        if cache and masks:
            raise DatasetError(f"{annotations_file if self.annotations_file else '<COCO dict>'}: masks=True: the "
                               "annotation cache does not hold segmentation masks yet; read them with "
                               "CocoSource(..., masks=True, cache=False)")
        if cache and self.annotations_file is not None:
            from detaug.formats.columnar import coco_view, load_coco_columns

            columns = load_coco_columns(self.annotations_file, cache_dir=None if cache is True else cache,
                                        allow_paths_outside=allow_paths_outside)
            view, report = coco_view(columns, self.images_dir, include_iscrowd=include_iscrowd, skip_empty=skip_empty)
            super().__init__(CheckedSamples(view, columns.categories, report, COCO_FIELDS), orientation=orientation)
            return
        dataset = load_coco(annotations_file, allow_paths_outside=allow_paths_outside, masks=masks)  # checked as parsed
        samples = coco_to_samples(dataset, self.images_dir, include_iscrowd=include_iscrowd, skip_empty=skip_empty)
        specs = dict(COCO_FIELDS)
        if KEYPOINTS in samples[0].fields:  # a COCO keypoints file: every sample has float32 [N, K, 3]
            specs[KEYPOINTS] = FieldSpec(np.dtype(np.float32), tuple(samples[0].fields[KEYPOINTS].shape[1:]))
        if masks:  # uint8 [N, H, W], each image's size (detaug.masks)
            specs[MASKS] = FieldSpec(np.dtype(np.uint8), ())
        super().__init__(CheckedSamples(samples, dataset.categories, dataset.report, specs), orientation=orientation)


class VocSource(SampleListSource):
    """A Pascal VOC folder (``Annotations/``, ``JPEGImages/``, ``ImageSets/Main/``) read with the
    ``voc2coco`` converter's parser (its conventions and skip report) straight into xyxy arrays
    (:func:`converters.voc2coco.read_voc_boxes`), then checked as every sample list is.

    Arguments after ``root`` are those of :func:`converters.voc2coco.convert`; ``include_iscrowd``
    drops ``iscrowd=1`` boxes (e.g. ``difficult="crowd"``) when false. ``self.report`` holds the
    checks' findings, ``self.report.conversion`` (also ``self.conversion_report``) the
    converter's report of what was skipped and why; ``report.summary()`` shows both.

    Nothing is left out silently, by the rules of every source:

    * an image whose file is missing, empty or not an image (the converter skips it) is kept,
      as a :class:`CocoSource` keeps it: the loader names it in a :class:`~detaug.DataWarning`
      and ``loader.skipped`` when it meets it, and reads the next sample instead. Its boxes are
      in the ``<size>`` frame; its image id follows the last converted image's, so that every
      other image keeps the id ``voc2coco`` gives it (with ``verify_images=True`` the converter
      skips these images and every image the loader would skip, as the next point says);
    * boxes the converter clipped to the image, or left out for having no area (``zero-size
      box``, ``box outside the image``), are repairs: counted in ``self.report`` as ``box clipped
      to the image``, ``empty box dropped``, ``box outside the image dropped`` (naming the file,
      image id and object) and said in one :class:`~detaug.DataWarning` when the source is built;
    * anything else the conversion leaves out (an XML that does not parse, a split entry without
      XML, an object without a name, a label not in ``labels``, ...) is said in one
      :class:`~detaug.DataWarning` when the source is built, with its counts by reason
      (``self.conversion_report.details()`` names every file).

    Per-box fields (:data:`VOC_FIELDS`): ``difficult`` (int64 ``[N]``, the object's
    ``<difficult>`` flag; all 0 with ``difficult="drop"``) and ``iscrowd`` (int64 ``[N]``:
    ``difficult`` with ``difficult="crowd"``, else 0).
    """

    def __init__(
        self,
        root: str | os.PathLike,
        split: str | None = None,
        *,
        labels: str | Sequence[str] = "discover",
        coords: str = "voc",
        difficult: str = "keep",
        annotations_dir: str | os.PathLike | None = None,
        images_dir: str | os.PathLike | None = None,
        include_iscrowd: bool = True,
        verify_images: bool = False,
        orientation: str = "auto",
    ) -> None:
        from converters import report as R
        from converters.voc2coco import read_voc_boxes

        orientation = check_orientation(orientation)
        # the converter's box repairs, as the checks name them
        repairs = {R.BOX_CLIPPED: v.BOX_CLIPPED, R.ZERO_SIZE_BOX: v.EMPTY_BOX, R.BOX_OUTSIDE_IMAGE: v.BOX_OUTSIDE}
        # "keep" and "crowd" keep the same objects, with the same report; "crowd" marks the
        # difficult ones iscrowd: read so, the converter's crowd flag is each box's difficult flag.
        voc = read_voc_boxes(root, split=split, annotations_dir=annotations_dir, images_dir=images_dir,
                             labels=labels, coords=coords, difficult="crowd" if difficult == "keep" else difficult,
                             verify_images=verify_images, orientation=orientation, keep_unreadable=not verify_images)
        self.conversion_report = voc.report
        report = v.Report(f"{root} (VOC" + (f", split {split})" if split else ")"))
        report.conversion = voc.report
        samples = []
        for image in voc.images:  # xyxy as converted: no JSON, no [x, y, w, h] round trip
            file = f"{report.source}: {image.file_name}"
            for reason, detail in image.repairs:
                report.add(repairs[reason], file, image_id=image.image_id, detail=detail)
            hard = np.asarray(image.iscrowd, dtype=bool)  # the difficult flags (read with "crowd")
            crowd = hard if difficult == "crowd" else np.zeros_like(hard)
            keep = np.ones(len(image.boxes), bool) if include_iscrowd else ~crowd
            for _ in np.flatnonzero(~keep):
                report.add(v.CROWD_LEFT_OUT, file, image_id=image.image_id)
            fields = {"iscrowd": crowd[keep].astype(np.int64), "difficult": hard[keep].astype(np.int64)}
            samples.append(Sample(str(Path(voc.image_root) / image.file_name), image.boxes[keep], image.labels[keep],
                                  image.image_id, image.size, fields))
        try:
            checked = check_samples(samples, voc.categories, report=report)  # the one set of checks
        except DatasetError as err:
            raise DatasetError(f"{err}\nconversion:\n{voc.report.summary()}") from err
        _warn_left_out(report.source, voc)  # stacklevel 3: the caller of VocSource(...)
        report.finish()
        super().__init__(replace(checked, field_specs=VOC_FIELDS), orientation=orientation)


class YoloSource(SampleListSource):
    """A YOLO-txt folder (``images/``, ``labels/`` with one ``class cx cy w h`` line per box as
    fractions of the image, ``classes.txt``), parsed by
    :func:`detaug.formats.yolo.read_yolo_folder` (its layout and errors: every malformed line
    named by file and line) and checked as every sample list is: sample ``i`` is the ``i``-th
    image in path order (or in the split list's order), its image id ``i + 1``, its labels the
    class indices (0-based), :attr:`categories` the names by index.

    Each box is placed on its image by the image's size, read from its header (no pixel is
    decoded) and declared as the sample's ``size``: boxes partly outside the image are clipped,
    boxes without area in it dropped (repairs, counted in ``report`` and said in one
    :class:`~detaug.DataWarning`). An image whose header gives no size is kept without boxes
    (a note; the loaders name and skip the image when they read it).

    Args:
        root: the folder.
        split: a split list ``root/<split>.txt`` of image paths relative to ``root``; ``None``:
            every image under ``images/``.
        names: the class names (a list or a names file); ``None``: ``root/classes.txt`` if there.
        orientation: the frame of the boxes of EXIF-rotated images; default ``"apply"``: YOLO
            labels are fractions of the image as displayed (after its EXIF orientation, as
            Ultralytics reads images); ``"ignore"``: of the stored pixels.
        allow_paths_outside: accept split list entries that are absolute or leave ``root``.
    """

    def __init__(self, root: str | os.PathLike, split: str | None = None, *,
                 names: Sequence[str] | str | os.PathLike | None = None, orientation: str = "apply",
                 allow_paths_outside: bool = False) -> None:
        orientation = check_orientation(orientation)
        folder = read_yolo_folder(root, split, names=names, allow_paths_outside=allow_paths_outside)
        report = folder.report
        samples = []
        for k, item in enumerate(folder.images):
            info = probe_file(item.image)
            if info.size_known:
                hw = info.stored_hw if orientation == "ignore" else info.displayed_hw
                samples.append(Sample(item.image, to_xyxy(item.boxes, "yolo", hw), item.labels, k + 1, hw))
                continue
            if len(item.labels):
                report.add(v.BOXES_NOT_PLACED, item.image, image_id=k + 1,
                           detail=f"{info.problem}: the {len(item.labels)} boxes of {item.label_file}")
            samples.append(Sample(item.image, np.zeros((0, 4)), np.zeros(0, np.int64), k + 1))
        checked = check_samples(samples, folder.categories or None, report=report)  # the one set of checks
        report.finish()
        super().__init__(checked, orientation=orientation)


def _warn_left_out(source: str, voc: Any) -> None:
    """One :class:`~detaug.DataWarning` for what the conversion of a VocSource left out and
    nobody else names (see :class:`VocSource`): images skipped and not kept for the loader,
    objects skipped for another reason than a box repair (counted in the report), their image
    being skipped, or ``difficult="drop"``."""
    from converters import report as R

    conversion = voc.report
    images = Counter(conversion.images_skipped)
    images.subtract(Counter(image.problem for image in voc.images if image.problem is not None))
    said = {R.OBJECT_OF_SKIPPED_IMAGE, R.DIFFICULT_DROPPED, R.ZERO_SIZE_BOX, R.BOX_OUTSIDE_IMAGE}
    objects = Counter({reason: n for reason, n in conversion.objects_skipped.items() if reason not in said})
    parts = []
    for what, counts in (("image", +images), ("object", +objects)):
        if counts:
            n = sum(counts.values())
            ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
            reasons = ", ".join(f"{k} {reason}" for reason, k in ranked)
            first = next(m for m in conversion.messages if m.kind == what and m.reason in counts)
            example = f"{first.path}: {first.detail or first.reason}"
            parts.append(f"{n} {what}{'s' if n != 1 else ''} ({reasons}; e.g. {example})")
    if parts:
        warnings.warn(f"{source}: the conversion left out {' and '.join(parts)} "
                      "(source.conversion_report.details() names each)", DataWarning, stacklevel=3)


def coco_to_samples(
    coco: CocoDataset | Mapping[str, Any],
    image_root: str | os.PathLike,
    *,
    include_iscrowd: bool = True,
    skip_empty: bool = False,
    masks: bool = False,
) -> list[Sample]:
    """Samples of a COCO dataset (a :class:`~detaug.formats.coco.CocoDataset`, or a dict checked
    with :func:`~detaug.formats.coco.load_coco`), in its image order: path ``image_root /
    file_name``, xyxy boxes, the declared size, and the per-box fields of :data:`COCO_FIELDS`
    (``iscrowd`` int64, ``area`` float32: the box's). Crowd boxes left out
    (``include_iscrowd=False``) and images left out (``skip_empty``) are counted as notes in the
    dataset's report. With ``masks`` (or a dataset loaded with ``load_coco(..., masks=True)``)
    each sample's ``fields`` also hold ``masks``: the boxes' segmentations
    (:class:`detaug.masks.CocoMasks`, decoded uint8 ``[N, H, W]`` when the image is read).

    Raises:
        DatasetError: the dataset's errors, or no image left.
    """
    dataset = coco if isinstance(coco, CocoDataset) else load_coco(coco, masks=masks)
    report, root = dataset.report, Path(image_root)
    dataset_masks = masks or any(image.masks is not None for image in dataset.images)
    samples = []
    for image in dataset.images:
        boxes, labels, crowd = image.boxes, image.labels, np.asarray(image.iscrowd, dtype=bool)
        file = f"{dataset.source}: {image.file_name}"
        if not include_iscrowd and crowd.any():
            for j in np.flatnonzero(crowd):
                aid = int(image.annotation_ids[j])
                report.add(v.CROWD_LEFT_OUT, file, image_id=image.id, annotation=None if aid == NO_ANNOTATION_ID else aid)
            points = None if image.keypoints is None else image.keypoints[~crowd]
            masks = None if image.masks is None else image.masks[~crowd]
            boxes, labels, crowd = boxes[~crowd], labels[~crowd], crowd[~crowd]
        else:
            points, masks = image.keypoints, image.masks
        if skip_empty and not len(boxes):
            report.add(v.EMPTY_IMAGE_LEFT_OUT, file, image_id=image.id)
            continue
        fields = {"iscrowd": crowd.astype(np.int64), "area": box_area(boxes, np.float32)}
        if points is not None:  # a keypoints file (detaug.keypoints: pixel indices + 0.5)
            fields[KEYPOINTS] = points
        if dataset_masks:  # read with masks=True: polygons / RLE, decoded when the image is read (detaug.masks)
            fields[MASKS] = masks if masks is not None else CocoMasks([])
        samples.append(Sample(str(root / image.file_name), boxes, labels, image.id, image.size, fields))
    report.images = len(samples)
    report.boxes = sum(len(s.boxes) for s in samples)
    if not samples:
        report.add(v.NO_IMAGES, dataset.source, detail=(
            "every image was left out (skip_empty=True)" if dataset.images else "the dataset has no images"))
        report.raise_errors()
    return samples


# -- sample-list checks (the rules themselves live in detaug.formats.validation) -------------------

def check_samples(samples: Iterable[Sample | Mapping[str, Any] | tuple], categories: Mapping[int, str] | None = None,
                  *, report: v.Report | None = None, box_format: str = "xyxy") -> CheckedSamples:
    """The one set of checks of every source built from samples (the table of
    :mod:`detaug.formats.validation`): boxes converted from ``box_format`` to float32 xyxy,
    clipped to the declared size or dropped (repairs), labels int64 among ``categories`` when
    given, unique ids (1..n assigned when all are 0), per-box fields aligned with their boxes.

    Args:
        samples, categories, box_format: as :class:`SampleListSource`'s.
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
            file and the image id. TypeError: as :class:`SampleListSource`'s.
    """
    check_box_format(box_format)
    report = v.Report("sample list") if report is None else report
    names = _check_categories(categories, report)
    checked, specs = _check_samples(samples, names if categories is not None else None, report, box_format)
    report.images = len(checked)
    report.boxes = sum(len(s.boxes) for s in checked)
    return CheckedSamples(checked, names, report, specs)


def _is_decoded(image: Any) -> bool:
    return isinstance(image, np.ndarray) and image.ndim >= 2


def _check_categories(categories: Mapping[int, str] | None, report: v.Report) -> dict[int, str]:
    if categories is None:
        return {}
    if not isinstance(categories, Mapping):
        raise TypeError(f"categories must be a mapping of id to name, got {type(categories).__name__}")
    names: dict[int, str] = {}
    for key, name in categories.items():
        cid = v.as_int(key)
        if cid is None:
            report.add(v.MALFORMED_CATEGORY, "categories", detail=f"id {key!r:.60} is not an integer")
        elif problem := v.label_problem(cid):
            report.add(problem, "categories", detail=f"category id {cid}")
        else:
            names[cid] = str(name)
    return names


def _check_image(image: Any, index: int, report: v.Report) -> tuple[Any, str]:
    """The image as kept (path str, bytes, or a contiguous uint8 array) and how it is described;
    ``None`` when it is unusable (the error is recorded). ``TypeError`` for an image of another
    type (:func:`~detaug.formats.validation.image_input`)."""
    file = f"sample {index}"
    given = image
    image = v.image_input(image, index)  # PIL images and tensors become arrays
    if isinstance(image, (str, os.PathLike)):
        path = os.fspath(image)
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if not path:
            report.add(v.MALFORMED_IMAGE, file, detail="empty path")
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
            f"{v.describe_type(given)} of {getattr(given, 'dtype', image.dtype)} (as an array {image.dtype} {image.shape})")
        report.add(v.MALFORMED_IMAGE, file, detail=(
            f"{what}: decoded images are uint8 [H, W, 3] or [H, W], encoded bytes a 1-D uint8 array"))
        return None, file
    raise AssertionError(f"{file}: image_input let {type(image).__name__} through")  # pragma: no cover


def _box_array(boxes: Any) -> tuple[np.ndarray | None, str]:
    """float64 ``[N, 4]`` of ``boxes``, or ``(None, why)``."""
    try:
        raw = np.asarray(boxes)
        if raw.dtype.kind not in "iufO" or (raw.dtype.kind == "O" and raw.size and
                                             not all(v.as_coordinate(x) is not None for x in raw.reshape(-1))):
            return None, f"boxes of dtype {raw.dtype} are not numbers"
        with np.errstate(over="ignore", invalid="ignore"):
            if raw.dtype.kind == "O":
                table = np.array([v.as_coordinate(x) for x in raw.reshape(-1)], np.float64).reshape(raw.shape)
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
        return None, v.MALFORMED_LABEL, f"labels are not an array ({err})"
    if raw.ndim > 1 and raw.size != max(raw.shape, default=0):
        return None, v.MALFORMED_LABEL, f"labels of shape {raw.shape} are not [N]"
    flat = raw.reshape(-1)
    if raw.dtype.kind in "iu":
        values = [int(flat.min()), int(flat.max())] if flat.size else []
    elif raw.dtype.kind in "fO":
        values = [v.as_int(x) for x in flat]
        if None in values:
            bad = next(x for x in flat if v.as_int(x) is None)
            return None, v.MALFORMED_LABEL, f"label {bad!r:.40} is not an integer"
    else:
        return None, v.MALFORMED_LABEL, f"labels of dtype {raw.dtype} are not integers"
    for value in values:
        problem = v.label_problem(value)  # type: ignore[arg-type]
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
        try:
            arr = np.asarray(values.detach().cpu().numpy() if hasattr(values, "detach") else values)
        except (ValueError, TypeError) as err:
            return None, f"field {name!r} is not an array ({err})"
        if arr.dtype.kind not in "biuf":
            return None, f"field {name!r} of dtype {arr.dtype} is not numbers"
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
                  report: v.Report) -> dict[str, FieldSpec]:
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
                    report.add(v.MALFORMED_ANNOTATION, files[k], image_id=s.image_id,
                               detail=f"no field {name!r} (sample {first} has one): every sample with boxes "
                                      "carries the same fields")
                    break
            elif f[name].shape[1:] != shape and name != MASKS:  # masks: each image's size
                report.add(v.MALFORMED_ANNOTATION, files[k], image_id=s.image_id,
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
                   report: v.Report, box_format: str = "xyxy") -> tuple[list[Sample], dict[str, FieldSpec]]:
    """The samples checked (boxes as float32 xyxy, labels int64, fields aligned with the boxes
    kept) and the specs of their per-box fields; errors raised as :class:`DatasetError`."""
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
            s = Sample(**v.sample_fields(s, i))  # TypeError naming i for anything else
            s.fields = extra
        items.append(s)
    if not items:
        report.add(v.NO_IMAGES, "sample list", detail="the sample list is empty")
        report.raise_errors()

    checked: list[Sample] = []
    checked_fields: list[dict[str, np.ndarray]] = []
    files: list[str] = []
    all_boxes: list[np.ndarray] = []
    clip: list[tuple[float, float]] = []
    for i, s in enumerate(items):
        errors = report.total
        image, file = _check_image(s.image, i, report)
        image_id = v.as_int(s.image_id)
        if image_id is None or not v.INT64_MIN <= image_id <= v.INT64_MAX:
            report.add(v.BAD_IMAGE_ID, file, annotation=f"sample {i}", detail=f"image_id {s.image_id!r:.60}")
            image_id = None
        size = None
        if s.size is not None:
            try:
                h, w = s.size  # type: ignore[misc]
                size, why = v.check_size(h, w)
            except (TypeError, ValueError):
                why = f"size {s.size!r:.60} is not (height, width)"
            if size is None:
                report.add(v.BAD_SIZE, file, image_id=image_id, detail=why)
        clip_hw = size
        if image is not None and _is_decoded(image):
            shape = (int(image.shape[0]), int(image.shape[1]))
            if size is not None and size != shape:
                report.add(v.BAD_SIZE, file, image_id=image_id, detail=f"declared (h, w) {size} but the array is {shape}")
            clip_hw = shape
        boxes, why = _box_array(s.boxes)
        if boxes is not None and box_format != "xyxy":
            boxes, why = _from_format(boxes, box_format, clip_hw, image)
        if boxes is None:
            report.add(v.MALFORMED_BOX, file, image_id=image_id, detail=why)
        labels, reason, why = _label_array(s.labels)
        if labels is None:
            report.add(reason, file, image_id=image_id, detail=why)
        elif categories is not None:
            unknown = sorted(set(labels.tolist()) - set(categories))
            if unknown:
                report.add(v.UNKNOWN_CATEGORY, file, image_id=image_id, detail=f"labels {unknown[:5]}")
        if boxes is not None and labels is not None and len(boxes) != len(labels):
            report.add(v.MALFORMED_BOX, file, image_id=image_id, detail=f"{len(boxes)} boxes but {len(labels)} labels")
        fields, why = _field_arrays(s.fields, None if boxes is None else len(boxes), clip_hw)
        if fields is None:
            report.add(v.MALFORMED_ANNOTATION, file, image_id=image_id, detail=why)
        if report.total > errors:
            continue
        checked.append(Sample(image, boxes, labels, image_id, size))
        checked_fields.append(fields)
        files.append(file)
        all_boxes.append(boxes)
        clip.append(clip_hw or (np.nan, np.nan))

    if checked and not report.errors:
        kinds = {_is_decoded(s.image) for s in checked}
        if len(kinds) > 1:
            first = next(i for i, s in enumerate(checked) if _is_decoded(s.image) != _is_decoded(checked[0].image))
            report.add(v.MALFORMED_IMAGE, files[first], image_id=checked[first].image_id,
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

    boxes32, keep = v.check_boxes(table, sizes, report, where)
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


def _check_ids(samples: list[Sample], files: list[str], report: v.Report) -> None:
    if all(s.image_id == 0 for s in samples):
        for i, s in enumerate(samples):
            s.image_id = i + 1
        report.add(v.IDS_ASSIGNED, "sample list", detail=f"1..{len(samples)}")
        return
    seen: dict[int, int] = {}
    for i, s in enumerate(samples):
        if s.image_id in seen:
            report.add(v.DUPLICATE_IMAGE_ID, files[i], image_id=s.image_id,
                       detail=f"samples {seen[s.image_id]} and {i}")
        else:
            seen[s.image_id] = i


def _check_files(samples: list[Sample], files: list[str], report: v.Report) -> None:
    seen: dict[str, int] = {}
    for i, s in enumerate(samples):
        if isinstance(s.image, str):
            key = v.file_key(s.image)
            if key in seen:
                report.add(v.DUPLICATE_FILE, files[i], image_id=s.image_id,
                           detail=f"also sample {seen[key]} (image_id {samples[seen[key]].image_id})")
            else:
                seen[key] = i
