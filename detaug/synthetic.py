"""Generated detection datasets with exactly known boxes.

Every image is a flat grey background with solid-coloured, non-overlapping rectangles. Each object
in an image has its own colour from :data:`PALETTE`, so its pixels can be found again by colour
after augmentation, and its box is known exactly because the rectangle has integer pixel edges.

Box conventions
---------------
* In Python (``SyntheticObject.box_xyxy``) and in COCO files, boxes live in continuous pixel
  coordinates: pixel ``i`` spans ``[i, i + 1)``. A rectangle filling pixel columns ``x0 .. x1 - 1``
  and rows ``y0 .. y1 - 1`` has box ``(x0, y0, x1, y1)``; in COCO this is
  ``bbox = [x0, y0, x1 - x0, y1 - y0]``.
* VOC XML files hold 1-based inclusive pixel indices: ``xmin = x0 + 1``, ``ymin = y0 + 1``,
  ``xmax = x1``, ``ymax = y1``. Back to boxes: ``x0 = xmin - 1``, ``w = xmax - xmin + 1``.

Entry points
------------
* :func:`make_scene` draws one image in memory.
* :func:`write_voc_dataset` writes a small VOC-style folder (for converter and pipeline tests).
* :func:`write_coco_dataset` writes a COCO-style JPEG dataset (for benchmarks and the demo).

All generators are deterministic for a given seed and arguments.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Literal, Union

import numpy as np
from lxml import etree
from PIL import Image
from tqdm import tqdm

__all__ = [
    "BACKGROUND",
    "DEFAULT_CLASSES",
    "PALETTE",
    "SyntheticImage",
    "SyntheticObject",
    "make_scene",
    "write_coco_dataset",
    "write_voc_dataset",
]

BACKGROUND: tuple[int, int, int] = (114, 114, 114)
"""RGB colour of the flat background of every synthetic image."""

PALETTE: list[tuple[int, int, int]] = [
    # Twelve fully saturated hues, 30 degrees apart.
    (255, 0, 0),
    (255, 128, 0),
    (255, 255, 0),
    (128, 255, 0),
    (0, 255, 0),
    (0, 255, 128),
    (0, 255, 255),
    (0, 128, 255),
    (0, 0, 255),
    (128, 0, 255),
    (255, 0, 255),
    (255, 0, 128),
    # Six darker saturated colours.
    (128, 0, 0),
    (128, 128, 0),
    (0, 128, 0),
    (0, 128, 128),
    (0, 0, 128),
    (128, 0, 128),
]
"""Object colours (RGB). Pairwise Euclidean distance >= 127 and distance to :data:`BACKGROUND`
>= 115, so an object's pixels stay identifiable through JPEG and mild colour jitter."""

DEFAULT_CLASSES: tuple[str, ...] = ("cat", "dog", "car", "person")

DEFAULT_SPLITS: Mapping[str, float] = MappingProxyType({"train": 0.75, "val": 0.25})

# One dimension of an image size: a fixed number of pixels or an inclusive ``(low, high)`` range.
SizeSpec = Union[int, tuple[int, int]]

_MAX_PLACEMENT_ATTEMPTS = 64


@dataclass(frozen=True)
class SyntheticObject:
    """One solid rectangle of a synthetic image.

    Attributes:
        box_xyxy: ``(x0, y0, x1, y1)`` float, absolute pixel coordinates, pixel ``i`` spans
            ``[i, i + 1)``; all four values are whole numbers.
        label: class name.
        color: RGB fill colour, an entry of :data:`PALETTE`, unique within its image.
    """

    box_xyxy: tuple[float, float, float, float]
    label: str
    color: tuple[int, int, int]


@dataclass(frozen=True)
class SyntheticImage:
    """Ground truth of one synthetic image.

    Attributes:
        name: image id (file stem), e.g. ``"000007"``.
        width: image width in pixels.
        height: image height in pixels.
        objects: the rectangles, in drawing order (they do not overlap, so order does not matter).
    """

    name: str
    width: int
    height: int
    objects: tuple[SyntheticObject, ...]


