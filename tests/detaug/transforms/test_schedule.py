"""Epoch schedules (detaug/transforms/schedule.py): values follow the schedule at each epoch in
real DALI CPU pipelines, Mosaic off for the last epochs (no image is a mosaic), every sample a pure
function of ``(seed, epoch, image_id)``, an unscheduled recipe's draws unchanged, eager calls with
``epoch=``, the recipe file round trip and its named errors, and a resumed loader."""

from __future__ import annotations

import json

import numpy as np
import pytest

import detaug.transforms as T
from detaug.errors import RecipeError
from detaug.epochs import EpochSpec
from detaug.planning import BatchPlanner
from detaug.seeds import sample_keys
from detaug.sources import SampleListSource
from detaug.synthetic import BACKGROUND, PALETTE
from detaug.transforms import Compose
from detaug.pipeline import build_pipeline, feed
from tests.detaug.transforms.test_mixing import DEVICE, FILL, one_object_images, run

RAMP = {"epochs": [0, 10], "values": [0, 20]}  # RandomAffine degrees: (-0, 0) .. (-20, 20)


def run_epochs(source, recipe: Compose, batch_size: int, epochs, *, seed: int = 0):
    """``{epoch: [(planned batch, [HWC uint8 images])]}``: every batch of ``epochs``, planned in
    this process and run by ONE real DALI pipeline built once (no rebuild when the epoch changes)."""
    spec = EpochSpec(n=len(source), batch_size=batch_size, seed=seed)
    planner = BatchPlanner(source, recipe, spec)
    pipe = build_pipeline(source, recipe, batch_size=batch_size, device=DEVICE, num_threads=2, layout="HWC",
                          prefetch_queue_depth=1)
    pipe.build()
    out = {}
    for epoch in epochs:
        out[epoch] = []
        for step in range(len(spec)):
            planned = planner.plan(epoch, step)
            feed(pipe, planned.data, planned.params, planned.partners)
            images = pipe.outputs()[0]
            images = images.as_cpu() if hasattr(images, "as_cpu") else images
            out[epoch].append((planned, [np.array(images[i]) for i in range(len(planned.positions))]))
    return out


def ramp_recipe(**schedule) -> Compose:
    return Compose([T.RandomAffine(degrees=5, translate=(0.1, 0.1)), T.ColorJitter(brightness=0.3, p=0.5)],
                   schedule=schedule or {"RandomAffine": {"degrees": RAMP}})


def test_values_follow_the_schedule_at_each_epoch():
    recipe = ramp_recipe(RandomAffine={"degrees": RAMP, "translate": {"epochs": [2, 4], "values": [[0, 0], [0.2, 0.4]],
                                                                      "mode": "step"}},
                         ColorJitter={"off_from_epoch": 7})
    expected = {0: ((0, 0), (0, 0), 0.5), 2: ((-4, 4), (0, 0), 0.5), 3: ((-6, 6), (0, 0), 0.5),
                4: ((-8, 8), (0.2, 0.4), 0.5), 7: ((-14, 14), (0.2, 0.4), 0.0), 10: ((-20, 20), (0.2, 0.4), 0.0),
                50: ((-20, 20), (0.2, 0.4), 0.0)}
    for epoch, (degrees, translate, p) in expected.items():
        affine, jitter = recipe.at_epoch(epoch).transforms
        assert affine.degrees == pytest.approx(degrees) and affine.translate == pytest.approx(translate)
        assert jitter.p == p and jitter.brightness == recipe.transforms[1].brightness
        assert not recipe.at_epoch(epoch).schedule
    assert recipe.transforms[0].degrees == (-5, 5)  # the recipe's own values stay as given


def angles(recipe: Compose, epoch: int, n: int = 64) -> np.ndarray:
    """The rotation (degrees) of the planned warp of ``n`` samples of ``epoch``."""
    shapes = [np.array([40, 60, 3])] * n
    boxes = [np.zeros((0, 4), np.float32)] * n
    labels = [np.zeros(0, np.int32)] * n
    params, _, _ = recipe.plan_batch(shapes, boxes, labels, sample_keys(0, epoch, np.arange(n)))
    m = recipe.plan_layout.read(np.stack(params), "warp0.matrix")
    return np.degrees(np.arctan2(m[:, 1, 0], m[:, 0, 0]))


