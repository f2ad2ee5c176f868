"""Write a small Pascal VOC style dataset of synthetic scenes (:func:`write_voc_dataset`).

VOC XML files hold 1-based inclusive pixel indices: ``xmin = x0 + 1``, ``ymin = y0 + 1``,
``xmax = x1``, ``ymax = y1`` for the box ``(x0, y0, x1, y1)`` of :mod:`detaug.synthetic_scenes`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Literal

import numpy as np
from lxml import etree

from detaug.synthetic_scenes import (
    DEFAULT_CLASSES,
    SizeSpec,
    SyntheticImage,
    _check_classes,
    _check_int,
    _check_size,
    _draw_size,
    _save_image,
    make_scene,
)

__all__ = ["DEFAULT_SPLITS", "write_voc_dataset"]

DEFAULT_SPLITS: Mapping[str, float] = MappingProxyType({"train": 0.75, "val": 0.25})


def write_voc_dataset(
    root: str | os.PathLike[str],
    *,
    num_images: int = 32,
    classes: Sequence[str] = DEFAULT_CLASSES,
    size: tuple[SizeSpec, SizeSpec] = ((320, 480), (320, 480)),
    max_objects: int = 6,
    image_format: Literal["jpg", "png"] = "jpg",
    seed: int = 0,
    splits: Mapping[str, float] = DEFAULT_SPLITS,
    jpeg_quality: int = 95,
) -> list[SyntheticImage]:
    """Write a small Pascal VOC style dataset of synthetic scenes.

    Layout (``root`` plays the role of ``VOCdevkit/VOC20xx``)::

        root/Annotations/<id>.xml         one standard VOC annotation per image
        root/JPEGImages/<id>.<ext>        the images (PNG too, despite the folder name)
        root/ImageSets/Main/<split>.txt   image ids of each split, one per line, sorted

    Image ids are ``"000000"``, ``"000001"``, ... . Each XML holds ``folder``, ``filename``,
    ``source``, ``size`` (``width``, ``height``, ``depth=3``), ``segmented=0`` and one ``object``
    per rectangle with ``name``, ``pose="Unspecified"``, ``truncated=0``, ``difficult=0`` and
    integer ``bndbox`` (``xmin``, ``ymin``, ``xmax``, ``ymax``) as 1-based inclusive pixel
    indices: ``xmin = x0 + 1``, ``xmax = x1`` for the box ``(x0, y0, x1, y1)``.

    Args:
        root: output folder, created if missing; existing files of the same names are replaced.
        num_images: number of images (``>= 1``).
        classes: class names of the objects.
        size: ``(width, height)``; each entry is a fixed pixel count or an inclusive
            ``(low, high)`` range drawn uniformly per image. The default draws both sides from
            ``[320, 480]``.
        max_objects: most objects per image (at least one is always drawn).
        image_format: ``"jpg"`` (JPEG, 4:4:4 chroma, quality ``jpeg_quality``) or ``"png"``
            (lossless: object pixels match ``SyntheticObject.color`` exactly).
        seed: seed of ``np.random.default_rng``; same seed and arguments, same files.
        splits: split name -> fraction of images; fractions must be positive and sum to 1. Images
            are shuffled and split by cumulative fractions (rounded), each in exactly one split.
        jpeg_quality: JPEG quality, 1..100 (ignored for PNG).

    Returns:
        One :class:`SyntheticImage` per image, in id order; boxes in absolute xyxy pixels.
    """
    _check_int("num_images", num_images, low=1)
    _check_int("jpeg_quality", jpeg_quality, low=1, high=100)
    if image_format not in ("jpg", "png"):
        raise ValueError(f"image_format must be 'jpg' or 'png', got {image_format!r}")
    split_names, split_fractions = _check_splits(splits)
    classes = _check_classes(classes)
    _check_size(size)

    root = Path(root)
    annotations_dir = root / "Annotations"
    images_dir = root / "JPEGImages"
    sets_dir = root / "ImageSets" / "Main"
    for folder in (annotations_dir, images_dir, sets_dir):
        folder.mkdir(parents=True, exist_ok=True)

    rng = np.random.default_rng(seed)
    metas: list[SyntheticImage] = []
    for index in range(num_images):
        name = f"{index:06d}"
        width, height = _draw_size(rng, size)
        image, meta = make_scene(rng, width, height, max_objects, classes, name=name)
        filename = f"{name}.{image_format}"
        _save_image(image, images_dir / filename, jpeg_quality=jpeg_quality, subsampling=0)
        _write_voc_xml(annotations_dir / f"{name}.xml", meta, filename, folder=root.name)
        metas.append(meta)

    # Split assignment: shuffle, then cut at the rounded cumulative fractions.
    order = rng.permutation(num_images)
    cuts = np.round(np.cumsum(split_fractions) * num_images).astype(int)
    cuts[-1] = num_images
    start = 0
    for split_name, stop in zip(split_names, cuts):
        names = sorted(metas[i].name for i in order[start:stop])
        text = "".join(f"{n}\n" for n in names)
        (sets_dir / f"{split_name}.txt").write_text(text, encoding="utf-8")
        start = stop
    return metas


def _write_voc_xml(path: Path, meta: SyntheticImage, filename: str, *, folder: str) -> None:
    """Write one VOC annotation; boxes become 1-based inclusive integer pixel indices."""
    annotation = etree.Element("annotation")
    _sub(annotation, "folder", folder)
    _sub(annotation, "filename", filename)
    source = etree.SubElement(annotation, "source")
    _sub(source, "database", "detaug synthetic")
    size = etree.SubElement(annotation, "size")
    _sub(size, "width", meta.width)
    _sub(size, "height", meta.height)
    _sub(size, "depth", 3)
    _sub(annotation, "segmented", 0)
    for obj in meta.objects:
        x0, y0, x1, y1 = (int(v) for v in obj.box_xyxy)
        element = etree.SubElement(annotation, "object")
        _sub(element, "name", obj.label)
        _sub(element, "pose", "Unspecified")
        _sub(element, "truncated", 0)
        _sub(element, "difficult", 0)
        bndbox = etree.SubElement(element, "bndbox")
        _sub(bndbox, "xmin", x0 + 1)
        _sub(bndbox, "ymin", y0 + 1)
        _sub(bndbox, "xmax", x1)
        _sub(bndbox, "ymax", y1)
    etree.ElementTree(annotation).write(str(path), pretty_print=True, encoding="utf-8")


def _sub(parent: etree._Element, tag: str, text: object) -> etree._Element:
    element = etree.SubElement(parent, tag)
    element.text = str(text)
    return element


def _check_splits(splits: Mapping[str, float]) -> tuple[list[str], np.ndarray]:
    if not splits:
        raise ValueError("splits must name at least one split")
    names = list(splits)
    fractions = np.array([splits[n] for n in names], dtype=np.float64)
    for n, f in zip(names, fractions):
        if not isinstance(n, str) or not n or "/" in n:
            raise ValueError(f"split names must be non-empty strings without '/', got {n!r}")
        if not f > 0:
            raise ValueError(f"split fraction of {n!r} must be > 0, got {f}")
    if abs(fractions.sum() - 1.0) > 1e-6:
        raise ValueError(
            f"split fractions must sum to 1, got {dict(splits)} (sum {fractions.sum()})"
        )
    return names, fractions
