"""The output stage: ``Normalize`` (float32, per-channel mean and std) and the layout."""

from __future__ import annotations

from typing import Any

from detaug.transforms.base import OutputTransform, Param, register

__all__ = ["Normalize", "IMAGENET_MEAN", "IMAGENET_STD"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@register
class Normalize(OutputTransform):
    """``(image / 255 - mean) / std`` per channel, to float32 (torchvision ``Normalize`` after
    ``ToDtype(float32, scale=True)``). Must be the last transform of a ``Compose``."""

    schema = (
        Param("mean", "numbers", IMAGENET_MEAN, "per-channel (RGB) mean, on the 0-1 scale", lengths=(3,)),
        Param("std", "numbers", IMAGENET_STD, "per-channel (RGB) standard deviation, on the 0-1 scale", lengths=(3,)),
    )

    def setup(self) -> None:
        if min(self.std) <= 0:
            raise self.error("std", f"values must be positive, got {list(self.std)!r}")

    takes_float = True  # crop_mirror_normalize takes float32 input as it takes uint8
    normalizes = True

    def dali_output(self, images: Any, layout: str) -> Any:
        """HWC uint8 -> float32 ``layout`` (``"CHW"`` or ``"HWC"``) in one ``crop_mirror_normalize``."""
        from nvidia.dali import fn, types

        return fn.crop_mirror_normalize(
            images, dtype=types.FLOAT, output_layout=layout,
            mean=[m * 255 for m in self.mean], std=[s * 255 for s in self.std],
        )
