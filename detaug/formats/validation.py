"""The checks every source runs once, when it is built, and the :class:`Report` of what they found.

One module for every source (:class:`~detaug.sources.SampleListSource`,
:class:`~detaug.sources.CocoSource`, :class:`~detaug.sources.VocSource` through the converter's
output) so that one dataset gives the same samples whichever way it is read. Each finding is
either an **error** (nothing is built: :class:`~detaug.errors.DatasetError`, whose message names
the file and the image or annotation id, and lists every problem by reason), a **repair** (the
box is changed or dropped, counted in ``source.report`` and said once with a
:class:`~detaug.errors.DataWarning`) or a **note** (an option or a documented default did
something; counted, no warning). Nothing is changed silently.

Boxes are absolute ``xyxy`` in continuous pixel coordinates (pixel ``i`` spans ``[i, i + 1)``),
checked in float32, the dtype they are kept in. "The image" is the declared size (COCO
``width``/``height``, VOC ``<size>``, ``Sample.size``; for a decoded array, its shape): the frame
the boxes are annotated in. Encoded samples without a declared size are not checked against an
image size here (planning clips to the decoded image).

=====================================  ======  ===========================================================
reason                                 kind    what is checked, and what happens
=====================================  ======  ===========================================================
not valid JSON                         error   the annotation file does not parse (message: line, column)
not a COCO detection file              error   top level not an object; ``images`` missing or not a list;
                                               ``annotations``/``categories`` not lists; annotations
                                               without ``categories``
no images                              error   nothing to read (empty list, or all left out)
malformed image entry                  error   not an object; ``file_name`` missing, empty or not a
                                               string; ``exif_orientation`` not 1..8; a sample whose
                                               image is an array that is not uint8 ``[H, W, 3]``/``[H, W]``
                                               (or 1-D uint8 encoded bytes); decoded and encoded mixed
image id not an int64 integer          error   missing, a string, a bool, fractional, or beyond int64
invalid image size                     error   declared width/height not a positive integer <= 2**31-1
                                               (zero, negative, NaN, inf, string, only one of the two), or
                                               a declared size that differs from a decoded array's shape
duplicate image id                     error   two images with one id
duplicate file name                    error   two images with one file (``file_name``, or sample path,
                                               compared after ``os.path.normpath``)
path outside the dataset folder        error   a path the dataset names (COCO ``file_name``, a shard
                                               folder's tar and index files) is absolute, leaves its
                                               folder with ``..`` (after ``os.path.normpath``) or holds
                                               a NUL byte (:func:`path_problem`); accepted with
                                               ``allow_paths_outside=True`` (docs/security.md)
malformed category                     error   not an object; ``id`` not an integer; ``name`` not a string
duplicate category id                  error   two categories with one id
malformed annotation                   error   not an object; ``id`` / ``image_id`` / ``category_id`` not
                                               integers; ``iscrowd`` not 0/1/true/false
annotation of an unknown image         error   ``image_id`` names no image
annotation without a box               error   no ``bbox`` (or ``null``)
malformed box                          error   ``bbox`` not 4 numbers; sample boxes not ``[N, 4]``
                                               numbers; as many boxes as labels
non-finite coordinate                  error   NaN, +-inf, or beyond float32 (also ``x + w``)
unknown category id                    error   a category id / label not among the categories (when the
                                               source has categories)
label does not fit int32               error   category id or label > 2**31 - 1 (Keras targets are int32)
negative label                         error   category id or label < 0 (Keras targets pad with -1)
malformed label                        error   labels not integers (strings, bools, fractions, NaN)
empty box dropped                      repair  width or height <= 0 (COCO ``w``/``h`` <= 0, or
                                               ``x2 <= x1``/``y2 <= y1``): the box and its label dropped
box clipped to the image               repair  part of the box outside ``[0, w] x [0, h]``: clipped
box outside the image dropped          repair  no area inside the image: the box and its label dropped
image size not declared                note    COCO image without ``width``/``height``: its boxes are not
                                               checked against the image here
crowd box left out                     note    ``iscrowd=1`` with ``include_iscrowd=False``
image without boxes left out           note    with ``skip_empty=True``
image ids assigned 1..n                note    every sample's ``image_id`` was 0: ids are positions + 1
image without a label file             note    YOLO: no label file for an image: it has no boxes
label file without an image            note    YOLO: a label file no image has: left out
boxes of an unreadable image left out  note    YOLO: the image's header gives no size, so its boxes
                                               (fractions of it) cannot be placed: left out (the
                                               loaders skip the image itself, naming it)
=====================================  ======  ===========================================================

Python objects of the wrong kind handed to a source's constructor raise ``TypeError`` naming the
sample's index and what it got; everything about the values raises ``DatasetError``. The type
rules (:func:`sample_fields`, :func:`image_input`):

* a sample is a :class:`~detaug.sources.Sample`, a mapping with its field names (``image``,
  ``boxes``, ``labels``, ``image_id``, ``size``; ``image`` required), or a tuple (or list)
  ``(image, boxes, labels)`` or ``(image, boxes, labels, image_id)``;
* an image is a file path (``str``/``os.PathLike``); encoded bytes (``bytes``, ``bytearray``,
  ``memoryview``, a 1-D uint8 NumPy array or torch tensor, e.g. ``torchvision.io.read_file``'s);
  a decoded NumPy array ``[H, W, 3]`` or ``[H, W]``; a PIL image (its pixels as PIL holds them,
  EXIF orientation not applied: ``ImageOps.exif_transpose`` first for boxes in the displayed
  frame; converted to RGB, ``"L"`` kept grayscale); or a torch tensor ``[3, H, W]`` / ``[1, H, W]``
  (CHW, torch's convention, also where ``W`` is 3), ``[H, W, 3]`` or ``[H, W]``, on any device.
  Decoded images must be uint8 (a value rule: "malformed image entry").
"""

