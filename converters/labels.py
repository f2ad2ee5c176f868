"""Category lists: the 20 VOC classes, labels files, discovered names.

COCO category ids are the 1-based positions in the resolved list (``id = index + 1``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from os import PathLike
from pathlib import Path

#: The 20 Pascal VOC classes in the devkit's order (``VOCopts.classes``).
VOC_CLASSES: tuple[str, ...] = (
    "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
    "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa",
    "train", "tvmonitor",
)

LabelsSpec = str | PathLike | Sequence[str]


def read_labels_file(path: str | PathLike) -> list[str]:
    """Read a labels file: one name a line, in category order.

    Blank lines and lines starting with ``#`` are skipped; surrounding whitespace is stripped.
    CVAT/Datumaro ``labelmap.txt`` lines (``name:r,g,b:parts:actions``) give the part before
    the first ``:``. Raises ``ValueError`` naming the file and line for a duplicate name, and
    for a file with no names.
    """
    path = Path(path)
    names: list[str] = []
    first_line: dict[str, int] = {}
    with path.open(encoding="utf-8-sig") as handle:
        for number, raw in enumerate(handle, start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            name = line.split(":", 1)[0].strip() if ":" in line else line
            if not name:
                raise ValueError(f"{path}:{number}: empty label name in {raw.rstrip()!r}")
            if name in first_line:
                raise ValueError(f"{path}:{number}: duplicate label {name!r} "
                                 f"(first on line {first_line[name]})")
            first_line[name] = number
            names.append(name)
    if not names:
        raise ValueError(f"{path}: no label names in the file")
    return names


def resolve_labels(spec: LabelsSpec, discovered: Iterable[str]) -> list[str]:
    """Turn a ``labels`` argument into the category list.

    ``"voc"``: :data:`VOC_CLASSES`. ``"discover"``: the ``discovered`` names, sorted (Python
    string order, so ``"Car"`` sorts before ``"bus"``). Any other string or path: a labels file
    (:func:`read_labels_file`). A list or tuple of names: those names, in that order.
    """
    if isinstance(spec, str) and spec == "voc":
        return list(VOC_CLASSES)
    if isinstance(spec, str) and spec == "discover":
        return sorted(set(discovered))
    if isinstance(spec, (str, PathLike)):
        path = Path(spec)
        if not path.is_file():
            raise ValueError(f"labels: {spec!s} is not 'voc', 'discover' or an existing file")
        return read_labels_file(path)
    names = [str(name) for name in spec]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"labels: duplicate names {duplicates}")
    if not names:
        raise ValueError("labels: the list is empty")
    return names
