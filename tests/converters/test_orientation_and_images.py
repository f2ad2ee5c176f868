"""What voc2coco does with the image files: EXIF orientation (the frame of the boxes, COCO
width/height, the report), --verify-images = the loader's skip rules, absurd sizes and
coordinates, --strict."""

from __future__ import annotations

import io
import json
import math
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps

from converters import cli
from converters import report as R
from converters.voc2coco import ConversionError, convert
from detaug.formats import images as I
from detaug.formats.images import orient_boxes, probe_file, probe_image, read_and_probe
from tests.converters.helpers import make_voc, obj, voc_xml

# Stored (w, h) = (60, 40); a red rectangle at stored continuous xyxy (10, 5, 30, 15).
STORED_WH = (60, 40)
RECT = (10, 5, 30, 15)


def rotated_jpeg(path: Path, orientation: int, size: tuple[int, int] = STORED_WH) -> Path:
    pixels = np.zeros((size[1], size[0], 3), np.uint8)
    x0, y0, x1, y1 = RECT
    pixels[y0:y1, x0:x1] = (255, 0, 0)
    exif = Image.Exif()
    exif[0x0112] = orientation
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path, "JPEG", quality=100, subsampling=0, exif=exif.tobytes())
    return path


def voc_box(xyxy) -> tuple[float, ...]:
    """Continuous xyxy -> VOC 1-based inclusive (xmin, ymin, xmax, ymax)."""
    x0, y0, x1, y1 = (float(v) for v in xyxy)
    return (x0 + 1, y0 + 1, x1, y1)


def coco_xyxy(ann: dict) -> list[float]:
    x, y, w, h = ann["bbox"]
    return [x, y, x + w, y + h]


def red_box(pixels: np.ndarray) -> list[float]:
    red = (pixels[..., 0] > 128) & (pixels[..., 1] < 100) & (pixels[..., 2] < 100)
    ys, xs = np.nonzero(red)
    return [float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1)]


# ---------------------------------------------------------------------------------------------
# EXIF orientation


def exif_dataset(tmp_path: Path) -> Path:
    """Orientation 6 (stored 60x40, displayed 40x60): annotated on the stored pixels (<size>
    60x40), on the displayed image (<size> 40x60), without <size>, with a <size> matching
    neither; a square image; an image without EXIF."""
    displayed_rect = orient_boxes([RECT], 6, (STORED_WH[1], STORED_WH[0]))[0]
    files = {
        "stored.xml": voc_xml("stored.jpg", (60, 40), [obj("x", voc_box(RECT))]),
        "displayed.xml": voc_xml("displayed.jpg", (40, 60), [obj("x", voc_box(displayed_rect))]),
        "nosize.xml": voc_xml("nosize.jpg", None, [obj("x", voc_box(RECT))]),
        "neither.xml": voc_xml("neither.jpg", (50, 50), [obj("x", voc_box(RECT))]),
        "square.xml": voc_xml("square.jpg", (40, 40), [obj("x", (1, 1, 10, 20))]),
        "plain.xml": voc_xml("plain.jpg", (60, 40), [obj("x", voc_box(RECT))]),
    }
    root = make_voc(tmp_path / "VOC", files)
    for stem in ("stored", "displayed", "nosize", "neither"):
        rotated_jpeg(root / "JPEGImages" / f"{stem}.jpg", 6)
    rotated_jpeg(root / "JPEGImages/square.jpg", 6, (40, 40))
    rotated_jpeg(root / "JPEGImages/plain.jpg", 1)
    return root


def by_name(result) -> dict[str, tuple[dict, list[dict]]]:
    images = {i["file_name"].split(".")[0]: i for i in result.coco["images"]}
    return {stem: (img, [a for a in result.coco["annotations"] if a["image_id"] == img["id"]])
            for stem, img in images.items()}


