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
"""

from __future__ import annotations

import io
import os
import stat
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO

if TYPE_CHECKING:
    import numpy as np

__all__ = ["MAX_PIXELS", "DEFAULT_MAX_IMAGE_PIXELS", "DEFAULT_MAX_IMAGE_SIDE", "HARD_MAX_IMAGE_PIXELS",
           "HARD_MAX_IMAGE_SIDE", "image_limits", "set_image_limits", "ORIENTATIONS", "DALI_FORMATS", "ORIENTED_FORMATS", "ImageInfo",
           "probe_image", "probe_file", "read_and_probe", "read_bytes", "exif_matrix", "orient_boxes",
           "annotation_frame", "explain_frame", "describe_orientation"]

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
#: How the frame of an image's boxes is chosen (see :func:`annotation_frame`).
ORIENTATIONS = ("auto", "apply", "ignore")
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


def _finish(fmt: str, hw: tuple[int, int], orientation: int, problem: str | None,
            mode: str | None) -> ImageInfo:
    """The info, "too large" (:func:`image_limits`) taking precedence over the structure's
    problem."""
    pixels, side = image_limits()
    if hw[0] * hw[1] > pixels or max(hw) > side:
        problem = TOO_LARGE
    return ImageInfo(fmt, hw, orientation, problem, mode)


def _pillow_header(fp: BinaryIO, fmt: str) -> tuple[tuple[int, int] | None, str | None]:
    """``((h, w), mode)`` from Pillow's plugin for ``fmt`` (header only, no pixel decoded, and
    no decompression-bomb check: the size is judged here), ``(None, None)`` on failure."""
    from PIL import Image

    Image.init()
    entry = Image.OPEN.get(fmt)
    if entry is None:
        return None, None
    try:
        fp.seek(0)
        image = entry[0](fp, None)
        width, height = image.size
        if fmt == "TIFF":  # Pillow gives the displayed size of a TIFF; the stored one is here
            width, height = image.tag_v2.get(256, width), image.tag_v2.get(257, height)
        mode = image.mode
    except Exception:  # noqa: BLE001 - Pillow raises many types; all mean "unreadable"
        return None, None
    if width <= 0 or height <= 0:
        return None, None
    return (int(height), int(width)), mode


def _orientation_of_exif(payload: bytes) -> int:
    """The orientation tag (0x0112) of an EXIF block (with or without its ``Exif\\0\\0``
    prefix); 1 when absent, unreadable or outside 1..8 (DALI then applies nothing)."""
    if payload.startswith(b"Exif\x00\x00"):
        payload = payload[6:]
    if len(payload) < 8:
        return 1
    order = payload[:2]
    if order == b"II":
        endian = "<"
    elif order == b"MM":
        endian = ">"
    else:
        return 1
    try:
        (offset,) = struct.unpack_from(endian + "I", payload, 4)
        (count,) = struct.unpack_from(endian + "H", payload, offset)
        for i in range(count):
            tag, kind, _, value = struct.unpack_from(endian + "HHI4s", payload, offset + 2 + 12 * i)
            if tag == 0x0112:
                if kind == 3:  # SHORT, left-justified in the value field
                    (k,) = struct.unpack_from(endian + "H", value)
                elif kind == 4:  # LONG
                    (k,) = struct.unpack_from(endian + "I", value)
                else:
                    return 1
                return k if 1 <= k <= 8 else 1
    except struct.error:
        return 1
    return 1


# JPEG: markers without a length (SOI, TEM, RST0-7), start-of-frame markers.
_JPEG_STANDALONE = frozenset({0x01, *range(0xD0, 0xD9)})
_JPEG_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE,
                       0xCF})
_JPEG_MODES = {1: "L", 3: "RGB", 4: "CMYK"}
_TAIL = 4096
_SCAN_BLOCK = 1 << 20


def _probe_jpeg(fp: BinaryIO, size: int) -> ImageInfo:
    """Walk the marker segments up to the first scan (size, components, first ``APP1 Exif``),
    then look for the end-of-image marker after it."""
    pos = 2
    hw: tuple[int, int] | None = None
    mode = None
    orientation = 0  # 0: no Exif segment seen yet
    while True:
        fp.seek(pos)
        marker = fp.read(4)
        if len(marker) < 2 or marker[0] != 0xFF:
            break  # not a marker where one must be: the header is broken or cut
        kind = marker[1]
        if kind == 0xFF:  # fill byte
            pos += 1
            continue
        if kind in _JPEG_STANDALONE:
            pos += 2
            continue
        if kind == 0xD9 or len(marker) < 4:
            break  # end of image (or of file) before any scan
        (length,) = struct.unpack(">H", marker[2:4])
        if length < 2:
            break
        if kind == 0xDA:  # start of scan: the header is complete
            if hw is None:
                return ImageInfo("JPEG", (0, 0), 1, unreadable_header("JPEG"))
            scan_start = pos + 2 + length
            problem = None if _jpeg_has_end(fp, size, scan_start) else TRUNCATED_JPEG
            return _finish("JPEG", hw, max(orientation, 1), problem, mode)
        if kind in _JPEG_SOF and hw is None:
            body = fp.read(6)
            if len(body) == 6:
                _, height, width, components = struct.unpack(">BHHB", body)
                if height > 0 and width > 0:
                    hw = (height, width)
                    mode = _JPEG_MODES.get(components)
        elif kind == 0xE1 and orientation == 0 and length > 8:
            body = fp.read(min(length - 2, 65533))
            if body.startswith(b"Exif\x00\x00"):
                orientation = _orientation_of_exif(body)
        pos += 2 + length
    if hw is None:
        return ImageInfo("JPEG", (0, 0), 1, unreadable_header("JPEG"))
    return _finish("JPEG", hw, max(orientation, 1), TRUNCATED_JPEG, mode)


def _jpeg_has_end(fp: BinaryIO, size: int, scan_start: int) -> bool:
    """Whether ``FFD9`` occurs after the first scan header. Entropy-coded data never holds
    ``FF D9`` (``FF`` is stuffed as ``FF 00``), so its presence means the scan data ended. The
    last :data:`_TAIL` bytes are looked at first (trailing NULs or a few bytes of junk after
    the marker are common); only when they lack it (a file with a large trailer, e.g. a video
    appended by a phone, or a truncated file) is the rest of the scan data read."""
    tail_start = max(scan_start, size - _TAIL)
    fp.seek(tail_start)
    if b"\xff\xd9" in fp.read(size - tail_start):
        return True
    pos, carry = scan_start, b""
    fp.seek(pos)
    while pos < tail_start:
        block = fp.read(min(_SCAN_BLOCK, tail_start - pos))
        if not block:
            break
        if b"\xff\xd9" in carry + block:
            return True
        carry = block[-1:]
        pos += len(block)
    return False


_PNG_MODES = {(0, 1): "1", (0, 16): "I;16", (2, 8): "RGB", (2, 16): "RGB", (3, 8): "P",
              (4, 8): "LA", (6, 8): "RGBA", (6, 16): "RGBA", (4, 16): "LA"}


def _probe_png(fp: BinaryIO, size: int) -> ImageInfo:
    """``IHDR`` (size, mode), the first ``eXIf`` (anywhere: DALI reads it after ``IDAT`` too)
    and ``IEND``, walking the chunk headers (one small read per chunk)."""
    fp.seek(8)
    ihdr = fp.read(25)
    if len(ihdr) < 25 or ihdr[4:8] != b"IHDR":
        return ImageInfo("PNG", (0, 0), 1, unreadable_header("PNG"))
    width, height, depth, color = struct.unpack(">IIBB", ihdr[8:18])
    if width == 0 or height == 0:
        return ImageInfo("PNG", (0, 0), 1, unreadable_header("PNG"))
    mode = _PNG_MODES.get((color, depth), {0: "L", 3: "P"}.get(color))
    orientation = 0
    pos = 8 + 25
    ended = False
    while pos + 8 <= size:
        fp.seek(pos)
        header = fp.read(8)
        if len(header) < 8:
            break
        (length,) = struct.unpack(">I", header[:4])
        kind = header[4:8]
        end = pos + 12 + length
        if end > size:
            break  # the chunk runs past the end of the file
        if kind == b"IEND":
            ended = True
            break
        if kind == b"eXIf" and orientation == 0:
            orientation = _orientation_of_exif(fp.read(length))
        pos = end
    return _finish("PNG", (height, width), max(orientation, 1), None if ended else TRUNCATED_PNG,
                   mode)


def _webp_structure(fp: BinaryIO, size: int) -> tuple[int, str | None]:
    """``(orientation, problem)`` of a WebP from its RIFF chunks."""
    fp.seek(4)
    (riff_size,) = struct.unpack("<I", fp.read(4))
    if size < riff_size + 8:
        return 1, TRUNCATED_WEBP
    pos, end = 12, min(size, riff_size + 8)
    odd_before = False
    while pos + 8 <= end:
        fp.seek(pos)
        header = fp.read(8)
        kind = header[:4]
        (length,) = struct.unpack("<I", header[4:8])
        if kind == b"EXIF":
            orientation = _orientation_of_exif(fp.read(length))
            return orientation, WEBP_EXIF_PADDING if odd_before else None
        odd_before = odd_before or bool(length & 1)
        pos += 8 + length + (length & 1)
    return 1, None


def _tiff_orientation(fp: BinaryIO) -> int:
    """The orientation tag of a TIFF's first IFD (the file is itself an EXIF-like block)."""
    fp.seek(0)
    head = fp.read(8)
    if head[:4] in (b"II+\x00", b"MM\x00+"):  # BigTIFF: 8-byte offsets; read it with Pillow
        return _pillow_tiff_orientation(fp)
    endian = "<" if head[:2] == b"II" else ">"
    (offset,) = struct.unpack(endian + "I", head[4:8])
    fp.seek(offset)
    count_bytes = fp.read(2)
    if len(count_bytes) < 2:
        return 1
    (count,) = struct.unpack(endian + "H", count_bytes)
    entries = fp.read(12 * count)
    return _orientation_of_exif(head[:4] + struct.pack(endian + "I", 8) + count_bytes + entries)


