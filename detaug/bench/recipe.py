"""The parameters of the benchmarked recipes, shared by every hand-written variant.

The recipes (:data:`RECIPES`, ``detaug bench --recipes``): ``"default"`` (:class:`RecipeSpec`,
below), ``"yolo"`` (:class:`YoloSpec`: ``detaug.transforms.yolo_recipe``) and ``"masks"`` (the
default recipe with an instance mask per box: :mod:`detaug.bench.mask_data`). :func:`detaug_recipe`
builds detaug's ``Compose`` of either; :func:`source_images_per_sample` says how many source
images one output sample is made of.

The default recipe

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

__all__ = [
    "DEFAULT_SIZES",
    "RECIPES",
    "RECIPE_TITLES",
    "RecipeSpec",
    "YoloSpec",
    "detaug_recipe",
    "peer_recipe",
    "source_images_per_sample",
]

#: The recipes ``detaug bench --recipes`` knows, in the order they are reported.
RECIPES: tuple[str, ...] = ("default", "yolo", "yolo-batch", "masks")
#: Output side of each recipe when ``--size`` is not given.
DEFAULT_SIZES: dict[str, int] = {"default": 512, "yolo": 640, "yolo-batch": 640, "masks": 512}
#: One line per recipe for the report (``{size}`` filled in).
RECIPE_TITLES: dict[str, str] = {
    "default": "IoU crop, flip, affine, resize {size}, colour jitter, normalize",
    "yolo": "Mosaic, RandomPerspective, affine, resize {size} (letterbox of the square mosaic), flip, "
            "MixUp, HSV jitter",
    "yolo-batch": "the YOLO recipe with pool='batch': partners are batch-mates, each image decoded once",
    "masks": "the default recipe with instance masks: each box's inscribed ellipse, rasterised and moved with it",
}


def peer_recipe(name: str) -> str:
    """The recipe whose peers a recipe is compared with: ``"yolo-batch"`` is the YOLO recipe with
    other partners (albumentations' Mosaic decodes its partners, as ``"yolo"`` does)."""
    return "yolo" if name == "yolo-batch" else name


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

    def dali_random_bbox_crop(self, boxes, labels):
        """DALI's ``fn.random_bbox_crop`` of ``boxes`` (``xyXY``, relative) and ``labels`` with this
        recipe's IoU-crop settings, one box reaching the threshold sufficing (SSD and
        torchvision): ``(anchor, shape, boxes, labels)``. The one definition of the window of the
        raw DALI pipeline and of the decode limit's window decoding."""
        from nvidia.dali import fn

        return fn.random_bbox_crop(
            boxes,
            labels,
            thresholds=list(self.crop_iou_thresholds),
            scaling=list(self.crop_scale),
            aspect_ratio=list(self.crop_aspect_ratio),
            allow_no_crop=self.crop_allow_no_crop,
            all_boxes_above_threshold=False,
            num_attempts=self.crop_trials,
            bbox_layout="xyXY",
        )

    @property
    def torchvision_sampler_options(self) -> list[float]:
        """``RandomIoUCrop.sampler_options``: the thresholds, plus 1.0 ("no crop") when allowed."""
        return [*self.crop_iou_thresholds, *([1.0] if self.crop_allow_no_crop else [])]


@dataclass(frozen=True)
class YoloSpec:
    """Numbers of the YOLO-style recipe (ultralytics' defaults, ``detaug.transforms.yolo_recipe``).

    1. ``Mosaic``: the sample and 3 partner images, each scaled to fit ``size`` (aspect kept), as
       2x2 tiles around a random centre on a ``2 size`` canvas (``fill`` elsewhere);
    2. ``RandomPerspective(perspective, p=0.5)``: corners moved inwards by up to
       ``perspective / 2`` of each side;
    3. a random affine about the canvas centre: translation ``+-translate`` of each side, zoom
       ``1 +- scale`` of the central ``size`` (ultralytics' ``scale=0.5``: 0.5 .. 1.5);
    4. resize to ``size x size`` (on the square canvas, the letterbox);
    5. horizontal flip with probability ``flip_p``;
    6. ``MixUp`` with probability ``mixup``: a partner image letterboxed into the canvas and
       blended, ratio from ``Beta(32, 32)``;
    7. HSV jitter: hue shift within ``+-hsv_h`` of the circle, saturation and value gains in
       ``1 +- hsv_s`` and ``1 +- hsv_v``.

    Boxes under ``min_box_size`` pixels or with less than ``min_visibility`` of their area left are
    dropped. Images stay uint8 (no normalization; YOLO trainers divide by 255 on the GPU).
    """

    size: int = 640
    mixup: float = 0.1
    perspective: float = 0.1
    translate: float = 0.1
    scale: float = 0.5
    flip_p: float = 0.5
    hsv_h: float = 0.015
    hsv_s: float = 0.7
    hsv_v: float = 0.4
    fill: int = 114
    min_box_size: float = 2.0
    min_visibility: float = 0.1
    #: images of a mosaic: the sample's own and 3 partners
    mosaic_images: int = 4

    def __post_init__(self) -> None:
        if not isinstance(self.size, int) or self.size < 1:
            raise ValueError(f"size should be a positive int, got {self.size!r}")


def detaug_recipe(name: str, size: int):
    """detaug's ``Compose`` of recipe ``name`` (:data:`RECIPES`) at output side ``size``:
    ``default_detection_recipe(size)`` (also for ``"masks"``: the source carries the masks) or
    ``yolo_recipe(size, mixup=..., perspective=...)`` with the numbers of :class:`YoloSpec`."""
    from detaug import transforms as T

    if name in ("default", "masks"):
        return T.default_detection_recipe(size=size)
    if name in ("yolo", "yolo-batch"):
        spec = YoloSpec(size=size)
        return T.yolo_recipe(size, mixup=spec.mixup, perspective=spec.perspective,
                             pool="batch" if name == "yolo-batch" else "dataset")
    raise ValueError(f"unknown recipe {name!r}; choose from {', '.join(RECIPES)}")


def source_images_per_sample(name: str, *, mixup: bool = True) -> float:
    """Source images read and decoded per output sample of recipe ``name``, on average: 1 for the
    default recipe; for ``"yolo"`` the 4 images of the mosaic plus the MixUp partner of the
    samples it blends (``YoloSpec.mixup`` of them: a partner that is not blended is not read),
    ``mixup=False`` for a pipeline without MixUp. detaug decodes only the visible part of each
    tile (ROI decoding); a peer decodes whole images: both count as one image here."""
    if name in ("default", "masks", "yolo-batch"):  # yolo-batch: partners are the batch's own images
        return 1.0
    if name == "yolo":
        spec = YoloSpec()
        return spec.mosaic_images + (spec.mixup if mixup else 0.0)
    raise ValueError(f"unknown recipe {name!r}; choose from {', '.join(RECIPES)}")
