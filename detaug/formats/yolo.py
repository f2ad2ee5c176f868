"""YOLO-txt label folders: the parser (no image is decoded here; no DALI, torch or Keras).

A folder::

    ROOT/
      images/...     the images, at any depth (file names ending in .jpg, .jpeg, .png, .bmp,
                     .tif, .tiff, .webp, .pnm, .ppm, .pgm, .pbm, .jp2, any case)
      labels/...     one text file per image: the image's path under images/ with .txt for its
                     suffix (images/train/a.jpg -> labels/train/a.txt)
      classes.txt    optional: the class names, class i on line i + 1
      train.txt ...  optional split lists: one image path per line, relative to ROOT
                     ("images/train/a.jpg" or "./images/train/a.jpg")

A label line is ``class cx cy w h``: the class index (0-based, an integer) and the box's centre,
width and height as fractions of the image width (x) and height (y); blank lines are skipped.
An image without a label file has no boxes (a background image; counted as a note), a label
file without an image is left out (a note); other files under ``images/`` are not images and
are not read. Directory links under ``images/`` are not walked; file links are followed, as
every source follows them (docs/security.md).

Errors name the file and the line (:class:`~detaug.formats.report.Report`, raised as one
:class:`~detaug.errors.DatasetError` listing every problem): a line that is not five numbers
("malformed box"), a class that is not an integer, negative, beyond int32 or not among the
names ("malformed label", "negative label", "label does not fit int32", "unknown category
id"), a coordinate that is NaN or infinite ("non-finite coordinate"), a label file that cannot
be read, is not a regular file, is larger than :data:`MAX_LABEL_BYTES` or is not UTF-8
("malformed annotation"), an empty or repeated class name ("malformed category"), a split
entry that leaves ROOT ("path outside the dataset folder", unless ``allow_paths_outside``) or
is not under an ``images/`` folder ("malformed image entry"). Boxes are placed on the image
(pixels, checked, repaired) by :class:`detaug.sources.YoloSource`, which reads each image's size.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from detaug.formats.paths import path_problem
from detaug.formats.report import (
    IMAGE_WITHOUT_LABELS, LABELS_WITHOUT_IMAGE, MALFORMED_ANNOTATION, MALFORMED_BOX, MALFORMED_CATEGORY,
    MALFORMED_IMAGE, MALFORMED_LABEL, NON_FINITE, NO_IMAGES, PATH_OUTSIDE, UNKNOWN_CATEGORY, Report,
)
from detaug.formats.values import as_int, label_problem

__all__ = [
    "IMAGE_SUFFIXES", "MAX_LABEL_BYTES", "YoloFolder", "YoloImage", "label_path", "parse_labels", "read_names",
    "read_yolo_folder",
]

#: The file name suffixes of images under ``images/`` (compared in lower case).
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp", ".pnm", ".ppm", ".pgm", ".pbm", ".jp2")

#: The largest label file or names file read (a line per box: 64 MiB is over a million boxes).
MAX_LABEL_BYTES = 64 << 20


@dataclass
class YoloImage:
    """One image of a YOLO folder and its label lines, as written.

    Attributes:
        image: the image's path (``ROOT/images/...``).
        label_file: its label file's path, ``None`` when it has none.
        labels: int64 ``[N]`` class indices.
        boxes: float64 ``[N, 4]`` ``(cx, cy, w, h)`` fractions of the image width and height.
        lines: int64 ``[N]`` the 1-based line of each box in the label file.
    """

    image: str
    label_file: str | None
    labels: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    boxes: np.ndarray = field(default_factory=lambda: np.zeros((0, 4), np.float64))
    lines: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))


@dataclass
class YoloFolder:
    """A parsed YOLO folder: its images in path order, the class names by index (``{}`` when
    the folder has no names), and the report of what the parser found (notes only: errors are
    raised)."""

    root: Path
    images: list[YoloImage]
    categories: dict[int, str]
    report: Report


def read_yolo_folder(root: str | os.PathLike, split: str | None = None, *,
                     names: Sequence[str] | str | os.PathLike | None = None,
                     allow_paths_outside: bool = False) -> YoloFolder:
    """Parse the YOLO folder ``root`` (module docstring).

    Args:
        root: the folder holding ``images/`` and ``labels/``.
        split: the name of a split list ``ROOT/<split>.txt`` (its images, in its order);
            ``None``: every image under ``images/``, in path order.
        names: the class names (a list, or a names file: one per line); ``None``:
            ``ROOT/classes.txt`` when there, else no names (labels then not checked against any).
        allow_paths_outside: accept split entries that are absolute or leave ``root`` with ``..``.

    Raises:
        FileNotFoundError: ``root``, ``root/images`` or the split list is missing.
        DatasetError: the errors of the module docstring, every one named by file and line.
    """
    root = Path(root)
    report = Report(f"{root} (YOLO" + (f", split {split})" if split else ")"))
    if not (root / "images").is_dir():
        raise FileNotFoundError(f"{root / 'images'}: images folder of the YOLO folder not found")
    if names is None and (root / "classes.txt").is_file():
        names = root / "classes.txt"
    categories = {} if names is None else read_names(names, report)
    if split is None:
        images = _walk_images(root, report)
    else:
        images = _listed_images(root, split, report, allow_paths_outside)
    report.raise_errors()
    found = []
    for image, labels in images:
        if labels is None or not labels.exists():
            report.add(IMAGE_WITHOUT_LABELS, str(image), detail=f"no {labels}: no boxes" if labels else "no boxes")
            found.append(YoloImage(str(image), None))
            continue
        text = _read_text(labels, report)
        parsed = parse_labels(text, str(labels), categories or None, report) if text is not None else None
        found.append(YoloImage(str(image), str(labels), *parsed) if parsed else YoloImage(str(image), str(labels)))
    report.raise_errors()
    if not found:
        report.add(NO_IMAGES, str(root / "images") if split is None else f"{root / split}.txt",
                   detail="no image files")
        report.raise_errors()
    return YoloFolder(root, found, categories, report)


def parse_labels(text: str, file: str, categories: dict[int, str] | None,
                 report: Report) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(labels int64 [N], boxes float64 [N, 4] cxcywh fractions, lines int64 [N])`` of a label
    file's ``text``; each bad line is an error in ``report`` naming ``file`` and the line (its
    box left out of the result). ``categories``: the names by class index, ``None``: not checked."""
    labels, boxes, lines = [], [], []
    for number, line in enumerate(text.splitlines(), 1):
        tokens = line.split()
        if not tokens:
            continue
        where = {"annotation": f"line {number}"}
        if len(tokens) != 5:
            report.add(MALFORMED_BOX, file, **where,
                       detail=f"expected 'class cx cy w h' (5 values), got {len(tokens)}: {line.strip()!r:.60}")
            continue
        label = _class_index(tokens[0])
        if label is None:
            report.add(MALFORMED_LABEL, file, **where, detail=f"class {tokens[0]!r:.40} is not an integer")
            continue
        if problem := label_problem(label):
            report.add(problem, file, **where, detail=f"class {label}")
            continue
        if categories is not None and label not in categories:
            report.add(UNKNOWN_CATEGORY, file, **where, detail=f"class {label} (the names have {len(categories)})")
            continue
        try:
            values = [float(t) for t in tokens[1:]]
        except ValueError:
            report.add(MALFORMED_BOX, file, **where, detail=f"{' '.join(tokens[1:])!r:.60} are not 4 numbers")
            continue
        if not all(np.isfinite(values)):
            report.add(NON_FINITE, file, **where, detail=" ".join(tokens[1:]))
            continue
        labels.append(label)
        boxes.append(values)
        lines.append(number)
    return (np.array(labels, np.int64), np.array(boxes, np.float64).reshape(-1, 4), np.array(lines, np.int64))


