"""detaug.planning: batches planned in groups (one ``plan_batch`` call) equal the batches
planned one by one, skips and errors included."""

from __future__ import annotations

import numpy as np
import pytest

import detaug.transforms as T
from detaug.errors import ImageError
from detaug.planning import BatchPlanner, EpochSpec, PlannedBatch
from detaug.sources import SampleListSource
from tests.detaug.consistency import scene_samples

RECIPES = {
    "geometry": lambda: T.Compose([T.RandomIoUCrop(), T.RandomHorizontalFlip(), T.RandomAffine(degrees=15),
                                   T.Resize((40, 48)), T.ColorJitter(0.3, 0.3)]),
    "mixing from the dataset": lambda: T.Compose([T.Mosaic((64, 64)), T.MixUp(p=0.5), T.Resize((32, 32))]),
    "mixing batch-mates": lambda: T.Compose([T.Mosaic((64, 64), pool="batch"), T.Resize((32, 32))]),
}


@pytest.fixture(scope="module")
def samples():
    """14 scenes, 4 of them without boxes and one a file that is not an image (position 5)."""
    samples = scene_samples(14, size=(96, 80), max_objects=3, min_size=12)[0]
    for k, sample in enumerate(samples):
        if k % 4 == 0:
            sample.boxes, sample.labels = np.zeros((0, 4), np.float32), np.zeros(0, np.int64)
        n = len(sample.labels)
        sample.fields = {"track": np.arange(n) + 10 * k, "point": np.full((n, 2), k, np.float32)}
    samples[5].image = b"not an image"
    return samples


def _planner(samples, recipe, on_error="skip"):
    spec = EpochSpec(n=len(samples), batch_size=3, shuffle=True, seed=4)  # 5 batches, the last padded
    return BatchPlanner(SampleListSource(samples), recipe, spec, on_error)


def _assert_same(got: PlannedBatch, want: PlannedBatch) -> None:
    assert (got.epoch, got.step) == (want.epoch, want.step)
    for name in ("positions", "image_ids", "params", "partner_positions"):
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name
    for a, b in zip(got.boxes + got.labels, want.boxes + want.labels, strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert [list(f) for f in got.fields] == [list(f) for f in want.fields]
    for mine, theirs in zip(got.fields, want.fields, strict=True):
        assert all(mine[k].dtype == theirs[k].dtype and np.array_equal(mine[k], theirs[k]) for k in mine)
    assert all(np.array_equal(a, b) for a, b in zip(got.data, want.data, strict=True))
    assert got.skipped == want.skipped and got.repaired == want.repaired


@pytest.mark.parametrize("recipe", RECIPES)
def test_batches_planned_in_a_group_equal_batches_planned_one_by_one(samples, recipe):
    planner = _planner(samples, RECIPES[recipe]())
    steps = list(range(len(planner.spec)))
    assert steps == [0, 1, 2, 3, 4]
    for epoch in (0, 3):
        want = [planner.plan(epoch, step) for step in steps]
        assert sum(len(p.skipped) for p in want) >= 1  # the broken file is replaced, in some batch
        for group in ([0, 1, 2, 3, 4], [3, 1], [4]):
            got = planner.plan_many(epoch, group)
            assert len(got) == len(group)
            for planned, step in zip(got, group):
                _assert_same(planned, want[step])


def test_an_error_stays_with_its_batch(samples):
    """With on_error='raise', the batch holding the broken file is its error; the batches
    before and after it in the group are planned as they would be alone."""
    planner = _planner(samples, RECIPES["geometry"](), on_error="raise")
    broken = next(s for s in range(5) if 5 in planner.positions(2, s))
    got = planner.plan_many(2, list(range(5)))
    assert isinstance(got[broken], ImageError) and "image_id 6" in str(got[broken])
    with pytest.raises(ImageError, match="image_id 6"):
        planner.plan(2, broken)
    for step, planned in enumerate(got):
        if step != broken:
            _assert_same(planned, planner.plan(2, step))
    out_of_range = planner.plan_many(2, [0, 5])
    assert isinstance(out_of_range[1], IndexError)
    _assert_same(out_of_range[0], planner.plan(2, 0))
