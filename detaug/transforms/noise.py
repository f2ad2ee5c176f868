"""Noise: ``GaussNoise`` (pixel values only, boxes unchanged), drawn by a counter-based hash.

DALI's own noise operators (``fn.noise.gaussian``) draw from DALI's generator: one state per
operator, advanced per batch and split by the sample's position in the batch, so a sample's noise
would depend on its batch-mates and on the iteration, against the seed contract
(:mod:`detaug.seeds`). Here the noise is a pure function of a per-sample 32-bit key planned from
``(seed, epoch, image_id)`` and of the pixel's ``(row, column, channel)``: a 32-bit integer hash
(``lowbias32``) of the coordinates and the key gives two uniforms, Box-Muller turns them into a
standard normal. It is plain DALI arithmetic (``uint32`` products wrap modulo ``2**32``), so the
same on CPU and GPU up to the last bit of ``log``/``cos`` (a grey level at a rounding edge).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from detaug.seeds import SampleRandom
from detaug.transforms.base import Param, PhotometricTransform, on_device_of, register

__all__ = ["GaussNoise", "hash_normal", "lowbias32"]

#: Longest image side the noise coordinates cover (rows and columns are cut from one ``arange``).
MAX_SIDE = 1 << 16


def lowbias32(x: Any, u32: Any) -> Any:
    """Chris Wellons' ``lowbias32`` integer hash on ``uint32`` values (DataNodes or NumPy
    arrays): ``u32(v)`` makes a ``uint32`` constant of the same kind; ``x >> k`` is ``x // 2**k``."""
    x = x ^ (x // u32(1 << 16))
    x = x * u32(0x7FEB352D)
    x = x ^ (x // u32(1 << 15))
    x = x * u32(0x846CA68B)
    return x ^ (x // u32(1 << 16))


def hash_normal(images: Any, key: Any, per_channel: bool) -> Any:
    """Standard normal float32 noise ``[H, W, C]`` (``[H, W, 1]`` unless ``per_channel``) for
    HWC ``images``, a pure function of the sample's ``uint32`` ``key`` (a CPU DataNode) and of
    each pixel's (row, column, channel). Uniforms have 24 bits: tails are cut at about 5.8 sigma."""
    import nvidia.dali.math as dmath
    from nvidia.dali import fn, types

    device = "gpu" if getattr(images, "device", "cpu") == "gpu" else "cpu"

    def u32(v: int) -> Any:
        return types.Constant(np.uint32(v), dtype=types.UINT32)

    shape = images.shape(dtype=types.INT32)  # [H, W, C], on the CPU
    iota = types.Constant(np.arange(MAX_SIDE, dtype=np.uint32), device=device)
    rows = fn.reshape(fn.slice(iota, shape[0:1] * 0, shape[0:1], axes=[0]), shape=[-1, 1, 1])
    cols = fn.reshape(fn.slice(iota, shape[1:2] * 0, shape[1:2], axes=[0]), shape=[1, -1, 1])
    channels = np.arange(3 if per_channel else 1, dtype=np.uint32).reshape(1, 1, -1)
    index = (rows * u32(MAX_SIDE) + cols) * u32(4) + types.Constant(channels, device=device)
    h1 = lowbias32(index ^ on_device_of(key, images), u32)
    h2 = lowbias32(h1 + u32(0x9E3779B9), u32)
    u1 = (h1 // u32(256)) * 2.0**-24 + 2.0**-25  # (0, 1): log is finite
    u2 = (h2 // u32(256)) * 2.0**-24
    return dmath.sqrt(-2.0 * dmath.log(u1)) * dmath.cos((2.0 * math.pi) * u2)


@register
class GaussNoise(PhotometricTransform):
    """Add Gaussian noise (albumentations ``GaussNoise``; torchvision ``GaussianNoise``).

    ``std``: a ``[min, max]`` range of the standard deviation **in grey levels (0-255)**, drawn per
    sample (albumentations' ``std_range`` is this divided by 255); ``mean``: the noise mean in
    grey levels; ``per_channel``: independent noise per channel (else one value for R, G and B).
    Applied with probability ``p``; the result is rounded and saturated to uint8. The noise is a
    pure function of the sample's key and the pixel's position (see :mod:`detaug.transforms.noise`).
    """

    schema = (
        Param("std", "range", (5.0, 25.0), "noise standard deviation range, in grey levels (0-255)", low=0, high=255),
        Param("mean", "number", 0.0, "noise mean, in grey levels", low=-255, high=255),
        Param("per_channel", "bool", True, "independent noise per channel (else the same for R, G, B)"),
        Param("p", "probability", 0.5, "probability of adding noise to a sample"),
    )
    param_names = ("std", "mean", "key_low", "key_high")
    neutral = (0.0, 0.0, 0.0, 0.0)

    def plan(self, rand: SampleRandom) -> list[np.ndarray]:
        apply = rand.random() < self.p
        std = np.where(apply, rand.uniform(*self.std), 0.0)
        mean = np.where(apply, self.mean, 0.0)
        key = rand.integers(1 << 16, 2)  # two 16-bit halves: exact in float32
        return [np.asarray(x, dtype=np.float32) for x in (std, mean, key[:, 0], key[:, 1])]

    def dali(self, images: Any, params: list[Any]) -> Any:
        import nvidia.dali.math as dmath
        from nvidia.dali import fn, types

        std, mean, key_low, key_high = params
        key = fn.cast(key_high, dtype=types.UINT32) * types.Constant(np.uint32(1 << 16), dtype=types.UINT32) \
            + fn.cast(key_low, dtype=types.UINT32)
        noise = hash_normal(images, key, self.per_channel)
        out = images + on_device_of(mean, images) + on_device_of(std, images) * noise
        return fn.cast(dmath.clamp(out, 0.0, 255.0), dtype=types.UINT8)