def read_names(names: Sequence[str] | str | os.PathLike, report: Report) -> dict[int, str]:
    """``{class index: name}`` of a names list or a names file (one name per line, blank lines
    at the end ignored); an empty or repeated name is an error in ``report`` naming the line."""
    if isinstance(names, (str, os.PathLike)):
        file = str(names)
        text = _read_text(Path(names), report)
        entries = [] if text is None else text.splitlines()
        while entries and not entries[-1].strip():
            entries.pop()
    else:
        file, entries = "names", [str(n) for n in names]
    found: dict[int, str] = {}
    seen: dict[str, int] = {}
    for k, name in enumerate(entries):
        name = name.strip()
        if not name or name in seen:
            report.add(MALFORMED_CATEGORY, file, annotation=f"line {k + 1}",
                       detail=f"name {name!r} also on line {seen[name] + 1}" if name else "empty name")
            continue
        seen[name] = k
        found[k] = name
    return found


def label_path(root: Path, image: str) -> Path | None:
    """The label file of the image at ``image`` (relative to ``root``): the last ``images``
    folder of the path replaced by ``labels``, the suffix by ``.txt``; ``None`` when the path
    has no ``images`` folder."""
    parts = list(Path(os.path.normpath(image)).parts)
    folders = [k for k, part in enumerate(parts[:-1]) if part == "images"]
    if not folders:
        return None
    parts[folders[-1]] = "labels"
    return (root.joinpath(*parts)).with_suffix(".txt")


