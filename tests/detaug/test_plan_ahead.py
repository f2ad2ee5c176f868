"""detaug.plan_ahead: plans made in worker processes equal the plans made here; their image
bytes travel through shared memory and leave nothing behind."""

from __future__ import annotations

import os
from concurrent.futures import wait

import numpy as np
import pytest

import detaug.transforms as T
from detaug.plan_ahead import PlanPool
from detaug.planning import BatchPlanner, EpochSpec
from detaug.shared_arrays import SHM_DIR
from detaug.sources import SampleListSource
from tests.detaug.consistency import scene_samples

pytestmark = pytest.mark.skipif(not os.path.isdir(SHM_DIR), reason=f"no {SHM_DIR}: plans come through the pipe here")


@pytest.fixture(scope="module")
def source():
    return SampleListSource(scene_samples(12, size=(96, 80), max_objects=3, min_size=12)[0])


def _planner(source, recipe):
    spec = EpochSpec(n=len(source), batch_size=4, shard_id=0, num_shards=1, shuffle=True, drop_last=False, seed=5, groups=None)
    return BatchPlanner(source, recipe, spec)


def _same_images(a, b):
    assert (a is None) == (b is None)
    if a is not None:
        assert len(a) == len(b)
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("pool", ["dataset", "batch"])
def test_worker_plans_equal_local_plans_with_images_from_shared_memory(source, pool):
    """Mosaic's partner slots (fed images with pool='dataset', None with pool='batch') and the
    batch's own images come back in place."""
    recipe = T.Compose([T.Mosaic((64, 64), pool=pool), T.MixUp(p=0.5, pool=pool), T.Resize((32, 32))])
    planner = _planner(source, recipe)
    plans = PlanPool(planner, 2)
    try:
        futures = [plans.submit(1, step) for step in range(3)]
        for step, future in enumerate(futures):
            got, want = future.result(timeout=60), planner.plan(1, step)
            _same_images(got.data, want.data)
            assert not any(a.flags.writeable for a in got.data)  # views of the shared file
            assert len(got.partners) == len(want.partners) == 4
            for mine, theirs in zip(got.partners, want.partners):
                _same_images(mine, theirs)
            np.testing.assert_array_equal(got.params, want.params)
            for a, b in zip(got.boxes, want.boxes):
                np.testing.assert_array_equal(a, b)
    finally:
        plans.close()
    assert not [n for n in os.listdir(SHM_DIR) if n.startswith(plans.prefix)]


def test_plans_nobody_takes_leave_no_files(source):
    """A plan's file is gone as soon as its result is in, taken or not (an epoch left early
    does not pile up files), and a stopped pool leaves none."""
    planner = _planner(source, T.Compose([T.RandomHorizontalFlip(), T.Resize((32, 32))]))
    plans = PlanPool(planner, 2)
    futures = [plans.submit(0, step % 3) for step in range(8)]
    for future in futures[1:3]:
        future.cancel()
    wait([f for f in futures if not f.cancelled()], timeout=60)
    assert not [n for n in os.listdir(SHM_DIR) if n.startswith(plans.prefix)]
    futures = [plans.submit(1, step % 3) for step in range(8)]
    plans.close()  # jobs still queued or running
    assert not [n for n in os.listdir(SHM_DIR) if n.startswith(plans.prefix)]