from __future__ import annotations

import math
import os
import sys
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from detaug.errors import DatasetError, DataWarning

__all__ = [
    "IMAGE_TYPES",
    "INT32_MAX",
    "INT64_MAX",
    "INT64_MIN",
    "MAX_EXAMPLES",
    "RULES",
    "SAMPLE_FIELDS",
    "Finding",
    "Report",
    "as_coordinate",
    "as_int",
    "check_boxes",
    "check_columns",
    "check_size",
    "describe_type",
    "file_key",
    "image_input",
    "label_problem",
    "outside_paths",
    "path_problem",
    "sample_fields",
]

INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
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

#: Every reason and its kind (the module docstring's table, in its order).
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


# -- value rules (one place each) ------------------------------------------------------------------

def as_int(value: Any) -> int | None:
    """The integer ``value`` stands for (a Python or NumPy integer, or an integral finite float),
    or ``None`` (bools, strings, fractions, NaN, anything else)."""
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)) and math.isfinite(value) and float(value).is_integer():
        return int(value)
    return None


def as_coordinate(value: Any) -> float | None:
    """A box coordinate as a float (``inf`` for integers beyond float range), or ``None`` when
    ``value`` is not a real number (bools and strings are not)."""
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, (int, np.integer)):
        try:
            return float(value)
        except OverflowError:
            return math.inf if value > 0 else -math.inf
    if isinstance(value, (float, np.floating)):
        return float(value)
    return None


def check_size(height: Any, width: Any) -> tuple[tuple[int, int] | None, str]:
    """``((h, w), "")`` for a valid declared size (positive integers <= 2**31 - 1), else
    ``(None, why)``."""
    h, w = as_int(height), as_int(width)
    if h is None or w is None or not (0 < h <= INT32_MAX and 0 < w <= INT32_MAX):
        return None, f"height {height!r:.40}, width {width!r:.40}: not positive integers <= 2**31-1"
    return (h, w), ""


def label_problem(label: int) -> str | None:
    """The error reason for a category id / label that detaug cannot carry, or ``None``."""
    if label < 0:
        return NEGATIVE_LABEL
    if label > INT32_MAX:
        return LABEL_RANGE
    return None


