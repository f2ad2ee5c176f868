"""Named recipes: torchvision's detection reference policies, and YOLO's (with Mosaic).

``preset(name)`` returns a :class:`~detaug.transforms.Compose` with the same semantics as
``references/detection/presets.py`` of torchvision (``DetectionPresetTrain(data_augmentation=name)``
with ``use_v2=True``), whose transforms are followed there by ``SanitizeBoundingBoxes`` (boxes
under 1 pixel wide or high removed: detaug's ``min_size=1``). ``detaug recipe --preset NAME``
prints one as YAML. docs/presets.md compares their statistics with torchvision's on real photos.
:func:`yolo_recipe` builds the ``yolo`` preset with its size, ``MixUp`` probability and perspective.

Deviation: torchvision fills revealed areas with the per-channel mean ``(123, 117, 104)``;
detaug's warps fill with one grey level, ``117`` (the middle value). It changes no box.
"""

from __future__ import annotations

from typing import Callable

from detaug.errors import RecipeError
from detaug.transforms.affine import RandomAffine
from detaug.transforms.base import Transform
from detaug.transforms.blend import MixUp
from detaug.transforms.color import ColorJitter, RandomPhotometricDistort
from detaug.transforms.compose import Compose
from detaug.transforms.crop import FixedSizeCrop, RandomIoUCrop
from detaug.transforms.flip import RandomHorizontalFlip
from detaug.transforms.mosaic import Mosaic
from detaug.transforms.normalize import Normalize
from detaug.transforms.pad import RandomZoomOut
from detaug.transforms.perspective import RandomPerspective
from detaug.transforms.resize import RandomShortestSize, Resize, ScaleJitter
from detaug.transforms.schema import closest

__all__ = ["PRESETS", "default_detection_recipe", "preset", "yolo_recipe"]

#: torchvision's ``mean`` fill, as one grey level.
MEAN_FILL = 117.0
#: ``RandomShortestSize`` sizes of torchvision's ``multiscale`` policy.
MULTISCALE_SIZES = (480, 512, 544, 576, 608, 640, 672, 704, 736, 768, 800)


def default_detection_recipe(size: int | tuple[int, int] = 512, fill: float = 114) -> Compose:
    """The default detection recipe: IoU crop, flip, affine, resize, colour jitter, normalize."""
    return Compose(
        [
            RandomIoUCrop(),
            RandomHorizontalFlip(p=0.5),
            RandomAffine(degrees=10, translate=(0.1, 0.1), scale=(0.9, 1.1), shear=5, fill=fill),
            Resize(size if not isinstance(size, int) else (size, size)),
            ColorJitter(brightness=0.2, contrast=0.2, saturation=0.2, hue=0.05),
            Normalize(),
        ],
        min_size=1.0,
        min_visibility=0.0,
    )


def yolo_recipe(size: int | tuple[int, int] = 640, mixup: float = 0.1, perspective: float = 0.1,
                pool: str = "dataset", close_mosaic_at: int | None = None) -> Compose:
    """The YOLO training recipe (ultralytics' defaults) as a :class:`~detaug.transforms.Compose`.

    ``Mosaic(size)`` (ultralytics ``mosaic=1.0``), ``RandomPerspective(perspective, p=0.5)`` on
    the mosaic canvas, ``RandomAffine(translate=0.1, scale=(1, 3))`` then ``Resize(size)``: the
    affine about the ``2 size`` canvas' centre followed by halving it is ultralytics' crop with
    ``translate=0.1, scale=0.5`` (``0.5 .. 1.5``); the mosaic canvas being square (or ``2 h`` by
    ``2 w``), the letterbox to ``size`` is this plain resize. Then ``RandomHorizontalFlip(0.5)``
    (``fliplr``), ``MixUp(p=mixup)`` (ultralytics' default is 0; YOLOv5/8 large models use
    0.1-0.15) and the HSV jitter ``hsv_h=0.015, hsv_s=0.7, hsv_v=0.4`` as ``ColorJitter`` (hue
    as a fraction of the circle, saturation and value as gain ranges ``1 -/+ v``). ``pool``:
    where ``Mosaic``'s and ``MixUp``'s partners come from (:mod:`detaug.transforms.mixing`; ``"batch"``
    decodes one image per sample instead of 4.1). ``close_mosaic_at``: the epoch from which
    ``Mosaic`` and ``MixUp`` are off (ultralytics' ``close_mosaic=N`` of an ``E``-epoch run is
    ``close_mosaic_at=E - N``; a schedule, docs/schedules.md); ``None``: never.
    """
    hw = (size, size) if isinstance(size, int) else tuple(size)
    transforms: list[Transform] = [
        Mosaic(hw, fill=114, pool=pool),
        RandomPerspective(distortion_scale=perspective, p=0.5, fill=114),
        RandomAffine(translate=(0.1, 0.1), scale=(1.0, 3.0), fill=114),
        Resize(hw),
        RandomHorizontalFlip(p=0.5),
    ]
    if mixup > 0:
        transforms.append(MixUp(p=mixup, alpha=32.0, fill=114, pool=pool))
    transforms.append(ColorJitter(brightness=0.4, saturation=0.7, hue=0.015))
    schedule = None
    if close_mosaic_at is not None:
        off = {"off_from_epoch": close_mosaic_at}
        schedule = {"Mosaic": off, **({"MixUp": off} if mixup > 0 else {})}
    return Compose(transforms, min_size=2.0, min_visibility=0.1, schedule=schedule)


def _hflip() -> Compose:
    return Compose([RandomHorizontalFlip(p=0.5)], min_size=1.0)


def _lsj() -> Compose:
    return Compose(
        [ScaleJitter(target_size=(1024, 1024)), FixedSizeCrop(size=(1024, 1024), fill=MEAN_FILL),
         RandomHorizontalFlip(p=0.5)],
        min_size=1.0,
    )


def _multiscale() -> Compose:
    return Compose([RandomShortestSize(min_size=MULTISCALE_SIZES, max_size=1333), RandomHorizontalFlip(p=0.5)],
                   min_size=1.0)


def _ssd() -> Compose:
    return Compose(
        [RandomPhotometricDistort(), RandomZoomOut(fill=MEAN_FILL), RandomIoUCrop(), RandomHorizontalFlip(p=0.5)],
        min_size=1.0,
    )


def _ssdlite() -> Compose:
    return Compose([RandomIoUCrop(), RandomHorizontalFlip(p=0.5)], min_size=1.0)


def _yolo() -> Compose:
    return yolo_recipe()


#: Preset builders by name (torchvision's ``data_augmentation`` names, and ``yolo``).
PRESETS: dict[str, Callable[[], Compose]] = {
    "hflip": _hflip,
    "lsj": _lsj,
    "multiscale": _multiscale,
    "ssd": _ssd,
    "ssdlite": _ssdlite,
    "yolo": _yolo,
}


def preset(name: str) -> Compose:
    """The recipe of preset ``name`` (``hflip``, ``lsj``, ``multiscale``, ``ssd``, ``ssdlite``, ``yolo``)."""
    if name not in PRESETS:
        raise RecipeError(f"unknown preset {name!r}{closest(name, PRESETS)}; known: {', '.join(PRESETS)}")
    return PRESETS[name]()
