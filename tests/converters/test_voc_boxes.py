"""read_voc_boxes: a VOC split straight to xyxy arrays, equal to the COCO path's numbers."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from converters.voc2coco import convert, read_voc_boxes
from detaug.formats.coco import load_coco
from tests.converters.helpers import make_voc, obj, voc_xml


def test_same_images_boxes_and_labels_as_through_coco(tmp_path: Path) -> None:
    root = make_voc(tmp_path, {
        "a.xml": voc_xml("a.jpg", (32, 24), [obj("cat", (1, 1, 10, 10), difficult=1),
                                             obj("dog", (217.62, 2.79, 256.61, 20.54)),
                                             obj("cat", (5, 5, 4, 5))]),
        "b.xml": voc_xml("b.jpg", (32, 24), [obj("dog", (20, 3, 40, 30))]),  # clipped
        "c.xml": voc_xml("c.jpg", (32, 24))}, {"a.jpg": (300, 24), "b.jpg": (32, 24), "c.jpg": (32, 24)})
    direct = read_voc_boxes(root, difficult="crowd")
    coco = load_coco(convert(root, difficult="crowd").coco)
    assert direct.categories == coco.categories == {1: "cat", 2: "dog"}
    assert [(i.image_id, i.file_name, i.size) for i in direct.images] == [
        (i.id, i.file_name, i.size) for i in coco.images]
    for mine, theirs in zip(direct.images, coco.images):
        assert mine.boxes.dtype == np.float32 and mine.labels.dtype == np.int64
        np.testing.assert_array_equal(mine.boxes, theirs.boxes)
        np.testing.assert_array_equal(mine.labels, theirs.labels)
        np.testing.assert_array_equal(mine.iscrowd, theirs.iscrowd)
    # VOC pixel convention: x1 = xmin - 1, x2 = xmax
    np.testing.assert_array_equal(direct.images[0].boxes[0], [0, 0, 10, 10])
    assert direct.images[0].iscrowd.tolist() == [True, False]
    assert direct.images[1].boxes.tolist() == [[19, 2, 32, 24]]
    assert direct.images[2].boxes.shape == (0, 4)
    assert direct.report.objects_converted == 3 and direct.report.objects_skipped == {"zero-size box": 1}


def test_keep_unreadable_gives_the_images_convert_skips_for_their_file(tmp_path: Path) -> None:
    """A loader's source (VocSource) keeps an image whose file is missing or has no readable
    size, so that the loader names it when it meets it: same report as convert, the converted
    images keep convert's ids, the kept ones come after, boxes in the <size> frame (not clipped
    without one)."""
    root = make_voc(tmp_path, {
        "a.xml": voc_xml("a.jpg", (32, 24), [obj("cat", (1, 1, 40, 10))]),  # missing, box clipped to <size>
        "b.xml": voc_xml("b.jpg", (32, 24), [obj("dog", (2, 3, 9, 9))]),
        "c.xml": voc_xml("c.png", None, [obj("cat", (1, 1, 50, 50))]),  # empty file, no <size>: not clipped
        "d.xml": voc_xml("d.jpg", (32, 24), [obj("dog", (1, 1, 5, 5))])}, {"b.jpg": (32, 24), "d.jpg": (32, 24)})
    (root / "JPEGImages" / "c.png").write_bytes(b"")
    kept = read_voc_boxes(root, keep_unreadable=True)
    plain = read_voc_boxes(root)
    converted = convert(root)
    assert kept.report.summary() == plain.report.summary() == converted.report.summary()
    assert [(i.image_id, i.file_name) for i in plain.images] == [
        (i["id"], i["file_name"]) for i in converted.coco["images"]]
    assert [(i.image_id, i.file_name, i.size, i.problem) for i in kept.images] == [
        (3, "a.jpg", (24, 32), "image file not found"), (1, "b.jpg", (24, 32), None),
        (4, "c.png", None, "empty file"), (2, "d.jpg", (24, 32), None)]
    assert kept.images[0].boxes.tolist() == [[0, 0, 32, 10]]
    assert kept.images[0].repairs[0][0] == "box clipped to the image"
    assert kept.images[2].boxes.tolist() == [[0, 0, 50, 50]]
    verified = read_voc_boxes(root, keep_unreadable=True, verify_images=True)  # skipped when converting
    assert [(i.image_id, i.file_name) for i in verified.images] == [(1, "b.jpg"), (2, "d.jpg")]
