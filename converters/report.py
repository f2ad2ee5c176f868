"""What a conversion did: counts by reason, one message per event, and the closing summary.

Four kinds of event, each counted by reason and each with a message naming the file:

* a **skipped image** (an XML file, or a split entry, that gives no COCO image);
* a **skipped object** (an ``<object>`` that gives no COCO annotation);
* a **warning**: the data was used, but something was changed or looked wrong
  (a box clipped to the image, a ``<filename>`` that disagrees, a size read from the image);
* an **EXIF** note: a converted image with an EXIF orientation other than 1, counted by the
  frame its boxes were taken in and why (:func:`detaug.formats.images.explain_frame`).

Files in ``Annotations/`` that are not ``.xml`` are counted as *ignored*, apart from the XML files.

The accounting invariants, checked by the tests on every real data set::

    images_total  == images_converted  + sum(images_skipped.values())
    objects_total == objects_converted + sum(objects_skipped.values())

Objects inside an XML that could not be parsed cannot be counted; they are not in ``objects_total``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

# Reasons for skipping an image (an XML file or a split entry).
MALFORMED_XML = "malformed XML"
NOT_VOC = "not a VOC annotation"
UNREADABLE_FILE = "file unreadable"
NO_XML_FOR_SPLIT_ENTRY = "listed in split, no XML"
DUPLICATE_ID = "duplicate image id"
IMAGE_NOT_FOUND = "image file not found"
IMAGE_SIZE_UNKNOWN = "image size unknown"
IMAGE_FILE_TAKEN = "image file belongs to another id"
# An image file with a problem is skipped with the problem as its reason, the text the loader
# uses too (detaug.formats.images: "empty file", "truncated JPEG (no end-of-image marker)",
# "GIF: not a format DALI decodes", "too large (...)", "cannot read: ...", ...): always when
# the header gives no size, else with --verify-images (without it: IMAGE_PROBLEM_KEPT).

# Reasons for skipping an object.
OBJECT_OF_SKIPPED_IMAGE = "image skipped"
NO_NAME = "object without <name>"
NO_BNDBOX = "object without <bndbox>"
BAD_COORDINATE = "bad coordinate"
ZERO_SIZE_BOX = "zero-size box"
BOX_OUTSIDE_IMAGE = "box outside the image"
UNKNOWN_LABEL = "label not in the labels list"
DIFFICULT_DROPPED = "difficult (--difficult drop)"

# Warnings: the data was used, with this caveat.
BOX_CLIPPED = "box clipped to the image"
FILENAME_MISMATCH = "<filename> disagrees with the image file"
SIZE_FROM_IMAGE = "size read from the image header"
SIZE_MISMATCH = "<size> disagrees with the image header"
DEPTH_MISMATCH = "<depth> disagrees with the image"
NON_INTEGER_VOC_COORDS = "non-integer coordinates under --coords voc"
BAD_ATTRIBUTE = "unreadable attribute value"
SPLIT_DUPLICATE_ENTRY = "id listed twice in split"
ANNOTATION_ONLY = "no images folder: sizes from <size>"
SEVERAL_IMAGE_FILES = "several image files for one id"
IMAGE_PROBLEM_KEPT = "image the loader will skip (kept: no --verify-images)"

# Files in Annotations/ that are not XML files.
NOT_XML_FILE = "not an .xml file"

Kind = Literal["image", "object", "warning", "ignored", "exif"]

_LABELS = {"image": "skipped image", "object": "skipped object", "warning": "warning",
           "ignored": "ignored", "exif": "EXIF orientation"}


@dataclass(frozen=True, slots=True)
class Message:
    """One event: its kind, reason, the file it concerns and what exactly happened."""

    kind: Kind
    reason: str
    path: str
    detail: str

    def __str__(self) -> str:
        label = _LABELS[self.kind]
        return f"{self.path}: {label}: {self.reason}" + (f" ({self.detail})" if self.detail else "")


@dataclass
class Report:
    """Counts and messages of one conversion. See the module docstring for the invariants."""

    images_total: int = 0
    images_converted: int = 0
    objects_total: int = 0
    objects_converted: int = 0
    categories: int = 0
    images_skipped: Counter[str] = field(default_factory=Counter)
    objects_skipped: Counter[str] = field(default_factory=Counter)
    warnings: Counter[str] = field(default_factory=Counter)
    ignored: Counter[str] = field(default_factory=Counter)
    exif: Counter[str] = field(default_factory=Counter)
    messages: list[Message] = field(default_factory=list)

    # -- recording -------------------------------------------------------------------------
    def skip_image(self, reason: str, path: str, detail: str = "", objects: int = 0) -> None:
        """Record an image (XML file or split entry) that gives no COCO image.

        ``objects`` is the number of ``<object>`` elements it held; they are counted as
        skipped objects with reason :data:`OBJECT_OF_SKIPPED_IMAGE`.
        """
        self.images_skipped[reason] += 1
        self.messages.append(Message("image", reason, path, detail))
        if objects:
            self.objects_total += objects
            self.objects_skipped[OBJECT_OF_SKIPPED_IMAGE] += objects

    def skip_object(self, reason: str, path: str, detail: str = "") -> None:
        """Record an object that gives no COCO annotation (``objects_total`` is counted apart)."""
        self.objects_skipped[reason] += 1
        self.messages.append(Message("object", reason, path, detail))

    def warn(self, reason: str, path: str, detail: str = "") -> None:
        """Record something used with a caveat."""
        self.warnings[reason] += 1
        self.messages.append(Message("warning", reason, path, detail))

    def ignore(self, reason: str, path: str, detail: str = "") -> None:
        """Record a file in the annotations folder that is not an annotation file."""
        self.ignored[reason] += 1
        self.messages.append(Message("ignored", reason, path, detail))

    def note_exif(self, reason: str, path: str, detail: str = "") -> None:
        """Record a converted image with an EXIF orientation; ``reason`` names the frame its
        boxes were taken in and why."""
        self.exif[reason] += 1
        self.messages.append(Message("exif", reason, path, detail))

    # -- reading ---------------------------------------------------------------------------
    @property
    def exif_total(self) -> int:
        """Converted images with an EXIF orientation other than 1."""
        return sum(self.exif.values())

    @property
    def skipped_total(self) -> int:
        """Skipped images plus skipped objects (objects of skipped images included)."""
        return sum(self.images_skipped.values()) + sum(self.objects_skipped.values())

    def messages_of(self, kind: Kind | None = None, reason: str | None = None) -> list[Message]:
        """The messages of one kind and/or one reason, in the order they were recorded."""
        return [m for m in self.messages
                if (kind is None or m.kind == kind) and (reason is None or m.reason == reason)]

    def summary(self) -> str:
        """A few lines: images, annotations, categories, EXIF-oriented images, and every skip,
        warning and EXIF frame by reason."""
        lines = [
            f"images:      {self.images_converted} converted, "
            f"{sum(self.images_skipped.values())} skipped, of {self.images_total}",
            f"annotations: {self.objects_converted} converted, "
            f"{sum(self.objects_skipped.values())} skipped, of {self.objects_total} objects",
            f"categories:  {self.categories}",
        ]
        if self.exif:
            n = self.exif_total
            lines.append(f"EXIF:        {n} image{'s' if n != 1 else ''} with an EXIF "
                         "orientation")
        for title, counter in (("EXIF-oriented images: frame of the boxes and of the COCO "
                                "width/height", self.exif),
                               ("skipped images", self.images_skipped),
                               ("skipped objects", self.objects_skipped),
                               ("warnings", self.warnings),
                               ("ignored files", self.ignored)):
            if counter:
                lines.append(f"{title}:")
                lines.extend(f"  {n:>6}  {reason}" for reason, n in sorted(
                    counter.items(), key=lambda item: (-item[1], item[0])))
        return "\n".join(lines)

    def details(self, per_reason: int | None = 5) -> str:
        """The messages, at most ``per_reason`` of each (kind, reason), with a count of the rest."""
        shown: Counter[tuple[str, str]] = Counter()
        lines: list[str] = []
        for message in self.messages:
            key = (message.kind, message.reason)
            shown[key] += 1
            if per_reason is None or shown[key] <= per_reason:
                lines.append(str(message))
        if per_reason is not None:
            for (kind, reason), n in shown.items():
                if n > per_reason:
                    lines.append(f"... and {n - per_reason} more '{reason}' ({kind}); "
                                 "--verbose lists all")
        return "\n".join(lines)

    def check(self) -> None:
        """Raise ``RuntimeError`` if the counts do not add up (a bug, never a data problem)."""
        images = self.images_converted + sum(self.images_skipped.values())
        objects = self.objects_converted + sum(self.objects_skipped.values())
        if images != self.images_total or objects != self.objects_total:
            raise RuntimeError(f"report does not add up: images {images} != {self.images_total} "
                               f"or objects {objects} != {self.objects_total}")
