"""What the probe of :mod:`detaug.formats.images` says about one encoded image:
:class:`ImageInfo`, the formats DALI decodes, and the problems (stable texts: reports count them
by reason; the list is in :mod:`detaug.formats.images`).
"""

from __future__ import annotations

from dataclasses import dataclass

from detaug.formats.size_limits import image_limits

__all__ = ["DALI_FORMATS", "ORIENTED_FORMATS", "ImageInfo"]

#: The formats DALI's ``fn.decoders.image`` decodes (``ImageInfo.format`` names).
DALI_FORMATS = frozenset({"JPEG", "PNG", "BMP", "TIFF", "WEBP", "PPM", "JPEG2000"})
#: The formats whose EXIF orientation DALI applies (checked with DALI in the tests).
ORIENTED_FORMATS = frozenset({"JPEG", "PNG", "TIFF", "WEBP"})

# Problems (stable texts: reports count them by reason).
EMPTY = "empty file"
NOT_A_FILE = "cannot read: not a regular file"
NOT_AN_IMAGE = "not an image (unknown format)"
TOO_LARGE = "too large (over detaug's image size limit)"
TRUNCATED_JPEG = "truncated JPEG (no end-of-image marker)"
TRUNCATED_PNG = "truncated PNG (no IEND chunk)"
TRUNCATED_WEBP = "truncated WebP (shorter than its RIFF size)"
WEBP_EXIF_PADDING = "WebP with EXIF after an odd-sized chunk: DALI cannot decode it"


def unsupported(fmt: str) -> str:
    """The problem of an image in a format DALI does not decode."""
    return f"{fmt}: not a format DALI decodes"


def unreadable_header(fmt: str) -> str:
    """The problem of a DALI format whose header does not parse."""
    return f"unreadable {fmt} header"


@dataclass(frozen=True)
class ImageInfo:
    """What the bytes of one encoded image are.

    ``format``: ``"JPEG"``, ``"PNG"``, ``"BMP"``, ``"TIFF"``, ``"WEBP"``, ``"PPM"``,
    ``"JPEG2000"``, another name for formats DALI does not decode (``"GIF"``), ``None`` when
    unknown. ``stored_hw``: ``(height, width)`` of the stored pixels, ``(0, 0)`` when unknown.
    ``orientation``: EXIF orientation 1..8 (1 when none or not applicable). ``problem``:
    ``None`` when DALI decodes it, else a short reason (module docstring). ``mode``: the Pillow
    mode of the stored pixels (``"RGB"``, ``"L"``, ``"CMYK"``, ``"RGBA"``, ``"P"``, ...),
    ``None`` when unknown; DALI delivers RGB whatever it is.
    """

    format: str | None
    stored_hw: tuple[int, int]
    orientation: int = 1
    problem: str | None = None
    mode: str | None = None

    @property
    def displayed_hw(self) -> tuple[int, int]:
        """``(height, width)`` after the EXIF orientation (swapped for 5..8)."""
        h, w = self.stored_hw
        return (w, h) if self.orientation >= 5 else (h, w)

    @property
    def size_known(self) -> bool:
        """Whether the header gave a size."""
        return self.stored_hw[0] > 0 and self.stored_hw[1] > 0


def _finish(fmt: str, hw: tuple[int, int], orientation: int, problem: str | None,
            mode: str | None) -> ImageInfo:
    """The info, "too large" (:func:`image_limits`) taking precedence over the structure's
    problem."""
    pixels, side = image_limits()
    if hw[0] * hw[1] > pixels or max(hw) > side:
        problem = TOO_LARGE
    return ImageInfo(fmt, hw, orientation, problem, mode)

