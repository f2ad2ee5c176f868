"""Finding the image of a VOC id. (What the image file is, its size, EXIF orientation and
problems: :mod:`detaug.formats.images`, shared with the loader.)

An image is identified by its VOC id, the stem of its XML file, as in the VOC devkit
(``JPEGImages/<id>.jpg``). The file is looked up by that id with any common extension
(case-insensitive: ``.jpg``, ``.JPG``, ``.jpeg``, ``.png``, ...); only when none exists is the
XML's ``<filename>`` tried (its last path component, exact name first, then case-insensitive).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

#: Extensions recognised as images, in the order preferred when one id has several files.
IMAGE_EXTENSIONS: tuple[str, ...] = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp",
                                     ".gif")
_EXTENSION_RANK = {ext: rank for rank, ext in enumerate(IMAGE_EXTENSIONS)}

FoundBy = Literal["id", "filename"]


@dataclass
class ImageIndex:
    """The image files of one folder (top level only), indexed by stem and by name."""

    folder: Path
    by_stem: dict[str, list[str]] = field(default_factory=dict)
    by_lower_name: dict[str, str] = field(default_factory=dict)
    names: set[str] = field(default_factory=set)

    @classmethod
    def scan(cls, folder: Path) -> ImageIndex:
        """List ``folder`` once; files without an image extension are left out."""
        index = cls(folder)
        with os.scandir(folder) as entries:
            names = sorted(e.name for e in entries if e.is_file())
        for name in names:
            stem, ext = os.path.splitext(name)
            if ext.lower() not in _EXTENSION_RANK:
                continue
            index.names.add(name)
            index.by_stem.setdefault(stem, []).append(name)
            index.by_lower_name.setdefault(name.lower(), name)
        for candidates in index.by_stem.values():
            candidates.sort(key=lambda n: (_EXTENSION_RANK[os.path.splitext(n)[1].lower()], n))
        return index

    def find(self, voc_id: str, filename: str | None) -> tuple[str | None, FoundBy | None, int]:
        """``(name, found_by, n_candidates)`` for the image of ``voc_id``.

        By id first; when one id has several files, the one named by ``<filename>`` wins, else
        the first in :data:`IMAGE_EXTENSIONS` order. Then by ``<filename>``. ``(None, None, 0)``
        when neither exists.
        """
        candidates = self.by_stem.get(voc_id)
        base = filename_base(filename)
        if candidates:
            if base in candidates:
                return base, "id", len(candidates)
            return candidates[0], "id", len(candidates)
        if base:
            if base in self.names:
                return base, "filename", 1
            lower = self.by_lower_name.get(base.lower())
            if lower is not None:
                return lower, "filename", 1
        return None, None, 0


def filename_base(filename: str | None) -> str | None:
    """Last component of a ``<filename>`` (``\\`` and ``/`` both separate), ``None`` if empty."""
    if not filename:
        return None
    base = filename.replace("\\", "/").rsplit("/", 1)[-1].strip()
    return base or None
