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
:class:`SampleListSource` lives in :mod:`detaug.sample_list` and :func:`check_samples` in
:mod:`detaug.sample_checks`; both are exported here, with the records of :mod:`detaug.formats.samples`.

Boxes are float32 ``[N, 4]`` absolute ``xyxy`` in continuous pixel coordinates (pixel ``i`` spans
``[i, i + 1)``), labels int64 ``[N]`` category ids in ``[0, 2**31 - 1]``, image ids ints that fit
int64, unique within a source.
"""

from __future__ import annotations

import os
import warnings
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from detaug.boxes import box_area
from detaug.errors import DatasetError, DataWarning
from detaug.formats.box_formats import to_xyxy
from detaug.formats.coco import NO_ANNOTATION_ID, CocoDataset, load_coco
from detaug.formats.images import ORIENTATIONS, probe_file
from detaug.formats.report import (
    BOXES_NOT_PLACED, BOX_CLIPPED, BOX_OUTSIDE, CROWD_LEFT_OUT, EMPTY_BOX, EMPTY_IMAGE_LEFT_OUT, NO_IMAGES,
    Report,
)
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
from detaug.keypoints import KEYPOINTS
from detaug.masks import MASKS, CocoMasks
from detaug.sample_checks import check_samples
from detaug.sample_list import SampleListSource, check_orientation

__all__ = [
    "COCO_FIELDS", "ORIENTATIONS", "RESERVED_FIELDS", "VOC_FIELDS", "CheckedSamples", "CocoSource", "FieldSpec",
    "Sample", "SampleListSource", "Source", "VocSource", "YoloSource", "box_area", "check_samples", "coco_to_samples",
    "field_specs",
]


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
            one, or a malformed one, is a "malformed annotation" naming it. With ``cache`` the
            segmentations are cached undecoded, in a cache of their own (docs/masks.md).

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
        if cache and self.annotations_file is not None:
            from detaug.formats.coco_cache import load_coco_columns
            from detaug.formats.coco_columns import coco_view

            columns = load_coco_columns(self.annotations_file, cache_dir=None if cache is True else cache,
                                        allow_paths_outside=allow_paths_outside, masks=masks)
            view, report = coco_view(columns, self.images_dir, include_iscrowd=include_iscrowd, skip_empty=skip_empty)
            specs = dict(COCO_FIELDS)
            if columns.keypoints is not None:  # the fields of the fresh parse below
                specs[KEYPOINTS] = FieldSpec(np.dtype(np.float32), tuple(columns.keypoints.shape[1:]))
            if masks:
                specs[MASKS] = FieldSpec(np.dtype(np.uint8), ())
            super().__init__(CheckedSamples(view, columns.categories, report, specs), orientation=orientation)
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
        repairs = {R.BOX_CLIPPED: BOX_CLIPPED, R.ZERO_SIZE_BOX: EMPTY_BOX, R.BOX_OUTSIDE_IMAGE: BOX_OUTSIDE}
        # "keep" and "crowd" keep the same objects, with the same report; "crowd" marks the
        # difficult ones iscrowd: read so, the converter's crowd flag is each box's difficult flag.
        voc = read_voc_boxes(root, split=split, annotations_dir=annotations_dir, images_dir=images_dir,
                             labels=labels, coords=coords, difficult="crowd" if difficult == "keep" else difficult,
                             verify_images=verify_images, orientation=orientation, keep_unreadable=not verify_images)
        self.conversion_report = voc.report
        report = Report(f"{root} (VOC" + (f", split {split})" if split else ")"))
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
                report.add(CROWD_LEFT_OUT, file, image_id=image.image_id)
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
                report.add(BOXES_NOT_PLACED, item.image, image_id=k + 1,
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
                report.add(CROWD_LEFT_OUT, file, image_id=image.id, annotation=None if aid == NO_ANNOTATION_ID else aid)
            points = None if image.keypoints is None else image.keypoints[~crowd]
            masks = None if image.masks is None else image.masks[~crowd]
            boxes, labels, crowd = boxes[~crowd], labels[~crowd], crowd[~crowd]
        else:
            points, masks = image.keypoints, image.masks
        if skip_empty and not len(boxes):
            report.add(EMPTY_IMAGE_LEFT_OUT, file, image_id=image.id)
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
        report.add(NO_IMAGES, dataset.source, detail=(
            "every image was left out (skip_empty=True)" if dataset.images else "the dataset has no images"))
        report.raise_errors()
    return samples
