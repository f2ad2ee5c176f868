"""Convert a Pascal VOC dataset into COCO detection dicts: the dataset-level API.

Layouts: a VOCdevkit-style folder (``Annotations/``, ``JPEGImages/``,
``ImageSets/Main/<split>.txt``), or an annotations folder plus an images folder. Without an
images folder (it does not exist) the conversion is *annotation-only*: sizes come from
``<size>`` and ``file_name`` is ``<id>`` plus the extension of ``<filename>`` (``.jpg`` when it
has none).

Conventions (see also :mod:`converters.boxes`):

* image, annotation and category ids start at 1; images in split-file order (``split=None``:
  sorted VOC ids), annotations in image order then object order, categories in label order;
* an image is identified by its VOC id (the XML file's stem); see :mod:`converters.images`;
* ``coords="voc"``: ``x = xmin - 1, y = ymin - 1, w = xmax - xmin + 1, h = ymax - ymin + 1``;
  ``coords="raw"``: ``x = xmin, y = ymin, w = xmax - xmin, h = ymax - ymin``; boxes are
  clipped to the image and boxes with nothing left are skipped;
* the image size is read from the image header whenever the image file exists (a ``<size>``
  that is missing, empty or disagrees is reported); ``<depth>`` is checked against the image;
  the per-file steps are in :mod:`converters.convert_file`;
* EXIF orientation (``orientation="auto"``, default): the boxes of an image are taken in the
  frame its ``<size>`` names, the stored pixels or the displayed (EXIF-rotated) image
  (undecidable: stored), and ``width``/``height`` are that frame's; ``"apply"``: always the
  displayed frame; ``"ignore"``: always the stored one. Such images get
  ``"exif_orientation": k`` and are counted in the report by frame
  (:func:`detaug.formats.images.explain_frame`);
* ``verify_images``: images the loader would skip (:func:`detaug.formats.images.probe_file`:
  empty, truncated, GIF, too large, ...) are skipped, by reason; without it they are kept with
  a warning (images whose header gives no size are always skipped);
* ``difficult="keep"`` keeps difficult objects (``attributes["difficult"] = 1``), ``"crowd"``
  also sets ``iscrowd = 1`` (COCOeval ignores them; DALI's reader drops them with
  ``include_iscrowd=False``), ``"drop"`` skips them (counted);
* each annotation has ``attributes``: ``difficult`` (0 when absent) and ``truncated``,
  ``occluded``, ``pose`` when the XML states them.

``converters.voc2coco`` is this module, and calling the module calls :func:`convert`.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any, Literal

from converters import report as R
from converters.assemble import assemble_split
from converters.boxes import COORDS, Coords
from converters.coco import (
    AtomicOutput,
    CocoStreamWriter,
    dumps_coco,
    signals_abort_writes,
    write_bytes_atomic,
    write_coco_json,
)
from converters.convert_file import FileOptions, FileResult, convert_file
from converters.images import ImageIndex
from converters.labels import LabelsSpec, resolve_labels
from converters.progress import Progress
from converters.report import Report
from converters.runner import PARALLEL_MIN_FILES, Runner, default_workers, gc_paused
from detaug.formats.images import ORIENTATIONS

__all__ = [
    "DIFFICULT_MODES",
    "ORIENTATIONS",
    "PARALLEL_MIN_FILES",
    "ConversionError",
    "ConversionResult",
    "VocBoxes",
    "VocImageBoxes",
    "convert",
    "convert_splits",
    "read_voc_boxes",
    "write_coco_json",
    "write_splits",
]

Difficult = Literal["keep", "crowd", "drop"]
Orientation = Literal["auto", "apply", "ignore"]
DIFFICULT_MODES: tuple[str, ...] = ("keep", "crowd", "drop")

#: From this many XML files on a progress bar is shown (progress=None, stderr a terminal).
PROGRESS_MIN_FILES = 1000


class ConversionError(ValueError):
    """The dataset cannot be converted at all (a folder or split file missing, bad options)."""


class ConversionResult:
    """One COCO document and how it was made.

    ``coco``: the complete COCO detection dict (``info``, ``licenses``, ``images``,
    ``annotations``, ``categories``). ``image_root``: images are at
    ``image_root / image["file_name"]``. ``report``: counts by reason and messages
    (:class:`converters.report.Report`). ``split``: the split name, ``None`` for every XML.

    The conversion produces the JSON text (encoded record by record in the worker processes);
    ``coco`` is decoded from it on first access. :meth:`to_json` and :meth:`write_json` give
    the bytes of ``coco`` as it is then, edits included.
    """

    def __init__(self, coco_json: bytes, image_root: Path, report: Report,
                 split: str | None = None) -> None:
        self._json: bytes | None = coco_json
        self._coco: dict[str, Any] | None = None
        self.image_root = image_root
        self.report = report
        self.split = split

    @property
    def coco(self) -> dict[str, Any]:
        if self._coco is None:
            assert self._json is not None
            with gc_paused():  # a million small containers, no cycles
                self._coco = json.loads(self._json)
            self._json = None  # the dict may be edited from now on: it is the truth
        return self._coco

    def to_json(self) -> bytes:
        """The document as :func:`converters.coco.dumps_coco` writes it (same bytes)."""
        return self._json if self._json is not None else dumps_coco(self.coco)

    def write_json(self, path: str | PathLike) -> Path:
        """Write :meth:`to_json` to ``path`` atomically (see :func:`write_coco_json`)."""
        return write_bytes_atomic(self.to_json(), path)

    def __repr__(self) -> str:
        return (f"ConversionResult(split={self.split!r}, image_root={str(self.image_root)!r}, "
                f"images={self.report.images_converted}, "
                f"annotations={self.report.objects_converted})")


def convert(voc_root: str | PathLike | None = None, *,
            annotations_dir: str | PathLike | None = None,
            images_dir: str | PathLike | None = None,
            split: str | None = None,
            labels: LabelsSpec = "discover",
            coords: Coords = "voc",
            difficult: Difficult = "keep",
            verify_images: bool = False,
            orientation: Orientation = "auto",
            workers: int | None = None,
            progress: bool | None = None) -> ConversionResult:
    """Convert one split (``split=None``: every XML in the annotations folder) to a COCO dict.

    ``voc_root``: a folder with ``Annotations/``, ``JPEGImages/`` and ``ImageSets/Main/``;
    ``annotations_dir``/``images_dir`` override the first two (``voc_root`` may then be ``None``).
    ``split``: a name (``"train"`` reads ``ImageSets/Main/train.txt``) or the path of a list file
    (one id a line; a second column, as in per-class lists, is ignored).
    ``labels``: ``"voc"`` (the 20 VOC classes in the devkit's order), ``"discover"`` (every name
    found in the annotations folder, sorted; the whole folder, not only the split, so that
    splits converted one by one share category ids), a labels file (one name a line; CVAT /
    Datumaro ``labelmap.txt`` is understood), or a list of names. Objects whose name is not in
    the list are skipped and counted.
    ``coords``: ``"voc"`` (1-based inclusive, default) or ``"raw"`` (continuous, as written).
    ``difficult``: ``"keep"``, ``"crowd"`` (``iscrowd = 1``) or ``"drop"``.
    ``verify_images``: skip (and count, by reason) every image the loader would skip:
    :func:`detaug.formats.images.probe_file` (header and end marker, no decoding) finds a
    problem (empty, truncated JPEG or PNG, GIF or another format DALI does not decode, too
    large); without it those images are kept with a warning.
    ``orientation``: the frame of the boxes of EXIF-oriented images: ``"auto"`` (the one
    ``<size>`` names; undecidable: the stored pixels), ``"apply"`` (the displayed image),
    ``"ignore"`` (the stored pixels); COCO ``width``/``height`` are that frame's.
    ``workers``: processes that parse XMLs (``None``: one per available core from
    :data:`PARALLEL_MIN_FILES` files on, else 1, this process); the output is the same for
    every value (results are merged in input order).
    ``progress``: a progress bar with ETA on stderr (tqdm's when installed; ``None``: when
    there are :data:`PROGRESS_MIN_FILES` files or more and stderr is a terminal).

    Raises :class:`ConversionError` when the dataset cannot be converted at all. Problems with
    single files or objects never raise: they are in ``result.report``.
    """
    return convert_splits(voc_root, [split], annotations_dir=annotations_dir,
                          images_dir=images_dir, labels=labels, coords=coords,
                          difficult=difficult, verify_images=verify_images,
                          orientation=orientation, workers=workers, progress=progress)[split]


def convert_splits(voc_root: str | PathLike | None, splits: Sequence[str | None], *,
                   annotations_dir: str | PathLike | None = None,
                   images_dir: str | PathLike | None = None,
                   labels: LabelsSpec = "discover",
                   coords: Coords = "voc",
                   difficult: Difficult = "keep",
                   verify_images: bool = False,
                   orientation: Orientation = "auto",
                   workers: int | None = None,
                   progress: bool | None = None) -> dict[str | None, ConversionResult]:
    """Convert several splits, in memory; every split gets the same categories. Arguments as for
    :func:`convert`; ``None`` in ``splits`` means every XML. Returns ``{split: result}`` in the
    order given. (An XML listed in several splits is parsed once per split.)"""
    plan = _Plan.make(voc_root, splits, annotations_dir, images_dir, labels, coords, difficult,
                      verify_images, orientation, workers)
    buffers = {split: bytearray() for split in splits}
    writers = {split: CocoStreamWriter(buffers[split].extend) for split in splits}
    reports, names = plan.run({s: _JsonSink(w) for s, w in writers.items()}, progress)
    for writer in writers.values():
        writer.finish(names)
    return {split: ConversionResult(bytes(buffers[split]), plan.layout.images, reports[split],
                                    split) for split in splits}


def write_splits(voc_root: str | PathLike | None,
                 targets: Mapping[str | None, str | PathLike], *,
                 annotations_dir: str | PathLike | None = None,
                 images_dir: str | PathLike | None = None,
                 labels: LabelsSpec = "discover",
                 coords: Coords = "voc",
                 difficult: Difficult = "keep",
                 verify_images: bool = False,
                 orientation: Orientation = "auto",
                 workers: int | None = None,
                 progress: bool | None = None,
                 before_commit: Callable[[dict[str | None, Report]], bool] | None = None,
                 on_commit: Callable[[str | None, Path], None] | None = None,
                 on_stale: Callable[[Path], None] | None = None,
                 ) -> dict[str | None, Report]:
    """Convert ``targets``' splits (``{split: output file}``) straight to their files, in
    bounded memory: each image's record is written as its XML is converted, annotations wait in
    an anonymous temporary file beside the output (they follow the images in the document),
    and nothing per file is kept. The bytes are those of :func:`convert_splits`'
    ``to_json()``.

    Every output is written atomically (:class:`converters.coco.AtomicOutput`): a temporary
    file beside it, renamed into place only when every split is converted and
    ``before_commit(reports)`` (when given) returns true; otherwise, and on any error, Ctrl-C
    or SIGTERM (caught from the start of the conversion), no output is touched and the
    temporary files are removed. ``on_commit(split, path)`` is called before each rename,
    ``on_stale(temp_file)`` for each temporary file of a killed run removed
    (:func:`converters.coco.remove_stale_temp_files`).
    ``OSError`` of an output names it (``err.filename``). Other arguments as for
    :func:`convert`. Returns ``{split: report}``.
    """
    splits = list(targets)
    plan = _Plan.make(voc_root, splits, annotations_dir, images_dir, labels, coords, difficult,
                      verify_images, orientation, workers)
    outputs = {split: AtomicOutput(path) for split, path in targets.items()}
    writers: dict[str | None, CocoStreamWriter] = {}
    with signals_abort_writes(next(iter(outputs.values())).path):
        try:
            for split, output in outputs.items():
                for stale in output.open():
                    if on_stale is not None:
                        on_stale(stale)
                spool_error = functools.partial(output.error, doing="spooling annotations")
                writers[split] = CocoStreamWriter(output.write, output.path.parent, spool_error)
            reports, names = plan.run({s: _JsonSink(w) for s, w in writers.items()}, progress)
            for writer in writers.values():
                writer.finish(names)
            if before_commit is not None and not before_commit(reports):
                raise _Discard
            for split, output in outputs.items():
                if on_commit is not None:
                    on_commit(split, output.path)
                output.commit()
        except _Discard:
            pass
        finally:
            for writer in writers.values():
                writer.close()
            for output in outputs.values():
                output.discard()  # nothing after a commit
    return reports


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


class _Discard(Exception):
    """``before_commit`` said no."""


class _JsonSink:
    """Writes each converted image (and spools its annotations) with a COCO stream writer."""

    def __init__(self, writer: CocoStreamWriter) -> None:
        self.writer = writer

    def add(self, image_id: int, result: FileResult) -> None:
        assert result.image is not None
        written = self.writer.add_image(result.image[3])
        assert written == image_id
        self.writer.add_annotations(image_id, *result.annotations)


@dataclass
class _Plan:
    """What to convert: checked options, the folders, the annotations listing, the splits'
    entries and the labels (``None`` until discovered)."""

    layout: _Layout
    options: FileOptions
    xml_names: dict[str, str]
    duplicates: list[tuple[str, str]]
    not_xml: list[str]
    entries: dict[str | None, tuple[list[str], str | None]]
    names: list[str] | None
    workers: int | None

    @classmethod
    def make(cls, voc_root: str | PathLike | None, splits: Sequence[str | None],
             annotations_dir: str | PathLike | None, images_dir: str | PathLike | None,
             labels: LabelsSpec, coords: str, difficult: str, verify_images: bool,
             orientation: str, workers: int | None, boxes: bool = False,
             keep_unreadable: bool = False) -> _Plan:
        """Everything that can fail before the long part (:class:`ConversionError`)."""
        _check_options(coords, difficult, orientation, workers, splits)
        layout = _Layout.resolve(voc_root, annotations_dir, images_dir)
        xml_names, duplicates, not_xml = _scan_annotations(layout.annotations)
        entries = {split: (_read_split(layout, split) if split is not None
                           else (sorted(xml_names), None)) for split in splits}
        discover = isinstance(labels, str) and labels == "discover"
        try:  # a bad labels file fails before the long part
            names = None if discover else resolve_labels(labels, ())
        except (ValueError, OSError) as err:
            raise ConversionError(str(err)) from None
        options = FileOptions(str(layout.annotations), str(layout.images),
                              ImageIndex.scan(layout.images) if layout.images_exist else None,
                              coords, difficult, verify_images,
                              frozenset(names) if names is not None else None, orientation,
                              boxes, keep_unreadable)
        return cls(layout, options, xml_names, duplicates, not_xml, entries, names, workers)

    def run(self, sinks: Mapping[str | None, Any], progress: bool | None,
            ) -> tuple[dict[str | None, Report], list[str]]:
        """Convert every split into its sink, in split order; returns the reports and the
        category names (discovered: from every XML of the folder, sorted)."""
        xml_names = self.xml_names
        to_parse = {split: [i for i in ids if i in xml_names]
                    for split, (ids, _) in self.entries.items()}
        rest: list[str] = []
        if self.names is None and None not in self.entries:  # names of the XMLs in no split
            parsed = {i for ids in to_parse.values() for i in ids}
            rest = [xml_names[i] for i in sorted(xml_names) if i not in parsed]
        total = sum(len(ids) for ids in to_parse.values()) + len(rest)
        workers = self.workers if self.workers is not None else default_workers(total)
        show = progress if progress is not None else (
            total >= PROGRESS_MIN_FILES and sys.stderr.isatty())
        bar = Progress(total, show)
        found: set[str] = set()
        reports: dict[str | None, Report] = {}
        try:
            with gc_paused(), Runner(self.options, workers, bar) as runner:
                for split, sink in sinks.items():
                    reports[split] = report = self._start_report(split)
                    results = runner.results([xml_names[i] for i in to_parse[split]])
                    if self.names is None:
                        results = _collect_names(results, found)
                    assemble_split(self.entries[split][0], results, xml_names=xml_names,
                                   annotations_dir=str(self.layout.annotations),
                                   split_file=self.entries[split][1],
                                   result_of=self._result_of, report=report, sink=sink)
                if rest:
                    found |= runner.names(rest)
        finally:
            bar.close()
        names = self.names if self.names is not None else resolve_labels("discover", found)
        for report in reports.values():
            report.categories = len(names)
            report.check()
        return reports, names

    def _start_report(self, split: str | None) -> Report:
        report = Report()
        layout = self.layout
        if self.options.index is None:
            report.warn(R.ANNOTATION_ONLY, str(layout.images), "folder does not exist")
        for name in self.not_xml:
            report.ignore(R.NOT_XML_FILE, str(layout.annotations / name))
        if split is None:
            for kept, dropped in self.duplicates:
                report.images_total += 1
                report.skip_image(R.DUPLICATE_ID, str(layout.annotations / dropped),
                                  f"same id as {kept}")
        return report

    def _result_of(self, voc_id: str) -> FileResult:
        return convert_file(self.xml_names[voc_id], self.options)


def _collect_names(results: Any, found: set[str]) -> Any:
    for result in results:
        found.update(result.names)
        yield result


# ---------------------------------------------------------------------------------------------
# Layout, annotation folder, split files


@dataclass(frozen=True)
class _Layout:
    root: Path | None
    annotations: Path
    images: Path
    images_exist: bool

    @classmethod
    def resolve(cls, voc_root: str | PathLike | None, annotations_dir: str | PathLike | None,
                images_dir: str | PathLike | None) -> _Layout:
        root = Path(voc_root) if voc_root is not None else None
        if root is None and annotations_dir is None:
            raise ConversionError("give a VOC root folder or an annotations folder")
        if root is not None and not root.is_dir():
            raise ConversionError(f"{root}: not a folder")
        annotations = Path(annotations_dir) if annotations_dir is not None else root / "Annotations"
        if not annotations.is_dir():
            hint = "" if annotations_dir is not None else (
                " (give the folder that holds Annotations/, e.g. VOCdevkit/VOC2007,"
                " or an annotations folder)")
            raise ConversionError(f"{annotations}: annotations folder not found{hint}")
        if images_dir is not None:
            images = Path(images_dir)
            if not images.is_dir():
                raise ConversionError(f"{images}: images folder not found")
        else:
            images = (root if root is not None else annotations.parent) / "JPEGImages"
        return cls(root, annotations, images, images.is_dir())


def _scan_annotations(folder: Path) -> tuple[dict[str, str], list[tuple[str, str]], list[str]]:
    """``({id: xml file name}, [(kept, duplicate)], [names that are not .xml files])``."""
    with os.scandir(folder) as entries:
        listing = sorted((e.name, e.is_file()) for e in entries)
    xml_names: dict[str, str] = {}
    duplicates: list[tuple[str, str]] = []
    not_xml: list[str] = []
    for name, is_file in listing:
        stem, ext = os.path.splitext(name)
        if not is_file or ext.lower() != ".xml":
            not_xml.append(name + ("" if is_file else "/"))
        elif stem in xml_names:
            duplicates.append((xml_names[stem], name))
        else:
            xml_names[stem] = name
    return xml_names, duplicates, not_xml


def _read_split(layout: _Layout, split: str) -> tuple[list[str], str]:
    """The ids of a split, in file order without repeats, and the split file's path."""
    main = layout.root / "ImageSets" / "Main" if layout.root is not None else None
    path = main / f"{split}.txt" if main is not None else None
    if path is None or not path.is_file():
        as_file = Path(split)
        if as_file.is_file():
            path = as_file
        else:
            available = _available_splits(main) if main is not None and main.is_dir() else []
            where = f"no {path}" if path is not None else "no VOC root to look in"
            listed = f"; available: {', '.join(available)}" if available else ""
            raise ConversionError(f"split {split!r} not found: {where}{listed}")
    ids: list[str] = []
    seen: set[str] = set()
    with path.open(encoding="utf-8-sig") as handle:
        for line in handle:
            fields = line.split()
            if fields and fields[0] not in seen:
                seen.add(fields[0])
                ids.append(fields[0])
    return ids, str(path)