def _pillow_tiff_orientation(fp: BinaryIO) -> int:
    from PIL import Image

    try:
        fp.seek(0)
        value = Image.OPEN["TIFF"][0](fp, None).getexif().get(0x0112, 1)
    except Exception:  # noqa: BLE001 - unreadable tag: DALI applies nothing either
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


# ---------------------------------------------------------------------------------------------
# Orientation geometry


def exif_matrix(orientation: int, stored_hw: tuple[int, int]) -> np.ndarray:
    """float64 ``[3, 3]``: homogeneous stored pixel coordinates ``(x, y, 1)`` -> displayed
    coordinates, for an image of stored ``(height, width)``, continuous coordinates (the
    corner ``(0, 0)`` and ``(W, H)`` map to corners).

    ====  ====================================  =======================
    k     to display the stored pixels          displayed ``(x', y')``
    ====  ====================================  =======================
    1     nothing                               ``(x, y)``
    2     mirror left-right                     ``(W - x, y)``
    3     rotate 180°                           ``(W - x, H - y)``
    4     mirror top-bottom                     ``(x, H - y)``
    5     transpose (mirror + rotate 90° CCW)   ``(y, x)``
    6     rotate 90° clockwise                  ``(H - y, x)``
    7     transverse (mirror + rotate 90° CW)   ``(H - y, W - x)``
    8     rotate 90° counter-clockwise          ``(y, W - x)``
    ====  ====================================  =======================

    This is what ``PIL.ImageOps.exif_transpose`` and DALI's decoder do (tested on all eight).
    """
    import numpy as np

    h, w = float(stored_hw[0]), float(stored_hw[1])
    rows = {
        1: ((1, 0, 0), (0, 1, 0)),
        2: ((-1, 0, w), (0, 1, 0)),
        3: ((-1, 0, w), (0, -1, h)),
        4: ((1, 0, 0), (0, -1, h)),
        5: ((0, 1, 0), (1, 0, 0)),
        6: ((0, -1, h), (1, 0, 0)),
        7: ((0, -1, h), (-1, 0, w)),
        8: ((0, 1, 0), (-1, 0, w)),
    }.get(orientation)
    if rows is None:
        raise ValueError(f"EXIF orientation must be 1..8, got {orientation!r}")
    return np.array([*rows, (0, 0, 1)], dtype=np.float64)


