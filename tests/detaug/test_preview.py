"""Tests of detaug.preview: outline pixels, input conversions, grid layout and the PNG file."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from detaug.preview import (
    _label_name,
    _to_hwc_uint8,
    class_color,
    draw_detections,
    make_grid,
    save_preview,
)

GREY = (90, 90, 90)
MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)


def _grey(height: int = 100, width: int = 120) -> np.ndarray:
    return np.full((height, width, 3), GREY, dtype=np.uint8)


class TestDrawDetections:
    def test_outline_pixels_have_the_class_colour(self):
        out = np.asarray(
            draw_detections(_grey(), np.array([[10.0, 30, 50, 70]]), np.array([2]), line_width=2)
        )
        color = class_color(2)
        assert out.shape == (100, 120, 3) and out.dtype == np.uint8
        rows = slice(31, 70)
        for col in (10, 11, 48, 49):  # left and right edges: the outermost 2 columns of the box
            assert (out[rows, col] == color).all(), col
        for row in (68, 69):  # bottom edge
            assert (out[row, 10:50] == color).all(), row
        for col in (9, 50):  # just outside stays grey
            assert (out[31:71, col] == GREY).all(), col
        for col in (12, 47):  # just inside too
            assert (out[32:68, col] == GREY).all(), col
        assert (out[70, 10:50] == GREY).all()
        # The tag sits above the box, starting at its left edge, in the class colour.
        assert (out[29, 10] == color).all()
        assert (out[32:68, 12:48] == GREY).all()  # interior untouched

    def test_fractional_boxes_cover_the_pixel_centres_they_contain(self):
        box = np.array([[10.4, 20.6, 40.5, 60.2]])  # columns 10..39, rows 21..59
        out = np.asarray(draw_detections(_grey(), box, [0], line_width=1))
        color = class_color(0)
        assert (out[30:59, 10] == color).all() and (out[30:59, 39] == color).all()
        assert (out[59, 11:39] == color).all()
        assert (out[30:59, 9] == GREY).all() and (out[30:59, 40] == GREY).all()

    def test_tag_moves_inside_when_there_is_no_room_above(self):
        out = np.asarray(draw_detections(_grey(), [[5, 0, 80, 60]], [1], ["a", "bird"]))
        assert (out[3, 7] == class_color(1)).all()

    def test_empty_and_out_of_image_boxes(self):
        empty = draw_detections(_grey(), np.zeros((0, 4)), np.zeros((0,), np.int64))
        np.testing.assert_array_equal(np.asarray(empty), _grey())
        outside = draw_detections(_grey(), [[200, 200, 300, 300], [-50, -50, -10, -10]], [0, 1])
        np.testing.assert_array_equal(np.asarray(outside), _grey())

    def test_accepts_float_chw_torch_and_grey_inputs(self):
        image = np.random.default_rng(0).integers(0, 256, (40, 50, 3), dtype=np.uint8)
        expected = np.asarray(draw_detections(image, [[5, 5, 30, 30]], [3], scores=[0.5]))
        variants = [
            image.transpose(2, 0, 1),  # uint8 CHW
            image.astype(np.float32) / 255,  # float HWC in [0, 1]
            image.astype(np.float64),  # float HWC in [0, 255]
            torch.from_numpy(image).permute(2, 0, 1).float() / 255,  # float CHW tensor
            torch.from_numpy(image).permute(2, 0, 1).half(),  # half CHW tensor in [0, 255]
            Image.fromarray(image),
        ]
        for variant in variants:
            boxes, labels = torch.tensor([[5.0, 5, 30, 30]]), torch.tensor([3])
            out = draw_detections(variant, boxes, labels, scores=[0.5])
            np.testing.assert_array_equal(np.asarray(out), expected)
        grey = draw_detections(image[:, :, 0], np.zeros((0, 4)), [])
        assert (np.asarray(grey) == image[:, :, :1]).all()

    def test_unnormalizes_float_chw(self):
        image = np.random.default_rng(1).integers(0, 256, (32, 48, 3), dtype=np.uint8)
        normalized = ((image - np.array(MEAN)) / np.array(STD)).transpose(2, 0, 1)
        for chw in (normalized.astype(np.float32), torch.from_numpy(normalized).float()):
            out = np.asarray(draw_detections(chw, np.zeros((0, 4)), [], mean=MEAN, std=STD))
            assert np.abs(out.astype(int) - image).max() <= 1

    @pytest.mark.parametrize(
        "image, boxes, labels, match",
        [
            (np.zeros((4, 5, 6, 7)), [], [], "image must be"),
            (np.zeros((10, 10, 4)), [], [], "image must be"),
            (np.full((10, 10, 3), 300, np.int32), [], [], r"\[0, 255\]"),
            (np.full((10, 10, 3), np.nan), [], [], "finite"),
            (np.zeros((10, 10, 3)), [[0, 0, 1]], [0], r"\[N, 4\]"),
            (np.zeros((10, 10, 3)), [[0, 0, 1, 1]], [0, 1], "labels"),
            (np.zeros((10, 10, 3)), [[0, 0, np.inf, 1]], [0], "finite"),
            (np.zeros((10, 10, 3)), [[0, 0, 1, 1]], [0.5], "integer"),
        ],
    )
    def test_invalid_inputs(self, image, boxes, labels, match):
        with pytest.raises(ValueError, match=match):
            draw_detections(image, boxes, labels)

    def test_class_names(self):
        assert _label_name(1, ["bg", "cat"]) == "cat"
        assert _label_name(5, ["bg", "cat"]) == "5"
        assert _label_name(3, {3: "car"}) == "car"
        assert _label_name(4, {3: "car"}) == "4"
        assert _label_name(7, None) == "7"


class TestMakeGrid:
    def test_size_and_placement(self):
        images = [Image.new("RGB", (30, 20), (255, 0, 0)) for _ in range(4)] + [
            Image.new("L", (10, 40), 0)
        ]
        grid = make_grid(images, ncols=3, pad=5, background=(0, 0, 255))
        # cells of 30x40, 3 columns and 2 rows
        assert grid.size == (3 * 30 + 4 * 5, 2 * 40 + 3 * 5)
        px = np.asarray(grid)
        assert (px[0, 0] == (0, 0, 255)).all()
        assert (px[5 + 10, 5] == (255, 0, 0)).all()  # first image, centred vertically in its cell
        assert (px[5, 5] == (0, 0, 255)).all()  # above it: padding of the 40-pixel tall cell
        assert (px[50 + 20, 5 + 10 + 2 + 1] == (255, 0, 0)).all()  # 4th image, 2nd row
        assert (px[50 + 20, 40 + 10 + 5] == (0, 0, 0)).all()  # 5th image, centred horizontally
        assert (px[50 + 20, 40 + 10 - 1] == (0, 0, 255)).all()

    def test_default_columns(self):
        images = [Image.new("RGB", (8, 8)) for _ in range(5)]
        assert make_grid(images, pad=0).size == (3 * 8, 2 * 8)
        assert make_grid(images[:1], ncols=4, pad=2).size == (12, 12)

    def test_invalid(self):
        with pytest.raises(ValueError, match="at least one"):
            make_grid([])
        with pytest.raises(ValueError, match="ncols"):
            make_grid([Image.new("RGB", (4, 4))], ncols=0)


class TestSavePreview:
    def test_normalized_torch_batch(self, tmp_path):
        rng = np.random.default_rng(2)
        batch = rng.integers(0, 256, (4, 64, 80, 3)).astype(np.float32)
        mean, std = np.array(MEAN, np.float32), np.array(STD, np.float32)
        normalized = torch.from_numpy((batch - mean) / std)
        targets = [
            {"boxes": torch.tensor([[4.0, 8.0, 40.0, 50.0]]), "labels": torch.tensor([i])}
            for i in range(4)
        ]
        path = save_preview(
            tmp_path / "sub" / "preview.png", normalized.permute(0, 3, 1, 2), targets,
            {0: "cat", 1: "dog"}, mean=MEAN, std=STD,
        )
        assert path == tmp_path / "sub" / "preview.png"
        with Image.open(path) as png:
            assert png.format == "PNG" and png.mode == "RGB"
            assert png.size == (2 * 80 + 3 * 4, 2 * 64 + 3 * 4)
            px = np.asarray(png)
        # Sample 3 (2nd row, 2nd column): an un-normalized pixel and its box's left edge.
        x, y = 4 + 80 + 4, 4 + 64 + 4
        assert np.abs(px[y + 60, x + 70].astype(int) - batch[3, 60, 70]).max() <= 1
        assert (px[y + 30, x + 4] == class_color(3)).all()

    def test_uint8_hwc_list_with_different_sizes(self, tmp_path):
        images = [np.zeros((30, 40, 3), np.uint8), np.zeros((50, 20, 3), np.uint8)]
        targets = [
            {"boxes": np.array([[1, 1, 10, 10]]), "labels": [1], "scores": np.array([0.9])},
            {"boxes": np.zeros((0, 4)), "labels": np.zeros((0,), np.int64)},
        ]
        path = save_preview(tmp_path / "p.png", images, targets, ncols=2)
        with Image.open(path) as png:
            assert png.size == (2 * 40 + 3 * 4, 50 + 2 * 4)

    def test_mismatched_targets(self, tmp_path):
        with pytest.raises(ValueError, match="targets"):
            save_preview(
                tmp_path / "p.png", np.zeros((2, 8, 8, 3), np.uint8), [{"boxes": [], "labels": []}]
            )
        with pytest.raises(ValueError, match="lacks"):
            save_preview(tmp_path / "p.png", np.zeros((1, 8, 8, 3), np.uint8), [{"boxes": []}])


def test_to_hwc_uint8_ambiguous_three_by_three_is_hwc():
    image = np.arange(27, dtype=np.uint8).reshape(3, 3, 3)
    np.testing.assert_array_equal(_to_hwc_uint8(image), image)
