"""Blur: ``GaussianBlur`` (pixel values only, boxes unchanged)."""

from __future__ import annotations

from typing import Any

import numpy as np

from detaug.seeds import SampleRandom
from detaug.transforms.base import Param, PhotometricTransform, register
from detaug.transforms.schema import REQUIRED

__all__ = ["GaussianBlur", "NEUTRAL_SIGMA"]

#: The sigma of a sample that is not blurred: every tap but the centre weighs ``exp(-5000) = 0``
#: in float, so DALI's blur returns the image bit for bit.
NEUTRAL_SIGMA = 0.01


@register
class GaussianBlur(PhotometricTransform):
    """Gaussian blur with a random ``sigma`` per sample (torchvision ``GaussianBlur``;
    albumentations ``GaussianBlur`` draws the kernel size too, detaug keeps it fixed).

    ``kernel_size``: an odd int, or ``[kx, ky]`` (width, height) as torchvision. ``sigma``: a
    fixed value or a ``[min, max]`` range drawn uniformly per sample (the same for x and y).
    Applied with probability ``p`` (torchvision has no ``p``: 1). One DALI ``gaussian_blur``
    with per-sample sigma; borders are mirrored (DALI's ``reflect 101``, torchvision's
    ``reflect``).
    """

    schema = (
        Param("kernel_size", "values", REQUIRED, "odd kernel size, or [kx, ky] (width, height)", lengths=(2,),
              low=1, integer=True),
        Param("sigma", "values", (0.1, 2.0), "sigma, or a [min, max] range drawn per sample", lengths=(2,), low=0),
        Param("p", "probability", 1.0, "probability of blurring a sample"),
    )
    param_names = ("sigma",)
    neutral = (NEUTRAL_SIGMA,)

    def setup(self) -> None:
        kx, ky = self.kernel_size * 2 if len(self.kernel_size) == 1 else self.kernel_size
        if kx % 2 == 0 or ky % 2 == 0:
            raise self.error("kernel_size", f"must be odd, got {list(self.kernel_size)!r}")
        self.kernel_size = (kx, ky) if kx != ky else kx
        lo, hi = self.sigma * 2 if len(self.sigma) == 1 else self.sigma
        if not 0 < lo <= hi:
            raise self.error("sigma", f"need 0 < min <= max, got {list(self.sigma)!r}")
        self.sigma = (lo, hi)

    def plan(self, rand: SampleRandom) -> list[np.ndarray]:
        apply = rand.random() < self.p
        sigma = rand.uniform(*self.sigma)
        return [np.where(apply, sigma, NEUTRAL_SIGMA).astype(np.float32)]

    def dali(self, images: Any, params: list[Any]) -> Any:
        from nvidia.dali import fn

        k = self.kernel_size
        kx, ky = (k, k) if isinstance(k, int) else k
        return fn.gaussian_blur(images, window_size=[ky, kx], sigma=params[0])  # DALI: layout order (H, W)
