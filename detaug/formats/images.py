"""Image bytes: what they are, their size, their EXIF orientation, and what would stop DALI.

One place for every rule about encoded images, used by the loader (skip an image before DALI
sees it), by the sources, and by ``voc2coco`` (``--verify-images`` rejects exactly what the
loader skips; the COCO ``width``/``height`` follow the same orientation rule).

**Probe** (:func:`probe_image`, :func:`probe_file`, :func:`read_and_probe`): cheap, no pixel is
decoded. The format is sniffed from the bytes (never from a file name); the header gives the
stored size; the end of the file is checked for the format's end marker. It never raises on bad
data: ``ImageInfo.problem`` says why DALI would not decode the image, ``None`` when it would:

* ``cannot read: <strerror>``: the file cannot be opened or read;
* ``empty file``: zero bytes;
* ``not an image (unknown format)``: no known signature (a text file named ``.jpg``);
* ``<FORMAT>: not a format DALI decodes``: GIF, HEIF, AVIF, PSD, ICO, ... (DALI decodes JPEG,
  PNG, BMP, TIFF, PNM, WebP and JPEG 2000: :data:`DALI_FORMATS`);
* ``unreadable <FORMAT> header``: a DALI format whose header does not parse;
* ``too large (over detaug's image size limit)``: the header's size has more than
  :func:`image_limits` pixels (default :data:`DEFAULT_MAX_IMAGE_PIXELS`, 2**28: 16384 x
  16384), or a side longer than its side limit (default :data:`DEFAULT_MAX_IMAGE_SIDE`,
  32768); raise them with ``$DETAUG_MAX_IMAGE_PIXELS`` / ``$DETAUG_MAX_IMAGE_SIDE`` or
  :func:`set_image_limits`, up to :data:`HARD_MAX_IMAGE_PIXELS` / :data:`HARD_MAX_IMAGE_SIDE`
  (beyond those DALI's kernels fail or crash: a 29999 x 29999 JPEG ends the process);
* ``truncated JPEG (no end-of-image marker)``: no ``FF D9`` after the first scan header
  (trailing NULs, whitespace or a trailer after the marker are fine);
* ``truncated PNG (no IEND chunk)``: a chunk runs past the end, or there is no ``IEND``;
* ``truncated WebP (shorter than its RIFF size)``: the RIFF header promises more bytes;
* ``WebP with EXIF after an odd-sized chunk: DALI cannot decode it``: the padding byte after a
  chunk of odd size trips DALI 2.4's WebP parser when it looks for the ``EXIF`` chunk
  ("Unexpected end of stream"; most lossless WebP with EXIF; tested).

Grayscale, CMYK, RGBA, palette, 16-bit and PNG bytes in a file named ``.jpg`` are not problems:
DALI decodes them to 3-channel RGB uint8 (``tests/detaug/formats/test_images.py`` checks it with
a real DALI CPU pipeline).

**EXIF orientation** (1..8, 1 when absent or out of range, as DALI): read from the EXIF of JPEG
(``APP1 Exif``), PNG (``eXIf``, anywhere in the file), TIFF (IFD0) and WebP (``EXIF`` chunk), the
formats whose orientation DALI's decoder applies (tested for each). XMP orientation is ignored,
as DALI ignores it. The *stored* frame is the pixels as written in the file; the *displayed*
frame is the image after the orientation (what DALI delivers with ``adjust_orientation=True``,
and ``PIL.ImageOps.exif_transpose``); orientations 5..8 swap height and width.

Coordinates are continuous pixels: pixel ``i`` spans ``[i, i + 1)``; an image of width ``W``
spans ``[0, W]``. Boxes are absolute ``xyxy``.

This module imports neither DALI nor torch; numpy and Pillow are imported when first needed, so
that ``voc2coco`` on annotations alone (which uses :data:`MAX_PIXELS`) does not load them.

Modules: this one holds the probe; :mod:`detaug.formats.size_limits` the size limits,
:mod:`detaug.formats.image_info` :class:`ImageInfo` and the problems,
:mod:`detaug.formats.image_headers` the per-format header readers and
:mod:`detaug.formats.orientation` the orientation geometry and the frame of the boxes. Their
public names are importable from here too.
"""