def _walk_images(root: Path, report: Report) -> list[tuple[Path, Path | None]]:
    """Every image under ``root/images`` in path order, with its label file; label files
    without an image are noted."""
    images = sorted(p for p in (root / "images").rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    pairs = [(p, label_path(root, str(p.relative_to(root)))) for p in images]
    if (root / "labels").is_dir():
        expected = {str(label) for _, label in pairs}
        for orphan in sorted(p for p in (root / "labels").rglob("*.txt") if str(p) not in expected):
            report.add(LABELS_WITHOUT_IMAGE, str(orphan), detail=f"no image for it under {root / 'images'}")
    return pairs


def _listed_images(root: Path, split: str, report: Report, allow_paths_outside: bool) -> list[tuple[Path, Path | None]]:
    """The images of the split list ``root/<split>.txt`` in its order, with their label files;
    entries leaving ``root`` or not under an ``images`` folder are errors naming the line."""
    listing = root / f"{split}.txt"
    if not listing.is_file():
        raise FileNotFoundError(f"{listing}: split list of the YOLO folder not found")
    text = _read_text(listing, report)
    pairs = []
    for number, line in enumerate((text or "").splitlines(), 1):
        entry = line.strip()
        if not entry:
            continue
        where = {"annotation": f"line {number}"}
        if not allow_paths_outside and (why := path_problem(entry)):
            report.add(PATH_OUTSIDE, str(listing), **where,
                       detail=f"{entry!r:.80} {why} (allow_paths_outside=True accepts it)")
            continue
        labels = label_path(root, entry)
        if labels is None:
            report.add(MALFORMED_IMAGE, str(listing), **where,
                       detail=f"{entry!r:.80} is not under an images/ folder (its label file is found there)")
            continue
        pairs.append((root / entry, labels))
    return pairs


def _class_index(token: str) -> int | None:
    """The integer a class token stands for (``"3"``, or an integral float such as ``"3.0"``)."""
    try:
        return int(token)
    except ValueError:
        pass
    try:
        return as_int(float(token))
    except ValueError:
        return None


def _read_text(path: Path, report: Report) -> str | None:
    """The UTF-8 text of a regular file of at most :data:`MAX_LABEL_BYTES`; else an error in
    ``report`` naming it (``None``)."""
    why = None
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            why = "not a regular file"
        elif info.st_size > MAX_LABEL_BYTES:
            why = f"{info.st_size} bytes: larger than {MAX_LABEL_BYTES} (detaug.formats.yolo.MAX_LABEL_BYTES)"
        else:
            with open(path, "rb") as f:
                data = f.read(MAX_LABEL_BYTES + 1)
            return data.decode("utf-8-sig")
    except OSError as err:
        why = f"cannot read it: {err.strerror or err}"
    except UnicodeDecodeError as err:
        why = f"not UTF-8 text (byte {err.start})"
    report.add(MALFORMED_ANNOTATION, str(path), detail=why)
    return None
