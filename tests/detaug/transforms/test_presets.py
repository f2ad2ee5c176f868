"""The named presets: torchvision's detection reference policies (and YOLO's), each run on the CPU."""

from __future__ import annotations

import numpy as np
import pytest

import detaug.transforms as T
from detaug import RecipeError
from detaug.transforms.presets import MULTISCALE_SIZES, PRESETS, preset


def photo(h: int = 90, w: int = 120) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.integers(0, 255, (h, w, 3), dtype=np.uint8), np.array([[10, 10, 60, 50], [70, 20, 110, 80]], np.float32)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_runs_and_round_trips(name):
    recipe = preset(name)
    assert T.Compose.from_yaml(recipe.to_yaml()) == recipe
    image, boxes = photo()
    out = recipe(image=image, boxes=boxes, labels=[1, 2], seed=1, image_id=3)
    h, w = out["image"].shape[:2]
    b = out["boxes"]
    assert len(b) == len(out["labels"]) <= 2 + (2 if name == "yolo" else 0) * 4
    assert ((b[:, 2:] - b[:, :2]) >= 1.0 - 1e-6).all()  # SanitizeBoundingBoxes' rule: min_size 1
    assert (b[:, 0] >= 0).all() and (b[:, 2] <= w + 1e-4).all() and (b[:, 3] <= h + 1e-4).all()


def test_preset_output_sizes_follow_torchvision():
    image, boxes = photo()
    for seed in range(6):
        assert preset("lsj")(image=image, boxes=boxes, seed=seed)["image"].shape[:2] == (1024, 1024)
        h, w = preset("multiscale")(image=image, boxes=boxes, seed=seed)["image"].shape[:2]
        assert min(h, w) in MULTISCALE_SIZES and max(h, w) <= 1333
        assert preset("hflip")(image=image, boxes=boxes, seed=seed)["image"].shape[:2] == (90, 120)


def test_unknown_preset_names_the_closest():
    with pytest.raises(RecipeError, match=r"unknown preset 'ssd_lite' \(did you mean 'ssdlite'\?\)"):
        preset("ssd_lite")