def test_planned_parameters_follow_the_schedule():
    recipe = ramp_recipe()
    assert np.allclose(angles(recipe, 0), 0)
    for epoch, bound in ((5, 10), (10, 20), (30, 20)):
        a = np.abs(angles(recipe, epoch))
        assert a.max() <= bound + 1e-9 and a.max() > 0.8 * bound  # drawn over the whole range of the epoch
    fixed = Compose([T.RandomAffine(degrees=(-10, 10), translate=(0.1, 0.1)), T.ColorJitter(brightness=0.3, p=0.5)])
    assert np.array_equal(angles(recipe, 5), angles(fixed, 5))  # the recipe of epoch 5, draw for draw


def test_a_scheduled_recipe_draws_as_the_recipe_of_its_epoch_pixels_and_boxes():
    """Eager calls (real DALI CPU pipelines) with ``epoch=``: the scheduled recipe gives, bit for
    bit, what the unscheduled recipe with that epoch's values gives for the same key."""
    rng = np.random.default_rng(0)
    image = rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)
    boxes = np.array([[10, 8, 40, 30], [30, 20, 60, 44]], np.float32)
    recipe = ramp_recipe()
    for epoch, degrees in ((0, 0), (5, 10)):
        got = recipe(image=image, boxes=boxes, labels=[1, 2], seed=3, epoch=epoch, image_id=7)
        fixed = Compose([T.RandomAffine(degrees=degrees, translate=(0.1, 0.1)), T.ColorJitter(brightness=0.3, p=0.5)])
        want = fixed(image=image, boxes=boxes, labels=[1, 2], seed=3, epoch=epoch, image_id=7)
        assert np.array_equal(np.asarray(got["image"]), np.asarray(want["image"]))
        assert np.array_equal(np.asarray(got["boxes"]), np.asarray(want["boxes"]))
    other = recipe(image=image, boxes=boxes, labels=[1, 2], seed=3, epoch=6, image_id=7)
    assert not np.array_equal(np.asarray(other["image"]), np.asarray(got["image"]))


def test_a_schedule_of_constant_values_changes_no_draw():
    """A schedule that keeps every value draws exactly what the unscheduled recipe draws: the
    schedule changes values, never the random stream."""
    plain = Compose([T.Mosaic((32, 32), p=1.0), T.RandomAffine(degrees=5, scale=(1.5, 2.5)), T.Resize((32, 32)),
                     T.MixUp(p=0.5)])
    scheduled = Compose(plain.transforms, schedule={"RandomAffine": {"degrees": {"epochs": [0, 9], "values": [5, 5]}},
                                                    "MixUp": {"p": {"epochs": [0], "values": [0.5]}}})
    samples, _ = one_object_images()
    source = SampleListSource(samples)
    for epoch in (0, 4):
        a = BatchPlanner(source, plain, EpochSpec(n=len(source), batch_size=6, seed=1)).plan(epoch, 1)
        b = BatchPlanner(source, scheduled, EpochSpec(n=len(source), batch_size=6, seed=1)).plan(epoch, 1)
        assert np.array_equal(a.params, b.params)
        assert all(np.array_equal(x, y) for x, y in zip(a.boxes, b.boxes))


def own_colour_only(image: np.ndarray, colour: tuple) -> bool:
    """Whether the image shows no palette colour but ``colour`` (and the grey fill and background)."""
    pixels = image.reshape(-1, 3).astype(int)
    for other in PALETTE:
        if tuple(other) == tuple(colour):
            continue
        if (np.abs(pixels - np.array(other)).max(axis=1) <= 2).sum() > 4:  # a few blended edge pixels aside
            return False
    return True


