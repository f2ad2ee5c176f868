"""detaug: detection-aware data augmentation on the GPU with NVIDIA DALI."""

import logging

from detaug.errors import DatasetError, DataWarning, DeviceError, ImageError, RecipeError

__version__ = "0.1.0"

__all__ = ["DataWarning", "DatasetError", "DeviceError", "ImageError", "RecipeError", "__version__"]

# A library adds no handler of its own: what detaug decides (device="auto") goes to the "detaug"
# logger at INFO, shown where the application configures logging; the command lines print it
# (detaug.cli_support.log_to_stderr).
logging.getLogger("detaug").addHandler(logging.NullHandler())
