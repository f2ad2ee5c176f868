"""The headers of encoded images, format by format, read without decoding a pixel: the JPEG
marker segments, the PNG chunks, the WebP RIFF chunks and the TIFF IFD (size, mode, EXIF
orientation, a cut file), and Pillow's header parsers for the other formats. The probe of
:mod:`detaug.formats.images` calls them on a seekable binary file.
"""

from __future__ import annotations

import struct
from typing import BinaryIO

from detaug.formats.image_info import (
    TRUNCATED_JPEG,
    TRUNCATED_PNG,
    TRUNCATED_WEBP,
    WEBP_EXIF_PADDING,
    ImageInfo,
    _finish,
    unreadable_header,
)


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

