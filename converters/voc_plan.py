"""A VOC conversion's run (:class:`_Plan`): the checked inputs of :mod:`converters.voc_inputs`,
then every split's XMLs converted in worker processes (:mod:`converters.runner`), assembled in
split order (:func:`converters.assemble.assemble_split`) into a sink, with the report of each
split and the category names (discovered: from every XML of the folder, sorted).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from os import PathLike
from typing import Any

from converters import report as R
from converters.assemble import assemble_split
from converters.convert_file import FileOptions, FileResult, convert_file
from converters.images import ImageIndex
from converters.labels import LabelsSpec, resolve_labels
from converters.progress import Progress
from converters.report import Report
from converters.runner import Runner, default_workers, gc_paused
from converters.voc_inputs import (
    ConversionError,
    _check_options,
    _Layout,
    _read_split,
    _scan_annotations,
)

__all__ = ["PROGRESS_MIN_FILES"]

#: From this many XML files on a progress bar is shown (progress=None, stderr a terminal).
PROGRESS_MIN_FILES = 1000


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