def _available_splits(main: Path) -> list[str]:
    """Split names in ``ImageSets/Main``, leaving out per-class lists (``cat_train``)."""
    stems = sorted(p.stem for p in main.glob("*.txt"))
    return [s for s in stems if not ("_" in s and s.rsplit("_", 1)[1] in stems)]


def _check_options(coords: str, difficult: str, orientation: str, workers: int | None,
                   splits: Sequence[str | None]) -> None:
    if coords not in COORDS:
        raise ConversionError(f"coords must be one of {', '.join(COORDS)}, got {coords!r}")
    if difficult not in DIFFICULT_MODES:
        raise ConversionError(
            f"difficult must be one of {', '.join(DIFFICULT_MODES)}, got {difficult!r}")
    if orientation not in ORIENTATIONS:
        raise ConversionError(
            f"orientation must be one of {', '.join(ORIENTATIONS)}, got {orientation!r}")
    if workers is not None and (not isinstance(workers, int) or workers < 1):
        raise ConversionError(f"workers must be a positive integer or None, got {workers!r}")
    if not splits:
        raise ConversionError("no split given (None converts every XML)")
    if len(set(splits)) != len(splits):
        raise ConversionError(f"a split is named twice in {list(splits)}")


class _CallableModule(types.ModuleType):
    """Lets ``from converters import voc2coco; voc2coco(root, ...)`` call :func:`convert`."""

    def __call__(self, *args: Any, **kwargs: Any) -> ConversionResult:
        return convert(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
