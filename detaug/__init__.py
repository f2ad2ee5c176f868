"""detaug: detection-aware data augmentation on the GPU with NVIDIA DALI."""

import logging

from detaug.errors import DatasetError, DataWarning, DeviceError, ImageError, RecipeError

__version__ = "0.1.0"

__all__ = ["DataWarning", "DatasetError", "DeviceError", "ImageError", "RecipeError", "__version__"]

_log = logging.getLogger("detaug")
if not _log.handlers:  # one line on stderr for what detaug decided (device="auto"); configurable
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("detaug: %(message)s"))
    _log.addHandler(_handler)
    _log.setLevel(logging.INFO)
    _log.propagate = False
