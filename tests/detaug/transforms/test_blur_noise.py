"""GaussianBlur and GaussNoise: planned parameters, pixels from real DALI CPU pipelines, and the
seed contract for the noise (a sample's noise is the same alone or in any batch)."""

from __future__ import annotations

import numpy as np
import pytest

import detaug.transforms as T
from detaug import RecipeError
from detaug.transforms import Compose
from detaug.transforms.blur import NEUTRAL_SIGMA
from tests.detaug.transforms.test_color import (
    photometric,
    plan_params,
    random_images,
    run_recipe,
)


def test_blur_draws_sigma_per_sample_and_is_exact_when_not_applied():
    sigma = plan_params(T.GaussianBlur(5, sigma=(0.5, 1.5), p=0.5), 2000)[0]
    applied = sigma != np.float32(NEUTRAL_SIGMA)
    assert abs(applied.mean() - 0.5) < 0.05
    assert sigma[applied].min() >= 0.5 and sigma[applied].max() <= 1.5 and sigma[applied].std() > 0.2
    images = random_images(4)
    recipe = Compose([T.GaussianBlur(5, sigma=(1.0, 2.0), p=0.5)])
    out, _, _, params = run_recipe(recipe, images)
    flags = photometric(recipe, params)[:, 0] != np.float32(NEUTRAL_SIGMA)
    assert 0 < flags.sum() < 4
    for got, image, flag in zip(out, images, flags):
        if flag:
            assert got.astype(float).var() < 0.5 * image.astype(float).var()  # noise is smoothed away
        else:
            np.testing.assert_array_equal(got, image)


def test_blur_kernel_is_width_by_height_as_torchvision():
    rows = np.repeat(random_images(1, hw=(16, 1))[0], 16, axis=1)  # varies along y only
    cols = np.repeat(random_images(1, hw=(1, 16))[0], 16, axis=0)  # varies along x only
    (rows_out, cols_out), *_ = run_recipe(Compose([T.GaussianBlur([9, 1], sigma=3.0)]), [rows, cols])
    np.testing.assert_array_equal(rows_out, rows)  # kx = 9 along x (width), ky = 1: nothing along y
    assert np.abs(cols_out.astype(int) - cols).mean() > 10
    assert T.GaussianBlur([3, 5]).kernel_size == (3, 5) and T.GaussianBlur(3, sigma=1.0).sigma == (1.0, 1.0)
    with pytest.raises(RecipeError, match=r"GaussianBlur\.kernel_size: must be odd"):
        T.GaussianBlur(4)
    with pytest.raises(RecipeError, match=r"GaussianBlur\.kernel_size: expected an integer or a list of 2 integers"):
        T.GaussianBlur(2.5)


def grey_images(n: int, hw=(48, 64)) -> list[np.ndarray]:
    return [np.full((*hw, 3), 128, np.uint8) for _ in range(n)]


def test_noise_has_the_planned_std_and_is_gaussian():
    recipe = Compose([T.GaussNoise(std=(20, 20), p=1.0)])
    out, *_ = run_recipe(recipe, grey_images(2))
    for got in out:
        noise = got.astype(float) - 128  # within +-5 std: no clipping
        assert abs(noise.mean()) < 1.0 and abs(noise.std() - 20) < 1.0
        assert abs((np.abs(noise) <= 20).mean() - 0.683) < 0.03  # one-sigma share of a normal
        for c in range(3):
            assert abs(noise[..., c].std() - 20) < 1.5
        assert abs(np.corrcoef(noise[..., 0].ravel(), noise[..., 1].ravel())[0, 1]) < 0.05  # per channel
        assert abs(np.corrcoef(noise[:, :-1, 0].ravel(), noise[:, 1:, 0].ravel())[0, 1]) < 0.05  # per pixel
    assert not np.array_equal(out[0], out[1])  # another image, other noise


def test_noise_is_shared_by_channels_unless_per_channel_and_off_when_not_applied():
    out, *_ = run_recipe(Compose([T.GaussNoise(std=(10, 10), per_channel=False, p=1.0)]), grey_images(1))
    assert (out[0][..., 0] == out[0][..., 1]).all() and (out[0][..., 0] == out[0][..., 2]).all()
    assert out[0].std() > 5
    images = random_images(3)
    out, *_ = run_recipe(Compose([T.GaussNoise(p=0.0)]), images)
    for got, image in zip(out, images):
        np.testing.assert_array_equal(got, image)
    std, mean, *_ = plan_params(T.GaussNoise(std=(5, 25), p=0.5), 2000)
    applied = std > 0
    assert abs(applied.mean() - 0.5) < 0.05 and std[applied].min() >= 5 and std[applied].max() <= 25
    assert (mean == 0).all()


def test_noise_of_a_sample_is_the_same_alone_and_in_a_batch():
    """The seed contract, on pixels: DALI's own noise op would fail it (its stream depends on the
    sample's position in the batch and on the iteration)."""
    images = grey_images(3, hw=(20, 24))
    recipe = Compose([T.GaussNoise(std=(15, 30), p=1.0)])
    batch, *_ = run_recipe(recipe, images, ids=[5, 9, 11], seed=3)
    alone, *_ = run_recipe(recipe, images[2:], ids=[11], seed=3)
    np.testing.assert_array_equal(batch[2], alone[0])
    other_epoch, *_ = run_recipe(recipe, images[2:], ids=[11], seed=4)
    assert not np.array_equal(batch[2], other_epoch[0])