_ORIENTATION_TEXTS = {
    1: "as stored", 2: "mirrored left-right", 3: "rotated 180°", 4: "mirrored top-bottom",
    5: "transposed", 6: "rotated 90° clockwise", 7: "transversed",
    8: "rotated 90° counter-clockwise",
}


def describe_orientation(orientation: int) -> str:
    """How an EXIF orientation displays the stored pixels, in words (``6``: "rotated 90°
    clockwise")."""
    return _ORIENTATION_TEXTS.get(orientation, f"unknown orientation {orientation}")


def orient_boxes(boxes_xyxy: Any, orientation: int, stored_hw: tuple[int, int]) -> np.ndarray:
    """float32 ``[N, 4]``: ``xyxy`` boxes of the stored frame mapped to the displayed frame
    (:func:`exif_matrix`; each orientation maps axis-aligned boxes to axis-aligned boxes)."""
    import numpy as np

    boxes = np.asarray(boxes_xyxy, dtype=np.float64)
    if boxes.size % 4 or (boxes.ndim != 1 and boxes.shape[-1] != 4):
        raise ValueError(f"boxes must be [N, 4] xyxy, got shape {boxes.shape}")
    boxes = boxes.reshape(-1, 4)
    m = exif_matrix(orientation, stored_hw)
    corners = np.stack([boxes[:, [0, 1]], boxes[:, [2, 3]]], axis=1)  # [N, 2, 2]
    mapped = corners @ m[:2, :2].T + m[:2, 2]
    return np.concatenate([mapped.min(axis=1), mapped.max(axis=1)], axis=1).astype(np.float32)


