"""Photometric transforms: pixel values only, boxes unchanged.

They run after all geometric transforms, on the output canvas (fewer pixels to touch), and
therefore also act on areas painted with ``fill``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from detaug.seeds import SampleRandom
from detaug.transforms.base import Param, PhotometricTransform, register

__all__ = ["ColorJitter"]


@register
class ColorJitter(PhotometricTransform):
    """Random brightness, contrast, saturation and hue, as torchvision ``ColorJitter``.

    ``brightness``, ``contrast``, ``saturation``: ``v`` means a factor drawn from
    ``[max(0, 1 - v), 1 + v]`` (or give ``(min, max)``); 1 keeps the image. ``hue``: ``v`` in
    ``[0, 0.5]`` means a shift drawn from ``[-v, v]`` of the full hue circle. Applied with
    probability ``p``. Runs as one DALI ``color_twist`` (whose contrast pivots on mid-grey).
    """

    schema = (
        Param("brightness", "range", 0, "brightness factor range; v means [max(0, 1 - v), 1 + v]", center=1.0),
        Param("contrast", "range", 0, "contrast factor range; v means [max(0, 1 - v), 1 + v]", center=1.0),
        Param("saturation", "range", 0, "saturation factor range; v means [max(0, 1 - v), 1 + v]", center=1.0),
        Param("hue", "range", 0, "hue shift range as a fraction of the circle; v means [-v, v]", center=0.0,
              low=-0.5, high=0.5),
        Param("p", "probability", 1.0, "probability of applying the transform to a sample"),
    )
    param_names = ("brightness", "contrast", "saturation", "hue")

    def setup(self) -> None:
        self.brightness, self.contrast, self.saturation = (
            (max(0.0, lo), hi) for lo, hi in (self.brightness, self.contrast, self.saturation)
        )

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
