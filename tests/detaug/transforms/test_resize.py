"""ScaleJitter and RandomShortestSize: exact boxes and sizes from the planner, the statistics of
torchvision's formulas, pixels through the real DALI CPU pipeline, and plans independent of the
batch-mates."""

from __future__ import annotations

import numpy as np
import pytest

import detaug.transforms as T
from detaug import RecipeError
from detaug.transforms import Compose
from tests.detaug.transforms.test_crop import (
    assert_batch_independent,
    assert_boxes_on_pixels,
    pipeline_results,
    plan_many,
    plan_one,
)

# -- ScaleJitter --------------------------------------------------------------------------------


def test_scale_jitter_with_a_fixed_factor_is_the_fitted_size():
    # (H, W) = (100, 250) into (64, 64): r = min(64 / 100, 64 / 250) = 0.256 -> (int(25.6), int(64.0))
    _, m, size, boxes, _ = plan_one([T.ScaleJitter(64, scale_range=(1.0, 1.0))], [[10, 20, 50, 60]], hw=(100, 250))
    np.testing.assert_array_equal(size, [25, 64])
    np.testing.assert_allclose(m, [[64 / 250, 0, 0], [0, 25 / 100, 0]], rtol=1e-6)
    np.testing.assert_allclose(boxes, [[10 * 64 / 250, 20 / 4, 50 * 64 / 250, 60 / 4]], rtol=1e-6)
    # torchvision's (width, height) target: (50, 400) fits a (100, 250) image by its width
    _, _, size, _, _ = plan_one([T.ScaleJitter((50, 400), scale_range=(2.0, 2.0))], [], hw=(100, 250))
    np.testing.assert_array_equal(size, [40, 100])  # r = min(50 / 250, 400 / 100) * 2 = 0.4
    _, _, size, _, _ = plan_one([T.ScaleJitter((400, 50), scale_range=(2.0, 2.0))], [], hw=(100, 250))
    np.testing.assert_array_equal(size, [100, 250])  # r = min(400 / 250, 50 / 100) * 2 = 1


def test_scale_jitter_truncates_in_float32_as_torchvision():
    # torchvision: r = min(...) * scale with scale a float32 tensor, int(W * r) in float32.
    # (H, W) = (100, 100), target 100, s = 1.15: float64 gives int(114.99999999999999) = 114,
    # float32 gives 115 (float32(1.15) * 100 rounds to 115.0)
    _, _, size, _, _ = plan_one([T.ScaleJitter(100, scale_range=(1.15, 1.15))], [], hw=(100, 100))
    np.testing.assert_array_equal(size, [115, 115])


def test_scale_jitter_sizes_follow_torchvision_formula():
    """Every output is ``(int(H r), int(W r))`` for one ``r = base * s`` with ``s`` in
    ``scale_range``, and ``s`` is uniform (Kolmogorov-Smirnov distance against U(0.1, 2))."""
    hw, n = (100.0, 250.0), 4000
    base = min(300 / hw[0], 400 / hw[1])  # target (width, height) = (400, 300): 1.6
    _, size = plan_many(T.ScaleJitter((400, 300)), hw, n)
    # s intervals implied by each side's truncation: int(x * base * s) = k  <=>  s in [k, k + 1) / (x * base)
    lo = np.maximum(size[:, 0] / (hw[0] * base), size[:, 1] / (hw[1] * base))
    hi = np.minimum((size[:, 0] + 1) / (hw[0] * base), (size[:, 1] + 1) / (hw[1] * base))
    assert (lo < hi).all()  # one factor explains both sides: the aspect ratio is torchvision's
    assert lo.min() >= 0.1 - 1e-9 and hi.max() <= 2.0 + 1e-9
    s = np.sort((lo + hi) / 2)
    cdf = (s - 0.1) / 1.9
    ks = np.max(np.abs(cdf - (np.arange(n) + 0.5) / n))
    assert ks < 1.63 / np.sqrt(n) + 0.01, ks  # 99% KS bound, plus the truncation's width