@pytest.mark.parametrize("pool", ["dataset", "batch"])
def test_mosaic_off_for_the_last_epochs(pool):
    """``off_from_epoch``: before it samples are mosaics (several images' objects, labels and
    colours); from it on every sample is its own image alone, letterboxed on the canvas (its one
    object and colour, ``fill`` around), in the same pipeline."""
    samples, objects = one_object_images()
    source = SampleListSource(samples)
    recipe = Compose([T.Mosaic((64, 64), fill=0, pool=pool), T.RandomAffine(scale=(2.0, 2.0), fill=0), T.Resize((64, 64))],
                     schedule={"Mosaic": {"off_from_epoch": 3}})  # fill 0: the images' background is grey 114
    mixed = 0
    results = run_epochs(source, recipe, 6, (0, 2, 3, 4))
    for epoch in (0, 2):
        for planned, images in results[epoch]:
            mixed += sum(len(set(labels.tolist()) - {planned.positions[i] + 1}) > 0
                         for i, labels in enumerate(planned.labels))
    assert mixed >= 20  # of 36 samples: mosaics
    for epoch in (3, 4):
        for planned, images in results[epoch]:
            for i, image in enumerate(images):
                own = int(planned.positions[i])
                assert planned.labels[i].tolist() == [own + 1]  # the sample's own object, no partner's
                assert own_colour_only(image, objects[own][1])
                box = planned.boxes[i][0]
                colour = np.all(image == np.array(objects[own][1]), axis=-1)
                ys, xs = np.nonzero(colour)
                assert abs(xs.min() - box[0]) <= 1 and abs(xs.max() + 1 - box[2]) <= 1
                assert abs(ys.min() - box[1]) <= 1 and abs(ys.max() + 1 - box[3]) <= 1
                # letterboxed: fill on the two sides the image does not reach, the image centred
                shown = image.max(axis=-1) > 0
                rows, cols = np.nonzero(shown.any(axis=1))[0], np.nonzero(shown.any(axis=0))[0]
                assert abs((rows.min() + rows.max() + 1) / 2 - 32) <= 1 and abs((cols.min() + cols.max() + 1) / 2 - 32) <= 1
                assert max(rows.max() + 1 - rows.min(), cols.max() + 1 - cols.min()) == 64


def test_mosaic_off_partners_are_not_decoded_and_match_a_letterbox():
    """A sample without a mosaic takes no partner image (placeholders), and its boxes are those of
    ``LetterBox(size)`` of its image, moved to the centre of the mosaic canvas (to a pixel: the
    tile is scaled to whole pixels, ultralytics' ``load_image``, ``LetterBox`` exactly)."""
    samples, _ = one_object_images()
    source = SampleListSource(samples)
    recipe = Compose([T.Mosaic((64, 64), fill=FILL, p=0.0)])
    letterbox = Compose([T.LetterBox((64, 64), fill=FILL)])
    planner = BatchPlanner(source, recipe, EpochSpec(n=len(source), batch_size=6, seed=0))
    planned = planner.plan(0, 0)
    assert (planned.partner_positions == -1).all()  # no partner read: 1x1 placeholders fed
    plain = BatchPlanner(source, letterbox, EpochSpec(n=len(source), batch_size=6, seed=0)).plan(0, 0)
    for got, want in zip(planned.boxes, plain.boxes):
        assert np.allclose(got, want + np.float32([32, 32, 32, 32]), atol=1.0)  # the tile's size: whole pixels


def test_mosaic_with_a_probability_mixes_some_samples():
    samples, _ = one_object_images()
    source = SampleListSource(samples)
    recipe = Compose([T.Mosaic((48, 48), p=0.5)])
    spec = EpochSpec(n=len(source), batch_size=6, seed=2)
    planner = BatchPlanner(source, recipe, spec)
    own_only = [len(planned.labels[i]) == 1 and planned.labels[i][0] == planned.positions[i] + 1
                for planned in (planner.plan(0, s) for s in range(3)) for i in range(6)]
    assert 3 <= sum(own_only) <= 15  # some of the 18, not all
    assert T.Mosaic((48, 48)).p == 1.0


def test_samples_are_a_pure_function_of_seed_epoch_and_image_id():
    """At a scheduled epoch a sample's plan does not depend on its batch or its batch-mates; the
    epoch and the seed change it."""
    samples, _ = one_object_images()
    source = SampleListSource(samples)
    recipe = Compose([T.Mosaic((48, 48), fill=FILL), T.RandomAffine(degrees=0, scale=(1.5, 2.5)), T.Resize((48, 48))],
                     schedule={"RandomAffine": {"degrees": RAMP}, "Mosaic": {"p": {"epochs": [0, 4], "values": [1, 0.5]}}})
    whole = BatchPlanner(source, recipe, EpochSpec(n=len(source), batch_size=6, seed=5, shuffle=True))
    alone = BatchPlanner(source, recipe, EpochSpec(n=len(source), batch_size=1, seed=5, shuffle=True))
    for epoch in (2, 6):
        batch = whole.plan(epoch, 1)
        for i in range(6):
            one = alone.plan(epoch, 6 + i)
            assert one.positions[0] == batch.positions[i]
            assert np.array_equal(one.params[0], batch.params[i]) and np.array_equal(one.boxes[0], batch.boxes[i])
    assert not np.array_equal(whole.plan(2, 1).params, whole.plan(3, 1).params)