from __future__ import annotations

import io
import os
import stat
from typing import TYPE_CHECKING, BinaryIO

from detaug.formats.image_headers import (
    _pillow_header,
    _probe_jpeg,
    _probe_png,
    _tiff_orientation,
    _webp_structure,
)
from detaug.formats.image_info import (  # noqa: F401 - importable from here
    DALI_FORMATS,
    EMPTY,
    NOT_A_FILE,
    NOT_AN_IMAGE,
    ORIENTED_FORMATS,
    TOO_LARGE,
    TRUNCATED_JPEG,
    TRUNCATED_PNG,
    TRUNCATED_WEBP,
    WEBP_EXIF_PADDING,
    ImageInfo,
    _finish,
    unreadable_header,
    unsupported,
)
from detaug.formats.orientation import (  # noqa: F401 - importable from here
    ORIENTATIONS,
    WHY_APPLY,
    WHY_DECLARED_DISPLAYED,
    WHY_DECLARED_STORED,
    WHY_IGNORE,
    WHY_NEITHER,
    WHY_NO_DECLARED,
    WHY_SAME_SIZE,
    annotation_frame,
    describe_orientation,
    exif_matrix,
    explain_frame,
    orient_boxes,
)
from detaug.formats.size_limits import (  # noqa: F401 - importable from here
    DEFAULT_MAX_IMAGE_PIXELS,
    DEFAULT_MAX_IMAGE_SIDE,
    HARD_MAX_IMAGE_PIXELS,
    HARD_MAX_IMAGE_SIDE,
    MAX_PIXELS,
    image_limits,
    set_image_limits,
)

if TYPE_CHECKING:
    import numpy as np

__all__ = ["MAX_PIXELS", "DEFAULT_MAX_IMAGE_PIXELS", "DEFAULT_MAX_IMAGE_SIDE", "HARD_MAX_IMAGE_PIXELS",
           "HARD_MAX_IMAGE_SIDE", "image_limits", "set_image_limits", "ORIENTATIONS", "DALI_FORMATS", "ORIENTED_FORMATS", "ImageInfo",
           "probe_image", "probe_file", "read_and_probe", "read_bytes", "exif_matrix", "orient_boxes",
           "annotation_frame", "explain_frame", "describe_orientation"]

# ---------------------------------------------------------------------------------------------
# Probing


def probe_image(data: bytes | bytearray | memoryview | np.ndarray) -> ImageInfo:
    """Probe encoded bytes (a ``uint8`` array is taken as its bytes). Never raises on bad data."""
    if isinstance(data, bytes):
        raw = data
    elif isinstance(data, (bytearray, memoryview)):
        raw = bytes(data)
    else:  # a numpy array (any layout): its bytes in C order
        raw = data.tobytes()
    return _probe(io.BytesIO(raw), len(raw))


def probe_file(path: str | os.PathLike) -> ImageInfo:
    """Probe an image file reading only its header and its end (plus, rarely, the scan data of
    a JPEG with bytes after its end marker). Never raises: an unreadable file gives the problem
    ``cannot read: <strerror>``."""
    try:
        if not _regular_file(path):
            return ImageInfo(None, (0, 0), 1, NOT_A_FILE)
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            return _probe(handle, size)
    except OSError as err:
        return ImageInfo(None, (0, 0), 1, _cannot_read(err))


def read_bytes(path: str | os.PathLike) -> np.ndarray:
    """A whole file as ``uint8 [L]``: one ``open``, ``fstat`` and ``readv`` into the array
    (``np.fromfile`` takes about 2.5 times as long for a 45 KB photo: it goes through a Python
    file object; it is used where there is no ``readv``). A file that shrinks while it is read
    gives what was there. Raises ``OSError`` (a missing file, a folder, no permission)."""
    import numpy as np

    if not hasattr(os, "readv"):  # Windows
        return np.fromfile(path, dtype=np.uint8)
    fd = os.open(path, os.O_RDONLY)
    try:
        data = np.empty(os.fstat(fd).st_size, dtype=np.uint8)
        got = 0
        while got < len(data):
            read = os.readv(fd, [memoryview(data)[got:]])
            if read == 0:  # the file is shorter than it was: keep what there is
                return data[:got].copy()
            got += read
        return data
    finally:
        os.close(fd)


