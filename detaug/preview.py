"""Pictures of augmented samples: boxes and class tags drawn on images, laid out in a grid.

Works with NumPy arrays and with PyTorch tensors (anything with ``.detach().cpu().numpy()``);
torch is never imported by this module.

Accepted images (:func:`draw_detections`, :func:`save_preview`)
-----------------------------------------------------------------
* ``PIL.Image.Image`` in any mode (converted to RGB), or
* an array: ``numpy.ndarray``, a torch tensor (any device, any dtype including half/bfloat16),
  or anything ``numpy.asarray`` accepts, shaped

  - ``[H, W]`` (grey),
  - ``[H, W, C]`` (HWC) with ``C`` in ``{1, 3}``, or
  - ``[C, H, W]`` (CHW) with ``C`` in ``{1, 3}``.

  The layout is HWC when the last dimension is 1 or 3, otherwise CHW when the first one is;
  anything else is an error. Channels are RGB.

Pixel values:

* with ``mean``/``std`` (per channel, in 0-255 pixel units, as DALI's
  ``crop_mirror_normalize`` takes them): the image is un-normalized as ``x * std + mean`` and the
  result is read as 0-255. For the torchvision convention ``(x / 255 - m) / s`` pass
  ``mean = 255 * m`` and ``std = 255 * s``;
* otherwise integer arrays must hold values in ``[0, 255]``; floating arrays whose maximum is
  ``<= 1`` are read as ``[0, 1]`` and scaled by 255, others are read as ``[0, 255]``.

Floating values are then clipped to ``[0, 255]`` and rounded to uint8; NaN or infinity is an error.

Boxes are ``[N, 4]`` absolute ``xyxy`` pixel coordinates of the image as given (pixel ``i`` spans
``[i, i + 1)``, the DALI convention); labels are ``[N]`` integer category ids.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Union

import numpy as np
from PIL import Image, ImageDraw, ImageFont

__all__ = ["class_color", "draw_detections", "make_grid", "save_preview"]

ClassNames = Union[Sequence[str], Mapping[int, str], None]
PerChannel = Union[float, Sequence[float], None]

# Twenty bright, distinct colours; class ``k`` is drawn in ``_CLASS_COLORS[k % 20]``.
_CLASS_COLORS: tuple[tuple[int, int, int], ...] = tuple(
    tuple(int(h[i : i + 2], 16) for i in (0, 2, 4))  # type: ignore[misc]
    for h in (
        "FF3838", "2C99A8", "FF9D97", "00C2FF", "FF701F", "344593", "FFB21D", "6473FF", "CFD231",
        "0018EC", "48F90A", "8438FF", "92CC17", "520085", "3DDB86", "CB38FF", "1A9334", "FF95C8",
        "00D4BB", "FF37C7",
    )
)


def class_color(label: int) -> tuple[int, int, int]:
    """RGB colour used to draw boxes and tags of category id ``label`` (same in every image)."""
    return _CLASS_COLORS[int(label) % len(_CLASS_COLORS)]


# --------------------------------------------------------------------------------------------
# Drawing
# --------------------------------------------------------------------------------------------


def draw_detections(
    image: Any,
    boxes_xyxy: Any,
    labels: Any,
    class_names: ClassNames = None,
    *,
    scores: Any = None,
    line_width: int = 2,
    font_size: int | None = None,
    mean: PerChannel = None,
    std: PerChannel = None,
) -> Image.Image:
    """Draw boxes with class tags on an image.

    Each box is outlined with ``line_width`` pixels in :func:`class_color` of its label. The
    outline lies inside the box: a box ``(x0, y0, x1, y1)`` covers the pixels whose centres it
    contains, columns ``ceil(x0 - 0.5) .. ceil(x1 - 0.5) - 1`` (``x0 .. x1 - 1`` for whole-number
    edges), and its outline fills the outermost ``line_width`` of them. Boxes thinner than a pixel
    are drawn one pixel wide; parts outside the image are cut off. A filled tag in the same
    colour, with the class name (and the score, if given) in black or white, sits on top of the
    box's upper-left corner, or just inside the box when there is no room above. Tags are drawn
    after all outlines so no outline crosses a tag.

    Args:
        image: see the module docstring for the accepted types, shapes and value ranges.
        boxes_xyxy: float ``[N, 4]`` absolute ``xyxy`` pixel coordinates (``N`` may be 0; a
            ``[0]`` array counts as empty).
        labels: integer ``[N]`` category ids.
        class_names: names of the category ids. A sequence is indexed by the id itself
            (``class_names[label]``; for 1-based COCO ids pass a mapping or put a placeholder at
            index 0); a mapping is looked up by id. Ids without a name, and all ids when
            ``None``, are shown as numbers.
        scores: optional float ``[N]`` confidences, shown with two decimals after the name.
        line_width: outline width in pixels (``>= 1``).
        font_size: tag text height in pixels; ``None`` scales it with the image
            (``max(12, min(H, W) // 32)``).
        mean: per-channel mean (0-255 units) to undo a normalization; see the module docstring.
        std: per-channel standard deviation (0-255 units) to undo a normalization.

    Returns:
        A new RGB ``PIL.Image.Image`` of the image's size.

    Raises:
        ValueError: on malformed shapes, mismatched lengths, non-finite boxes or out-of-range
            pixel values.
    """
    if not isinstance(line_width, (int, np.integer)) or line_width < 1:
        raise ValueError(f"line_width must be an int >= 1, got {line_width!r}")
    if font_size is not None and (not isinstance(font_size, (int, np.integer)) or font_size < 1):
        raise ValueError(f"font_size must be None or an int >= 1, got {font_size!r}")
    rgb = _to_hwc_uint8(image, mean=mean, std=std)
    boxes, label_ids, score_values = _check_detections(boxes_xyxy, labels, scores)

    canvas = Image.fromarray(rgb)
    height, width = rgb.shape[:2]
    draw = ImageDraw.Draw(canvas)
    font = _load_font(font_size if font_size is not None else max(12, min(height, width) // 32))

    # 1. Outlines, in pixel indices: first and last pixel whose centre lies inside the box.
    first = np.ceil(boxes[:, :2] - 0.5).astype(np.int64)
    last = np.maximum(np.ceil(boxes[:, 2:] - 0.5).astype(np.int64) - 1, first)
    for (left, top), (right, bottom), label in zip(first, last, label_ids):
        if right < 0 or bottom < 0 or left >= width or top >= height:
            continue
        draw.rectangle(
            [int(left), int(top), int(right), int(bottom)],
            outline=class_color(label),
            width=int(line_width),
        )

    # 2. Tags, on top of all outlines.
    for i, ((left, top), (right, bottom), label) in enumerate(zip(first, last, label_ids)):
        if right < 0 or bottom < 0 or left >= width or top >= height:
            continue
        text = _label_name(int(label), class_names)
        if score_values is not None:
            text = f"{text} {score_values[i]:.2f}"
        _draw_tag(draw, font, text, class_color(label), int(left), int(top), width, height)
    return canvas


def _draw_tag(
    draw: ImageDraw.ImageDraw,
    font: ImageFont.ImageFont | ImageFont.FreeTypeFont,
    text: str,
    color: tuple[int, int, int],
    box_left: int,
    box_top: int,
    width: int,
    height: int,
) -> None:
    """Filled tag with ``text`` above the box corner (inside the box if no room above)."""
    text_box = draw.textbbox((0, 0), text, font=font)
    line_box = draw.textbbox((0, 0), "Ag|", font=font)  # same tag height for every text
    pad_x = max(2, (line_box[3] - line_box[1]) // 4)
    pad_y = max(1, (line_box[3] - line_box[1]) // 8)
    tag_w = (text_box[2] - text_box[0]) + 2 * pad_x
    tag_h = (line_box[3] - line_box[1]) + 2 * pad_y

    x = min(max(box_left, 0), max(width - tag_w, 0))
    y = box_top - tag_h if box_top - tag_h >= 0 else max(box_top, 0)
    draw.rectangle([x, y, x + tag_w - 1, y + tag_h - 1], fill=color)
    text_color = _text_color_on(color)
    draw.text((x + pad_x - text_box[0], y + pad_y - line_box[1]), text, fill=text_color, font=font)


def _text_color_on(color: tuple[int, int, int]) -> tuple[int, int, int]:
    """Black or white, whichever has the higher WCAG contrast ratio on ``color``."""
    linear = [(c / 255) / 12.92 if c <= 10 else ((c / 255 + 0.055) / 1.055) ** 2.4 for c in color]
    luminance = 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]
    # contrast with black (luminance + 0.05) / 0.05 vs with white 1.05 / (luminance + 0.05)
    return (0, 0, 0) if (luminance + 0.05) ** 2 > 0.05 * 1.05 else (255, 255, 255)


def _load_font(size: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    """Pillow's default font at ``size`` pixels (its fixed bitmap font on Pillow < 10.1)."""
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1 has no size argument
        return ImageFont.load_default()


def _label_name(label: int, class_names: ClassNames) -> str:
    if class_names is None:
        return str(label)
    if isinstance(class_names, Mapping):
        return str(class_names.get(label, label))
    if 0 <= label < len(class_names):
        return str(class_names[label])
    return str(label)


def _check_detections(
    boxes_xyxy: Any, labels: Any, scores: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """float64 ``[N, 4]`` boxes, int64 ``[N]`` labels and float64 ``[N]`` scores (or None)."""
    boxes = _to_numpy(boxes_xyxy).astype(np.float64)
    if boxes.size == 0:
        boxes = boxes.reshape(0, 4)
    if boxes.ndim != 2 or boxes.shape[1] != 4:
        raise ValueError(f"boxes_xyxy must have shape [N, 4], got {list(boxes.shape)}")
    if not np.isfinite(boxes).all():
        raise ValueError("boxes_xyxy must be finite")
    label_ids = _to_numpy(labels).reshape(-1)
    if label_ids.size and not np.issubdtype(label_ids.dtype, np.integer):
        if not np.array_equal(label_ids, np.round(label_ids)):
            raise ValueError(f"labels must be integer category ids, got dtype {label_ids.dtype}")
    label_ids = label_ids.astype(np.int64)
    if len(label_ids) != len(boxes):
        raise ValueError(f"got {len(boxes)} boxes but {len(label_ids)} labels")
    score_values = None
    if scores is not None:
        score_values = _to_numpy(scores).reshape(-1).astype(np.float64)
        if len(score_values) != len(boxes):
            raise ValueError(f"got {len(boxes)} boxes but {len(score_values)} scores")
    return boxes, label_ids, score_values


# --------------------------------------------------------------------------------------------
# Grids and files
# --------------------------------------------------------------------------------------------


def make_grid(
    images: Sequence[Image.Image],
    *,
    ncols: int | None = None,
    pad: int = 4,
    background: tuple[int, int, int] = (255, 255, 255),
) -> Image.Image:
    """Lay images out in a grid, row by row.

    Every cell is as large as the largest image (``cell_w = max width``, ``cell_h = max height``);
    each image is centred in its cell. The result has size
    ``(ncols * cell_w + (ncols + 1) * pad, nrows * cell_h + (nrows + 1) * pad)`` (width, height)
    with ``nrows = ceil(len(images) / ncols)``.

    Args:
        images: PIL images (any mode, converted to RGB); at least one.
        ncols: columns; ``None`` picks ``ceil(sqrt(len(images)))``. At most ``len(images)`` columns
            are used.
        pad: background pixels around and between cells (``>= 0``).
        background: RGB colour of the padding and of unused cell area.

    Returns:
        A new RGB ``PIL.Image.Image``.
    """
    images = list(images)
    if not images:
        raise ValueError("make_grid needs at least one image")
    for i, im in enumerate(images):
        if not isinstance(im, Image.Image):
            raise ValueError(f"images[{i}] must be a PIL.Image.Image, got {type(im).__name__}")
    if ncols is None:
        ncols = math.ceil(math.sqrt(len(images)))
    if not isinstance(ncols, (int, np.integer)) or ncols < 1:
        raise ValueError(f"ncols must be None or an int >= 1, got {ncols!r}")
    if not isinstance(pad, (int, np.integer)) or pad < 0:
        raise ValueError(f"pad must be an int >= 0, got {pad!r}")
    ncols = min(int(ncols), len(images))
    nrows = math.ceil(len(images) / ncols)
    cell_w = max(im.width for im in images)
    cell_h = max(im.height for im in images)

    grid = Image.new(
        "RGB",
        (ncols * cell_w + (ncols + 1) * pad, nrows * cell_h + (nrows + 1) * pad),
        tuple(background),
    )
    for i, im in enumerate(images):
        row, col = divmod(i, ncols)
        x = pad + col * (cell_w + pad) + (cell_w - im.width) // 2
        y = pad + row * (cell_h + pad) + (cell_h - im.height) // 2
        grid.paste(im.convert("RGB"), (x, y))
    return grid


def save_preview(
    path: str | os.PathLike[str],
    images: Any,
    targets: Sequence[Mapping[str, Any]] | None,
    class_names: ClassNames = None,
    *,
    ncols: int | None = None,
    mean: PerChannel = None,
    std: PerChannel = None,
    line_width: int = 2,
    font_size: int | None = None,
) -> Path:
    """Draw a batch of samples with their boxes and write them as one PNG grid.

    Args:
        path: output file; written as PNG whatever its suffix; parent folders are created.
        images: a batch, either one array/tensor ``[B, 3, H, W]`` or ``[B, H, W, 3]`` (e.g. a
            DALI/PyTorch batch, float normalized or uint8), or a sequence of per-sample images
            (each as accepted by :func:`draw_detections`; sizes may differ).
        targets: one dict per sample with ``"boxes"`` (``[N, 4]`` absolute ``xyxy`` pixels of
            that sample's image), ``"labels"`` (``[N]`` category ids) and optionally
            ``"scores"`` (``[N]``); torch or NumPy. ``None`` draws the images without boxes.
        class_names: see :func:`draw_detections`.
        ncols: grid columns, see :func:`make_grid`.
        mean: per-channel mean in 0-255 pixel units (e.g. ``(0.485 * 255, 0.456 * 255,
            0.406 * 255)``) to undo the normalization ``(x - mean) / std`` before drawing.
        std: per-channel standard deviation in 0-255 pixel units.
        line_width: box outline width, see :func:`draw_detections`.
        font_size: tag text size, see :func:`draw_detections`.

    Returns:
        ``Path(path)``.
    """
    samples = _split_batch(images)
    if targets is not None and len(targets) != len(samples):
        raise ValueError(f"got {len(samples)} images but {len(targets)} targets")
    drawn = []
    for i, sample in enumerate(samples):
        if targets is None:
            boxes, labels, scores = np.zeros((0, 4)), np.zeros((0,), np.int64), None
        else:
            target = targets[i]
            missing = {"boxes", "labels"} - set(target)
            if missing:
                raise ValueError(f"targets[{i}] lacks {sorted(missing)}; it has {sorted(target)}")
            boxes, labels, scores = target["boxes"], target["labels"], target.get("scores")
        drawn.append(
            draw_detections(
                sample,
                boxes,
                labels,
                class_names,
                scores=scores,
                line_width=line_width,
                font_size=font_size,
                mean=mean,
                std=std,
            )
        )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    make_grid(drawn, ncols=ncols).save(path, format="PNG")
    return path


def _split_batch(images: Any) -> list[Any]:
    """Per-sample images from a 4-D batch or a sequence of samples."""
    if isinstance(images, (list, tuple)):
        samples = list(images)
    else:
        batch = _to_numpy(images)
        if batch.ndim != 4:
            raise ValueError(
                f"a batch must have shape [B, 3, H, W] or [B, H, W, 3], got {list(batch.shape)}; "
                "pass a list for single images"
            )
        samples = list(batch)
    if not samples:
        raise ValueError("images is empty")
    return samples


# --------------------------------------------------------------------------------------------
# Conversion
# --------------------------------------------------------------------------------------------


def _to_numpy(x: Any) -> np.ndarray:
    """NumPy view/copy of an array-like; torch tensors go through ``.detach().cpu()``."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        x = x.detach().cpu()
        if x.dtype.is_floating_point:  # half and bfloat16 have no NumPy equivalent
            x = x.float()
        return x.numpy()
    return np.asarray(x)


def _to_hwc_uint8(image: Any, *, mean: PerChannel = None, std: PerChannel = None) -> np.ndarray:
    """uint8 ``[H, W, 3]`` RGB from any accepted image (see the module docstring)."""
    if isinstance(image, Image.Image):
        if mean is not None or std is not None:
            raise ValueError("mean/std apply to normalized arrays, not to PIL images")
        return np.asarray(image.convert("RGB"))
    array = _to_numpy(image)
    if array.ndim == 2:
        array = array[:, :, None]
    elif array.ndim == 3:
        if array.shape[-1] not in (1, 3):
            if array.shape[0] not in (1, 3):
                raise ValueError(
                    f"image must be [H, W], [H, W, C] or [C, H, W] with C in {{1, 3}}, "
                    f"got shape {list(array.shape)}"
                )
            array = np.moveaxis(array, 0, -1)
    else:
        raise ValueError(
            f"image must be [H, W], [H, W, C] or [C, H, W] with C in {{1, 3}}, "
            f"got shape {list(array.shape)}"
        )
    if array.dtype == np.bool_ or not (
        np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)
    ):
        raise ValueError(f"image dtype must be integer or floating, got {array.dtype}")

    if mean is not None or std is not None:
        channels = array.shape[-1]
        mean_v = _per_channel("mean", 0.0 if mean is None else mean, channels)
        std_v = _per_channel("std", 1.0 if std is None else std, channels)
        if np.any(std_v == 0):
            raise ValueError(f"std must be non-zero, got {std}")
        array = array.astype(np.float64) * std_v + mean_v
    elif array.dtype == np.uint8:
        pass
    elif np.issubdtype(array.dtype, np.integer):
        if array.size and (array.min() < 0 or array.max() > 255):
            raise ValueError(
                f"integer image values must be in [0, 255], got [{array.min()}, {array.max()}]"
            )
    else:
        array = array.astype(np.float64)
        if array.size and np.isfinite(array).all() and array.max() <= 1.0:
            array = array * 255.0

    if np.issubdtype(array.dtype, np.floating):
        if not np.isfinite(array).all():
            raise ValueError("image values must be finite")
        array = np.clip(np.rint(array), 0, 255)
    array = array.astype(np.uint8)
    if array.shape[-1] == 1:
        array = np.repeat(array, 3, axis=-1)
    return np.ascontiguousarray(array)


def _per_channel(name: str, value: float | Sequence[float], channels: int) -> np.ndarray:
    """``value`` as float64 ``[channels]`` (a scalar or one value per channel)."""
    v = np.asarray(_to_numpy(value), dtype=np.float64).reshape(-1)
    if v.size == 1:
        v = np.repeat(v, channels)
    if v.size != channels:
        raise ValueError(f"{name} needs 1 or {channels} values, got {v.size}")
    return v
