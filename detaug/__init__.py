"""detaug: detection-aware data augmentation on the GPU with NVIDIA DALI."""

from detaug.errors import DataWarning, DatasetError, ImageError

__version__ = "0.1.0"

__all__ = ["DataWarning", "DatasetError", "ImageError", "__version__"]
