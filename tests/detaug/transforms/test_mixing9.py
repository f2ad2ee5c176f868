"""Mosaic(grid=(3, 3)): YOLOv5's mosaic9 on the (2h, 2w) canvas, boxes against object pixels after
real DALI CPU pipelines (alone, then affine, rotation, perspective), its cells and fill, the seed
contract, and malformed recipes. DETAUG_TEST_DEVICE=gpu runs them on a GPU."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

import detaug.transforms as T
from detaug.errors import RecipeError
from detaug.sources import SampleListSource
from detaug.synthetic import BACKGROUND
from detaug.transforms import Compose
from tests.detaug.transforms.test_mixing import (
    FILL, assert_iou_targets, assert_plans_follow_the_seed, one_object_images, run, shown_ious,
)


MOSAIC9_RECIPES = {
    "alone": [T.Mosaic((64, 64), fill=FILL, grid=3)],
    "affine_resize": [
        T.Mosaic((64, 64), fill=FILL, grid=(3, 3)),
        T.RandomAffine(degrees=15, translate=(0.1, 0.1), scale=(1.0, 3.0), shear=5, fill=FILL),
        T.Resize((64, 64)),
    ],
    "zoom_out_rotate": [  # cells cut by the canvas border, then rotated into view
        T.Mosaic((128, 128), center=(0.1, 1.9), fill=FILL, grid=3),  # (small objects miss IoU 0.95 on a pixel grid)
        T.RandomAffine(degrees=(-40, -20), scale=(0.6, 0.8), fill=FILL),
    ],
    "perspective_flip": [
        T.Mosaic((96, 96), fill=FILL, grid=3),
        T.RandomPerspective(distortion_scale=0.5, p=1.0, fill=FILL),
        T.RandomAffine(translate=(0.1, 0.1), scale=(1.5, 2.5), fill=FILL),
        T.Resize((96, 96)),
        T.RandomHorizontalFlip(),
    ],
}


@pytest.mark.parametrize("name, pool", [(name, "dataset") for name in sorted(MOSAIC9_RECIPES)] + [("alone", "batch")])
def test_mosaic9_boxes_match_object_pixels(name, pool):
    samples, objects = one_object_images()
    transforms = list(MOSAIC9_RECIPES[name])
    first = {k: v for k, v in transforms[0].to_dict().items() if k != "name"}
    transforms[0] = T.Mosaic(**{**first, "pool": pool})
    recipe = Compose(transforms, min_size=1.0)
    assert recipe.num_partners == 8
    results = run(SampleListSource(samples), recipe, 6)
    ious, problems = shown_ious(results, objects, 8, border_slivers=name == "perspective_flip")
    assert not problems, "\n".join(problems)
    assert_iou_targets(ious)
    if name == "alone":
        assert {tuple(img.shape) for _, imgs in results for img in imgs} == {(128, 128, 3)}


def test_mosaic9_cells_and_fill_where_no_image():
    """Mosaic(grid=3) alone: the cells' parts of the canvas add up to it, the centre cell is
    (h, w) with its corner in [1, w - 1] x [1, h - 1]; the sample's own image is centred in the
    centre cell, ``fill`` around it in that cell."""
    samples, _ = one_object_images(seed=3)
    h, w = 50, 60
    recipe = Compose([T.Mosaic((h, w), fill=30, grid=3)])
    (planned, images), = run(SampleListSource(samples), recipe, 4, steps=[0])
    for i, image in enumerate(images):
        assert image.shape == (2 * h, 2 * w, 3)
        sizes = np.array([planned.plan(f"mosaic.tile{k}.size")[i] for k in range(9)])  # (h, w) per tile
        assert (sizes[0] == [h, w]).all()  # the centre cell, whole on the canvas
        x0, y0 = sizes[7][1], sizes[1][0]  # the left cell's width, the top cell's height
        assert 1 <= x0 <= w - 1 and 1 <= y0 <= h - 1
        # rows: top (8, 1, 2), middle (7, 0, 3), bottom (6, 5, 4) share heights; widths add up
        for row in ((8, 1, 2), (7, 0, 3), (6, 5, 4)):
            assert len({sizes[k][0] for k in row}) == 1 and sum(sizes[k][1] for k in row) == 2 * w
        for col in ((8, 7, 6), (1, 0, 5), (2, 3, 4)):
            assert len({sizes[k][1] for k in col}) == 1 and sum(sizes[k][0] for k in col) == 2 * h
        own = samples[int(planned.positions[i])].image
        h0, w0 = Image.open(io.BytesIO(own)).size[::-1]
        r = min(h / h0, w / w0)
        tw, th = int(min(np.ceil(w0 * r), w)), int(min(np.ceil(h0 * r), h))
        left, top = int(x0) + (w - tw) // 2, int(y0) + (h - th) // 2
        cell = image[int(y0):int(y0) + h, int(x0):int(x0) + w].astype(int)
        inside = np.zeros((h, w), bool)
        inside[top - int(y0):top - int(y0) + th, left - int(x0):left - int(x0) + tw] = True
        grown = np.zeros((h + 2, w + 2), bool)
        grown[top - int(y0):top - int(y0) + th + 2, left - int(x0):left - int(x0) + tw + 2] = True
        outside = ~grown[1:-1, 1:-1]
        assert (cell[outside] == 30).all()  # fill around the image, one pixel of blending aside
        assert (cell[inside] != 30).any(axis=-1).mean() > 0.95  # the image itself
        assert (np.abs(cell[inside] - np.asarray(BACKGROUND)).sum(-1) == 0).any()  # its grey background


def test_mosaic9_partners_and_plans_do_not_depend_on_batch_or_order():
    """The seed contract: a sample's 8 partners, its parameters and boxes are a pure function of
    (seed, epoch, image_id), whatever the batch size and order; they change with the epoch."""
    samples, _ = one_object_images()
    recipe = Compose([T.Mosaic((48, 48), grid=3), T.RandomAffine(degrees=10), T.Resize((48, 48)), T.CutMix(p=0.5)])
    reference = assert_plans_follow_the_seed(SampleListSource(samples), recipe, 5)
    drawn = np.concatenate([v[0][:8] for v in reference.values()])
    assert len(set(drawn.tolist())) >= 10  # uniform over the dataset


def test_mosaic9_plan_fields_round_trip_and_malformed():
    recipe = Compose([T.Mosaic(64, grid=3), T.Resize((64, 64)), T.CutMix(p=0.3, alpha=2.0)])
    assert recipe.num_partners == 9 and recipe.slots_of(recipe.canvas_stage) == tuple(range(8))
    rois = [n for n in recipe.plan_layout.names if n.endswith(".roi")]
    assert rois == [f"mosaic.tile{k}.roi" for k in range(9)] + ["cutmix.roi"]
    assert Compose.from_yaml(recipe.to_yaml()) == recipe
    assert Compose([T.Mosaic(64)]).num_partners == 3  # the default stays YOLO's 2x2
    for spec, match in [({"name": "Mosaic", "size": 64, "grid": [2, 3]}, "Mosaic.grid"),
                        ({"name": "Mosaic", "size": 64, "grid": 4}, "Mosaic.grid")]:
        with pytest.raises(RecipeError, match=match):
            Compose.from_dict({"transforms": [spec]})
