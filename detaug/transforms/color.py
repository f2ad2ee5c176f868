"""Photometric transforms of colour: pixel values only, boxes unchanged.

They run after all geometric transforms, on the output canvas (fewer pixels to touch), and
therefore also act on areas painted with ``fill``. Images are HWC uint8 RGB; every DALI op here
keeps uint8 (rounded to nearest and saturated; torchvision truncates its uint8 results, so
values may differ by one grey level).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from detaug.seeds import SampleRandom
from detaug.transforms.base import Param, PhotometricTransform, on_device_of, register

__all__ = ["ColorJitter", "RandomPhotometricDistort", "Grayscale", "RandomGrayscale", "LUMA"]

#: ITU-R 601-2 luma weights of (R, G, B), as torchvision's ``rgb_to_grayscale``.
LUMA = (0.2989, 0.587, 0.114)

#: The 6 permutations of 3 channels (``RandomPhotometricDistort``'s channel shuffle).
PERMUTATIONS = np.array([[0, 1, 2], [0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]], dtype=np.float32)


def contrast_about_mean(images: Any, factor: Any) -> Any:
    """torchvision's ``adjust_contrast`` in DALI: ``factor * x + (1 - factor) * mean``, where
    ``mean`` is the sample's mean luma (:data:`LUMA`), saturated to uint8. ``factor``: a
    per-sample scalar DataNode; 1 leaves the image as it is."""
    import nvidia.dali.math as dmath
    from nvidia.dali import fn, types

    mean = fn.reductions.mean(fn.coord_transform(images, M=list(LUMA), dtype=types.FLOAT))
    f = on_device_of(factor, images)
    return fn.cast(dmath.clamp(images * f + mean * (1.0 - f), 0.0, 255.0), dtype=types.UINT8)


@register
class ColorJitter(PhotometricTransform):
    """Random brightness, contrast, saturation and hue, as torchvision ``ColorJitter``.

    ``brightness``, ``contrast``, ``saturation``: ``v`` means a factor drawn from
    ``[max(0, 1 - v), 1 + v]`` (or give ``(min, max)``); 1 keeps the image. ``hue``: ``v`` in
    ``[0, 0.5]`` means a shift drawn from ``[-v, v]`` of the full hue circle. Applied with
    probability ``p``. Runs as one DALI ``color_twist`` (whose contrast pivots on mid-grey, not on
    the image's mean grey as torchvision's; its hue turns in YIQ space, not HSV; the four run in
    a fixed order, not torchvision's random one).
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
    neutral = (1.0, 1.0, 1.0, 0.0)

    def setup(self) -> None:
        self.brightness, self.contrast, self.saturation = (
            (max(0.0, lo), hi) for lo, hi in (self.brightness, self.contrast, self.saturation)
        )

    def plan(self, rand: SampleRandom) -> list[np.ndarray]:
        apply = rand.random() < self.p
        out = []
        for (lo, hi), neutral in zip((self.brightness, self.contrast, self.saturation, self.hue), self.neutral):
            out.append(np.where(apply, rand.uniform(lo, hi), neutral).astype(np.float32))
        out[3] *= 360.0  # DALI takes hue in degrees
        return out

    def dali(self, images: Any, params: list[Any]) -> Any:
        from nvidia.dali import fn

        brightness, contrast, saturation, hue = params
        return fn.color_twist(images, brightness=brightness, contrast=contrast, saturation=saturation, hue=hue)

    def dali_float(self, images: Any, params: list[Any]) -> Any:
        """The same ``color_twist`` with float32 output, clamped to [0, 255] (on the CPU, half
        the time of its uint8 output: docs/benchmarks.md, "The CPU path")."""
        import nvidia.dali.math as dmath
        from nvidia.dali import fn, types

        brightness, contrast, saturation, hue = params
        twisted = fn.color_twist(images, brightness=brightness, contrast=contrast, saturation=saturation, hue=hue,
                                 dtype=types.FLOAT)
        return dmath.clamp(twisted, 0.0, 255.0)


@register
class RandomPhotometricDistort(PhotometricTransform):
    """SSD's photometric distortion, as torchvision ``RandomPhotometricDistort``.

    Each of brightness, contrast, saturation and hue is applied with probability ``p`` (factors
    drawn from the given ``(min, max)`` ranges, hue as a fraction of the circle), contrast either
    before saturation and hue or after them (even odds), then, with probability ``p``, the
    channels are shuffled by a random permutation. Order: brightness, contrast (before),
    saturation and hue, contrast (after), permutation; each step saturates to uint8 as
    torchvision's.

    DALI ops: ``brightness_contrast`` (brightness), a mean-luma contrast (arithmetic, pivot on
    the image's mean grey as torchvision's ``adjust_contrast``), ``hsv`` (saturation: the same
    blend with the grey image as torchvision; hue: a rotation in YIQ space, an approximation of
    torchvision's HSV hue shift) and ``coord_transform`` with a per-sample permutation matrix
    (exact). Every sample runs every op, with neutral values where a step is not drawn.
    """

    schema = (
        Param("brightness", "range", (0.875, 1.125), "brightness factor range", low=0),
        Param("contrast", "range", (0.5, 1.5), "contrast factor range", low=0),
        Param("saturation", "range", (0.5, 1.5), "saturation factor range", low=0),
        Param("hue", "range", (-0.05, 0.05), "hue shift range as a fraction of the circle", low=-0.5, high=0.5),
        Param("p", "probability", 0.5, "probability of each distortion (and of the channel permutation)"),
    )
    param_names = ("brightness", "contrast_before", "saturation", "hue", "contrast_after", "perm0", "perm1", "perm2")
    neutral = (1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 2.0)

    def plan(self, rand: SampleRandom) -> list[np.ndarray]:
        applied = rand.random(4) < self.p  # brightness, contrast, saturation, hue
        values = [rand.uniform(lo, hi) for lo, hi in (self.brightness, self.contrast, self.saturation, self.hue)]
        before = rand.random() < 0.5
        permute = rand.random() < self.p
        perm = np.where(permute[:, None], PERMUTATIONS[rand.integers(len(PERMUTATIONS))], PERMUTATIONS[0])
        brightness, contrast, saturation, hue = (np.where(applied[:, k], v, n) for k, (v, n) in
                                                 enumerate(zip(values, (1.0, 1.0, 1.0, 0.0))))
        out = [brightness, np.where(before, contrast, 1.0), saturation, hue * 360.0, np.where(before, 1.0, contrast)]
        out += [perm[:, 0], perm[:, 1], perm[:, 2]]
        return [np.asarray(x, dtype=np.float32) for x in out]

    def dali(self, images: Any, params: list[Any]) -> Any:
        from nvidia.dali import fn, types

        brightness, contrast_before, saturation, hue, contrast_after, *perm = params
        images = fn.brightness_contrast(images, brightness=brightness)
        images = contrast_about_mean(images, contrast_before)
        images = fn.hsv(images, hue=hue, saturation=saturation)
        images = contrast_about_mean(images, contrast_after)
        # row i of the matrix picks input channel perm[i]: out[..., i] = in[..., perm[i]]
        matrix = fn.one_hot(fn.cast(fn.stack(*perm), dtype=types.INT32), num_classes=3, dtype=types.FLOAT)
        return fn.coord_transform(images, M=matrix, dtype=types.UINT8)


def _grayscale_dali(images: Any, weight: Any) -> Any:
    """``weight * luma + (1 - weight) * image`` per channel (weight 1: grey, 0: unchanged), one
    ``coord_transform`` with a per-sample 3x3 matrix; uint8."""
    from nvidia.dali import fn, types

    grey = types.Constant(np.tile(np.asarray(LUMA, dtype=np.float32), (3, 1)))
    eye = types.Constant(np.eye(3, dtype=np.float32))
    return fn.coord_transform(images, M=weight * grey + (1.0 - weight) * eye, dtype=types.UINT8)


@register
class Grayscale(PhotometricTransform):
    """Convert to grey, ITU-R 601-2 luma ``0.2989 R + 0.587 G + 0.114 B`` (torchvision
    ``Grayscale``; albumentations ``ToGray``), one DALI ``coord_transform``.

    ``num_output_channels=3`` (the default here; torchvision's is 1) repeats the grey level in
    R, G and B, so that the rest of a detection recipe sees RGB. With 1, the output has one
    channel: put no ``Normalize`` (3 means) after it, nor use it inside a composition (it cannot
    be skipped for some samples of a batch only).
    """

    schema = (Param("num_output_channels", "choice", 3, "1 (one grey channel) or 3 (grey in R, G, B)", choices=(1, 3)),)
    param_names = ("grayscale",)
    neutral = (0.0,)

    def setup(self) -> None:
        if self.num_output_channels == 1:
            self.neutral = None

    def plan(self, rand: SampleRandom) -> list[np.ndarray]:
        return [np.ones(rand.batch_size, dtype=np.float32)]

    def dali(self, images: Any, params: list[Any]) -> Any:
        from nvidia.dali import fn, types

        if self.num_output_channels == 1:
            return fn.coord_transform(images, M=list(LUMA), dtype=types.UINT8)
        return _grayscale_dali(images, params[0])


@register
class RandomGrayscale(PhotometricTransform):
    """Convert to grey with probability ``p`` (torchvision ``RandomGrayscale``; the output keeps
    3 channels, the grey level in each; luma as :class:`Grayscale`)."""

    schema = (Param("p", "probability", 0.1, "probability of converting a sample to grey"),)
    param_names = ("grayscale",)
    neutral = (0.0,)

    def plan(self, rand: SampleRandom) -> list[np.ndarray]:
        return [(rand.random() < self.p).astype(np.float32)]

    def dali(self, images: Any, params: list[Any]) -> Any:
        return _grayscale_dali(images, params[0])