def test_auto_takes_the_frame_that_size_names(tmp_path: Path) -> None:
    result = convert(exif_dataset(tmp_path))
    images = by_name(result)
    sizes = {stem: (img["width"], img["height"]) for stem, (img, _) in images.items()}
    assert sizes == {"stored": (60, 40), "displayed": (40, 60), "nosize": (60, 40),
                     "neither": (60, 40), "square": (40, 40), "plain": (60, 40)}
    assert {stem: img.get("exif_orientation") for stem, (img, _) in images.items()} == {
        "stored": 6, "displayed": 6, "nosize": 6, "neither": 6, "square": 6, "plain": None}
    report = result.report
    assert report.exif == {
        f"stored frame: {I.WHY_DECLARED_STORED}": 1,
        f"displayed frame: {I.WHY_DECLARED_DISPLAYED}": 1,
        f"stored frame: {I.WHY_NO_DECLARED}": 1,
        f"stored frame: {I.WHY_NEITHER}": 1,
        f"stored frame: {I.WHY_SAME_SIZE}": 1}
    assert report.exif_total == 5
    notes = {Path(m.path).stem: m for m in report.messages_of("exif")}
    assert set(notes) == {"stored", "displayed", "nosize", "neither", "square"}
    assert "EXIF orientation 6 (rotated 90° clockwise); stored 60x40, displayed 40x60" in \
        notes["displayed"].detail
    assert str(notes["displayed"]).startswith(str(tmp_path / "VOC/Annotations/displayed.xml"))
    summary = report.summary()
    assert "EXIF:        5 images with an EXIF orientation" in summary
    assert f"       1  displayed frame: {I.WHY_DECLARED_DISPLAYED}" in summary
    # <size> that matches neither frame: reported as before
    mismatched = report.messages_of("warning", R.SIZE_MISMATCH)
    assert [Path(m.path).stem for m in mismatched] == ["neither"]


def test_boxes_and_size_agree_and_land_on_the_object(tmp_path: Path) -> None:
    """Each image's boxes, in its COCO frame, mapped to the displayed image when that frame is
    the stored one, cover the red rectangle of the EXIF-transposed pixels."""
    root = exif_dataset(tmp_path)
    for orientation in ("auto", "apply", "ignore"):
        result = convert(root, orientation=orientation)
        for stem, (img, anns) in by_name(result).items():
            if stem in ("square", "neither") or (orientation != "auto" and stem != "plain"):
                continue  # annotations that do not match the option: checked elsewhere
            info = probe_file(root / "JPEGImages" / img["file_name"])
            frame = "displayed" if (img["height"], img["width"]) != info.stored_hw else "stored"
            box = np.array([coco_xyxy(anns[0])])
            if frame == "stored":
                box = orient_boxes(box, info.orientation, info.stored_hw)
            with Image.open(root / "JPEGImages" / img["file_name"]) as image:
                shown = np.asarray(ImageOps.exif_transpose(image).convert("RGB"))
            np.testing.assert_allclose(box[0], red_box(shown), atol=1, err_msg=stem)


def test_apply_and_ignore_force_the_frame_and_clip_to_it(tmp_path: Path) -> None:
    root = exif_dataset(tmp_path)
    applied = by_name(convert(root, orientation="apply"))
    ignored = by_name(convert(root, orientation="ignore"))
    for stem in ("stored", "displayed", "nosize", "neither"):
        assert (applied[stem][0]["width"], applied[stem][0]["height"]) == (40, 60)
        assert (ignored[stem][0]["width"], ignored[stem][0]["height"]) == (60, 40)
        assert applied[stem][0]["exif_orientation"] == ignored[stem][0]["exif_orientation"] == 6
    # a box of the 60-wide stored frame, taken in the 40-wide displayed frame, is clipped to it
    assert coco_xyxy(applied["stored"][1][0]) == [10.0, 5.0, 30.0, 15.0]
    wide = make_voc(tmp_path / "wide", {"a.xml": voc_xml("a.jpg", (60, 40), [
        obj("x", (41, 1, 60, 10))])})
    rotated_jpeg(wide / "JPEGImages/a.jpg", 6)
    result = convert(wide, orientation="apply")
    assert result.report.objects_skipped == {R.BOX_OUTSIDE_IMAGE: 1}
    assert result.report.exif == {f'displayed frame: {I.WHY_APPLY}': 1}
    assert "in a 40x60 image" in result.report.messages_of("object")[0].detail
    assert convert(wide, orientation="ignore").report.exif == {f'stored frame: {I.WHY_IGNORE}': 1}


