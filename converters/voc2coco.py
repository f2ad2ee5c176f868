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

Modules: :mod:`converters.voc_inputs` checks the options and finds the folders and splits,
:mod:`converters.voc_plan` runs a conversion, :mod:`converters.voc_boxes` reads a split into
arrays (:func:`read_voc_boxes`); their public names are importable from here too.

``converters.voc2coco`` is this module, and calling the module calls :func:`convert`.
"""

from __future__ import annotations

import functools
import json
import sys
import types
from collections.abc import Callable, Mapping, Sequence
from os import PathLike
from pathlib import Path
from typing import Any

from converters.boxes import Coords
from converters.atomic_output import AtomicOutput, signals_abort_writes, write_bytes_atomic
from converters.coco import CocoStreamWriter, dumps_coco, write_coco_json
from converters.convert_file import FileResult
from converters.labels import LabelsSpec
from converters.report import Report
from converters.runner import PARALLEL_MIN_FILES, gc_paused
from converters.voc_boxes import (  # noqa: F401 - BOX_REPAIRS: importable from here
    BOX_REPAIRS, VocBoxes, VocImageBoxes, read_voc_boxes,
)
from converters.voc_inputs import DIFFICULT_MODES, ConversionError, Difficult, Orientation
from converters.voc_plan import PROGRESS_MIN_FILES, _Plan  # noqa: F401 - importable from here
from detaug.formats.orientation import ORIENTATIONS

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
    reports = _write_documents(plan, writers, progress)
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

    Every output is written atomically (:class:`converters.atomic_output.AtomicOutput`): a temporary
    file beside it, renamed into place only when every split is converted and
    ``before_commit(reports)`` (when given) returns true; otherwise, and on any error, Ctrl-C
    or SIGTERM (caught from the start of the conversion), no output is touched and the
    temporary files are removed. ``on_commit(split, path)`` is called before each rename,
    ``on_stale(temp_file)`` for each temporary file of a killed run removed
    (:func:`converters.atomic_output.remove_stale_temp_files`).
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
            reports = _write_documents(plan, writers, progress)
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



def _write_documents(plan: _Plan, writers: Mapping[str | None, CocoStreamWriter],
                     progress: bool | None) -> dict[str | None, Report]:
    """Run ``plan`` into ``writers`` (one COCO document a split: each image's record and its
    annotations as its XML is converted), then finish every document with the categories the
    conversion found. Returns ``{split: report}``."""
    reports, names = plan.run({s: _JsonSink(w) for s, w in writers.items()}, progress)
    for writer in writers.values():
        writer.finish(names)
    return reports


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


class _CallableModule(types.ModuleType):
    """Lets ``from converters import voc2coco; voc2coco(root, ...)`` call :func:`convert`."""

    def __call__(self, *args: Any, **kwargs: Any) -> ConversionResult:
        return convert(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
