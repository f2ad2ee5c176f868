"""Detection transforms: images and boxes move together (names as in torchvision.transforms.v2).

One module per family (``flip``, ``affine``, ``crop``, ``pad``, ``resize``, ``color``,
``normalize``); each class holds its schema, planner, output size, box rule and pixel op, and is
registered under its class name for recipes (``Compose.from_dict``).
"""

from detaug.transforms.affine import RandomAffine, RandomRotation
from detaug.transforms.base import (
    TRANSFORMS,
    GeometricTransform,
    OutputTransform,
    Param,
    PhotometricTransform,
    Transform,
)
from detaug.transforms.blur import GaussianBlur
from detaug.transforms.color import ColorJitter, Grayscale, RandomGrayscale, RandomPhotometricDistort
from detaug.transforms.compose import Compose
from detaug.transforms.composition import OneOf, RandomApply, RandomChoice, SomeOf
from detaug.transforms.crop import CenterCrop, FixedSizeCrop, RandomCrop, RandomIoUCrop, RandomResizedCrop
from detaug.transforms.erasing import CoarseDropout, RandomErasing
from detaug.transforms.flip import RandomHorizontalFlip, RandomVerticalFlip
# the mixing kind, registered in this order (the registry's): Mosaic, MixUp, CutMix, CopyPaste
from detaug.transforms.mosaic import Mosaic
from detaug.transforms.blend import CutMix, MixUp
from detaug.transforms.copypaste import CopyPaste
from detaug.transforms.noise import GaussNoise
from detaug.transforms.normalize import IMAGENET_MEAN, IMAGENET_STD, Normalize
from detaug.transforms.perspective import RandomPerspective
from detaug.transforms.presets import PRESETS, default_detection_recipe, preset, yolo_recipe
from detaug.transforms.pad import Pad, RandomZoomOut
from detaug.transforms.resize import LetterBox, RandomShortestSize, Resize, ScaleJitter

__all__ = [
    "Transform",
    "GeometricTransform",
    "PhotometricTransform",
    "OutputTransform",
    "Param",
    "TRANSFORMS",
    "Compose",
    "default_detection_recipe",
    "RandomHorizontalFlip",
    "RandomVerticalFlip",
    "RandomAffine",
    "RandomRotation",
    "RandomZoomOut",
    "RandomIoUCrop",
    "RandomResizedCrop",
    "RandomCrop",
    "CenterCrop",
    "FixedSizeCrop",
    "Pad",
    "Resize",
    "LetterBox",
    "ScaleJitter",
    "RandomShortestSize",
    "ColorJitter",
    "RandomPhotometricDistort",
    "Grayscale",
    "RandomGrayscale",
    "GaussianBlur",
    "GaussNoise",
    "RandomErasing",
    "CoarseDropout",
    "OneOf",
    "RandomChoice",
    "RandomApply",
    "SomeOf",
    "Mosaic",
    "MixUp",
    "CopyPaste",
    "CutMix",
    "RandomPerspective",
    "yolo_recipe",
    "preset",
    "PRESETS",
    "Normalize",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
]
