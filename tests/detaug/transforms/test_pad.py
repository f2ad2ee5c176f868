"""Pad: torchvision's padding forms, exact boxes, output size, constant mode only, pixels through
the real DALI CPU pipeline, and plans independent of the batch-mates."""

from __future__ import annotations

import numpy as np
import pytest

import detaug.transforms as T
from detaug import RecipeError
from detaug.transforms import Compose
from tests.detaug.transforms.test_crop import (
    FILL,
    assert_batch_independent,
    assert_boxes_on_pixels,
    pipeline_results,
    plan_one,
)


@pytest.mark.parametrize(
    "padding, ltrb",
    [(5, (5, 5, 5, 5)), ([5], (5, 5, 5, 5)), ([3, 7], (3, 7, 3, 7)), ([1, 2, 3, 4], (1, 2, 3, 4)), ([0, 0, 0, 9], (0, 0, 0, 9))],
)
def test_pad_moves_boxes_by_left_top_and_grows_the_canvas(padding, ltrb):
    left, top, right, bottom = ltrb
    _, m, size, boxes, labels = plan_one([T.Pad(padding, fill=FILL)], [[10, 20, 50, 60], [0, 0, 200, 100]])
    np.testing.assert_array_equal(m, [[1, 0, left], [0, 1, top]])
    np.testing.assert_array_equal(size, [100 + top + bottom, 200 + left + right])
    np.testing.assert_allclose(boxes, [[10 + left, 20 + top, 50 + left, 60 + top], [left, top, 200 + left, 100 + top]])
    assert labels.tolist() == [1, 2]
    assert T.Pad(padding).out_size((100, 200)) == (100 + top + bottom, 200 + left + right)
    assert T.Pad(padding).out_size(None) is None


def test_pad_fields_are_checked_and_round_trip():
    assert Compose([T.Resize((64, 80)), T.Pad([1, 2, 3, 4])]).output_size() == (70, 84)
    assert T.Pad(padding=3) == T.Pad([3]) and T.Pad(3).to_dict() == {"name": "Pad", "padding": [3], "fill": 0,
                                                                      "padding_mode": "constant"}
    recipe = Compose.from_yaml("transforms:\n  - name: Pad\n    padding: [2, 4]\n    fill: 114\n")
    assert recipe.transforms[0].ltrb == (2, 4, 2, 4) and recipe.transforms[0].fill == 114
    for bad, message in [
        ({"padding": -1}, r"Pad\.padding: -1 is out of range"),
        ({"padding": [1, 2, 3]}, r"Pad\.padding: expected a list of 1 or 2 or 4 numbers"),
        ({"padding": 2.5}, r"Pad\.padding: expected whole pixels, got 2\.5"),
        ({"padding": "4"}, r"Pad\.padding: expected .* got the string '4'"),
        ({"padding": 1, "padding_mode": "edge"}, r"Pad\.padding_mode: expected one of 'constant', got the string 'edge'"),
        ({"padding": 1, "fill": 300}, r"Pad\.fill: 300 is out of range"),
    ]:
        with pytest.raises(RecipeError, match=message):
            T.Pad(**bad)


def test_pad_paints_fill_and_keeps_boxes_on_their_pixels():
    results = pipeline_results([T.Pad([3, 7, 11, 2], fill=40)], n=6, batch_size=3)
    for image, *_ in results:
        assert image.shape == (160 + 7 + 2, 200 + 3 + 11, 3)
        assert (image[:7] == 40).all() and (image[:, :3] == 40).all() and (image[-2:] == 40).all() and (image[:, -11:] == 40).all()
    assert_boxes_on_pixels(results)


def test_a_sample_plans_the_same_alone_and_among_batch_mates():
    assert_batch_independent([T.Pad([1, 2, 3, 4]), T.RandomCrop(60, pad_if_needed=True)])
