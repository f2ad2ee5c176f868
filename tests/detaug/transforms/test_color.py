"""Colour transforms (ColorJitter, RandomPhotometricDistort, Grayscale, RandomGrayscale): planned
parameters and their statistics, and pixels from real DALI CPU pipelines on tiny images.

``run_recipe`` (used by the other photometric test files too) plans a batch with
``Compose.plan_batch`` and runs the recipe's own DALI pipeline (:func:`detaug.pipeline.build_pipeline`)
on decoded arrays.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import detaug.transforms as T
from detaug import RecipeError
from detaug.pipeline import build_pipeline, feed
from detaug.seeds import SampleRandom, sample_keys
from detaug.transforms import Compose
from detaug.transforms.color import LUMA

DEVICE = os.environ.get("DETAUG_TEST_DEVICE", "cpu")


class DecodedSource:
    """What ``build_pipeline`` reads of a source: decoded HWC arrays, no EXIF."""

    decoded = True
    orientation = "ignore"


def run_recipe(recipe: Compose, images: list[np.ndarray], *, ids=None, seed: int = 0, boxes=None):
    """``(images_out, boxes, labels, params)`` of one batch of uint8 HWC ``images`` through the
    real pipeline; ``ids`` default ``1..B``; ``boxes`` per image (float32 ``[N, 4]``, labels ``1..N``)."""
    n = len(images)
    ids = list(range(1, n + 1)) if ids is None else ids
    boxes = [np.zeros((0, 4), np.float32)] * n if boxes is None else [np.asarray(b, np.float32).reshape(-1, 4) for b in boxes]
    labels = [np.arange(1, len(b) + 1, dtype=np.int32) for b in boxes]
    params, out_boxes, out_labels = recipe.plan_batch([np.array(im.shape) for im in images], boxes, labels,
                                                      sample_keys(seed, 0, ids))
    pipe = build_pipeline(DecodedSource(), recipe, batch_size=n, device=DEVICE, num_threads=2, layout="HWC",
                          prefetch_queue_depth=1)
    pipe.build()
    feed(pipe, images, np.stack(params))
    (out,) = pipe.outputs()
    if DEVICE == "gpu":
        out = out.as_cpu()
    return [np.array(out[i]) for i in range(n)], out_boxes, out_labels, np.stack(params)


def random_images(n: int, hw=(12, 16), seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (*hw, 3), dtype=np.uint8) for _ in range(n)]


def photometric(recipe: Compose, params: np.ndarray, k: int = 0) -> np.ndarray:
    """``[B, n]`` parameters of the recipe's ``k``-th photometric transform."""
    return params[:, recipe.plan_layout.slice(f"photometric{k}")]


def plan_params(t, n: int, seed: int = 0, canvas=(100, 100)) -> list[np.ndarray]:
    return t.plan_on(SampleRandom(sample_keys(seed, 0, np.arange(n))), np.tile(np.asarray(canvas, float), (n, 1)))


def test_neutral_values_leave_pixels_unchanged():
    images = random_images(3)
    recipe = Compose([T.ColorJitter(0.5, 0.5, 0.5, 0.2, p=0.0), T.RandomPhotometricDistort(p=0.0), T.RandomGrayscale(p=0.0)])
    out, _, _, params = run_recipe(recipe, images)
    for got, image in zip(out, images):
        np.testing.assert_array_equal(got, image)
    for k, t in enumerate(recipe.photometric):
        np.testing.assert_array_equal(photometric(recipe, params, k), np.tile(t.neutral, (3, 1)))


def test_photometric_distort_statistics_follow_torchvision():
    t = T.RandomPhotometricDistort(p=0.5)
    n = 4000
    b, c_before, s, hue, c_after, *perm = plan_params(t, n)
    assert abs((b != 1).mean() - 0.5) < 0.04 and abs((s != 1).mean() - 0.5) < 0.04 and abs((hue != 0).mean() - 0.5) < 0.04
    assert b.min() >= 0.875 and b.max() <= 1.125 and s.min() >= 0.5 and s.max() <= 1.5
    assert np.abs(hue).max() <= 0.05 * 360 + 1e-3  # degrees for DALI
    assert not ((c_before != 1) & (c_after != 1)).any()  # contrast runs once, before or after
    contrast = (c_before != 1) | (c_after != 1)
    assert abs(contrast.mean() - 0.5) < 0.04 and abs((c_before != 1)[contrast].mean() - 0.5) < 0.05
    perms = np.stack(perm, axis=1).astype(int)
    assert (np.sort(perms, axis=1) == [0, 1, 2]).all()
    shuffled = (perms != [0, 1, 2]).any(axis=1)
    assert abs(shuffled.mean() - 0.5 * 5 / 6) < 0.04  # p, then one of the 5 non-identity permutations
    assert len({tuple(p) for p in perms}) == 6