def test_batches_of_several_epochs_are_refused():
    recipe = ramp_recipe()
    keys = np.concatenate([sample_keys(0, 1, [1]), sample_keys(0, 2, [2])])
    with pytest.raises(ValueError, match="one epoch"):
        recipe.plan_batch([np.array([8, 8, 3])] * 2, [np.zeros((0, 4))] * 2, [np.zeros(0)] * 2, keys)


def test_recipe_file_round_trip(tmp_path):
    recipe = Compose([T.Mosaic((64, 64)), T.RandomAffine(degrees=5), T.Resize((64, 64)), T.MixUp(p=0.1),
                      T.ColorJitter(brightness=0.4)],
                     schedule={"Mosaic": {"off_from_epoch": 90}, "MixUp": {"off_from_epoch": 90},
                               "1": {"degrees": RAMP, "scale": {"epochs": [0, 50], "values": [[1, 1], [0.5, 1.5]]}},
                               "ColorJitter": {"brightness": {"epochs": [0, 5], "values": [0, 0.4], "mode": "step"}}})
    data = recipe.to_dict()
    assert data["schedule"]["Mosaic"] == {"off_from_epoch": 90}
    assert data["schedule"]["1"]["degrees"] == {"epochs": [0, 10], "values": [[0.0, 0.0], [-20.0, 20.0]], "mode": "linear"}
    for text, load in ((recipe.to_yaml(), Compose.from_yaml), (recipe.to_json(), Compose.from_json)):
        again = load(text)
        assert again == recipe and again.to_dict() == data
        for epoch in (0, 3, 60, 95):
            assert again.at_epoch(epoch) == recipe.at_epoch(epoch)
    for name in ("r.yaml", "r.json"):
        recipe.save(tmp_path / name)
        assert Compose.load(tmp_path / name) == recipe
    assert "schedule" not in Compose([T.RandomAffine(degrees=5)]).to_dict()  # recipes without one read as before
    assert json.loads(recipe.to_json())["schedule"]["MixUp"] == {"off_from_epoch": 90}


@pytest.mark.parametrize("schedule, match", [
    ({"RandomAfine": {"p": {"epochs": [0], "values": [1]}}}, r"schedule\.RandomAfine: no transform .*did you mean 'RandomAffine'"),
    ({"RandomAffine": {"fill": {"epochs": [0], "values": [1]}}}, r"schedule\.RandomAffine\.fill: cannot be scheduled: it is read by the DALI"),
    ({"RandomAffine": {"center": {"epochs": [0], "values": [[1, 2, 3]]}}}, r"RandomAffine\.center: value at epoch 0: expected a list of 2"),
    ({"RandomAffine": {"shear": {"epochs": [0, 4], "values": [[2], [-3]]}}}, r"schedule\.RandomAffine\.shear: at epoch 4: a single"),
    ({"RandomAffine": {"degress": RAMP}}, r"schedule\.RandomAffine\.degress: unknown field \(did you mean 'degrees'\?\)"),
    ({"RandomAffine": {"degrees": {"epochs": [4, 2], "values": [0, 1]}}}, r"epochs: expected increasing epochs"),
    ({"RandomAffine": {"degrees": {"epochs": [0, 1], "values": [0]}}}, r"values: expected one value per epoch"),
    ({"RandomAffine": {"degrees": {"epochs": [0, 1.5], "values": [0, 1]}}}, r"epochs: expected a non-empty list"),
    ({"RandomAffine": {"degrees": {"epochs": [0], "values": [1], "mode": "cubic"}}}, r"mode: expected one of 'linear', 'step'"),
    ({"RandomAffine": {"p": {"epochs": [0, 5], "values": [1, 1.5]}}}, r"p: value at epoch 5: expected a probability"),
    ({"RandomAffine": {"p": {"epochs": [0], "values": [0.5]}, "off_from_epoch": 3}}, r"both p and off_from_epoch"),
    ({"Resize": {"off_from_epoch": 3}}, r"schedule\.Resize\.off_from_epoch: Resize has no probability p"),
    ({"RandomAffine": {"off_from_epoch": -1}}, r"off_from_epoch: expected an epoch"),
    ({"7": {"off_from_epoch": 1}}, r"schedule\.7: index 7 out of range"),
    ({"RandomAffine": {"scale": {"epochs": [0, 4], "values": [[1, 2], [0.5, 0.4]]}}}, r"range reversed"),
    ({"RandomAffine": 3}, r"expected a mapping of fields"),
    ([1, 2], r"schedule: a schedule is a mapping"),
])
def test_malformed_schedules_are_named(schedule, match):
    with pytest.raises(RecipeError, match=match):
        Compose([T.RandomAffine(degrees=5), T.Resize((32, 32))], schedule=schedule)


