"""The type rules of sample lists: what Python objects a :class:`~detaug.sources.SampleListSource` takes.

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

import os
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = [
    "IMAGE_TYPES",
    "SAMPLE_FIELDS",
    "describe_type",
    "image_input",
    "sample_fields",
]

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