# -- type rules of sample lists (what Python objects a SampleListSource takes) ---------------------

#: The fields of a sample (:class:`~detaug.sources.Sample`), in a tuple sample's order.
SAMPLE_FIELDS = ("image", "boxes", "labels", "image_id", "size")
IMAGE_TYPES = ("a file path, encoded bytes (bytes, bytearray, memoryview, 1-D uint8 array or tensor), "
               "a decoded uint8 NumPy array [H, W, 3] / [H, W], a PIL image, or a uint8 torch tensor "
               "[3, H, W] / [H, W, 3] / [H, W]")


def describe_type(value: Any) -> str:
    """A short description of ``value`` for a ``TypeError``: its type (and shape, length)."""
    kind = type(value)
    name = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"{name} of shape {tuple(shape)}"
    if isinstance(value, (tuple, list)):
        return f"a {name} of {len(value)} items"
    return name


def sample_fields(sample: Any, index: int) -> dict[str, Any]:
    """The fields (:data:`SAMPLE_FIELDS`) of sample ``index`` given as a mapping or as a tuple /
    list ``(image, boxes, labels[, image_id])``; a :class:`~detaug.sources.Sample` is handled by
    the caller. ``TypeError`` naming the index and what it got for anything else, a mapping with
    unknown keys or without ``image``, a tuple of another length."""
    if isinstance(sample, Mapping):
        unknown = [k for k in sample if k not in SAMPLE_FIELDS]
        if unknown:
            raise TypeError(f"sample {index}: unknown key(s) {', '.join(repr(k) for k in unknown)}; "
                            f"a sample mapping has {', '.join(SAMPLE_FIELDS)}")
        if "image" not in sample:
            raise TypeError(f"sample {index}: a sample mapping needs an 'image' key, got keys {list(sample)}")
        return dict(sample)
    if isinstance(sample, (tuple, list)):
        if len(sample) not in (3, 4):
            raise TypeError(f"sample {index}: a tuple sample is (image, boxes, labels) or "
                            f"(image, boxes, labels, image_id), got {describe_type(sample)}")
        return dict(zip(SAMPLE_FIELDS, sample))
    raise TypeError(f"sample {index}: a Sample, a mapping or an (image, boxes, labels[, image_id]) tuple, "
                    f"got {describe_type(sample)}")


def image_input(image: Any, index: int) -> Any:
    """Sample ``index``'s image with PIL images and torch tensors turned into NumPy arrays
    (decoded ``[H, W, 3]`` / ``[H, W]``, or 1-D encoded bytes); paths, bytes-likes and NumPy
    arrays as given. ``TypeError`` naming the index and the type for anything else. Neither PIL
    nor torch is imported here: an object of theirs exists only if its module is loaded."""
    if isinstance(image, (str, os.PathLike, bytes, bytearray, memoryview, np.ndarray)):
        return image
    pil = sys.modules.get("PIL.Image")
    if pil is not None and isinstance(image, pil.Image):
        if image.mode not in ("RGB", "L"):
            image = image.convert("L" if image.mode in ("1", "I", "I;16", "F") else "RGB")
        return np.asarray(image)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(image, torch.Tensor):
        return _tensor_pixels(image)
    raise TypeError(f"sample {index}: image must be {IMAGE_TYPES}; got {describe_type(image)}")


def _tensor_pixels(tensor: Any) -> np.ndarray:
    """A torch tensor's values as a NumPy array: ``[C, H, W]`` with ``C`` in (1, 3) made
    ``[H, W, 3]`` / ``[H, W]``, ``[H, W, 1]`` made ``[H, W]``; other shapes as they are (the value
    checks name them)."""
    t = tensor.detach().cpu()
    try:
        array = t.numpy()
    except (TypeError, RuntimeError):  # bfloat16 and the like: the dtype check names it
        array = t.float().numpy()
    if array.ndim == 3 and array.shape[0] in (1, 3):
        array = array.transpose(1, 2, 0)
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    return np.ascontiguousarray(array)


