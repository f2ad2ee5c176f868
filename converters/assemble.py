"""One split, file by file: the per-file results in split order -> image ids, the report, and a
sink that writes (or keeps) each converted image as it comes.

What needs more than one file is decided here (the per-file step is
:mod:`converters.convert_file`):

* image ids ``1, 2, ...`` in split order over the converted images; annotation ids likewise
  (the sink counts them);
* an entry of the split file without an XML is skipped (``listed in split, no XML``);
* an image file found by its id belongs to that id: an XML whose image was found only through
  its ``<filename>`` may not take it (``image file belongs to another id``), nor a file already
  taken by an earlier ``<filename>`` fallback. The owner of a file ``F`` can only be the id
  ``stem(F)``; when that id is in the split its result is computed again here (a pure function
  of the file; such fallbacks are rare), so nothing per file has to be kept;
* the events of a file become report messages naming the XML.

Nothing is held per converted file: memory is the sink's (a file writer: bounded).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from converters import report as R
from converters.convert_file import FileResult
from converters.report import Report


class Sink(Protocol):
    """Receives the converted images of a split, in order: ``add(image_id, result)`` where
    ``result.image`` is not ``None``. A sink that has a ``keep(result)`` method also receives,
    in the same order, the images skipped for their file but kept for the loader
    (``FileOptions.keep_unreadable``: ``result.error`` and ``result.image`` both set); they
    take no image id."""

    def add(self, image_id: int, result: FileResult) -> None: ...


def assemble_split(entries: Sequence[str], results: Iterator[FileResult], *,
                   xml_names: dict[str, str], annotations_dir: str, split_file: str | None,
                   result_of: Callable[[str], FileResult], report: Report, sink: Sink) -> None:
    """Feed ``sink`` the converted images of ``entries`` (VOC ids in split order) and record
    everything in ``report``.

    ``results`` yields the :class:`FileResult` of each entry that has an XML
    (``xml_names[id]``), in the order of ``entries``. ``result_of(id)`` computes the result of
    any id with an XML (used for the owner of a ``<filename>`` fallback only).
    """
    in_split: set[str] | None = None  # made at the first <filename> fallback (rare)
    claimed: dict[str, str] = {}  # image file -> the fallback id that took it (rare)
    owners: dict[str, FileResult] = {}  # results computed again for the owner check (rare)
    report.images_total += len(entries)
    for voc_id in entries:
        xml_name = xml_names.get(voc_id)
        if xml_name is None:
            report.skip_image(R.NO_XML_FOR_SPLIT_ENTRY, str(split_file),
                              f"{voc_id}: no {os.path.join(annotations_dir, voc_id + '.xml')}")
            continue
        result = next(results)
        error, image = result.error, result.image
        if error is None and result.found_by == "filename":
            assert image is not None
            if in_split is None:
                in_split = set(entries)
            taken_by = _owner(image[0], voc_id, in_split, xml_names, owners, result_of)
            if taken_by is None:
                taken_by = claimed.setdefault(image[0], voc_id)
            if taken_by != voc_id:
                error = (R.IMAGE_FILE_TAKEN, f"no {voc_id}.<image extension>; <filename> "
                         f"{image[0]} is the image of {taken_by}")
        if error is not None or result.events:  # messages name the file
            path = os.path.join(annotations_dir, xml_name)
        if error is not None:  # its warnings still tell; its objects and EXIF frame do not
            for kind, reason, detail in result.events:
                if kind == "warning":
                    report.warn(reason, path, detail)
            report.skip_image(error[0], path, error[1], objects=result.n_objects)
            if result.error is not None and result.image is not None and hasattr(sink, "keep"):
                sink.keep(result)  # kept for the loader (FileOptions.keep_unreadable)
            continue
        report.images_converted += 1
        report.objects_total += result.n_objects
        for kind, reason, detail in result.events:
            if kind == "object":
                report.skip_object(reason, path, detail)
            elif kind == "exif":
                report.note_exif(reason, path, detail)
            else:
                report.warn(reason, path, detail)
        sink.add(report.images_converted, result)
        report.objects_converted += len(result.annotations[0])


def _owner(file_name: str, voc_id: str, in_split: set[str], xml_names: dict[str, str],
           owners: dict[str, FileResult], result_of: Callable[[str], FileResult]) -> str | None:
    """The id whose image ``file_name`` is (found by that id), if it is in the split."""
    stem = os.path.splitext(file_name)[0]
    if stem == voc_id or stem not in in_split or stem not in xml_names:
        return None
    if stem not in owners:
        owners[stem] = result_of(stem)
    other = owners[stem]
    if other.found_by == "id" and other.image is not None and other.image[0] == file_name:
        return stem
    return None