def test_photometric_distort_permutes_channels_exactly():
    images = random_images(4)
    t = T.RandomPhotometricDistort(brightness=(1, 1), contrast=(1, 1), saturation=(1, 1), hue=(0, 0), p=1.0)
    recipe = Compose([t])
    out, _, _, params = run_recipe(recipe, images)
    perms = photometric(recipe, params)[:, 5:8].astype(int)
    assert len({tuple(p) for p in perms}) > 1
    for got, image, perm in zip(out, images, perms):
        np.testing.assert_array_equal(got, image[..., perm])


def test_photometric_distort_contrast_pivots_on_the_mean_grey():
    images = [(image * 0.4).astype(np.uint8) for image in random_images(3, seed=1)]  # dark: mean far from 128
    t = T.RandomPhotometricDistort(brightness=(1, 1), contrast=(0.5, 0.5), saturation=(1, 1), hue=(0, 0), p=1.0)
    recipe = Compose([t])
    out, _, _, params = run_recipe(recipe, images)
    perms = photometric(recipe, params)[:, 5:8].astype(int)
    for got, image, perm in zip(out, images, perms):
        x = image.astype(np.float64)
        mean = (x @ np.asarray(LUMA)).mean()  # torchvision's adjust_contrast pivot
        expected = np.clip(0.5 * x + 0.5 * mean, 0, 255)[..., perm]
        assert np.abs(got - expected).max() <= 1.0  # rounding (torchvision truncates)


def test_grayscale_is_the_luma_in_every_channel():
    images = random_images(2)
    out, *_ = run_recipe(Compose([T.Grayscale()]), images)
    for got, image in zip(out, images):
        assert (got[..., 0] == got[..., 1]).all() and (got[..., 1] == got[..., 2]).all()
        assert np.abs(got[..., 0] - image.astype(np.float64) @ np.asarray(LUMA)).max() <= 0.5 + 1e-6
    out, *_ = run_recipe(Compose([T.Grayscale(num_output_channels=1)]), images)
    assert out[0].shape == (12, 16, 1)


def test_random_grayscale_rate_and_pixels():
    grey = plan_params(T.RandomGrayscale(p=0.1), 4000)[0]
    assert set(np.unique(grey)) == {0.0, 1.0} and abs(grey.mean() - 0.1) < 0.015
    images = random_images(8)
    recipe = Compose([T.RandomGrayscale(p=0.5)])
    out, _, _, params = run_recipe(recipe, images)
    flags = photometric(recipe, params)[:, 0]
    assert 0 < flags.sum() < 8
    for got, image, flag in zip(out, images, flags):
        if flag:
            assert (got[..., 0] == got[..., 2]).all() and (got[..., 1] == got[..., 2]).all()
        else:
            np.testing.assert_array_equal(got, image)


def test_color_jitter_keeps_its_behaviour_and_declares_neutral_values():
    t = T.ColorJitter(brightness=0.2, hue=0.1, p=0.5)
    b, c, s, h = plan_params(t, 2000)
    applied = b != 1
    assert abs(applied.mean() - 0.5) < 0.05 and (c == 1).all() and (s == 1).all()
    assert (h[~applied] == 0).all() and np.abs(h).max() <= 36 + 1e-3
    assert t.neutral == (1.0, 1.0, 1.0, 0.0)


def test_schema_checks_of_colour_transforms():
    with pytest.raises(RecipeError, match=r"Grayscale\.num_output_channels: expected one of 1, 3"):
        T.Grayscale(2)
    with pytest.raises(RecipeError, match=r"RandomPhotometricDistort\.hue: .*out of range"):
        T.RandomPhotometricDistort(hue=(-0.6, 0.1))


def test_color_jitter_hands_float_to_normalize_equal_to_its_uint8_output_to_rounding():
    """On the CPU the last ColorJitter before Normalize runs color_twist with float32 output
    (clamped to [0, 255], not rounded): the same values as its uint8 output, to within half a
    level (a second, neutral ColorJitter after it keeps the first on the uint8 path)."""
    jitter = T.ColorJitter(brightness=0.6, contrast=0.6, saturation=0.9, hue=0.2)
    std = (0.25, 0.5, 1.0)
    images = random_images(6, hw=(20, 24), seed=4)
    fast, _, _, _ = run_recipe(Compose([jitter, T.Normalize(mean=(0, 0, 0), std=std)]), images)
    plain, _, _, _ = run_recipe(Compose([jitter, T.ColorJitter(), T.Normalize(mean=(0, 0, 0), std=std)]), images)
    levels = np.abs(np.stack(fast) - np.stack(plain)) * (np.asarray(std) * 255)
    assert levels.max() <= 0.5 + 1e-3  # rounding to uint8 only
    assert (levels.max() > 0) == (DEVICE == "cpu")  # the float hand-over runs on the CPU only
    assert (np.stack(plain) * (np.asarray(std) * 255)).max() == pytest.approx(255, abs=1e-3)  # saturated pixels stay clamped
    assert (np.stack(fast) * (np.asarray(std) * 255)).max() == pytest.approx(255, abs=1e-3)
