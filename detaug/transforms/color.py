"""Photometric transforms: pixel values only, boxes unchanged.

They run after all geometric transforms, on the output canvas (fewer pixels to touch), and
therefore also act on areas painted with ``fill``.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from detaug.seeds import SampleRandom
from detaug.transforms.base import PhotometricTransform, register, validate_probability, validate_range

__all__ = ["ColorJitter", "Normalize", "IMAGENET_MEAN", "IMAGENET_STD"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@register
class ColorJitter(PhotometricTransform):
    """Random brightness, contrast, saturation and hue, as torchvision ``ColorJitter``.

    ``brightness``, ``contrast``, ``saturation``: ``v`` means a factor drawn from
    ``[max(0, 1 - v), 1 + v]`` (or give ``(min, max)``); 1 keeps the image. ``hue``: ``v`` in
    ``[0, 0.5]`` means a shift drawn from ``[-v, v]`` of the full hue circle. Applied with
    probability ``p``. Runs as one DALI ``color_twist`` (whose contrast pivots on mid-grey).
    """

    param_names = ("brightness", "contrast", "saturation", "hue")

    def __init__(
        self,
        brightness: float | Sequence[float] = 0,
        contrast: float | Sequence[float] = 0,
        saturation: float | Sequence[float] = 0,
        hue: float | Sequence[float] = 0,
        p: float = 1.0,
    ) -> None:
        self.brightness = validate_range("brightness", brightness, center=1.0)
        self.contrast = validate_range("contrast", contrast, center=1.0)
        self.saturation = validate_range("saturation", saturation, center=1.0)
        self.brightness, self.contrast, self.saturation = (
            (max(0.0, lo), hi) for lo, hi in (self.brightness, self.contrast, self.saturation)
        )
        self.hue = validate_range("hue", hue, center=0.0)
        if not -0.5 <= self.hue[0] <= self.hue[1] <= 0.5:
            raise ValueError(f"hue values must be between -0.5 and 0.5, got {hue!r}")
        self.p = validate_probability(p)

    def plan(self, rand: SampleRandom) -> list[np.ndarray]:
        apply = rand.random() < self.p
        out = []
        for (lo, hi), neutral in ((self.brightness, 1.0), (self.contrast, 1.0), (self.saturation, 1.0), (self.hue, 0.0)):
            out.append(np.where(apply, rand.uniform(lo, hi), neutral).astype(np.float32))
        out[3] *= 360.0  # DALI takes hue in degrees
        return out

    def dali(self, images: Any, params: list[Any]) -> Any:
        from nvidia.dali import fn

        brightness, contrast, saturation, hue = params
        return fn.color_twist(images, brightness=brightness, contrast=contrast, saturation=saturation, hue=hue)


@register
class Normalize(PhotometricTransform):
    """``(image / 255 - mean) / std`` per channel, to float32 (torchvision ``Normalize`` after
    ``ToDtype(float32, scale=True)``). Must be the last transform of a ``Compose``."""

    def __init__(self, mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD) -> None:
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        if len(self.mean) != 3 or len(self.std) != 3:
            raise ValueError(f"mean and std need 3 values (RGB), got {mean!r} and {std!r}")
        if min(self.std) <= 0:
            raise ValueError(f"std values must be positive, got {std!r}")

    def dali(self, images: Any, params: list[Any]) -> Any:  # applied by the pipeline with the layout
        raise NotImplementedError("Normalize is fused into the pipeline's output step")