# Why a frame was chosen (stable texts: reports count them).
WHY_APPLY = 'orientation "apply"'
WHY_IGNORE = 'orientation "ignore"'
WHY_DECLARED_STORED = "declared size is the stored size"
WHY_DECLARED_DISPLAYED = "declared size is the displayed size"
WHY_NO_DECLARED = "no declared size (default: stored)"
WHY_SAME_SIZE = "stored and displayed sizes are equal (default: stored)"
WHY_NEITHER = "declared size is neither the stored nor the displayed size (default: stored)"


def explain_frame(declared_hw: tuple[int, int] | None, info: ImageInfo,
                  orientation: str) -> tuple[str, str]:
    """``(frame, why)``: :func:`annotation_frame` and the rule that decided it (one of the
    ``WHY_*`` texts of this module)."""
    if orientation == "apply":
        return "displayed", WHY_APPLY
    if orientation == "ignore":
        return "stored", WHY_IGNORE
    if orientation != "auto":
        raise ValueError(f"orientation must be one of {', '.join(ORIENTATIONS)}, "
                         f"got {orientation!r}")
    stored, displayed = tuple(info.stored_hw), info.displayed_hw
    if declared_hw is None:
        return "stored", WHY_NO_DECLARED
    declared = (int(declared_hw[0]), int(declared_hw[1]))
    if stored == displayed:
        return "stored", WHY_SAME_SIZE
    if declared == stored:
        return "stored", WHY_DECLARED_STORED
    if declared == displayed:
        return "displayed", WHY_DECLARED_DISPLAYED
    return "stored", WHY_NEITHER


def annotation_frame(declared_hw: tuple[int, int] | None, info: ImageInfo,
                     orientation: str) -> str:
    """``"stored"`` or ``"displayed"``: the frame an annotation's boxes are in.

    ``orientation="apply"``: displayed; ``"ignore"``: stored; ``"auto"``: the declared
    ``(height, width)`` decides (equal to the stored size and not the displayed one: stored;
    the reverse: displayed); undecidable (no declared size, a square image or an orientation
    that keeps the size, a declared size matching neither) gives "stored", what Pillow,
    labelImg and ``torchvision.io.decode_jpeg`` show by default. Raises ``ValueError`` for an
    ``orientation`` not in :data:`ORIENTATIONS`.
    """
    return explain_frame(declared_hw, info, orientation)[0]