def file_key(name: str) -> str:
    """How file names are compared for duplicates."""
    return os.path.normpath(name)


def check_boxes(
    boxes: np.ndarray,
    sizes: np.ndarray,
    report: Report,
    where: Callable[[int], tuple[str, int | None, int | str | None]],
) -> tuple[np.ndarray, np.ndarray]:
    """Check and repair boxes (every source's boxes go through here).

    Args:
        boxes: float64 ``[N, 4]`` absolute ``xyxy``.
        sizes: float64 ``[N, 2]``: each box's image ``(h, w)``, NaN where not known.
        report: receives the findings.
        where: box index -> ``(file, image_id, annotation)`` for the findings' messages.

    Returns:
        float32 ``[N, 4]`` boxes (clipped where they were partly outside) and bool ``[N]``: the
        boxes kept (not empty, not outside). Non-finite boxes are errors and are not kept.
    """
    given = np.asarray(boxes)
    with np.errstate(over="ignore", invalid="ignore"):
        b = given.reshape(-1, 4).astype(np.float32)  # a copy (beyond float32: inf)
    finite = np.isfinite(b).all(axis=1)
    _add_rows(report, NON_FINITE, where, np.flatnonzero(~finite),
              lambda j: f"xyxy {given.reshape(-1, 4)[j].tolist()} (float32)")
    empty = finite & ((b[:, 2] <= b[:, 0]) | (b[:, 3] <= b[:, 1]))
    _add_rows(report, EMPTY_BOX, where, np.flatnonzero(empty), lambda j: f"xyxy {b[j].tolist()}")
    keep = finite & ~empty
    sizes = np.asarray(sizes).reshape(-1, 2)
    known = keep & np.isfinite(sizes).all(axis=1)
    if known.any():
        rows = np.flatnonzero(known)
        hw = sizes[rows].astype(np.float32)
        part = b[rows]
        limit = np.stack([hw[:, 1], hw[:, 0], hw[:, 1], hw[:, 0]], axis=1)
        inside = np.clip(part, np.float32(0), limit)
        outside = (inside[:, 2] <= inside[:, 0]) | (inside[:, 3] <= inside[:, 1])
        clipped = ~outside & (inside != part).any(axis=1)
        out_rows = rows[outside]
        _add_rows(report, BOX_OUTSIDE, where, out_rows, lambda j: (
            f"xyxy {b[j].tolist()}, image (h, w) ({int(sizes[j][0])}, {int(sizes[j][1])})"))
        clip_at = np.flatnonzero(clipped)
        _add_rows(report, BOX_CLIPPED, where, rows[clip_at],
                  lambda j: f"xyxy {b[j].tolist()} -> {inside[np.searchsorted(rows, j)].tolist()}")
        if clip_at.size:
            b[rows[clip_at]] = inside[clip_at]
        keep[out_rows] = False
    return b, keep


def _add_rows(report: Report, reason: str, where: Callable[[int], tuple[str, int | None, int | str | None]],
              rows: np.ndarray, detail: Callable[[int], str]) -> None:
    """Count a finding of ``reason`` for each box of ``rows``: the first ones (up to
    :data:`MAX_EXAMPLES` examples of the reason) with their messages, the rest counted at once."""
    if not len(rows):
        return
    room = max(0, MAX_EXAMPLES - len(report.examples.get(reason, [])))
    if RULES[reason] == "error" and report._first_error is None:
        room = max(room, 1)
    for j in rows[:room]:
        file, image_id, annotation = where(int(j))
        report.add(reason, file, image_id=image_id, annotation=annotation, detail=detail(int(j)))
    if len(rows) > room:
        report.counts[reason] += len(rows) - room


# -- paths a dataset names (containment) -----------------------------------------------------------

