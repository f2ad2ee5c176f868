"""Fuzzing convert() with mutated real VOC XML files (seeded, ~200 cases): it never raises
anything but ConversionError, its report adds up, and its JSON is valid (no NaN or infinity,
positive integer sizes, every box finite and inside its image)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from lxml import etree
from PIL import Image

from converters.voc2coco import ConversionError, convert
from detaug.formats.images import MAX_PIXELS
from tests.converters.helpers import REALDATA

CASES = 200
SEED = 20261122
#: Values put into elements: non-finite, absurd, negative, empty, text, markup-ish, unicode.
VALUES = ["1e200", "-1e200", "1e308", "inf", "-inf", "nan", "NaN", "", " ", "0", "-0", "-1",
          "1e-320", "0.5", "3.7", "9" * 400, "0x10", "abc", "猫", "%d%s%%", "&amp;", "1_000",
          "٣", "  42  ", "1e9", "899999999", "-899999999", "65535", "1", "true", "2147483648"]


def source_xmls() -> list[Path]:
    if REALDATA is None:
        return []
    return sorted(p for p in REALDATA.glob("*/Annotations/*.xml"))


def mutate(data: bytes, rng: np.random.Generator) -> bytes:
    """One or a few random mutations: bytes flipped, cut, inserted; an element's text
    replaced, an element removed, duplicated or renamed; the encoding declaration changed."""
    for _ in range(int(rng.integers(1, 4))):
        # bytes (flip, cut, insert) and the declaration rarely: they mostly make malformed XML
        kind = int(rng.choice(8, p=[0.04, 0.04, 0.04, 0.25, 0.25, 0.18, 0.15, 0.05]))
        if kind == 0 and data:  # flip bytes
            raw = bytearray(data)
            for _ in range(int(rng.integers(1, 6))):
                raw[int(rng.integers(0, len(raw)))] = int(rng.integers(0, 256))
            data = bytes(raw)
        elif kind == 1 and data:  # cut
            data = data[: int(rng.integers(0, len(data)))]
        elif kind == 2:  # insert bytes
            at = int(rng.integers(0, len(data) + 1))
            junk = rng.choice([b"\x00", b"<", b"&", b"]]>", b"\xff\xfe", "é".encode(),
                               b"<object>", b"</size>", rng.bytes(int(rng.integers(1, 8)))])
            data = data[:at] + junk + data[at:]
        elif kind == 7:  # the declaration
            data = b'<?xml version="1.0" encoding="' + rng.choice(
                [b"bogus", b"utf-16", b"latin-1", b"ascii"]) + b'"?>\n' + data
        else:
            try:
                root = etree.fromstring(data)
            except (etree.LxmlError, ValueError):
                continue
            elements = list(root.iter())
            if not elements or root is None:
                continue
            element = elements[int(rng.integers(0, len(elements)))]
            try:
                if kind == 3:  # replace a text
                    element.text = str(rng.choice(VALUES))
                elif kind == 4:  # one value for every child (all four coordinates, say)
                    value = str(rng.choice(VALUES))
                    for child in element.getparent() if element.getparent() is not None else ():
                        child.text = value
                elif kind == 5 and element.getparent() is not None:  # remove or duplicate
                    parent = element.getparent()
                    if rng.random() < 0.5:
                        parent.remove(element)
                    else:
                        parent.append(etree.fromstring(etree.tostring(element)))
                elif kind == 6:  # rename
                    element.tag = str(rng.choice(["size", "object", "bndbox", "name", "width",
                                                  "xmin", "difficult", "part", "x"]))
            except ValueError:  # lxml refuses some texts (control characters)
                continue
            data = etree.tostring(root)
    return data


def check_coco(coco: dict) -> None:
    sizes = {}
    for image in coco["images"]:
        w, h = image["width"], image["height"]
        assert type(w) is int and type(h) is int and w > 0 and h > 0 and w * h < MAX_PIXELS
        assert image.get("exif_orientation", 1) in range(1, 9)
        sizes[image["id"]] = (w, h)
    ids = [a["id"] for a in coco["annotations"]]
    assert ids == list(range(1, len(ids) + 1))
    for ann in coco["annotations"]:
        x, y, w, h = ann["bbox"]
        assert all(math.isfinite(v) for v in (x, y, w, h, ann["area"]))
        width, height = sizes[ann["image_id"]]
        assert 0 <= x and 0 <= y and 0 < w and 0 < h
        assert x + w <= width + 1e-6 and y + h <= height + 1e-6


def refuse_constant(name: str) -> None:
    raise AssertionError(f"{name} in the JSON")


@pytest.mark.skipif(not source_xmls(), reason="real VOC data absent (../shared/realdata)")
def test_mutated_real_xml_never_breaks_convert(tmp_path: Path) -> None:
    sources = source_xmls()
    rng = np.random.default_rng(SEED)
    jpeg = {}  # small JPEGs with an EXIF orientation, by (orientation, wide)
    for k in (1, 6, 3):
        for wide in (True, False):
            path = tmp_path / f"img{k}{wide}.jpg"
            exif = Image.Exif()
            exif[0x0112] = k
            Image.new("RGB", (64, 40) if wide else (40, 64), (90, 20, 200)).save(
                path, "JPEG", exif=exif.tobytes())
            jpeg[k, wide] = path.read_bytes()
    failures = []
    for case in range(CASES):
        source = sources[int(rng.integers(0, len(sources)))]
        data = mutate(source.read_bytes(), rng)
        root = tmp_path / f"case{case}"
        (root / "Annotations").mkdir(parents=True)
        (root / "Annotations" / "x.xml").write_bytes(data)
        if rng.random() < 0.5:  # with an image (else annotation-only: sizes from <size>)
            (root / "JPEGImages").mkdir()
            key = (int(rng.choice([1, 6, 3])), bool(rng.random() < 0.5))
            (root / "JPEGImages" / "x.jpg").write_bytes(jpeg[key])
        options = {"coords": str(rng.choice(["voc", "raw"])),
                   "difficult": str(rng.choice(["keep", "crowd", "drop"])),
                   "orientation": str(rng.choice(["auto", "apply", "ignore"])),
                   "verify_images": bool(rng.random() < 0.5),
                   "labels": str(rng.choice(["discover", "voc"]))}
        try:
            result = convert(root, **options)
        except ConversionError:
            continue  # documented (not expected here: the folders are fine)
        except Exception as err:  # noqa: BLE001 - what the test is looking for
            failures.append(f"case {case} ({source.name}, {options}): "
                            f"{type(err).__name__}: {err}")
            continue
        try:
            text = result.to_json()
            coco = json.loads(text, parse_constant=refuse_constant)
            check_coco(coco)
            result.report.check()
            assert result.report.images_total == 1
            written = result.write_json(root / "out.json").read_bytes()
            assert written == text
        except AssertionError as err:
            failures.append(f"case {case} ({source.name}, {options}): {err}\n{data[:300]!r}")
    assert not failures, "\n".join(failures[:10])
