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

import contextlib
import gc
import json
import multiprocessing
import os
import signal
import sys
import types
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any, Literal

from converters import report as R
from converters.boxes import COORDS, Coords
from converters.coco import (
    coco_json_from_parts,
    dumps_coco,
    make_categories,
    write_bytes_atomic,
    write_coco_json,
)
from converters.convert_file import FileOptions, FileResult, convert_file
from converters.images import ImageIndex
from converters.labels import LabelsSpec, resolve_labels
from converters.report import Report
from detaug.formats.images import ORIENTATIONS

__all__ = ["ConversionError", "ConversionResult", "convert", "convert_splits", "write_coco_json",
           "DIFFICULT_MODES", "ORIENTATIONS"]

Difficult = Literal["keep", "crowd", "drop"]
Orientation = Literal["auto", "apply", "ignore"]
DIFFICULT_MODES: tuple[str, ...] = ("keep", "crowd", "drop")

#: Below this many XML files the parsing runs in the calling process (workers=None).
PARALLEL_MIN_FILES = 2000
#: Above this many XML files a progress bar is shown (progress=None, stderr a terminal).
PROGRESS_MIN_FILES = 1000
_CHUNK = 256


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
            with _gc_paused():  # a million small containers, no cycles
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
    ``workers``: processes that parse XMLs (``None``: one per CPU for large datasets, else 1).
    ``progress``: a progress bar on stderr (``None``: when large and stderr is a terminal).

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
    """Convert several splits in one pass: each XML is parsed once, and every split gets the same
    categories. Arguments as for :func:`convert`; ``None`` in ``splits`` means every XML.
    Returns ``{split: result}`` in the order given."""
    _check_options(coords, difficult, orientation, workers, splits)
    layout = _Layout.resolve(voc_root, annotations_dir, images_dir)
    xml_names, duplicates, not_xml = _scan_annotations(layout.annotations)
    split_ids = {split: _read_split(layout, split) for split in splits if split is not None}
    discover = isinstance(labels, str) and labels == "discover"
    try:  # a bad labels file fails before the long part
        names = None if discover else resolve_labels(labels, ())
    except (ValueError, OSError) as err:
        raise ConversionError(str(err)) from None

    wanted: set[str] = set()
    if None in splits or discover:
        wanted.update(xml_names)
    for ids, _ in split_ids.values():
        wanted.update(i for i in ids if i in xml_names)
    options = FileOptions(str(layout.annotations), str(layout.images),
                          ImageIndex.scan(layout.images) if layout.images_exist else None,
                          coords, difficult, verify_images,
                          frozenset(names) if names is not None else None, orientation)
    with _gc_paused():
        files = _convert_files(sorted(wanted), xml_names, options, workers, progress)
        if names is None:
            names = resolve_labels("discover", (n for r in files.values() for n in r.names))

        results: dict[str | None, ConversionResult] = {}
        for split in splits:
            report = Report()
            if options.index is None:
                report.warn(R.ANNOTATION_ONLY, str(layout.images), "folder does not exist")
            for name in not_xml:
                report.ignore(R.NOT_XML_FILE, str(layout.annotations / name))
            if split is None:
                entries, split_file = sorted(xml_names), None
                for kept, dropped in duplicates:
                    report.images_total += 1
                    report.skip_image(R.DUPLICATE_ID, str(layout.annotations / dropped),
                                      f"same id as {kept}")
            else:
                entries, split_file = split_ids[split]
            images, annotations = _assemble(layout, entries, split_file, xml_names, files, names,
                                            report)
            report.categories = len(names)
            report.check()
            coco_json = coco_json_from_parts(images, annotations, make_categories(names))
            results[split] = ConversionResult(coco_json, layout.images, report, split)
        return results


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


# ---------------------------------------------------------------------------------------------
# The per-file step (in parallel for large datasets) and the assembly


_worker_options: FileOptions | None = None


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector: the conversion allocates millions of small tuples,
    strings and dicts and no reference cycles, and collections triggered by those allocations
    cost a fifth of the time for nothing (measured with converters.bench). Restored after."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _init_worker(options: FileOptions) -> None:
    # Ctrl-C goes to the whole process group: the main process handles it (and terminates the
    # pool); workers ignore it instead of printing one traceback each.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    gc.disable()  # see _gc_paused; the worker ends with the conversion
    global _worker_options
    _worker_options = options


