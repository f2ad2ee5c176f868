"""The image size limits: the largest image (pixels) and the longest side the probe of
:mod:`detaug.formats.images` accepts, from the environment or :func:`set_image_limits`, and the
bound of a plausible size in annotations (:data:`MAX_PIXELS`). Imports nothing heavy.
"""

from __future__ import annotations

import os

__all__ = ["MAX_PIXELS", "DEFAULT_MAX_IMAGE_PIXELS", "DEFAULT_MAX_IMAGE_SIDE", "HARD_MAX_IMAGE_PIXELS",
           "HARD_MAX_IMAGE_SIDE", "image_limits", "set_image_limits"]

#: The bound of a plausible coordinate or side length in annotations (no side of an acceptable
#: image reaches it); images are judged by :func:`image_limits`.
MAX_PIXELS = 30000 * 30000
#: Default largest image (pixels) the probe accepts: 2**28 (16384 x 16384), well above real
#: photos (100 MP is 1e8) and a few GB of DALI memory at most.
DEFAULT_MAX_IMAGE_PIXELS = 1 << 28
#: Default longest side the probe accepts.
DEFAULT_MAX_IMAGE_SIDE = 1 << 15
#: The most pixels a limit may be raised to: the bytes of a decoded HWC uint8 image must fit
#: int32 in DALI's kernels (29999 x 29999 x 3 does not: the process is killed by SIGSEGV).
HARD_MAX_IMAGE_PIXELS = (2**31 - 1) // 3
#: The longest side a limit may be raised to (JPEG's own bound).
HARD_MAX_IMAGE_SIDE = 65535
_PIXELS_ENV, _SIDE_ENV = "DETAUG_MAX_IMAGE_PIXELS", "DETAUG_MAX_IMAGE_SIDE"


def _limit(name: str, default: int, hard: int) -> int:
    text = os.environ.get(name)
    if text is None or not text.strip():
        return default
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise ValueError(f"${name}={text!r}: not an integer") from None
    if not 1 <= value <= hard:
        raise ValueError(f"${name}={value}: must be 1..{hard} (DALI's kernels do not take more)")
    return value


_limits: tuple[int, int] | None = None


def image_limits() -> tuple[int, int]:
    """``(pixels, side)``: the largest image (``width * height``) and the longest side the probe
    accepts; a larger image is a problem (:data:`TOO_LARGE`): named and skipped before DALI
    sees it. From ``$DETAUG_MAX_IMAGE_PIXELS`` / ``$DETAUG_MAX_IMAGE_SIDE`` (read once; worker
    processes inherit them), else :data:`DEFAULT_MAX_IMAGE_PIXELS` / :data:`DEFAULT_MAX_IMAGE_SIDE`.
    ``ValueError`` for a value that is not an integer in ``1..HARD_MAX_*``."""
    global _limits
    if _limits is None:
        _limits = (_limit(_PIXELS_ENV, DEFAULT_MAX_IMAGE_PIXELS, HARD_MAX_IMAGE_PIXELS),
                   _limit(_SIDE_ENV, DEFAULT_MAX_IMAGE_SIDE, HARD_MAX_IMAGE_SIDE))
    return _limits


def set_image_limits(pixels: int | None = None, side: int | None = None) -> tuple[int, int]:
    """Set the image limits (``None``: the default) for this process and, through the
    environment variables, for the worker processes it starts afterwards; returns the
    previous ``(pixels, side)``. ``ValueError`` beyond ``HARD_MAX_IMAGE_PIXELS`` /
    ``HARD_MAX_IMAGE_SIDE``."""
    global _limits
    before = image_limits()
    for name, value, default, hard in ((_PIXELS_ENV, pixels, DEFAULT_MAX_IMAGE_PIXELS, HARD_MAX_IMAGE_PIXELS),
                                       (_SIDE_ENV, side, DEFAULT_MAX_IMAGE_SIDE, HARD_MAX_IMAGE_SIDE)):
        value = default if value is None else int(value)
        if not 1 <= value <= hard:
            raise ValueError(f"{name.lower().removeprefix('detaug_')}={value}: must be 1..{hard} "
                             "(DALI's kernels do not take more)")
        os.environ[name] = str(value)
    _limits = None
    image_limits()
    return before
