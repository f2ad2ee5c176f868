"""Synthetic scenes: one image of solid rectangles in memory, with exactly known boxes, and the
checks and size rules every synthetic dataset writer shares.

Every image is a flat grey background with solid-coloured, non-overlapping rectangles. Each object
in an image has its own colour from :data:`PALETTE`, so its pixels can be found again by colour
after augmentation, and its box is known exactly because the rectangle has integer pixel edges.
Box conventions: :mod:`detaug.synthetic`. The writers are :mod:`detaug.synthetic_voc` and
:mod:`detaug.synthetic_coco`; every public name is importable from :mod:`detaug.synthetic`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Union

import numpy as np
from PIL import Image

__all__ = [
    "BACKGROUND",
    "DEFAULT_CLASSES",
    "PALETTE",
    "SizeSpec",
    "SyntheticImage",
    "SyntheticObject",
    "make_scene",
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