def path_problem(name: str) -> str | None:
    """Why the relative path ``name`` that a dataset file gives would leave the folder it is
    relative to, or ``None`` when it stays inside. The rule is lexical, on the path as written:
    absolute paths, paths that climb above the folder with ``..`` (after ``os.path.normpath``:
    ``a/../../x``, ``./../x``) and paths holding a NUL byte are refused. Symbolic links inside
    the folder are followed wherever they point (docs/security.md). A backslash is an ordinary
    character of a POSIX file name (``..\\x`` names a file inside the folder)."""
    if "\0" in name:
        return "holds a NUL byte"
    if os.path.isabs(name):
        return "is an absolute path"
    if ".." in name:
        norm = os.path.normpath(name)
        if norm == ".." or norm.startswith(".." + os.sep):
            return "leaves its folder (..)"
    return None


def outside_paths(names: Sequence[str]) -> list[int]:
    """The positions of the ``names`` that :func:`path_problem` refuses: one search of the
    joined names first (a million names in about 0.05 s); only names with ``..``, a leading
    ``/`` or a NUL byte are looked at closer."""
    joined = "\n".join(names)
    if ".." not in joined and "\0" not in joined and "\n/" not in joined and not joined.startswith("/"):
        return []
    return [i for i, n in enumerate(names)
            if (n[:1] == "/" or ".." in n or "\0" in n) and path_problem(n) is not None]


# -- columns of a whole dataset (shard manifests, caches) ------------------------------------------

#: Boxes checked at once by :func:`check_columns`.
_BLOCK_ROWS = 1 << 21


def _more(report: Report, reason: str, count: int) -> None:
    """Count the findings of ``reason`` beyond the :data:`MAX_EXAMPLES` added one by one."""
    if count > MAX_EXAMPLES:
        report.counts[reason] += count - MAX_EXAMPLES