# --------------------------------------------------------------------------------------------
# Scenes
# --------------------------------------------------------------------------------------------


def make_scene(
    rng: np.random.Generator,
    width: int,
    height: int,
    max_objects: int,
    classes: Sequence[str],
    *,
    min_size: int = 8,
    margin: int = 2,
    min_objects: int = 1,
    name: str = "",
) -> tuple[np.ndarray, SyntheticImage]:
    """Draw one image of solid rectangles on a flat grey background.

    Steps:
      1. draw the number of objects ``n`` uniformly from ``[min_objects, max_objects]``;
      2. place rectangles one by one by rejection sampling: side lengths are integers in
         ``[min_size, max(min_size, side // 3)]`` (the upper bound shrinks towards ``min_size``
         over the attempts), positions are integers with the rectangle fully inside the image, and
         a candidate is kept only if at least ``margin`` background pixels separate it from every
         placed rectangle (objects may touch the image border). If a rectangle cannot be placed
         the image is full and fewer than ``n`` objects are drawn, but never fewer than
         ``min_objects``;
      3. give each object a distinct colour from :data:`PALETTE` and a uniform random class.

    Args:
        rng: source of randomness; the result is a pure function of its state and the arguments.
        width: image width in pixels, ``>= min_size``.
        height: image height in pixels, ``>= min_size``.
        max_objects: most objects, ``1 <= max_objects <= len(PALETTE)``.
        classes: class names to draw labels from (non-empty).
        min_size: smallest side length of a rectangle, in pixels (``>= 1``).
        margin: background pixels required between two rectangles (``>= 0``).
        min_objects: fewest objects, ``1 <= min_objects <= max_objects``.
        name: stored as ``SyntheticImage.name``.

    Returns:
        ``(image, meta)``: ``image`` is uint8 ``[height, width, 3]`` RGB with background
        :data:`BACKGROUND`; ``meta.objects`` lists the rectangles with boxes in absolute xyxy
        pixel coordinates (pixel ``i`` spans ``[i, i + 1)``).

    Raises:
        ValueError: on invalid arguments, or when ``min_objects`` rectangles do not fit.
    """
    _check_int("width", width, low=1)
    _check_int("height", height, low=1)
    _check_int("min_size", min_size, low=1)
    _check_int("margin", margin, low=0)
    _check_int("max_objects", max_objects, low=1, high=len(PALETTE))
    _check_int("min_objects", min_objects, low=1, high=max_objects)
    if width < min_size or height < min_size:
        raise ValueError(
            f"image size {width}x{height} (width x height) is smaller than min_size={min_size}"
        )
    classes = _check_classes(classes)

    num_wanted = int(rng.integers(min_objects, max_objects + 1))
    rects = _place_rectangles(rng, width, height, num_wanted, min_size, margin)
    if len(rects) < min_objects:
        raise ValueError(
            f"could only place {len(rects)} of min_objects={min_objects} rectangles of side "
            f">= {min_size} with margin {margin} in a {width}x{height} image"
        )
    color_ids = rng.choice(len(PALETTE), size=len(rects), replace=False)
    label_ids = rng.integers(0, len(classes), size=len(rects))

    image = np.empty((height, width, 3), dtype=np.uint8)
    image[...] = BACKGROUND
    objects = []
    for (x0, y0, x1, y1), color_id, label_id in zip(rects, color_ids, label_ids):
        color = PALETTE[int(color_id)]
        image[y0:y1, x0:x1] = color
        box = (float(x0), float(y0), float(x1), float(y1))
        objects.append(SyntheticObject(box_xyxy=box, label=classes[int(label_id)], color=color))
    meta = SyntheticImage(name=name, width=width, height=height, objects=tuple(objects))
    return image, meta


