"""Named recipes: torchvision's detection reference policies, and YOLO's (with Mosaic).

``preset(name)`` returns a :class:`~detaug.transforms.Compose` with the same semantics as
``references/detection/presets.py`` of torchvision (``DetectionPresetTrain(data_augmentation=name)``
with ``use_v2=True``), whose transforms are followed there by ``SanitizeBoundingBoxes`` (boxes
under 1 pixel wide or high removed: detaug's ``min_size=1``). ``detaug recipe --preset NAME``
prints one as YAML. docs/presets.md compares their statistics with torchvision's on real photos.

Deviation: torchvision fills revealed areas with the per-channel mean ``(123, 117, 104)``;
detaug's warps fill with one grey level, ``117`` (the middle value). It changes no box.
"""

from __future__ import annotations

from typing import Callable

from detaug.transforms.compose import Compose

__all__ = ["PRESETS", "preset"]

#: torchvision's ``mean`` fill, as one grey level.
MEAN_FILL = 117.0
#: ``RandomShortestSize`` sizes of torchvision's ``multiscale`` policy.
MULTISCALE_SIZES = (480, 512, 544, 576, 608, 640, 672, 704, 736, 768, 800)


def _hflip() -> Compose:
    from detaug.transforms import RandomHorizontalFlip

    return Compose([RandomHorizontalFlip(p=0.5)], min_size=1.0)


def _lsj() -> Compose:
    from detaug.transforms import FixedSizeCrop, RandomHorizontalFlip, ScaleJitter

    return Compose(
        [ScaleJitter(target_size=(1024, 1024)), FixedSizeCrop(size=(1024, 1024), fill=MEAN_FILL),
         RandomHorizontalFlip(p=0.5)],
        min_size=1.0,
    )


def _multiscale() -> Compose:
    from detaug.transforms import RandomHorizontalFlip, RandomShortestSize

    return Compose([RandomShortestSize(min_size=MULTISCALE_SIZES, max_size=1333), RandomHorizontalFlip(p=0.5)],
                   min_size=1.0)


def _ssd() -> Compose:
    from detaug.transforms import RandomHorizontalFlip, RandomIoUCrop, RandomPhotometricDistort, RandomZoomOut

    return Compose(
        [RandomPhotometricDistort(), RandomZoomOut(fill=MEAN_FILL), RandomIoUCrop(), RandomHorizontalFlip(p=0.5)],
        min_size=1.0,
    )


def _ssdlite() -> Compose:
    from detaug.transforms import RandomHorizontalFlip, RandomIoUCrop

    return Compose([RandomIoUCrop(), RandomHorizontalFlip(p=0.5)], min_size=1.0)


def _yolo() -> Compose:
    from detaug.transforms.mixing import yolo_recipe

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
    from detaug.errors import RecipeError
    from detaug.transforms.schema import closest

    if name not in PRESETS:
        raise RecipeError(f"unknown preset {name!r}{closest(name, PRESETS)}; known: {', '.join(PRESETS)}")
    return PRESETS[name]()
