"""converters.boxes: the two coordinate conventions, clipping and degenerate boxes."""

from __future__ import annotations

import pytest

from converters import report as R
from converters.boxes import voc_box_to_coco


class TestVocConvention:
    def test_formula(self) -> None:
        # x = xmin - 1, y = ymin - 1, w = xmax - xmin + 1, h = ymax - ymin + 1
        box = voc_box_to_coco((48, 240, 195, 371), "voc", 353, 500)
        assert box.bbox == [47.0, 239.0, 148.0, 132.0]
        assert box.area == 148.0 * 132.0
        assert not box.clipped and box.skip_reason is None

    def test_whole_image_box(self) -> None:
        # pixels 1..W inclusive in VOC are the whole image [0, W] in COCO
        box = voc_box_to_coco((1, 1, 500, 375), "voc", 500, 375)
        assert box.bbox == [0.0, 0.0, 500.0, 375.0] and not box.clipped

    def test_single_point_box_is_one_pixel(self) -> None:
        box = voc_box_to_coco((10, 20, 10, 20), "voc", 640, 480)
        assert box.bbox == [9.0, 19.0, 1.0, 1.0] and box.area == 1.0

    def test_inverted_box_is_zero_size(self) -> None:
        box = voc_box_to_coco((10, 20, 8, 30), "voc", 640, 480)
        assert box.bbox is None and box.skip_reason == R.ZERO_SIZE_BOX

    def test_zero_coordinate_is_clipped(self) -> None:
        # xmin = 0 is one pixel left of the image under the 1-based convention
        box = voc_box_to_coco((0, 0, 2, 4), "voc", 10, 5)
        assert box.bbox == [0.0, 0.0, 2.0, 4.0] and box.clipped

    def test_float_values_follow_the_same_formula(self) -> None:
        box = voc_box_to_coco((217.62, 182.79, 256.61, 240.54), "voc", 640, 427)
        assert box.bbox == [216.62, 181.79, 39.99, 58.75]


class TestRawConvention:
    def test_formula_and_float_noise_rounded(self) -> None:
        # 256.61 - 217.62 is 38.99000000000001 in floating point
        box = voc_box_to_coco((217.62, 182.79, 256.61, 240.54), "raw", 640, 427)
        assert box.bbox == [217.62, 182.79, 38.99, 57.75]
        assert box.area == round(38.99 * 57.75, 6)

    def test_single_point_box_is_empty(self) -> None:
        box = voc_box_to_coco((10, 20, 10, 20), "raw", 640, 480)
        assert box.skip_reason == R.ZERO_SIZE_BOX

    def test_negative_coordinate_clipped(self) -> None:
        box = voc_box_to_coco((388.66, -207.7, 498.07, 69.92), "raw", 640, 427)
        assert box.clipped and box.bbox == [388.66, 0.0, 109.41, 69.92]
        assert box.corners[1] == -207.7


class TestClipping:
    @pytest.mark.parametrize("coords", ["voc", "raw"])
    def test_box_beyond_right_and_bottom_edges(self, coords: str) -> None:
        box = voc_box_to_coco((5, 5, 900, 700), coords, 100, 50)
        x, y, w, h = box.bbox
        assert box.clipped and x + w == 100 and y + h == 50

    def test_box_entirely_outside(self) -> None:
        box = voc_box_to_coco((120, 10, 150, 20), "voc", 100, 50)
        assert box.bbox is None and box.skip_reason == R.BOX_OUTSIDE_IMAGE

    def test_no_negative_zero(self) -> None:
        box = voc_box_to_coco((-0.0, -0.0, 5, 5), "raw", 10, 10)
        assert str(box.bbox[0]) == "0.0" and str(box.bbox[1]) == "0.0"

    def test_thinner_than_rounding_step(self) -> None:
        box = voc_box_to_coco((1.0, 1.0, 1.0000000001, 5.0), "raw", 10, 10)
        assert box.skip_reason == R.ZERO_SIZE_BOX