def _place_rectangles(
    rng: np.random.Generator, width: int, height: int, count: int, min_size: int, margin: int
) -> list[tuple[int, int, int, int]]:
    """Up to ``count`` integer xyxy rectangles inside the image, pairwise ``margin`` apart."""
    max_w = max(min_size, width // 3)
    max_h = max(min_size, height // 3)
    rects: list[tuple[int, int, int, int]] = []
    for _ in range(count):
        for attempt in range(_MAX_PLACEMENT_ATTEMPTS):
            shrink = 1.0 - attempt / _MAX_PLACEMENT_ATTEMPTS
            w = int(rng.integers(min_size, max(min_size, int(max_w * shrink)) + 1))
            h = int(rng.integers(min_size, max(min_size, int(max_h * shrink)) + 1))
            x0 = int(rng.integers(0, width - w + 1))
            y0 = int(rng.integers(0, height - h + 1))
            candidate = (x0, y0, x0 + w, y0 + h)
            if all(_separated(candidate, other, margin) for other in rects):
                rects.append(candidate)
                break
        else:
            break  # the image is full: stop instead of trying the remaining objects
    return rects


def _separated(a: tuple[int, int, int, int], b: tuple[int, int, int, int], margin: int) -> bool:
    """Whether at least ``margin`` pixels lie between xyxy rectangles ``a`` and ``b``."""
    return (
        a[2] + margin <= b[0]
        or b[2] + margin <= a[0]
        or a[3] + margin <= b[1]
        or b[3] + margin <= a[1]
    )


# --------------------------------------------------------------------------------------------
# VOC
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# COCO
# --------------------------------------------------------------------------------------------


def write_coco_dataset(
    root: str | os.PathLike[str],
    *,
    num_images: int = 2048,
    size: tuple[SizeSpec, SizeSpec] = (600, 420),
    min_objects: int = 1,
    max_objects: int = 11,
    seed: int = 0,
    classes: Sequence[str] = DEFAULT_CLASSES,
    jpeg_quality: int = 90,
    progress: bool = True,
) -> Path:
    """Write a COCO-style JPEG detection dataset of synthetic scenes.

    Layout::

        root/images/<id:06d>.jpg   JPEG, quality ``jpeg_quality``, 4:2:0 chroma (as most photos)
        root/annotations.json      COCO instances file

    The JSON holds ``info``, ``licenses``, ``images`` (``id`` from 1, ``file_name`` relative to
    ``root/images``, ``width``, ``height``, ``license``), ``annotations`` (``id`` from 1,
    ``image_id``, ``category_id``, ``bbox = [x, y, w, h]`` in absolute pixels with pixel ``i``
    spanning ``[i, i + 1)``, ``area = w * h``, ``iscrowd = 0``, and the rectangle as a
    ``segmentation`` polygon) and ``categories`` (``id`` from 1 in the order of ``classes``,
    ``name``, ``supercategory``). Every image has at least ``min_objects`` annotations. The
    output is the same for the same seed and arguments.

    Args:
        root: output folder, created if missing; existing files of the same names are replaced.
        num_images: number of images (``>= 1``). 2048 images of 600x420 take roughly 10 s.
        size: ``(width, height)``; each entry is a fixed pixel count or an inclusive
            ``(low, high)`` range drawn uniformly per image.
        min_objects: fewest objects per image (``>= 1``).
        max_objects: most objects per image (``<= len(PALETTE)``).
        seed: seed of ``np.random.default_rng``.
        classes: category names; category ``k`` (1-based) is ``classes[k - 1]``.
        jpeg_quality: JPEG quality, 1..100.
        progress: show a tqdm progress bar.

    Returns:
        The path of ``annotations.json`` (the images are in ``root / "images"``).
    """
    _check_int("num_images", num_images, low=1)
    _check_int("jpeg_quality", jpeg_quality, low=1, high=100)
    _check_int("max_objects", max_objects, low=1, high=len(PALETTE))
    _check_int("min_objects", min_objects, low=1, high=max_objects)
    classes = _check_classes(classes)
    _check_size(size)

    root = Path(root)
    images_dir = root / "images"
    images_dir.mkdir(parents=True, exist_ok=True)
    category_ids = {name: k for k, name in enumerate(classes, start=1)}

    rng = np.random.default_rng(seed)
    images: list[dict] = []
    annotations: list[dict] = []
    for image_id in tqdm(
        range(1, num_images + 1), desc="synthetic COCO", unit="img", disable=not progress
    ):
        name = f"{image_id:06d}"
        width, height = _draw_size(rng, size)
        image, meta = make_scene(
            rng, width, height, max_objects, classes, min_objects=min_objects, name=name
        )
        file_name = f"{name}.jpg"
        _save_image(image, images_dir / file_name, jpeg_quality=jpeg_quality, subsampling=2)
        images.append(
            {"id": image_id, "file_name": file_name, "width": width, "height": height, "license": 1}
        )
        for obj in meta.objects:
            x0, y0, x1, y1 = obj.box_xyxy
            w, h = x1 - x0, y1 - y0
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": category_ids[obj.label],
                    "bbox": [x0, y0, w, h],
                    "area": w * h,
                    "iscrowd": 0,
                    "segmentation": [[x0, y0, x1, y0, x1, y1, x0, y1]],
                }
            )

    dataset = {
        "info": {
            "description": "detaug synthetic detection dataset",
            "version": "1.0",
            "contributor": "detaug.synthetic",
            "url": "",
        },
        "licenses": [{"id": 1, "name": "Synthetic data, no restrictions", "url": ""}],
        "images": images,
        "annotations": annotations,
        "categories": [
            {"id": k, "name": name, "supercategory": "object"} for name, k in category_ids.items()
        ],
    }
    annotations_path = root / "annotations.json"
    with annotations_path.open("w", encoding="utf-8") as f:
        json.dump(dataset, f)
    return annotations_path


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def _save_image(image: np.ndarray, path: Path, *, jpeg_quality: int, subsampling: int) -> None:
    """Save uint8 HWC RGB ``image``; JPEG when ``path`` ends in ``.jpg``, else PNG."""
    pil = Image.fromarray(image)
    if path.suffix == ".jpg":
        pil.save(path, format="JPEG", quality=jpeg_quality, subsampling=subsampling)
    else:
        pil.save(path, format="PNG", compress_level=1)


