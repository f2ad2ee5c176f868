"""The parameters of the benchmarked detection recipe, shared by every hand-written variant.

detaug builds the recipe itself (``detaug.transforms.default_detection_recipe``); the raw DALI
pipeline and the CPU peers read the numbers below, so all variants do the same work:

1. Random IoU crop, SSD style: a window of ``crop_scale`` of each side and width/height ratio in
   ``crop_aspect_ratio``, accepted when at least one box has its centre inside the window and an
   IoU with it of at least a threshold drawn per sample from ``crop_iou_thresholds`` or "no crop"
   (``crop_allow_no_crop``); ``crop_trials`` windows per drawn threshold. Boxes whose centre
   falls outside the window are dropped. (torchvision's ``RandomIoUCrop`` with
   ``sampler_options=[0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0]``; DALI's ``random_bbox_crop`` with the
   same thresholds, ``allow_no_crop=True`` and ``all_boxes_above_threshold=False``: its default,
   True, asks every box to reach the threshold and leaves about 97% of these images uncropped.)
2. Horizontal flip with probability ``flip_p``.
3. Random affine about the image centre: rotation within ``+-rotate_deg`` degrees, translation
   within ``+-translate_frac`` of each side, isotropic scale in ``scale_range``, x-shear within
   ``+-shear_x_deg`` degrees; grey ``fill`` outside the source, bilinear.
4. Resize to ``size x size`` (aspect ratio not kept), bilinear.
5. Colour jitter: brightness, contrast and saturation factors in ``1 +- jitter``, hue shift within
   ``+-hue`` of the hue circle (``hue = 0.05`` is +-18 degrees).
6. Normalize with ``mean`` / ``std`` (fractions of 255) to float32 CHW.

Boxes go through every step; boxes under ``min_box_size`` pixels wide or high are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RecipeSpec"]


@dataclass(frozen=True)
class RecipeSpec:
    """Numbers of the default detection recipe (see the module docstring for their meaning)."""

    size: int = 512
    crop_scale: tuple[float, float] = (0.3, 1.0)
    crop_aspect_ratio: tuple[float, float] = (0.5, 2.0)
    crop_iou_thresholds: tuple[float, ...] = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9)
    crop_allow_no_crop: bool = True
    crop_trials: int = 40
    flip_p: float = 0.5
    rotate_deg: float = 10.0
    translate_frac: float = 0.1
    scale_range: tuple[float, float] = (0.9, 1.1)
    shear_x_deg: float = 5.0
    fill: int = 114
    brightness: float = 0.2
    contrast: float = 0.2
    saturation: float = 0.2
    hue: float = 0.05
    mean: tuple[float, float, float] = (0.485, 0.456, 0.406)
    std: tuple[float, float, float] = (0.229, 0.224, 0.225)
    min_box_size: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.size, int) or self.size < 1:
            raise ValueError(f"size should be a positive int, got {self.size!r}")

    @property
    def torchvision_sampler_options(self) -> list[float]:
        """``RandomIoUCrop.sampler_options``: the thresholds, plus 1.0 ("no crop") when allowed."""
        return [*self.crop_iou_thresholds, *([1.0] if self.crop_allow_no_crop else [])]