def test_scale_jitter_fields():
    assert T.ScaleJitter(1024).target_size == (1024, 1024) and T.ScaleJitter(1024).scale_range == (0.1, 2.0)
    assert Compose([T.ScaleJitter(64)]).output_size() is None
    assert Compose([T.ScaleJitter(64), T.FixedSizeCrop(64)]).output_size() == (64, 64)
    with pytest.raises(RecipeError, match=r"ScaleJitter\.scale_range: range reversed"):
        T.ScaleJitter(64, scale_range=(2.0, 0.5))
    with pytest.raises(RecipeError, match=r"ScaleJitter\.scale_range: 0 is out of range"):
        T.ScaleJitter(64, scale_range=(0.0, 0.5))


# -- RandomShortestSize -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "hw, min_size, max_size, expected",
    [
        ((100, 250), 50, None, (50, 125)),
        ((250, 100), 50, None, (125, 50)),
        ((100, 250), 50, 100, (40, 100)),  # 125 > 100: the longer side is capped
        ((7, 30), 61, None, (60, 261)),  # torchvision's float products: int(7 * (61 / 7)) = 60, int(30 * (61 / 7)) = 261
        ((480, 640), 800, 1333, (800, 1066)),
        ((480, 1000), 800, 1333, (639, 1333)),
    ],
)
def test_random_shortest_size_exact_sizes_and_boxes(hw, min_size, max_size, expected):
    _, m, size, boxes, _ = plan_one([T.RandomShortestSize(min_size, max_size=max_size)], [[0, 0, hw[1], hw[0]]], hw=hw)
    np.testing.assert_array_equal(size, expected)
    np.testing.assert_allclose(m, [[expected[1] / hw[1], 0, 0], [0, expected[0] / hw[0], 0]], rtol=1e-6)
    np.testing.assert_allclose(boxes, [[0, 0, expected[1], expected[0]]], rtol=1e-6)


def test_random_shortest_size_draws_each_size_equally_often():
    """torchvision's rule: ``m`` uniform over the list; for each ``m`` the size is the formula's."""
    choices, hw, n = [480, 512, 544, 576, 608], (375.0, 500.0), 5000
    _, size = plan_many(T.RandomShortestSize(choices, max_size=780), hw, n)

    def formula(m: int) -> tuple[int, int]:  # torchvision's RandomShortestSize._get_params
        r = min(m / min(hw), 780 / max(hw))
        return int(hw[0] * r), int(hw[1] * r)

    expected = {formula(m): m for m in choices}
    assert len(expected) == len(choices)
    counts = {m: 0 for m in choices}
    for h, w in size.astype(int):
        counts[expected[(h, w)]] += 1  # KeyError: a size the formula cannot give
    assert all(800 < c < 1200 for c in counts.values()), counts  # 1000 each
    assert formula(608)[1] == 780 and formula(576)[1] < 780  # the cap does bind for the largest sizes


def test_random_shortest_size_fields():
    assert T.RandomShortestSize(800).min_size == (800,)
    assert T.RandomShortestSize([640, 672], 1333).to_dict() == {"name": "RandomShortestSize", "min_size": [640, 672],
                                                                 "max_size": 1333}
    with pytest.raises(RecipeError, match=r"RandomShortestSize\.min_size: expected whole pixels, got 640\.5"):
        T.RandomShortestSize([640.5])
    with pytest.raises(RecipeError, match=r"RandomShortestSize\.min_size: 0 is out of range"):
        T.RandomShortestSize(0)
    with pytest.raises(RecipeError, match=r"RandomShortestSize\.max_size: expected an integer"):
        T.RandomShortestSize(800, max_size=1333.5)


# -- pixels and batch-mates ---------------------------------------------------------------------


@pytest.mark.parametrize("transforms", [
    [T.ScaleJitter((160, 200), scale_range=(0.5, 1.5))],
    [T.RandomShortestSize([100, 140, 190], max_size=220)],
], ids=["scale_jitter", "random_shortest_size"])
def test_boxes_match_object_pixels(transforms):
    results = pipeline_results(transforms)
    assert len({image.shape for image, *_ in results}) > 1  # the sizes do vary
    assert_boxes_on_pixels(results)


@pytest.mark.parametrize("transforms", [
    [T.ScaleJitter((64, 96))],
    [T.RandomShortestSize([32, 48, 64], max_size=90)],
], ids=["scale_jitter", "random_shortest_size"])
def test_a_sample_plans_the_same_alone_and_among_batch_mates(transforms):
    assert_batch_independent(transforms)