def test_orientation_option_is_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = exif_dataset(tmp_path)
    with pytest.raises(ConversionError, match="orientation must be one of auto, apply, ignore"):
        convert(root, orientation="exif")
    out = tmp_path / "o.json"
    assert cli.main([str(root), "-o", str(out), "--orientation", "apply", "-q"]) == 0
    assert {i["width"] for i in json.loads(out.read_bytes())["images"]
            if "exif_orientation" in i and i["height"] != i["width"]} == {40}
    with pytest.raises(SystemExit):
        cli.main([str(root), "-o", str(out), "--orientation", "rotate"])
    assert "invalid choice" in capsys.readouterr().err


def test_summary_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([str(exif_dataset(tmp_path)), "-o", str(tmp_path / "o.json")]) == 0
    err = capsys.readouterr().err
    assert "EXIF:        5 images with an EXIF orientation" in err
    assert "displayed.xml: EXIF orientation: displayed frame: declared size is the displayed" in err


# ---------------------------------------------------------------------------------------------
# --verify-images = what the loader skips


def png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def bad_images(folder: Path) -> dict[str, bytes]:
    """{stem: bytes} of images the loader skips, plus two odd ones it does not."""
    folder.mkdir(parents=True, exist_ok=True)
    jpeg = io.BytesIO()
    Image.new("RGB", (32, 24), (200, 100, 50)).save(jpeg, "JPEG")
    png = io.BytesIO()
    Image.new("RGBA", (32, 24), (200, 100, 50, 10)).save(png, "PNG")
    gif = io.BytesIO()
    Image.new("RGB", (32, 24), (200, 100, 50)).save(gif, "GIF")
    huge = (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", 30000, 30000, 8, 2,
                                                                   0, 0, 0))
            + png_chunk(b"IDAT", zlib.compress(b"\0" * 16)) + png_chunk(b"IEND", b""))
    return {"empty": b"", "text": b"this is not an image\n", "cutjpeg": jpeg.getvalue()[:300],
            "cutpng": png.getvalue()[:-12], "gif": gif.getvalue(), "huge": huge,
            "pngnamedjpg": png.getvalue(), "good": jpeg.getvalue()}


