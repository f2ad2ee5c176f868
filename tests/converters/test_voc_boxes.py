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