def _convert_in_worker(xml_name: str) -> tuple[Any, ...]:
    assert _worker_options is not None
    return tuple(convert_file(xml_name, _worker_options))  # plain tuple: cheaper to pickle


def _convert_files(ids: list[str], xml_names: dict[str, str], options: FileOptions,
                   workers: int | None, progress: bool | None) -> dict[str, FileResult]:
    """Run :func:`converters.convert_file.convert_file` on every id, in worker processes when
    ``workers`` (or, for ``None``, the number of files) says so."""
    files = [xml_names[i] for i in ids]
    n_workers = workers if workers is not None else (
        min(os.cpu_count() or 1, 8) if len(files) >= PARALLEL_MIN_FILES else 1)
    show = progress if progress is not None else (
        len(files) >= PROGRESS_MIN_FILES and sys.stderr.isatty())
    if n_workers <= 1 or len(files) < 2:
        results = (convert_file(name, options) for name in files)
        return dict(zip(ids, _with_progress(results, len(files), show), strict=True))
    chunk = max(1, min(_CHUNK, len(files) // (n_workers * 4)))
    with multiprocessing.get_context().Pool(n_workers, _init_worker, (options,)) as pool:
        plain = pool.imap(_convert_in_worker, files, chunksize=chunk)
        return {i: FileResult._make(r)
                for i, r in zip(ids, _with_progress(plain, len(files), show), strict=True)}


def _with_progress(results: Iterable[Any], total: int, show: bool) -> Iterator[Any]:
    if not show:
        return iter(results)
    from tqdm import tqdm

    return iter(tqdm(results, total=total, desc="voc2coco", unit="xml", file=sys.stderr))


def _assemble(layout: _Layout, entries: list[str], split_file: str | None,
              xml_names: dict[str, str], files: dict[str, FileResult], names: list[str],
              report: Report) -> tuple[list[str], list[str]]:
    """The JSON texts of the COCO images (one each) and annotations (one text per file, its
    annotations joined by commas) of ``entries``, in order, with ids from 1; every skip and
    warning goes to ``report``."""
    category_ids = {name: i for i, name in enumerate(names, 1)}
    annotations_dir = str(layout.annotations)
    # An image file found by id belongs to that id: a <filename> fallback may not take it.
    owner = {files[i].image[0]: i for i in entries
             if i in files and files[i].found_by == "id" and files[i].image is not None}
    images: list[str] = []
    annotations: list[str] = []
    report.images_total += len(entries)
    for voc_id in entries:
        if voc_id not in xml_names:
            report.skip_image(R.NO_XML_FOR_SPLIT_ENTRY, str(split_file),
                              f"{voc_id}: no {layout.annotations / (voc_id + '.xml')}")
            continue
        result = files[voc_id]
        error, image = result.error, result.image
        if error is None and result.found_by == "filename":
            assert image is not None
            claimed_by = owner.setdefault(image[0], voc_id)
            if claimed_by != voc_id:
                error = (R.IMAGE_FILE_TAKEN, f"no {voc_id}.<image extension>; <filename> "
                         f"{image[0]} is the image of {claimed_by}")
        if error is not None or result.events:  # messages name the file
            path = os.path.join(annotations_dir, xml_names[voc_id])
        if error is not None:  # its warnings still tell; its objects and EXIF frame do not
            for kind, reason, detail in result.events:
                if kind == "warning":
                    report.warn(reason, path, detail)
            report.skip_image(error[0], path, error[1], objects=result.n_objects)
            continue
        assert image is not None
        image_id = len(images) + 1
        images.append(f'{{"id":{image_id},{image[3]}')
        report.images_converted += 1
        report.objects_total += result.n_objects
        for kind, reason, detail in result.events:
            if kind == "object":
                report.skip_object(reason, path, detail)
            elif kind == "exif":
                report.note_exif(reason, path, detail)
            else:
                report.warn(reason, path, detail)
        names_in_file, template = result.annotations
        if names_in_file:
            first = report.objects_converted + 1
            ids: list[int] = []
            for k, name in enumerate(names_in_file):
                ids += (first + k, image_id, category_ids[name])
            annotations.append(template % tuple(ids))
            report.objects_converted += len(names_in_file)
    return images, annotations


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