def test_verify_images_rejects_exactly_what_the_loader_skips(tmp_path: Path) -> None:
    images = bad_images(tmp_path / "VOC/JPEGImages")
    files = {f"{stem}.xml": voc_xml(f"{stem}.jpg", (32, 24), [obj("x", (1, 1, 5, 5))])
             for stem in images}
    root = make_voc(tmp_path / "VOC", files)
    for stem, data in images.items():
        (root / "JPEGImages" / f"{stem}.jpg").write_bytes(data)  # all named .jpg
    # the loader probes the bytes it read (probe_image); the converter probes the file
    # without reading all of it (probe_file): the same answers
    for stem in images:
        path = root / "JPEGImages" / f"{stem}.jpg"
        assert probe_file(path) == probe_image(path.read_bytes()) == read_and_probe(path)[1]
    loader_skips = {stem: probe_file(root / "JPEGImages" / f"{stem}.jpg").problem
                    for stem in images}
    assert loader_skips["pngnamedjpg"] is None and loader_skips["good"] is None
    assert loader_skips["gif"] == "GIF: not a format DALI decodes"

    verified = convert(root, verify_images=True)
    skipped = {Path(m.path).stem: m.reason for m in verified.report.messages_of("image")}
    assert skipped == {s: p for s, p in loader_skips.items() if p is not None}
    assert verified.report.images_skipped == {
        "empty file": 1, "not an image (unknown format)": 1,
        "truncated JPEG (no end-of-image marker)": 1, "truncated PNG (no IEND chunk)": 1,
        "GIF: not a format DALI decodes": 1, "too large (over detaug's image size limit)": 1}
    assert [i["file_name"] for i in verified.coco["images"]] == ["good.jpg", "pngnamedjpg.jpg"]
    for message in verified.report.messages_of("image"):
        assert message.detail.endswith(f"{Path(message.path).stem}.jpg")  # names the image

    # without --verify-images: no size -> skipped; a size -> kept, with a warning
    unverified = convert(root)
    assert unverified.report.images_skipped == {"empty file": 1,
                                                "not an image (unknown format)": 1}
    kept = {Path(m.path).stem for m in unverified.report.messages_of("warning",
                                                                     R.IMAGE_PROBLEM_KEPT)}
    assert kept == {"cutjpeg", "cutpng", "gif", "huge"}
    assert len(unverified.coco["images"]) == 6


