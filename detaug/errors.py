"""Errors and warnings about the user's data (one place, imported by every layer).

* :class:`DatasetError` (a ``ValueError``): an input problem that detaug will not repair; the
  message names the file and the image or annotation id.
* :class:`ImageError` (a :class:`DatasetError`): one image cannot be read or decoded; raised with
  ``on_error="raise"``, otherwise the image is skipped and reported.
* :class:`DataWarning`: a skipped image or a counted repair, said once.
* :class:`DeviceError` (a ``RuntimeError``): ``device="gpu"`` where DALI finds no GPU.
"""

from __future__ import annotations

__all__ = ["DatasetError", "ImageError", "DataWarning", "DeviceError"]


class DatasetError(ValueError):
    """An input problem that is not repaired: the message names the file and the image or
    annotation id."""


class ImageError(DatasetError):
    """An image that cannot be read or decoded.

    Attributes:
        file: the image file (or a description of an in-memory image).
        image_id: the image's id.
        reason: why it cannot be used (``"empty file"``, ``"truncated JPEG"``, ...).
    """

    def __init__(self, file: str, image_id: int | None, reason: str) -> None:
        self.file, self.image_id, self.reason = file, image_id, reason
        super().__init__(f"{file} (image_id {image_id}): {reason}")

    def __reduce__(self):  # picklable across worker processes
        return (type(self), (self.file, self.image_id, self.reason))


class DataWarning(UserWarning):
    """A skipped image or a counted repair of the input data."""


class DeviceError(RuntimeError):
    """``device="gpu"`` where DALI finds no CUDA device: the message says what was looked for."""
