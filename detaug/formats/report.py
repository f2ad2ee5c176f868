"""The :class:`Report` of what a source's checks found (each a :class:`Finding`) and the reasons.

Every reason a check reports is a constant here, with its kind in :data:`RULES`: an **error**
(nothing is built: :meth:`Report.raise_errors` raises one :class:`~detaug.errors.DatasetError`
naming the file and the image or annotation id, and listing every problem by reason), a
**repair** (counted, said once with a :class:`~detaug.errors.DataWarning` by
:meth:`Report.finish`) or a **note** (counted, no warning). What each reason checks is the table
of :mod:`detaug.formats.validation`.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal

from detaug.errors import DatasetError, DataWarning

__all__ = [
    "MAX_EXAMPLES",
    "RULES",
    "Finding",
    "Kind",
    "Report",
]

#: Examples kept per reason (the counts are complete).
MAX_EXAMPLES = 3

Kind = Literal["error", "repair", "note"]

NOT_JSON = "not valid JSON"
NOT_COCO = "not a COCO detection file"
NO_IMAGES = "no images"
MALFORMED_IMAGE = "malformed image entry"
BAD_IMAGE_ID = "image id not an int64 integer"
BAD_SIZE = "invalid image size"
DUPLICATE_IMAGE_ID = "duplicate image id"
DUPLICATE_FILE = "duplicate file name"
PATH_OUTSIDE = "path outside the dataset folder"
MALFORMED_CATEGORY = "malformed category"
DUPLICATE_CATEGORY = "duplicate category id"
MALFORMED_ANNOTATION = "malformed annotation"
UNKNOWN_IMAGE = "annotation of an unknown image"
NO_BOX = "annotation without a box"
MALFORMED_BOX = "malformed box"
NON_FINITE = "non-finite coordinate"
UNKNOWN_CATEGORY = "unknown category id"
LABEL_RANGE = "label does not fit int32"
NEGATIVE_LABEL = "negative label"
MALFORMED_LABEL = "malformed label"
EMPTY_BOX = "empty box dropped"
BOX_CLIPPED = "box clipped to the image"
BOX_OUTSIDE = "box outside the image dropped"
SIZE_NOT_DECLARED = "image size not declared"
CROWD_LEFT_OUT = "crowd box left out"
EMPTY_IMAGE_LEFT_OUT = "image without boxes left out"
IDS_ASSIGNED = "image ids assigned 1..n"
IMAGE_WITHOUT_LABELS = "image without a label file"
LABELS_WITHOUT_IMAGE = "label file without an image"
BOXES_NOT_PLACED = "boxes of an unreadable image left out"

#: Every reason and its kind (the table of :mod:`detaug.formats.validation`'s docstring, in its order).
RULES: dict[str, Kind] = {
    **dict.fromkeys([NOT_JSON, NOT_COCO, NO_IMAGES, MALFORMED_IMAGE, BAD_IMAGE_ID, BAD_SIZE,
                     DUPLICATE_IMAGE_ID, DUPLICATE_FILE, PATH_OUTSIDE, MALFORMED_CATEGORY, DUPLICATE_CATEGORY,
                     MALFORMED_ANNOTATION, UNKNOWN_IMAGE, NO_BOX, MALFORMED_BOX, NON_FINITE,
                     UNKNOWN_CATEGORY, LABEL_RANGE, NEGATIVE_LABEL, MALFORMED_LABEL], "error"),
    **dict.fromkeys([EMPTY_BOX, BOX_CLIPPED, BOX_OUTSIDE], "repair"),
    **dict.fromkeys([SIZE_NOT_DECLARED, CROWD_LEFT_OUT, EMPTY_IMAGE_LEFT_OUT, IDS_ASSIGNED, IMAGE_WITHOUT_LABELS,
                     LABELS_WITHOUT_IMAGE, BOXES_NOT_PLACED], "note"),
}


@dataclass(frozen=True)
class Finding:
    """One finding: its reason, the file and the image / annotation it concerns, and what exactly.

    ``annotation`` is an annotation id (int, shown as ``annotation_id N``) or a position such as
    ``"annotations[5]"`` or ``"box 2"`` (shown as is).
    """

    reason: str
    file: str
    image_id: int | None = None
    annotation: int | str | None = None
    detail: str = ""

    @property
    def location(self) -> str:
        """``FILE (image_id I, annotation_id A)``."""
        ids = []
        if self.image_id is not None:
            ids.append(f"image_id {self.image_id}")
        if isinstance(self.annotation, int):
            ids.append(f"annotation_id {self.annotation}")
        elif self.annotation is not None:
            ids.append(str(self.annotation))
        return f"{self.file} ({', '.join(ids)})" if ids else self.file

    def __str__(self) -> str:
        return f"{self.location}: {self.reason}" + (f": {self.detail}" if self.detail else "")

    def brief(self) -> str:
        """Without the reason (listed under it)."""
        return self.location + (f": {self.detail}" if self.detail else "")


class Report:
    """What the checks of one source found: counts by reason, a few examples of each.

    Attributes:
        source: what was checked (the annotation file, or ``"sample list"``).
        images, boxes: images and boxes kept.
        counts: findings by reason (kinds in :data:`RULES`).
        examples: up to :data:`MAX_EXAMPLES` :class:`Finding` per reason.
        conversion: the converter's report when the data came through ``voc2coco`` (VocSource).
    """

    def __init__(self, source: str = "") -> None:
        self.source = source
        self.images = 0
        self.boxes = 0
        self.counts: Counter[str] = Counter()
        self.examples: dict[str, list[Finding]] = {}
        self.conversion: Any = None
        self._first_error: Finding | None = None

    # -- recording -------------------------------------------------------------------------
    def add(self, reason: str, file: str, *, image_id: int | None = None,
            annotation: int | str | None = None, detail: str = "") -> None:
        """Count one finding of ``reason`` (a key of :data:`RULES`)."""
        if reason not in RULES:
            raise KeyError(f"unknown reason {reason!r}")
        self.counts[reason] += 1
        shown = self.examples.setdefault(reason, [])
        if len(shown) < MAX_EXAMPLES or (RULES[reason] == "error" and self._first_error is None):
            finding = Finding(reason, file, image_id, annotation, detail)
            if len(shown) < MAX_EXAMPLES:
                shown.append(finding)
            if RULES[reason] == "error" and self._first_error is None:
                self._first_error = finding

    # -- reading ---------------------------------------------------------------------------
    def _of(self, kind: Kind) -> dict[str, int]:
        return {r: n for r, n in self.counts.items() if RULES[r] == kind}

    @property
    def errors(self) -> dict[str, int]:
        """Error counts by reason (a built source has none)."""
        return self._of("error")

    @property
    def repairs(self) -> dict[str, int]:
        """Repair counts by reason."""
        return self._of("repair")

    @property
    def notes(self) -> dict[str, int]:
        """Note counts by reason."""
        return self._of("note")

    @property
    def total(self) -> int:
        """All findings: errors, repairs and notes."""
        return sum(self.counts.values())

    def summary(self) -> str:
        """A few lines: what was kept, then each kind's counts by reason with examples."""
        lines = []
        if self.conversion is not None:
            lines.append("conversion:")
            lines.extend("  " + line for line in self.conversion.summary().splitlines())
        lines.append(f"{self.source or 'source'}: {self.images} images, {self.boxes} boxes kept")
        if not self.counts:
            lines.append("checks: nothing to repair")
        for kind, title in (("error", "errors"), ("repair", "repaired"), ("note", "notes")):
            counts = self._of(kind)  # type: ignore[arg-type]
            if not counts:
                continue
            lines.append(f"{title}:")
            for reason, n in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
                lines.append(f"  {n:>6}  {reason}")
                lines.extend(f"          e.g. {f.brief()}" for f in self.examples.get(reason, []))
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: ``source``, ``images``, ``boxes``, ``total``, ``errors``/``repairs``/``notes``
        (counts by reason), ``examples`` (strings by reason) and ``conversion`` (the converter's
        counts, or ``None``)."""
        conversion = None
        if self.conversion is not None:
            c = self.conversion
            conversion = {key: (dict(value) if isinstance(value, Counter) else value)
                          for key, value in vars(c).items() if key != "messages"}
        return {
            "source": self.source, "images": self.images, "boxes": self.boxes, "total": self.total,
            "errors": self.errors, "repairs": self.repairs, "notes": self.notes,
            "examples": {r: [str(f) for f in fs] for r, fs in self.examples.items()},
            "conversion": conversion,
        }

    def __repr__(self) -> str:
        return (f"Report(source={self.source!r}, images={self.images}, boxes={self.boxes}, "
                f"counts={dict(self.counts)})")

    # -- closing ---------------------------------------------------------------------------
    def raise_errors(self) -> None:
        """Raise :class:`DatasetError` if anything was an error: the first error on the first
        line, then every error reason with its count and examples (``err.report`` is this)."""
        errors = self.errors
        if not errors:
            return
        n = sum(errors.values())
        lines = [str(self._first_error)]
        if n > 1:
            lines.append(f"{n} problems in {self.source or 'the source'} that detaug does not repair:")
            for reason, count in sorted(errors.items(), key=lambda item: (-item[1], item[0])):
                lines.append(f"  {count:>6}  {reason}")
                lines.extend(f"          e.g. {f.brief()}" for f in self.examples.get(reason, []))
        err = DatasetError("\n".join(lines))
        err.report = self  # type: ignore[attr-defined]
        raise err

    def finish(self) -> None:
        """:meth:`raise_errors`, then one :class:`DataWarning` if anything was repaired."""
        self.raise_errors()
        repairs = self.repairs
        if repairs:
            what = ", ".join(f"{n} {r}" for r, n in sorted(repairs.items()))
            warnings.warn(f"{self.source or 'source'}: {what} (source.report.summary() has examples)",
                          DataWarning, stacklevel=_caller_level())


def _caller_level() -> int:
    """``stacklevel`` of the first frame outside detaug (the user's call that built the source)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frame, level = sys._getframe(2), 2
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package + os.sep):
        frame, level = frame.f_back, level + 1
    return level