def check_columns(
    image_ids: np.ndarray,
    sizes: np.ndarray,
    box_starts: np.ndarray,
    boxes: np.ndarray,
    labels: np.ndarray,
    categories: Mapping[int, str] | None,
    report: Report,
    file_of: Callable[[int], str],
) -> tuple[np.ndarray, np.ndarray]:
    """Check the columns of a whole dataset (:class:`~detaug.formats.columnar.SampleTable`'s
    layout) by the rules a freshly parsed COCO file passes, vectorised: the arrays fit together
    (else :class:`DatasetError` naming ``report.source``), image ids are unique, declared sizes
    valid, labels fit int32, are not negative and are among ``categories`` (when given), and
    the boxes pass :func:`check_boxes` (non-finite: an error; empty, outside: dropped; partly
    outside: clipped; each counted).

    Args:
        image_ids: int ``[n]``. sizes: int ``[n, 2]`` (``(0, 0)``: not declared).
        box_starts: int ``[n + 1]``. boxes: float32 ``[M, 4]`` xyxy. labels: int ``[M]``.
        categories: the category ids allowed, ``None``: any.
        report: receives the findings (the caller raises / finishes it).
        file_of: image row -> the file the messages name.

    Returns:
        float32 ``[M, 4]`` boxes (clipped) and bool ``[M]``: the boxes kept.
    """
    where_src = report.source or "the columns"
    image_ids, sizes = np.asarray(image_ids), np.asarray(sizes)
    box_starts, boxes, labels = np.asarray(box_starts), np.asarray(boxes), np.asarray(labels)
    n = len(image_ids)
    problems = []
    if image_ids.ndim != 1 or image_ids.dtype.kind not in "iu":
        problems.append(f"image_ids: {image_ids.dtype} {image_ids.shape}, not int [n]")
    if sizes.shape != (n, 2) or sizes.dtype.kind not in "iu":
        problems.append(f"sizes: {sizes.dtype} {sizes.shape}, not int [{n}, 2]")
    if box_starts.shape != (n + 1,) or box_starts.dtype.kind not in "iu":
        problems.append(f"box_starts: {box_starts.dtype} {box_starts.shape}, not int [{n + 1}]")
    elif n >= 0 and (box_starts[0] != 0 or (np.diff(box_starts) < 0).any() or box_starts[-1] != len(boxes)):
        problems.append(f"box_starts do not run from 0 up to the {len(boxes)} boxes")
    if boxes.ndim != 2 or boxes.shape[1:] != (4,) or boxes.dtype.kind != "f":
        problems.append(f"boxes: {boxes.dtype} {boxes.shape}, not float [M, 4]")
    if labels.shape != (len(boxes),) or labels.dtype.kind not in "iu":
        problems.append(f"labels: {labels.dtype} {labels.shape}, not int [{len(boxes)}]")
    if problems:
        raise DatasetError(f"{where_src}: the columns do not fit together: " + "; ".join(problems))
    if n == 0:
        report.add(NO_IMAGES, where_src, detail="no samples")
        return np.zeros((0, 4), np.float32), np.zeros(0, bool)
    ids = image_ids.astype(np.int64, copy=False)
    if n < 2 or (ids[1:] > ids[:-1]).all():  # ids written in order: unique without a sort
        order, same = None, np.zeros(0, np.int64)
    else:
        order = np.argsort(ids, kind="stable")
        same = np.flatnonzero(ids[order][1:] == ids[order][:-1])
    for k in same[:MAX_EXAMPLES]:
        row = int(order[k + 1])
        report.add(DUPLICATE_IMAGE_ID, file_of(row), image_id=int(ids[row]), detail=f"also the id of row {int(order[k])}")
    _more(report, DUPLICATE_IMAGE_ID, len(same))
    hw = sizes.astype(np.int64, copy=False)
    declared = (hw != 0).any(axis=1)
    bad = np.flatnonzero(declared & ((hw <= 0) | (hw > INT32_MAX)).any(axis=1))
    for row in bad[:MAX_EXAMPLES]:
        report.add(BAD_SIZE, file_of(int(row)), image_id=int(ids[row]), detail=f"(h, w) {hw[row].tolist()}")
    _more(report, BAD_SIZE, len(bad))
    lab = labels.astype(np.int64, copy=False)

    def owner_of(j: int) -> int:
        return int(np.searchsorted(box_starts, j, side="right") - 1)

    def where(j: int) -> tuple[str, int | None, int | str | None]:
        i = owner_of(j)
        return file_of(i), int(ids[i]), f"box {int(j - box_starts[i])}"

    def label_error(reason: str, rows: np.ndarray) -> None:
        for j in rows[:MAX_EXAMPLES]:
            file, image_id, box = where(int(j))
            report.add(reason, file, image_id=image_id, annotation=box, detail=f"label {int(lab[j])}")
        _more(report, reason, len(rows))

    label_error(NEGATIVE_LABEL, np.flatnonzero(lab < 0))
    label_error(LABEL_RANGE, np.flatnonzero(lab > INT32_MAX))
    if categories is not None:
        known = np.fromiter(categories, np.int64, len(categories))
        top = int(lab.max(initial=0))
        if len(lab) and int(lab.min()) >= 0 and top < 1 << 24:  # a lookup table: one pass
            table = np.zeros(top + 1, bool)
            table[known[(known >= 0) & (known <= top)]] = True
            unknown = ~table[lab]
        else:
            unknown = (lab >= 0) & (lab <= INT32_MAX) & ~np.isin(lab, known)
        label_error(UNKNOWN_CATEGORY, np.flatnonzero(unknown))
    # the boxes, a block of rows at a time (bounded memory for 10M images)
    out = np.empty((len(boxes), 4), np.float32)
    keep = np.empty(len(boxes), bool)
    for a in range(0, len(boxes), _BLOCK_ROWS):
        b = min(len(boxes), a + _BLOCK_ROWS)
        owner = np.searchsorted(box_starts, np.arange(a, b), side="right") - 1
        box_hw = hw[owner].astype(np.float64)
        box_hw[~declared[owner]] = np.nan
        out[a:b], keep[a:b] = check_boxes(boxes[a:b], box_hw, report, lambda j, a=a: where(j + a))
    return out, keep
