"""Helpers for the converter tests: where the real data is, and small datasets made on the fly."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

REALDATA_ENV = "DETAUG_REALDATA"


def realdata_root() -> Path | None:
    """``$DETAUG_REALDATA``, else ``<repo>/../shared/realdata``; ``None`` when absent."""
    configured = os.environ.get(REALDATA_ENV)
    path = (Path(configured) if configured
            else Path(__file__).resolve().parents[2] / ".." / "shared" / "realdata")
    return path.resolve() if path.is_dir() else None


REALDATA = realdata_root()
#: Every dataset folder of the real data (empty when it is absent).
REALDATA_FOLDERS: list[str] = sorted(
    p.name for p in REALDATA.iterdir() if p.is_dir()) if REALDATA else []


def write_image(path: Path, size: tuple[int, int] = (32, 24), mode: str = "RGB") -> Path:
    """A small JPEG (or other format, by extension) of ``size = (width, height)``."""
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, color=128 if mode == "L" else (200, 100, 50)).save(path)
    return path


def voc_xml(filename: str | None = "img.jpg", size: tuple[int, int] | None = (32, 24),
            objects: Iterable[str] = (), depth: int | None = 3) -> str:
    """A VOC annotation document. ``objects`` are ``<object>`` elements as text (see obj())."""
    parts = ["<annotation>", "<folder>VOC</folder>"]
    if filename is not None:
        parts.append(f"<filename>{filename}</filename>")
    if size is not None:
        parts.append(f"<size><width>{size[0]}</width><height>{size[1]}</height>"
                     + (f"<depth>{depth}</depth>" if depth is not None else "") + "</size>")
    parts.extend(objects)
    parts.append("</annotation>")
    return "\n".join(parts)


def obj(name: str, box: tuple[float, float, float, float], difficult: int | None = 0,
        extra: str = "") -> str:
    """An ``<object>`` element; ``box = (xmin, ymin, xmax, ymax)`` as written."""
    xmin, ymin, xmax, ymax = box
    flag = f"<difficult>{difficult}</difficult>" if difficult is not None else ""
    return (f"<object><name>{name}</name>{flag}{extra}<bndbox><xmin>{xmin}</xmin>"
            f"<ymin>{ymin}</ymin><xmax>{xmax}</xmax><ymax>{ymax}</ymax></bndbox></object>")


def make_voc(root: Path, files: dict[str, str], images: dict[str, tuple[int, int]] | None = None,
             splits: dict[str, list[str]] | None = None) -> Path:
    """A VOCdevkit-style folder: ``files`` = {xml name: text}, ``images`` = {image name: size}."""
    (root / "Annotations").mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (root / "Annotations" / name).write_text(text, encoding="utf-8")
    if images is not None:
        (root / "JPEGImages").mkdir(exist_ok=True)
        for name, size in images.items():
            write_image(root / "JPEGImages" / name, size)
    for split, ids in (splits or {}).items():
        main = root / "ImageSets" / "Main"
        main.mkdir(parents=True, exist_ok=True)
        (main / f"{split}.txt").write_text("".join(f"{i}\n" for i in ids), encoding="utf-8")
    return root