def _draw_size(rng: np.random.Generator, size: tuple[SizeSpec, SizeSpec]) -> tuple[int, int]:
    """``(width, height)`` from a size spec: fixed ints or inclusive ``(low, high)`` ranges."""
    return tuple(_draw_side(rng, side) for side in size)  # type: ignore[return-value]


def _draw_side(rng: np.random.Generator, side: SizeSpec) -> int:
    if isinstance(side, (int, np.integer)):
        return int(side)
    low, high = side
    return int(rng.integers(low, high + 1))


def _check_size(size: object) -> None:
    if not isinstance(size, (tuple, list)) or len(size) != 2:
        raise ValueError(f"size must be (width, height), got {size!r}")
    for axis, side in zip(("width", "height"), size):
        if isinstance(side, (int, np.integer)) and not isinstance(side, bool):
            if side < 1:
                raise ValueError(f"size {axis} must be >= 1, got {side}")
            continue
        if (
            isinstance(side, (tuple, list))
            and len(side) == 2
            and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in side)
            and 1 <= side[0] <= side[1]
        ):
            continue
        raise ValueError(
            f"size {axis} must be an int >= 1 or an inclusive range (low, high) with "
            f"1 <= low <= high, got {side!r}"
        )


def _check_int(
    name: str, value: object, *, low: int | None = None, high: int | None = None
) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise ValueError(f"{name} must be an int, got {value!r}")
    if low is not None and value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    if high is not None and value > high:
        raise ValueError(f"{name} must be <= {high}, got {value}")


def _check_classes(classes: Sequence[str]) -> tuple[str, ...]:
    if isinstance(classes, str):
        raise ValueError(f"classes must be a sequence of names, not the string {classes!r}")
    classes = tuple(classes)
    if not classes:
        raise ValueError("classes must not be empty")
    for c in classes:
        if not isinstance(c, str) or not c:
            raise ValueError(f"class names must be non-empty strings, got {c!r}")
    if len(set(classes)) != len(classes):
        raise ValueError(f"class names must be unique, got {classes!r}")
    return classes


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
