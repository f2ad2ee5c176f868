"""detaug.planning: batches planned in groups (one ``plan_batch`` call) equal the batches
planned one by one, skips and errors included."""

from __future__ import annotations

import numpy as np
import pytest

import detaug.transforms as T
from detaug.errors import ImageError
from detaug.epochs import EpochSpec
from detaug.planned_batch import PlannedBatch
from detaug.planning import BatchPlanner
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


# -- findings: each unreadable image and each repair once per epoch, whichever batches meet it --------

def _broken_run(n: int = 16, broken: tuple[int, ...] = (5, 6, 7, 8, 9)) -> list:
    """``n`` scenes whose positions ``broken`` are not images (consecutive: the replacement of
    each probes the ones after it, across the batch's end) and whose boxes reach past the image
    (no declared size: clipped when read, a repair)."""
    samples = scene_samples(n, size=(64, 48), max_objects=2, min_size=8)[0]
    for k, sample in enumerate(samples):
        sample.boxes = np.concatenate([sample.boxes, [[40, 30, 90, 70]]]).astype(np.float32)  # past 64x48
        sample.labels = np.concatenate([sample.labels, [9]])
        if k in broken:
            sample.image = b"not an image %d" % k
    return samples


def _findings(planner: BatchPlanner, epoch: int) -> tuple[list[int], list[int]]:
    skipped, repaired = [], []
    for step in range(len(planner.spec)):
        planned = planner.plan(epoch, step)
        skipped += [s["image_id"] for s in planned.skipped]
        repaired += [r["image_id"] for r in planned.repaired]
    return skipped, repaired


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("recipe", ["geometry", "mixing from the dataset"])
def test_each_unreadable_image_and_repair_is_recorded_once_per_epoch(shuffle, recipe):
    """5 consecutive unreadable images: every batch that probes them for a replacement (or draws
    them as Mosaic/MixUp partners) reads them, but only the batch holding each records it; the
    same for the boxes clipped when an image is read."""
    samples = _broken_run()
    source = SampleListSource(samples)
    for batch in (3, 4):
        planner = BatchPlanner(source, RECIPES[recipe](), EpochSpec(n=len(samples), batch_size=batch, shuffle=shuffle,
                                                                     seed=2))
        for epoch in (0, 1):
            skipped, repaired = _findings(planner, epoch)
            assert sorted(skipped) == [6, 7, 8, 9, 10]  # image ids: positions + 1
            assert sorted(repaired) == [k + 1 for k in range(len(samples)) if k not in (5, 6, 7, 8, 9)]


@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_record_each_unreadable_image_once_between_them(drop_last):
    """Over the ranks of one epoch, each unreadable image is recorded by one rank, the one whose
    batch holds it (a partner from another rank's share is that rank's to name)."""
    samples = _broken_run(n=17, broken=(2, 3, 11))
    source = SampleListSource(samples)
    recipe = RECIPES["mixing from the dataset"]()
    skipped: list[int] = []
    held: set[int] = set()
    for rank in range(3):
        spec = EpochSpec(n=len(samples), batch_size=2, shard_id=rank, num_shards=3, shuffle=True, seed=7,
                         drop_last=drop_last)
        planner = BatchPlanner(source, recipe, spec)
        skipped += _findings(planner, 0)[0]
        held |= {int(p) + 1 for step in range(len(spec)) for p in planner.positions(0, step)}
    bad = {3, 4, 12}
    assert sorted(i for i in skipped if i in held) == sorted(bad & held)  # those a batch holds: once
    if not drop_last:
        assert sorted(skipped) == sorted(bad)
