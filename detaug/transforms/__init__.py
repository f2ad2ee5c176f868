"""Detection transforms: images and boxes move together (names as in torchvision.transforms.v2)."""

from detaug.transforms.base import GeometricTransform, PhotometricTransform, Transform, TRANSFORMS
from detaug.transforms.color import IMAGENET_MEAN, IMAGENET_STD, ColorJitter, Normalize
from detaug.transforms.compose import Compose, default_detection_recipe
from detaug.transforms.geometry import (
    LetterBox,
    RandomAffine,
    RandomHorizontalFlip,
    RandomIoUCrop,
    RandomResizedCrop,
    RandomRotation,
    RandomVerticalFlip,
    RandomZoomOut,
    Resize,
)

__all__ = [
    "Transform",
    "GeometricTransform",
    "PhotometricTransform",
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
    "Resize",
    "LetterBox",
    "ColorJitter",
    "Normalize",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
]
