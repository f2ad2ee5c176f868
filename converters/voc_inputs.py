"""What a VOC conversion reads before the long part, checked: the options, the folders (a
VOCdevkit-style root or an annotations folder plus an images folder), the annotations folder's
listing and the split files. Anything wrong is a :class:`ConversionError` (the dataset cannot be
converted at all); :mod:`converters.voc2coco` is the API that uses them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Literal

from converters.boxes import COORDS
from detaug.formats.orientation import ORIENTATIONS

__all__ = ["DIFFICULT_MODES", "ConversionError"]

Difficult = Literal["keep", "crowd", "drop"]
Orientation = Literal["auto", "apply", "ignore"]
DIFFICULT_MODES: tuple[str, ...] = ("keep", "crowd", "drop")


class ConversionError(ValueError):
    """The dataset cannot be converted at all (a folder or split file missing, bad options)."""



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