def read_and_probe(path: str | os.PathLike) -> tuple[np.ndarray | None, ImageInfo]:
    """Read a whole image file: ``(uint8 [L] bytes, info)``; ``(None, info)`` when the file
    cannot be read (problem ``cannot read: <strerror>``); an empty file gives an empty array
    and the problem ``empty file``."""
    import numpy as np

    try:
        if not _regular_file(path):
            return None, ImageInfo(None, (0, 0), 1, NOT_A_FILE)
        data = read_bytes(path)
    except OSError as err:
        return None, ImageInfo(None, (0, 0), 1, _cannot_read(err))
    return data, probe_image(data)


def _regular_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a regular file (a folder, FIFO or device is not read: a FIFO would
    block). Raises ``OSError`` when it cannot be looked at (missing, permission)."""
    return stat.S_ISREG(os.stat(path).st_mode)


def _cannot_read(err: OSError) -> str:
    return f"cannot read: {err.strerror or type(err).__name__}"


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_JP2_SIGNATURE = b"\x00\x00\x00\x0cjP  \r\n\x87\n"
_HEAD = 64


def sniff_format(head: bytes) -> str | None:
    """The format of an image from its first bytes (at least 16), ``None`` when unknown."""
    if head[:3] == b"\xff\xd8\xff":
        return "JPEG"
    if head[:8] == _PNG_SIGNATURE:
        return "PNG"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WEBP"
    if head[:4] in (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+"):
        return "TIFF"
    if head[:2] == b"BM":
        return "BMP"
    if head[:1] == b"P" and head[1:2] in (b"1", b"2", b"3", b"4", b"5", b"6") \
            and head[2:3] in (b" ", b"\t", b"\n", b"\r"):
        return "PPM"
    if head[:12] == _JP2_SIGNATURE or head[:4] == b"\xff\x4f\xff\x51":
        return "JPEG2000"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "GIF"
    if head[4:8] == b"ftyp":
        brand = head[8:12]
        if brand in (b"avif", b"avis"):
            return "AVIF"
        if brand in (b"heic", b"heix", b"hevc", b"heim", b"heis", b"mif1", b"msf1"):
            return "HEIF"
        return None
    if head[:4] == b"8BPS":
        return "PSD"
    if head[:4] == b"\x00\x00\x01\x00":
        return "ICO"
    if head[:4] == b"qoif":
        return "QOI"
    if head[:4] == b"\x76\x2f\x31\x01":
        return "EXR"
    return None


def _probe(fp: BinaryIO, size: int) -> ImageInfo:
    """The probe on a seekable binary file of ``size`` bytes."""
    if size == 0:
        return ImageInfo(None, (0, 0), 1, EMPTY)
    try:
        head = fp.read(_HEAD)
        fmt = sniff_format(head)
        if fmt is None:
            return ImageInfo(None, (0, 0), 1, NOT_AN_IMAGE)
        if fmt not in DALI_FORMATS:
            hw, mode = _pillow_header(fp, fmt)
            return ImageInfo(fmt, hw or (0, 0), 1, unsupported(fmt), mode)
        if fmt == "JPEG":
            return _probe_jpeg(fp, size)
        if fmt == "PNG":
            return _probe_png(fp, size)
        orientation, problem = _webp_structure(fp, size) if fmt == "WEBP" else (1, None)
        hw, mode = _pillow_header(fp, fmt)
        if hw is None:  # a cut WebP does not parse: say it is cut
            return ImageInfo(fmt, (0, 0), 1, problem or unreadable_header(fmt))
        if fmt == "TIFF":
            orientation = _tiff_orientation(fp)
        return _finish(fmt, hw, orientation, problem, mode)
    except OSError as err:  # a read error in the middle of the file
        return ImageInfo(None, (0, 0), 1, _cannot_read(err))