def test_verify_images_on_the_command_line(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    root = make_voc(tmp_path / "VOC", {"a.xml": voc_xml("a.gif"), "b.xml": voc_xml("b.jpg")},
                    {"a.gif": (32, 24), "b.jpg": (32, 24)})
    out = tmp_path / "o.json"
    assert cli.main([str(root), "-o", str(out), "--verify-images", "--strict"]) == 1
    err = capsys.readouterr().err
    assert "a.xml: skipped image: GIF: not a format DALI decodes" in err
    assert "--strict: 1 skipped image; nothing written" in err and not out.exists()
    assert cli.main([str(root), "-o", str(out), "--strict", "-q"]) == 0  # a warning only


# ---------------------------------------------------------------------------------------------
# Non-finite and absurd numbers, --strict


ABSURD_SIZES = ["1e200", "inf", "-inf", "nan", "NaN", "-5", "0", "1e9", "99999999999999999999"]


def strict_json_loads(data: bytes) -> object:
    def refuse(constant: str) -> None:
        raise ValueError(f"non-finite number {constant} in the JSON")

    return json.loads(data, parse_constant=refuse)


@pytest.mark.parametrize("value", ABSURD_SIZES)
def test_absurd_size_without_images_is_a_skip_naming_the_xml(tmp_path: Path, value: str,
                                                            capsys) -> None:
    text = voc_xml("a.jpg", None, [obj("x", (1, 1, 5, 5))]).replace(
        "</filename>", f"</filename><size><width>{value}</width><height>20</height></size>")
    root = make_voc(tmp_path / "VOC", {"a.xml": text, "b.xml": voc_xml("b.jpg")})
    result = convert(root)
    assert result.report.images_skipped == {R.IMAGE_SIZE_UNKNOWN: 1}
    message = result.report.messages_of("image")[0]
    assert message.path.endswith("a.xml") and f"<width> is {value!r}" in message.detail
    coco = strict_json_loads(result.to_json())
    assert [i["file_name"] for i in coco["images"]] == ["b.jpg"]
    out = tmp_path / "o.json"
    assert cli.main([str(root), "-o", str(out), "--strict"]) == 1 and not out.exists()
    assert "a.xml: skipped image: image size unknown" in capsys.readouterr().err


def test_size_with_too_many_pixels_and_absurd_size_with_an_image(tmp_path: Path) -> None:
    root = make_voc(tmp_path / "VOC", {
        "a.xml": voc_xml("a.jpg", (40000, 30000), [obj("x", (1, 1, 5, 5))]),
        "b.xml": voc_xml("b.jpg", (32, 24)).replace("<width>32", "<width>1e200")})
    result = convert(root)  # no images folder
    assert result.report.images_skipped == {R.IMAGE_SIZE_UNKNOWN: 2}
    assert "<size> 40000x30000 is absurd" in result.report.messages_of("image")[0].detail
    with_images = make_voc(tmp_path / "VOC2", {
        "b.xml": voc_xml("b.jpg", (32, 24)).replace("<width>32", "<width>1e200")},
        {"b.jpg": (32, 24)})
    used = convert(with_images)  # the image gives the size: a warning, as for any bad <size>
    assert used.report.warnings == {R.SIZE_FROM_IMAGE: 1}
    assert (used.coco["images"][0]["width"], used.coco["images"][0]["height"]) == (32, 24)


@pytest.mark.parametrize("box, what", [
    (("1e200", 1, 5, 5), "<xmin> is '1e200' (absurd"), ((1, "-1e200", 5, 5), "<ymin> is '-1e200'"),
    ((1, 1, "inf", 5), "<xmax> is 'inf'"), ((1, 1, 5, "nan"), "<ymax> is 'nan'"),
    (("1e308", "1e308", "1e308", "1e308"), "<xmin> is '1e308' (absurd"),  # sum overflows
    ((1, 1, "900000000", 5), "<xmax> is '900000000' (absurd"),
])
def test_absurd_coordinates_are_bad_coordinates(tmp_path: Path, box, what: str) -> None:
    root = make_voc(tmp_path / "VOC", {"a.xml": voc_xml("a.jpg", (32, 24), [obj("x", box),
                                                                          obj("y", (1, 1, 5, 5))])})
    result = convert(root)
    assert result.report.objects_skipped == {R.BAD_COORDINATE: 1}
    message = result.report.messages_of("object")[0]
    assert message.path.endswith("a.xml") and what in message.detail
    coco = strict_json_loads(result.to_json())
    assert [a["bbox"] for a in coco["annotations"]] == [[0.0, 0.0, 5.0, 5.0]]


def test_huge_but_plausible_coordinates_are_clipped(tmp_path: Path) -> None:
    root = make_voc(tmp_path / "VOC", {"a.xml": voc_xml("a.jpg", (32, 24), [
        obj("x", (-899999999, -5, 899999999, 1e8))])})
    result = convert(root)
    assert result.report.warnings[R.BOX_CLIPPED] == 1
    assert strict_json_loads(result.to_json())["annotations"][0]["bbox"] == [0.0, 0.0, 32.0, 24.0]


def test_strict_counts_every_skip_and_no_warning(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    clean = make_voc(tmp_path / "clean", {"a.xml": voc_xml("a.jpg", (32, 24), [
        obj("x", (1, 1, 50, 5))])}, {"a.jpg": (32, 24)})  # clipped: a warning
    out = tmp_path / "o.json"
    assert cli.main([str(clean), "-o", str(out), "--strict", "-q"]) == 0 and out.exists()
    one_object = make_voc(tmp_path / "obj", {"a.xml": voc_xml("a.jpg", (32, 24), [
        obj("x", (1, 1, "1e200", 5))])})
    assert cli.main([str(one_object), "-o", str(tmp_path / "p.json"), "--strict", "-q"]) == 1
    assert "--strict: 1 skipped object; nothing written" in capsys.readouterr().err
    assert not (tmp_path / "p.json").exists()


def test_json_is_written_without_nan(tmp_path: Path) -> None:
    from converters.coco import write_coco_json

    result = convert(make_voc(tmp_path / "VOC", {"a.xml": voc_xml("a.jpg")}))
    coco = result.coco
    coco["images"][0]["width"] = math.inf
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        write_coco_json(coco, tmp_path / "o.json")
    with pytest.raises(ValueError):
        result.write_json(tmp_path / "o.json")
    assert not (tmp_path / "o.json").exists()
