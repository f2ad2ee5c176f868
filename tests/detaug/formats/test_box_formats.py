"""Box formats: each rule against hand-computed values and its inverse."""

from __future__ import annotations

import numpy as np
import pytest

from detaug.formats.box_formats import (
    convert_format,
    cxcywh_to_xyxy,
    from_xyxy,
    to_xyxy,
    xywh_to_xyxy,
    xyxy_to_cxcywh,
    xyxy_to_xywh,
)


def test_xywh_round_trip():
    boxes = np.array([[1.5, 2.0, 10.0, 4.0], [0, 0, 1, 1]])
    xyxy = xywh_to_xyxy(boxes)
    np.testing.assert_allclose(xyxy, [[1.5, 2.0, 11.5, 6.0], [0, 0, 1, 1]])
    np.testing.assert_allclose(xyxy_to_xywh(xyxy), boxes)


@pytest.mark.parametrize(
    "fmt, expected",
    [
        ("xyxy", [10, 20, 30, 60]),
        ("xywh", [10, 20, 20, 40]),
        ("cxcywh", [20, 40, 20, 40]),
        ("yxyx", [20, 10, 60, 30]),
        ("rel_xyxy", [0.1, 0.1, 0.3, 0.3]),
        ("rel_yxyx", [0.1, 0.1, 0.3, 0.3]),
    ],
)
def test_convert_format(fmt, expected):
    out = convert_format(np.array([[10, 20, 30, 60]], np.float32), fmt, canvas_size=(200, 100))
    np.testing.assert_allclose(out[0], expected, rtol=1e-6)
    assert out.dtype == np.float32


def test_convert_format_rejects_unknown_names():
    with pytest.raises(ValueError, match="unknown box format 'ltrb'"):
        convert_format(np.zeros((1, 4)), "ltrb", (1, 1))


def test_rules_keep_the_dtype_and_invert_each_other():
    boxes = np.array([[2.0, 4.0, 6.0, 10.0]], np.float32)
    assert cxcywh_to_xyxy(boxes).tolist() == [[-1.0, -1.0, 5.0, 9.0]]
    for there, back in ((xyxy_to_xywh, xywh_to_xyxy), (xyxy_to_cxcywh, cxcywh_to_xyxy)):
        assert there(boxes).dtype == np.float32
        np.testing.assert_array_equal(back(there(boxes)), boxes)


@pytest.mark.parametrize("box_format, given", [("xyxy", [10, 20, 30, 60]), ("xywh", [10, 20, 20, 40]),
                                               ("cxcywh", [20, 40, 20, 40]), ("yolo", [0.2, 0.2, 0.2, 0.2])])
def test_users_formats_round_trip(box_format, given):
    xyxy = to_xyxy(np.array([given]), box_format, (200, 100))
    assert xyxy.dtype == np.float64 and xyxy.tolist() == [[10, 20, 30, 60]]
    np.testing.assert_allclose(from_xyxy(xyxy, box_format, (200, 100)), [given], rtol=1e-6)


def test_yolo_needs_the_image_size():
    with pytest.raises(ValueError, match="needs the image size"):
        to_xyxy(np.zeros((1, 4)), "yolo")
