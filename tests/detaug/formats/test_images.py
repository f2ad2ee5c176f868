"""detaug.formats.images: the probe's problems, EXIF orientation, and, with real DALI CPU
pipelines, that what the probe accepts decodes to the right RGB and that ``orient_boxes``
puts boxes where DALI (and ``PIL.ImageOps.exif_transpose``) put the pixels."""

from __future__ import annotations

import io
import os
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps

from detaug.formats import images as I
from detaug.formats.images import (
    ORIENTATIONS,
    ImageInfo,
    annotation_frame,
    exif_matrix,
    explain_frame,
    orient_boxes,
    probe_file,
    probe_image,
    read_and_probe,
    read_bytes,
)

REALDATA = Path(__file__).resolve().parents[4] / "shared" / "realdata"
TRUNCATED = REALDATA / "damse-truncated-jpeg" / "JPEGImages" / "000001.jpg"

# A stored image of (h, w) = (48, 64) with a red rectangle at stored xyxy RECT (continuous px).
H, W = 48, 64
RECT = (8.0, 16.0, 32.0, 40.0)
RED = (255, 0, 0)


def encode(image: Image.Image, fmt: str, **save) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **save)
    return out.getvalue()


def exif_bytes(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif.tobytes()


def rectangle_image() -> Image.Image:
    pixels = np.zeros((H, W, 3), np.uint8)
    x0, y0, x1, y1 = (int(v) for v in RECT)
    pixels[y0:y1, x0:x1] = RED
    return Image.fromarray(pixels)


def halves(kind: str = "RGB") -> Image.Image:
    """Left half red, right half blue, (h, w) = (32, 48)."""
    pixels = np.zeros((32, 48, 3), np.uint8)
    pixels[:, :24] = RED
    pixels[:, 24:] = (0, 0, 255)
    return Image.fromarray(pixels).convert(kind) if kind != "RGB" else Image.fromarray(pixels)


def png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_by_hand(width: int, height: int, *, depth: int = 8, rgb16: np.ndarray | None = None,
                extra_after_idat: bytes = b"") -> bytes:
    """A PNG written chunk by chunk: a header claiming any size (no pixels behind it), or a
    real 16-bit RGB image (which Pillow cannot write)."""
    if rgb16 is not None:
        height, width = rgb16.shape[:2]
        raw = b"".join(b"\x00" + rgb16[y].astype(">u2").tobytes() for y in range(height))
        depth = 16
    else:
        raw = b"\x00" * 16
    ihdr = struct.pack(">IIBBBBB", width, height, depth, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", zlib.compress(raw))
            + extra_after_idat + png_chunk(b"IEND", b""))


def jpeg_by_hand(width: int, height: int, app: bytes = b"") -> bytes:
    """SOI, optional segments, a 3-component SOF0 header claiming any size, a scan, EOI."""
    sof = struct.pack(">BHHB", 8, height, width, 3) + bytes([1, 0x22, 0, 2, 0x11, 1, 3, 0x11, 1])
    sos = bytes([3, 1, 0, 2, 0x11, 3, 0x11, 0, 63, 0])
    return (b"\xff\xd8" + app + b"\xff\xc0" + struct.pack(">H", len(sof) + 2) + sof
            + b"\xff\xda" + struct.pack(">H", len(sos) + 2) + sos + b"\x12\x34" * 8 + b"\xff\xd9")


# ---------------------------------------------------------------------------------------------
# The probe: problems


def test_sniffed_by_bytes_not_by_extension(tmp_path: Path) -> None:
    named_jpg = tmp_path / "photo.jpg"
    named_jpg.write_bytes(encode(halves(), "PNG"))
    info = probe_file(named_jpg)
    assert info == ImageInfo("PNG", (32, 48), 1, None, "RGB")
    named_png = tmp_path / "photo.png"
    named_png.write_bytes(encode(halves(), "JPEG"))
    assert probe_file(named_png).format == "JPEG"


def test_every_dali_format_is_accepted() -> None:
    image = halves()
    for fmt, save in [("JPEG", {}), ("PNG", {}), ("BMP", {}), ("TIFF", {}), ("WEBP", {}),
                      ("PPM", {}), ("JPEG2000", {}), ("WEBP", {"lossless": True})]:
        info = probe_image(encode(image, fmt, **save))
        assert (info.format, info.stored_hw, info.problem) == (fmt, (32, 48), None), fmt


def test_empty_and_unreadable_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jpg"
    empty.write_bytes(b"")
    assert probe_file(empty).problem == I.EMPTY == "empty file"
    data, info = read_and_probe(empty)
    assert data is not None and data.size == 0 and info.problem == "empty file"
    assert probe_image(b"").problem == "empty file"
    for path in (tmp_path / "missing.jpg", tmp_path):  # no file; a folder
        data, info = read_and_probe(path)
        assert data is None and info.problem.startswith("cannot read: "), info
        assert probe_file(path).problem.startswith("cannot read: ")
        assert info.stored_hw == (0, 0) and not info.size_known
    fifo = tmp_path / "pipe.jpg"
    os.mkfifo(fifo)  # would block a reader: not opened
    assert probe_file(fifo).problem == read_and_probe(fifo)[1].problem == I.NOT_A_FILE
    assert I.NOT_A_FILE == "cannot read: not a regular file"


def test_read_bytes_gives_the_whole_file(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    for size in (0, 1, 45_000, 3 * 1024 * 1024 + 7):  # empty, tiny, a photo, more than one read may give
        path = tmp_path / f"f{size}.bin"
        payload = rng.integers(0, 256, size, dtype=np.uint8)
        payload.tofile(path)
        data = read_bytes(path)
        assert data.dtype == np.uint8 and data.shape == (size,)
        np.testing.assert_array_equal(data, np.fromfile(path, dtype=np.uint8))
    with pytest.raises(FileNotFoundError):
        read_bytes(tmp_path / "missing.jpg")
    with pytest.raises(IsADirectoryError):
        read_bytes(tmp_path)


def test_text_file_named_jpg(tmp_path: Path) -> None:
    path = tmp_path / "notes.jpg"
    path.write_text("<annotation>this is not an image</annotation>\n")
    assert probe_file(path) == ImageInfo(None, (0, 0), 1, "not an image (unknown format)")
    assert probe_image(b"\x00" * 100).problem == I.NOT_AN_IMAGE


def test_formats_dali_does_not_decode() -> None:
    gif = probe_image(encode(halves(), "GIF"))
    assert gif == ImageInfo("GIF", (32, 48), 1, "GIF: not a format DALI decodes", "P")
    heif = probe_image(b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic" + b"\x00" * 64)
    assert heif.format == "HEIF" and heif.problem == "HEIF: not a format DALI decodes"
    assert heif.stored_hw == (0, 0)


def test_truncated_jpeg_from_real_data() -> None:
    if not TRUNCATED.is_file():
        pytest.skip(f"real data absent: {TRUNCATED}")
    info = probe_file(TRUNCATED)
    assert info == ImageInfo("JPEG", (500, 353), 1, "truncated JPEG (no end-of-image marker)",
                             "RGB")
    data, same = read_and_probe(TRUNCATED)
    assert same == info and data is not None and data.dtype == np.uint8 and data.size == 8192


def test_jpeg_end_marker_rules() -> None:
    whole = encode(rectangle_image(), "JPEG", quality=90)
    assert probe_image(whole).problem is None
    for cut in (len(whole) - 2, len(whole) // 2, 700):
        assert probe_image(whole[:cut]).problem == I.TRUNCATED_JPEG, cut
    # trailing NULs, whitespace, or a large trailer (a phone's appended video) are fine
    assert probe_image(whole + b"\x00" * 5000).problem is None
    assert probe_image(whole + b"\r\n  ").problem is None
    assert probe_image(whole + bytes(range(256)) * 100).problem is None
    # an FFD9 inside a header segment (an EXIF thumbnail) does not hide a cut scan
    app2 = b"\xff\xe2" + struct.pack(">H", 2 + 40) + b"\xff\xd9" * 20
    with_thumbnail = whole[:2] + app2 + whole[2:]
    assert probe_image(with_thumbnail).problem is None
    assert probe_image(with_thumbnail[:-200]).problem == I.TRUNCATED_JPEG
    # cut inside the header: no scan at all
    assert probe_image(whole[:300]).problem in (I.TRUNCATED_JPEG, "unreadable JPEG header")
    assert probe_image(b"\xff\xd8\xff\xe0\x00\x10JFIF").problem == "unreadable JPEG header"


def test_truncated_png() -> None:
    whole = encode(halves(), "PNG")
    assert probe_image(whole).problem is None
    assert probe_image(whole + b"\x00" * 10).problem is None  # junk after IEND
    assert probe_image(whole[:-12]).problem == I.TRUNCATED_PNG  # IEND missing
    assert probe_image(whole[: len(whole) // 2]).problem == I.TRUNCATED_PNG  # IDAT cut
    assert probe_image(whole[:20]).problem == "unreadable PNG header"


def test_truncated_webp() -> None:
    whole = encode(halves(), "WEBP")
    assert probe_image(whole).problem is None
    assert probe_image(whole[:-10]).problem == I.TRUNCATED_WEBP


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_header_claiming_too_many_pixels(fmt: str) -> None:
    make = png_by_hand if fmt == "PNG" else jpeg_by_hand
    pixels, side = I.image_limits()
    assert (pixels, side) == (I.DEFAULT_MAX_IMAGE_PIXELS, I.DEFAULT_MAX_IMAGE_SIDE) == (16384 * 16384, 32768)
    huge = probe_image(make(29999, 29999))  # the size that ended the process in DALI (SIGSEGV)
    assert huge == ImageInfo(fmt, (29999, 29999), 1, I.TOO_LARGE, "RGB")
    assert huge.problem == "too large (over detaug's image size limit)"
    assert probe_image(make(20000, 20000)).problem == I.TOO_LARGE  # 3.7 GB per image in DALI
    assert probe_image(make(16384 * 2, 8192)).problem is None  # the product counts: 2**28 exactly
    assert probe_image(make(16384 * 2, 8193)).problem == I.TOO_LARGE
    assert probe_image(make(32769, 10)).problem == I.TOO_LARGE  # and the longest side
    assert probe_image(make(10, 32768)).problem is None
    assert 29999 * 29999 > I.HARD_MAX_IMAGE_PIXELS  # no limit may be raised to what crashes DALI


def test_image_limits_can_be_raised_and_lowered() -> None:
    data = jpeg_by_hand(20000, 20000)
    before = I.set_image_limits(pixels=20000 * 20000)
    try:
        assert os.environ["DETAUG_MAX_IMAGE_PIXELS"] == str(20000 * 20000)  # worker processes inherit it
        assert probe_image(data).problem is None
        I.set_image_limits(pixels=100, side=9)
        assert probe_image(jpeg_by_hand(10, 9)).problem == I.TOO_LARGE
        assert probe_image(jpeg_by_hand(9, 9)).problem is None
        with pytest.raises(ValueError, match="must be 1..715827882"):
            I.set_image_limits(pixels=29999 * 29999)
        with pytest.raises(ValueError, match="must be 1..65535"):
            I.set_image_limits(side=70000)
    finally:
        I.set_image_limits(*before)
        os.environ.pop("DETAUG_MAX_IMAGE_PIXELS", None)
        os.environ.pop("DETAUG_MAX_IMAGE_SIDE", None)
    assert probe_image(data).problem == I.TOO_LARGE


def test_probe_accepts_bytes_memoryview_and_arrays() -> None:
    data = encode(halves(), "JPEG")
    info = probe_image(data)
    assert probe_image(memoryview(data)) == probe_image(bytearray(data)) == info
    assert probe_image(np.frombuffer(data, np.uint8)) == info
    assert probe_image(np.frombuffer(data, np.uint8)[::1].copy()) == info


def test_modes_are_reported_and_are_not_problems() -> None:
    cases = {"L": encode(halves("L"), "JPEG"), "CMYK": encode(halves("CMYK"), "JPEG"),
             "RGBA": encode(halves("RGBA"), "PNG"), "P": encode(halves("P"), "PNG"),
             "I;16": encode(Image.fromarray(np.full((4, 4), 300, np.uint16)), "PNG")}
    for mode, data in cases.items():
        info = probe_image(data)
        assert info.mode == mode and info.problem is None, (mode, info)


# ---------------------------------------------------------------------------------------------
# EXIF orientation: where it is read from


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "TIFF", "WEBP"])
def test_orientation_read_from_each_oriented_format(fmt: str) -> None:
    for k in range(1, 9):
        info = probe_image(encode(rectangle_image(), fmt, exif=exif_bytes(k)))
        assert (info.orientation, info.stored_hw) == (k, (H, W)), (fmt, k)
        assert info.displayed_hw == ((W, H) if k >= 5 else (H, W))


def test_orientation_rules() -> None:
    assert probe_image(encode(rectangle_image(), "JPEG")).orientation == 1  # no EXIF
    for k in (0, 9, 300):  # out of range: DALI applies nothing
        assert probe_image(encode(rectangle_image(), "JPEG", exif=exif_bytes(k))).orientation == 1
    # PNG eXIf after the image data counts (DALI reads it there)
    exif6 = exif_bytes(6)
    late = png_by_hand(W, H, extra_after_idat=png_chunk(b"eXIf", exif6[6:]))
    assert probe_image(late).orientation == 6
    # XMP orientation alone is ignored (Pillow's getexif() would use it; DALI does not)
    xmp = b'<x:xmpmeta><rdf:Description tiff:Orientation="6"/></x:xmpmeta>'
    assert probe_image(encode(rectangle_image(), "JPEG", xmp=xmp)).orientation == 1
    # formats without EXIF orientation in DALI
    assert probe_image(encode(rectangle_image(), "BMP")).orientation == 1


# ---------------------------------------------------------------------------------------------
# Geometry


def test_exif_matrix_maps_corners_to_corners() -> None:
    for k in range(1, 9):
        m = exif_matrix(k, (H, W))
        assert m.dtype == np.float64 and m.shape == (3, 3)
        dh, dw = (W, H) if k >= 5 else (H, W)
        corners = np.array([[0, 0, 1], [W, 0, 1], [0, H, 1], [W, H, 1]], np.float64)
        mapped = {tuple(p) for p in (corners @ m.T)[:, :2]}
        assert mapped == {(0, 0), (dw, 0), (0, dh), (dw, dh)}, k
    # the stored top-left corner: top-right when rotated clockwise, bottom-left anticlockwise
    np.testing.assert_array_equal(exif_matrix(6, (H, W)) @ [0, 0, 1], [H, 0, 1])
    np.testing.assert_array_equal(exif_matrix(8, (H, W)) @ [0, 0, 1], [0, W, 1])
    with pytest.raises(ValueError, match="1..8"):
        exif_matrix(0, (H, W))


def test_orient_boxes_shapes() -> None:
    empty = orient_boxes(np.zeros((0, 4)), 6, (H, W))
    assert empty.shape == (0, 4) and empty.dtype == np.float32
    one = orient_boxes([1, 2, 3, 4], 1, (H, W))
    assert one.dtype == np.float32 and one.tolist() == [[1, 2, 3, 4]]
    assert orient_boxes([[0, 0, 10, 5]], 6, (H, W)).tolist() == [[H - 5, 0, H, 10]]
    with pytest.raises(ValueError, match=r"\[N, 4\]"):
        orient_boxes(np.zeros((2, 3)), 6, (H, W))


def test_annotation_frame_rule() -> None:
    rotated = ImageInfo("JPEG", (H, W), 6)
    assert annotation_frame((H, W), rotated, "auto") == "stored"
    assert annotation_frame((W, H), rotated, "auto") == "displayed"
    assert annotation_frame(None, rotated, "auto") == "stored"
    assert annotation_frame((10, 10), rotated, "auto") == "stored"  # matches neither
    assert annotation_frame((H, H), ImageInfo("JPEG", (H, H), 6), "auto") == "stored"  # square
    assert annotation_frame((H, W), ImageInfo("JPEG", (H, W), 3), "auto") == "stored"  # 180°
    assert annotation_frame((H, W), rotated, "apply") == "displayed"
    assert annotation_frame((W, H), rotated, "ignore") == "stored"
    assert explain_frame((W, H), rotated, "auto") == ("displayed", I.WHY_DECLARED_DISPLAYED)
    assert explain_frame(None, rotated, "auto") == ("stored", I.WHY_NO_DECLARED)
    assert ORIENTATIONS == ("auto", "apply", "ignore")
    with pytest.raises(ValueError, match="auto, apply, ignore"):
        annotation_frame((H, W), rotated, "exif")


# ---------------------------------------------------------------------------------------------
# Real DALI CPU pipelines


@pytest.fixture(scope="module")
def dali_decode():
    """``decode(list of encoded bytes, adjust_orientation=True) -> list of [H, W, C] uint8``
    with ``fn.decoders.image(device="cpu", output_type=RGB)``; one pipeline per setting."""
    pytest.importorskip("nvidia.dali")
    from nvidia.dali import fn, pipeline_def, types

    pipes = {}

    def decode(samples: list[bytes], adjust_orientation: bool = True) -> list[np.ndarray]:
        if adjust_orientation not in pipes:
            @pipeline_def(batch_size=32, num_threads=1, device_id=None, exec_dynamic=True,
                          prefetch_queue_depth=1)
            def pipe():
                data = fn.external_source(name="data", dtype=types.UINT8, ndim=1)
                return fn.decoders.image(data, device="cpu", output_type=types.RGB,
                                         adjust_orientation=adjust_orientation)

            pipes[adjust_orientation] = pipe()
            pipes[adjust_orientation].build()
        p = pipes[adjust_orientation]
        p.feed_input("data", [np.frombuffer(s, np.uint8) for s in samples])
        (out,) = p.run()
        return [np.asarray(out[i]) for i in range(len(samples))]

    return decode


def dali_fails(data: bytes) -> bool:
    """Whether a fresh DALI CPU pipeline fails to decode ``data``."""
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=1, num_threads=1, device_id=None, exec_dynamic=True)
    def pipe():
        return fn.decoders.image(fn.external_source(name="data", dtype=types.UINT8, ndim=1),
                                 device="cpu", output_type=types.RGB)

    p = pipe()
    p.build()
    p.feed_input("data", [np.frombuffer(data, np.uint8)])
    try:
        p.run()
    except RuntimeError:
        return True
    return False


def red_box(pixels: np.ndarray) -> list[float]:
    """xyxy (continuous) of the red pixels."""
    red = (pixels[..., 0] > 128) & (pixels[..., 1] < 100) & (pixels[..., 2] < 100)
    ys, xs = np.nonzero(red)
    return [float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1)]


@pytest.mark.parametrize("fmt, save", [("JPEG", {"quality": 100, "subsampling": 0}),
                                       ("PNG", {}), ("TIFF", {}), ("WEBP", {"quality": 100})])
def test_orient_boxes_follows_dali_and_pillow(dali_decode, fmt: str, save: dict) -> None:
    samples = [encode(rectangle_image(), fmt, exif=exif_bytes(k), **save) for k in range(1, 9)]
    shown = dali_decode(samples)
    stored = dali_decode(samples, adjust_orientation=False)
    tolerance = 0.0 if fmt in ("PNG", "TIFF") else 1.0
    for k, data, dali, raw in zip(range(1, 9), samples, shown, stored, strict=True):
        info = probe_image(data)
        assert info.orientation == k and info.problem is None
        expected = orient_boxes([RECT], k, info.stored_hw)[0]
        pil = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB"))
        for name, pixels in (("DALI", dali), ("PIL exif_transpose", pil)):
            assert pixels.shape == (*info.displayed_hw, 3), (fmt, k, name)
            np.testing.assert_allclose(red_box(pixels), expected, atol=tolerance,
                                       err_msg=f"{fmt} orientation {k}: {name}")
        # adjust_orientation=False (orientation="ignore"): the stored frame, boxes unchanged
        assert raw.shape == (H, W, 3)
        np.testing.assert_allclose(red_box(raw), RECT, atol=tolerance)


def test_odd_images_decode_to_rgb_in_dali(dali_decode, tmp_path: Path) -> None:
    """Grayscale and CMYK JPEG, RGBA, palette and 16-bit PNG: 3-channel RGB uint8, right colours."""
    gray = np.zeros((32, 48), np.uint8)
    gray[:, :24], gray[:, 24:] = 200, 50
    rgb16 = np.zeros((32, 48, 3), np.uint16)
    rgb16[:, :24] = (65535, 0, 0)
    rgb16[:, 24:] = (0, 0, 65535)
    rgba = np.zeros((32, 48, 4), np.uint8)
    rgba[:, :24] = (255, 0, 0, 255)
    rgba[:, 24:] = (0, 0, 255, 40)  # alpha is dropped, not blended
    cases = {
        "grayscale JPEG": (encode(Image.fromarray(gray), "JPEG", quality=95),
                           (200, 200, 200), (50, 50, 50)),
        "CMYK JPEG": (encode(halves("CMYK"), "JPEG", quality=95), RED, (0, 0, 255)),
        "RGBA PNG": (encode(Image.fromarray(rgba), "PNG"), RED, (0, 0, 255)),
        "palette PNG": (encode(halves("P"), "PNG"), RED, (0, 0, 255)),
        "16-bit RGB PNG": (png_by_hand(0, 0, rgb16=rgb16), RED, (0, 0, 255)),
        "16-bit gray PNG": (encode(Image.fromarray(gray.astype(np.uint16) * 257), "PNG"),
                            (200, 200, 200), (50, 50, 50)),
    }
    for name, (data, _, _) in cases.items():
        assert probe_image(data).problem is None, name
    outputs = dali_decode([c[0] for c in cases.values()])
    for (name, (_, left, right)), out in zip(cases.items(), outputs, strict=True):
        assert out.dtype == np.uint8 and out.shape == (32, 48, 3), (name, out.shape, out.dtype)
        np.testing.assert_allclose(out[:, :20].reshape(-1, 3).mean(0), left, atol=4, err_msg=name)
        np.testing.assert_allclose(out[:, 28:].reshape(-1, 3).mean(0), right, atol=4, err_msg=name)


def test_png_bytes_in_a_file_named_jpg_decode_in_dali(tmp_path: Path) -> None:
    pytest.importorskip("nvidia.dali")
    from nvidia.dali import fn, pipeline_def, types

    path = tmp_path / "really_a_png.jpg"
    path.write_bytes(encode(halves("RGBA"), "PNG"))
    assert probe_file(path).format == "PNG" and probe_file(path).problem is None

    @pipeline_def(batch_size=1, num_threads=1, device_id=None, exec_dynamic=True)
    def pipe():
        data, _ = fn.readers.file(files=[str(path)], labels=[0])
        return fn.decoders.image(data, device="cpu", output_type=types.RGB)

    p = pipe()
    p.build()
    (out,) = p.run()
    pixels = np.asarray(out[0])
    assert pixels.shape == (32, 48, 3) and pixels.dtype == np.uint8
    assert pixels[0, 0].tolist() == list(RED) and pixels[-1, -1].tolist() == [0, 0, 255]


def webp_chunks(data: bytes) -> list[tuple[bytes, int]]:
    pos, chunks = 12, []
    while pos + 8 <= len(data):
        (length,) = struct.unpack("<I", data[pos + 4:pos + 8])
        chunks.append((data[pos:pos + 4], length))
        pos += 8 + length + (length & 1)
    return chunks


def test_what_the_probe_rejects_dali_cannot_decode() -> None:
    """GIF, and WebP whose EXIF chunk follows a chunk of odd size (DALI 2.4's parser skips
    chunks without their padding byte): DALI fails. If a DALI release decodes them, this test
    fails: drop the rule from the probe."""
    pytest.importorskip("nvidia.dali")
    gif = encode(halves(), "GIF")
    assert probe_image(gif).problem == "GIF: not a format DALI decodes" and dali_fails(gif)
    odd_icc = encode(halves(), "WEBP", icc_profile=b"\0" * 201, exif=exif_bytes(6))
    even_icc = encode(halves(), "WEBP", icc_profile=b"\0" * 200, exif=exif_bytes(6))
    odd_no_exif = encode(halves(), "WEBP", icc_profile=b"\0" * 201)
    assert [k for k, _ in webp_chunks(odd_icc)] == [b"VP8X", b"ICCP", b"VP8 ", b"EXIF"]
    assert probe_image(odd_icc).problem == I.WEBP_EXIF_PADDING and dali_fails(odd_icc)
    assert probe_image(even_icc).problem is None and not dali_fails(even_icc)
    assert probe_image(odd_no_exif).problem is None and not dali_fails(odd_no_exif)
    for seed in range(4):  # lossless: the VP8L chunk's size decides
        pixels = np.random.default_rng(seed).integers(0, 255, (20 + seed, 30, 3), dtype=np.uint8)
        data = encode(Image.fromarray(pixels), "WEBP", lossless=True, exif=exif_bytes(1))
        odd = webp_chunks(data)[1][1] % 2 == 1
        assert (probe_image(data).problem == I.WEBP_EXIF_PADDING) == odd == dali_fails(data)


@pytest.mark.filterwarnings("ignore")  # Pillow warns about the corrupt TIFF tags it skips
def test_probe_never_raises_on_mutated_images() -> None:
    """Cut, flipped and overwritten bytes of every format: an ImageInfo, never an exception."""
    rng = np.random.default_rng(7)
    image = Image.fromarray(rng.integers(0, 255, (30, 40, 3), dtype=np.uint8))
    exif = exif_bytes(6)
    bases = [encode(image, "JPEG", exif=exif), encode(image, "PNG", exif=exif),
             encode(image, "TIFF", exif=exif), encode(image, "WEBP", exif=exif),
             encode(image, "WEBP", lossless=True), encode(image, "BMP"), encode(image, "PPM"),
             encode(image, "JPEG2000"), encode(image, "GIF")]
    problems = set()
    for case in range(1500):
        data = bytearray(bases[case % len(bases)])
        kind = case // len(bases) % 3
        if kind == 0:
            data = data[: int(rng.integers(0, len(data)))]
        elif kind == 1:
            for _ in range(int(rng.integers(1, 10))):
                data[int(rng.integers(0, len(data)))] = int(rng.integers(0, 256))
        else:  # the header fields right after the signature
            at = int(rng.integers(4, 40))
            data[at:at + 4] = rng.bytes(4)
        info = probe_image(bytes(data))
        assert isinstance(info, ImageInfo) and 1 <= info.orientation <= 8
        assert info.problem is not None or info.size_known
        problems.add(info.problem)
    assert {None, I.TRUNCATED_JPEG, I.TRUNCATED_PNG, I.TOO_LARGE} <= problems