def test_a_recipe_file_names_the_schedule_line(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text("transforms:\n  - name: RandomAffine\n    degrees: 5\nmin_size: 1\n"
                    "schedule:\n  RandomAffine:\n    degrees: {epochs: [0, 10], values: [0, '15']}\n")
    with pytest.raises(RecipeError, match=r"recipe\.yaml: line 5: schedule\.RandomAffine\.degrees: value at epoch 10: "
                                          r"expected .* got the string '15'"):
        Compose.load(path)
    with pytest.raises(RecipeError, match="the recipe has 2 Resize"):
        Compose([T.Resize((8, 8)), T.Resize((8, 8))], schedule={"Resize": {}})


class _Reveals(T.GeometricTransform):
    """A warp that reveals area outside its input where ``amount > 0`` (so that it starts a new
    warp segment after a crop): its value changes the recipe's warps. Not registered."""

    schema = (T.Param("amount", "number", 0.0),)

    def setup(self) -> None:
        self.reveals = self.amount > 0

    def plan(self, state):
        return np.broadcast_to(np.eye(3), (state.batch_size, 3, 3)).copy(), state.canvas_hw


def test_a_schedule_cannot_change_the_pipeline():
    """A value read by the DALI graph cannot be scheduled, and a value that would give another
    plan layout or other warp segments at some epoch is refused (one pipeline serves every epoch)."""
    with pytest.raises(RecipeError, match="kernel_size: cannot be scheduled: it is read by the DALI pipeline"):
        Compose([T.GaussianBlur(kernel_size=3)], schedule={"GaussianBlur": {"kernel_size": {"epochs": [0], "values": [5]}}})
    with pytest.raises(RecipeError, match="schedule: at epoch 5 the recipe would need another DALI pipeline"):
        Compose([T.RandomAffine(degrees=5), _Reveals()], schedule={"1": {"amount": {"epochs": [0, 5], "values": [0, 1],
                                                                                  "mode": "step"}}})
    assert Compose([T.RandomAffine(degrees=5), _Reveals()], schedule={"1": {"amount": {"epochs": [0], "values": [0]}}})


torch = pytest.importorskip("torch")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_resumed_loader_yields_the_same_batches_of_the_scheduled_epochs(num_workers):
    """Planned in this process or in planning workers (the recipe and its schedule pickled)."""
    from detaug.torch import DetectionLoader

    samples, _ = one_object_images()
    source = SampleListSource(samples[:8])
    recipe = Compose([T.Mosaic((32, 32), fill=FILL), T.RandomAffine(degrees=0, scale=(1.5, 2.5), fill=FILL),
                      T.Resize((32, 32))], schedule={"RandomAffine": {"degrees": RAMP}, "Mosaic": {"off_from_epoch": 2}})

    def batches(loader, count=None):
        out = []
        for images, targets in loader:
            out.append(([t["image_id"] for t in targets], images.clone(), [t["boxes"].clone() for t in targets]))
            if count is not None and len(out) == count:
                break
        return out

    whole = DetectionLoader(source, recipe, 4, device="cpu", shuffle=True, seed=3, num_workers=0)
    want = [b for _ in range(3) for b in batches(whole)]  # epochs 0, 1, 2: 2 batches each
    loader = DetectionLoader(source, recipe, 4, device="cpu", shuffle=True, seed=3, num_workers=num_workers)
    got = batches(loader) + batches(loader, 1)  # epoch 0 and the first batch of epoch 1
    resumed = DetectionLoader(source, recipe, 4, device="cpu", shuffle=True, seed=3, num_workers=num_workers)
    resumed.load_state_dict(loader.state_dict())
    got += batches(resumed) + batches(resumed)
    assert len(got) == len(want) == 6
    for (ids, images, boxes), (ids2, images2, boxes2) in zip(got, want):
        assert ids == ids2 and torch.equal(images, images2)
        assert all(torch.equal(x, y) for x, y in zip(boxes, boxes2))
    jumped = DetectionLoader(source, recipe, 4, device="cpu", shuffle=True, seed=3, num_workers=num_workers)
    jumped.set_epoch(2)
    for (ids, images, _), (ids2, images2, _) in zip(batches(jumped), want[4:]):
        assert ids == ids2 and torch.equal(images, images2)
    assert all(len(b) == 1 for _, _, boxes in want[4:] for b in boxes)  # epoch 2: no mosaic, one object each


def test_an_eager_call_takes_the_recipe_of_its_epoch():
    """``recipe(..., epoch=e)``: before the switch the sample is a mosaic of itself (a one-sample
    dataset: its own partner, its box up to four times); from it on its image alone, letterboxed."""
    image = np.full((40, 80, 3), 114, np.uint8)
    image[10:30, 20:60] = (200, 40, 40)
    recipe = Compose([T.Mosaic((64, 64), fill=0)], schedule={"Mosaic": {"off_from_epoch": 5}})
    early = recipe(image=image, boxes=[[20, 10, 60, 30]], labels=[1], seed=0, epoch=4, image_id=1)
    late = recipe(image=image, boxes=[[20, 10, 60, 30]], labels=[1], seed=0, epoch=5, image_id=1)
    assert len(early["boxes"]) >= 2
    # 80x40 scaled to 64x32, letterboxed at top 16, then centred on the 128x128 canvas (+32)
    assert np.allclose(late["boxes"], [[32 + 16, 32 + 16 + 8, 32 + 48, 32 + 16 + 24]])
    shown = np.nonzero(np.asarray(late["image"]).max(axis=-1) > 0)
    assert (shown[0].min(), shown[0].max(), shown[1].min(), shown[1].max()) == (48, 79, 32, 95)


def test_yolo_recipe_closes_mosaic_and_mixup():
    recipe = T.yolo_recipe(64, close_mosaic_at=90)
    assert recipe.to_dict()["schedule"] == {"Mosaic": {"off_from_epoch": 90}, "MixUp": {"off_from_epoch": 90}}
    assert [t.p for t in recipe.at_epoch(89).transforms if t.kind == "mixing"] == [1.0, 0.1]
    assert [t.p for t in recipe.at_epoch(90).transforms if t.kind == "mixing"] == [0.0, 0.0]
    assert "schedule" not in T.yolo_recipe(64).to_dict()
    with pytest.raises(RecipeError, match="off_from_epoch: expected an epoch"):
        T.yolo_recipe(64, close_mosaic_at=-1)


def test_pixels_follow_a_scheduled_photometric_value():
    """A real DALI pipeline: ``ColorJitter``'s brightness factor stepped from 1 to 0.5 at epoch 3
    halves the pixels from that epoch on, in the same pipeline."""
    samples, _ = one_object_images(decoded=True)
    source = SampleListSource(samples[:4])
    recipe = Compose([T.Resize((32, 32)), T.ColorJitter(brightness=(1, 1))],
                     schedule={"ColorJitter": {"brightness": {"epochs": [0, 3], "values": [[1, 1], [0.5, 0.5]],
                                                              "mode": "step"}}})
    plain = run(source, Compose([T.Resize((32, 32))]), 4, steps=[0])[0][1]
    results = run_epochs(source, recipe, 4, (0, 2, 3, 7))
    for epoch, factor in ((0, 1.0), (2, 1.0), (3, 0.5), (7, 0.5)):
        (_, images), = results[epoch]
        for got, want in zip(images, plain):
            assert np.abs(got.astype(float) - factor * want).max() <= 1.0
