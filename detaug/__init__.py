"""detaug: detection-aware data augmentation on the GPU with NVIDIA DALI."""

__version__ = "0.1.0"
