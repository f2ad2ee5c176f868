"""The typed plan (detaug.plan_layout): fields named with shape and dtype, filled and read by name."""

from __future__ import annotations

import io
import pickle

import numpy as np
import pytest
from PIL import Image

import detaug.transforms as T
from detaug.plan_layout import PlanLayout
from detaug.epochs import EpochSpec
from detaug.planning import BatchPlanner
from detaug.seeds import sample_keys
from detaug.sources import Sample, SampleListSource
from detaug.synthetic import DEFAULT_CLASSES, make_scene

LAYOUT = PlanLayout([
    ("roi", (4,), "float32", "region"),
    ("warp0.matrix", (2, 3), "float32", "map"),
    ("warp0.size", (2,), "float32", "size"),
    ("mixup.ratio", (), "float32", "ratio"),
    ("slot0.batch_index", (), "int32", "position"),
])


def test_fields_sit_one_after_the_other_with_their_shapes():
    assert LAYOUT.size == 4 + 6 + 2 + 1 + 1 and len(LAYOUT) == 5
    assert LAYOUT.slice("roi") == slice(0, 4) and LAYOUT.slice("warp0.matrix") == slice(4, 10)
    assert LAYOUT.slice("warp0") == slice(4, 12)  # a group: its fields together
    assert LAYOUT.field("mixup.ratio").slice == slice(12, 13) and LAYOUT.field("mixup.ratio").shape == ()
    assert "warp0" in LAYOUT and "warp1" not in LAYOUT
    with pytest.raises(KeyError, match="no field 'warp1.matrix'; it has roi, warp0.matrix"):
        LAYOUT.field("warp1.matrix")


def test_pack_places_each_field_and_read_gives_it_back_in_its_shape_and_dtype():
    rng = np.random.default_rng(0)
    values = {"roi": rng.uniform(0, 9, (3, 4)), "warp0.matrix": rng.normal(size=(3, 2, 3)),
              "warp0.size": np.array([[4, 5], [6, 7], [8, 9]]), "mixup.ratio": np.array([0.25, 1.0, 0.5]),
              "slot0.batch_index": np.array([2, 0, 1])}
    params = LAYOUT.pack(values, 3)
    assert params.dtype == np.float32 and params.shape == (3, LAYOUT.size)
    for name, value in values.items():
        got = LAYOUT.read(params, name)
        assert got.shape == value.shape
        np.testing.assert_array_equal(got, np.asarray(value).astype(np.float32).astype(got.dtype))
    assert LAYOUT.read(params, "slot0.batch_index").dtype == np.int32
    assert LAYOUT.read(params[1], "warp0.matrix").shape == (2, 3)  # one sample's vector


def test_pack_names_a_missing_unknown_or_misshapen_field():
    good = {name: np.zeros((2, *LAYOUT.field(name).shape)) for name in LAYOUT.names}
    with pytest.raises(ValueError, match=r"missing \['roi'\], unknown \['rio'\]"):
        LAYOUT.pack({**{k: v for k, v in good.items() if k != "roi"}, "rio": np.zeros((2, 4))}, 2)
    with pytest.raises(ValueError, match=r"'warp0.size': expected \[2, 2\] values, got \[2, 3\]"):
        LAYOUT.pack({**good, "warp0.size": np.zeros((2, 3))}, 2)


def test_declarations_are_checked():
    with pytest.raises(ValueError, match="named twice"):
        PlanLayout([("a", (1,), "float32", ""), ("a", (2,), "float32", "")])
    with pytest.raises(ValueError, match="also the prefix"):
        PlanLayout([("a", (1,), "float32", ""), ("a.b", (2,), "float32", "")])
    with pytest.raises(ValueError, match="dtype 'float64'"):
        PlanLayout([("a", (1,), "float64", "")])


def test_a_layout_travels_by_its_declarations():
    again = pickle.loads(pickle.dumps(LAYOUT))
    assert again == LAYOUT and again.specs() == LAYOUT.specs()
    assert pickle.loads(pickle.dumps(LAYOUT)) is again  # built once per process


@pytest.mark.parametrize("recipe, names", [
    (T.Compose([T.RandomHorizontalFlip(), T.Resize((8, 8)), T.ColorJitter(0.2)]),
     ["roi", "warp0.matrix", "warp0.size", "photometric0.brightness", "photometric0.contrast",
      "photometric0.saturation", "photometric0.hue"]),
    (T.Compose([T.RandomPerspective(p=1.0)]), ["roi", "warp0.matrix", "warp0.size"]),
    (T.Compose([T.Resize((8, 8)), T.MixUp(pool="batch")]),
     ["roi", "warp0.matrix", "warp0.size", "mixup.roi", "mixup.matrix", "mixup.size", "mixup.ratio",
      "slot0.batch_index"]),
])
def test_a_recipe_names_every_field_it_plans(recipe, names):
    layout = recipe.plan_layout
    assert layout.names == names and recipe.num_params == layout.size
    projective = layout.field("warp0.matrix").shape == (3, 3)
    assert projective == recipe.segment_projective[0]
    n = 3
    params = recipe.plan_batch([np.array([20 + i, 30, 3]) for i in range(n)], [np.zeros((0, 4))] * n,
                               [np.zeros(0)] * n, sample_keys(0, 0, np.arange(n)),
                               *([recipe_partners(recipe, n)] if recipe.num_partners else []))[0]
    assert all(p.shape == (layout.size,) for p in params)
    sizes = layout.read(np.stack(params), "warp0.size")  # the output canvases
    expected = [[20 + i, 30] for i in range(n)] if projective else [[8, 8]] * n
    np.testing.assert_array_equal(sizes, expected)


def recipe_partners(recipe, n):
    from detaug.plan import Partners

    j = recipe.num_partners
    return Partners([[np.array([16, 16, 3])] * n] * j, [[np.zeros((0, 4))] * n] * j, [[np.zeros(0)] * n] * j)


def test_a_planned_batch_carries_its_layout_and_reads_fields_by_name():
    rng = np.random.default_rng(1)
    samples = []
    for i in range(4):
        image, scene = make_scene(rng, 64, 48, 3, DEFAULT_CLASSES, min_size=8)
        png = io.BytesIO()
        Image.fromarray(image).save(png, format="PNG")
        boxes = np.array([o.box_xyxy for o in scene.objects], np.float32).reshape(-1, 4)
        samples.append(Sample(png.getvalue(), boxes, np.arange(1, len(boxes) + 1), image_id=i + 1))
    recipe = T.yolo_recipe(32, mixup=0.5)
    planned = BatchPlanner(SampleListSource(samples), recipe, EpochSpec(n=4, batch_size=4, seed=0)).plan(0, 0)
    assert planned.layout == recipe.plan_layout
    ratio = planned.plan("mixup.ratio")
    assert ratio.shape == (4,) and ((ratio > 0) & (ratio <= 1)).all()
    sizes = np.stack([planned.plan(f"mosaic.tile{k}.size") for k in range(4)], 1)  # [B, 4, (h, w)]
    assert sizes.shape == (4, 4, 2) and (sizes >= 1).all()
