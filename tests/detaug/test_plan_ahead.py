"""detaug.plan_ahead: plans made in worker processes equal the plans made here; their image
bytes travel through the pool's ring of shared-memory files, each file free again once its
plans are dropped, and none left behind."""

from __future__ import annotations

import copy
import gc
import os
import pickle
from concurrent.futures import Future, wait

import numpy as np
import pytest

import detaug.transforms as T
from detaug.plan_ahead import PlanPool, _Group, _members, _pack_boxes, _Packed, plan_group
from detaug.epochs import EpochSpec
from detaug.plan_jobs import init_plan_worker, planner_payload
from detaug.planned_batch import batch_columns
from detaug.planning import BatchPlanner
from detaug.shared_arrays import SHM_DIR, SlotRing, file_prefix
from detaug.sources import SampleListSource
from tests.detaug.consistency import scene_samples

pytestmark = pytest.mark.skipif(not os.path.isdir(SHM_DIR), reason=f"no {SHM_DIR}: plans come through the pipe here")


@pytest.fixture(scope="module")
def source():
    """Scenes whose boxes carry two fields: an int64 track id and a float32 ``[N, 2]`` point."""
    samples = scene_samples(12, size=(96, 80), max_objects=3, min_size=12)[0]
    for k, sample in enumerate(samples):
        if k % 4 == 0:  # some images without objects
            sample.boxes, sample.labels = np.zeros((0, 4), np.float32), np.zeros(0, np.int64)
        n = len(sample.labels)
        sample.fields = {"track": np.arange(n) + 10 * k, "point": np.full((n, 2), k, np.float32)}
    return SampleListSource(samples)


def _planner(source, recipe):
    spec = EpochSpec(n=len(source), batch_size=4, shard_id=0, num_shards=1, shuffle=True, drop_last=False, seed=5, groups=None)
    return BatchPlanner(source, recipe, spec)


def _same_arrays(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a, b)


def _same_box_arrays(got, want):
    """Boxes, labels and fields per sample, dtypes and shapes included."""
    assert len(got.boxes) == len(got.labels) == len(got.fields) == len(want.boxes) == len(want.fields)
    for a, b in zip(got.boxes + got.labels, want.boxes + want.labels):
        _same_arrays(a, b)
    for mine, theirs in zip(got.fields, want.fields):
        assert list(mine) == list(theirs)
        for name in mine:
            _same_arrays(mine[name], theirs[name])


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
            _same_box_arrays(got, want)
    finally:
        plans.close()
    assert not [n for n in os.listdir(SHM_DIR) if n.startswith(plans.prefix)]


def test_plans_nobody_takes_free_their_files_and_a_stopped_pool_leaves_none(source):
    """A job's file is leased while its plan lives, taken or not, and free for the next job once
    the plan is dropped (an epoch left early does not pile up files); files are made only when
    none is free, and a stopped pool leaves none."""
    planner = _planner(source, T.Compose([T.RandomHorizontalFlip(), T.Resize((32, 32))]))
    plans = PlanPool(planner, 2)
    futures = [plans.submit(0, step % 3) for step in range(8)]
    for future in futures[1:3]:
        future.cancel()
    wait([f for f in futures if not f.cancelled()], timeout=60)
    ring = plans.ring
    assert ring.leased == sum(not f.cancelled() for f in futures) and len(ring) == 8
    del futures, future
    gc.collect()
    assert ring.leased == 0
    made = [n for n in os.listdir(SHM_DIR) if n.startswith(plans.prefix)]
    assert len(made) == len(ring) == 8
    for step in range(6):  # one at a time: one file, written again and again
        plans.submit(1, step % 3).result(timeout=60)
    assert len(ring) == 8 and ring.leased == 0
    futures = [plans.submit(1, step % 3) for step in range(8)]
    plans.close()  # jobs still queued or running
    assert not [n for n in os.listdir(SHM_DIR) if n.startswith(plans.prefix)]


def test_box_arrays_travel_joined_and_come_back_as_they_were(source):
    """A worker joins each kind of per-sample box array into one (a few objects to unpickle, not
    hundreds); slicing gives back every sample's array, empty ones and trailing shapes included.
    Arrays that slicing could not give back (dtypes differing between samples) travel as they are."""
    planner = _planner(source, T.Compose([T.RandomAffine(degrees=10), T.Resize((32, 32))]))
    step = next(s for s in range(3) if any(len(b) == 0 for b in planner.plan(0, s).boxes))
    want = planner.plan(0, step)
    assert any(len(b) for b in want.boxes)
    init_plan_worker(planner_payload(planner))
    ring = SlotRing(file_prefix("test_"))
    group = pickle.loads(pickle.dumps(plan_group(0, [step], None, ring.take())))
    [packed] = group.plans
    assert isinstance(packed, _Packed) and set(packed.joined) == {"boxes", "labels", "track", "point", "area"}
    assert packed.planned.boxes == packed.planned.labels == packed.planned.fields == []
    got = packed.unpack(ring.open(group.shared))
    ring.close()
    _same_box_arrays(got, want)
    _same_images(got.data, want.data)
    # The joined columns come along, and give the loader's targets what joining the per-sample
    # arrays gives (batch_columns reads them as they are; the local plan has none).
    assert got.joined is not None and want.joined is None
    for a, b in zip(batch_columns(got), batch_columns(want)):
        if isinstance(a, dict):
            assert a.keys() == b.keys() == {"track", "point", "area"}
            for name in a:
                assert a[name].dtype == b[name].dtype and np.array_equal(a[name], b[name])
        else:
            assert np.asarray(a).dtype == np.asarray(b).dtype and np.array_equal(a, b)

    mixed = copy.deepcopy(want)
    mixed.fields[0]["track"] = mixed.fields[0]["track"].astype(np.int32)
    assert _pack_boxes(mixed) is None


def test_a_plan_can_be_cancelled_only_while_its_job_can(source):
    """Cancelling a plan whose job runs fails (its result comes); one whose job waits succeeds,
    and cancels the job."""
    planner = _planner(source, T.Compose([T.RandomHorizontalFlip(), T.Resize((32, 32))]))
    want = planner.plan(0, 1)
    running, waiting = Future(), Future()
    assert running.set_running_or_notify_cancel()
    [plan], [other] = _members(running, 1), _members(waiting, 1)
    assert not plan.cancel() and not plan.cancelled()
    running.set_result(_Group([_Packed(want, None, [])]))
    assert plan.result(timeout=5) is want
    assert other.cancel() and other.cancelled() and waiting.cancelled()


def test_a_group_of_batches_planned_by_one_job_comes_back_as_each_batch(source):
    """submit_many: one job plans consecutive batches, each future gets its own batch (equal to
    the batch planned here, images from shared memory), or, without the image data, the plan
    less its data; an error stays with its batch."""
    recipe = T.Compose([T.Mosaic((64, 64)), T.MixUp(p=0.5), T.Resize((32, 32))])
    planner = _planner(source, recipe)
    plans = PlanPool(planner, 1)
    try:
        futures = plans.submit_many(2, [0, 1, 2])
        without = plans.submit_many(2, [1, 2], keep_data=False)
        failing = plans.submit_many(2, [1, 7])  # 3 batches an epoch: 7 is out of range
        for step, future in enumerate(futures):
            got, want = future.result(timeout=60), planner.plan(2, step)
            _same_images(got.data, want.data)
            for mine, theirs in zip(got.partners, want.partners, strict=True):
                _same_images(mine, theirs)
            np.testing.assert_array_equal(got.params, want.params)
            _same_box_arrays(got, want)
        for step, future in zip([1, 2], without):
            got, want = future.result(timeout=60), planner.plan(2, step)
            assert got.data is None
            np.testing.assert_array_equal(got.params, want.params)
        np.testing.assert_array_equal(failing[0].result(timeout=60).params, planner.plan(2, 1).params)
        with pytest.raises(IndexError, match="batch 7 out of range"):
            failing[1].result(timeout=60)
    finally:
        plans.close()
    assert not [n for n in os.listdir(SHM_DIR) if n.startswith(plans.prefix)]


def test_the_plans_of_a_group_are_cancelled_together_while_their_job_waits(source):
    planner = _planner(source, T.Compose([T.RandomHorizontalFlip(), T.Resize((32, 32))]))
    want = [planner.plan(0, step) for step in range(2)]
    waiting, running = Future(), Future()
    first, second = _members(waiting, 2)
    assert second.cancel() and first.cancelled() and waiting.cancelled()
    assert running.set_running_or_notify_cancel()
    first, second = _members(running, 2)
    assert not first.cancel() and not second.cancelled()
    running.set_result(_Group([_Packed(want[0], None, []), _Packed(want[1], None, [])]))
    assert first.result(timeout=5) is want[0] and second.result(timeout=5) is want[1]


def test_bytes_that_shared_memory_refuses_come_through_the_pipe_and_the_pool_says_so(source, monkeypatch, tmp_path):
    """Without room in shared memory (a container's small /dev/shm) a plan's image bytes come
    through the result pipe, the same bytes; the pool warns once, naming what /dev/shm has."""
    planner = _planner(source, T.Compose([T.RandomHorizontalFlip(), T.Resize((32, 32))]))
    want = planner.plan(0, 1)
    init_plan_worker(planner_payload(planner))
    monkeypatch.setattr("detaug.shared_arrays.SHM_DIR", str(tmp_path / "no-shm"))
    ring = SlotRing(file_prefix("test_"))
    assert ring.take() is None  # no file can be made: the job gets no slot
    results = plan_group(0, [1, 2], None, None)
    assert results.shared is None and [p.span is None and p.piped for p in results.plans] == [True, True]
    pool = PlanPool(planner, 1)  # not started: its result handling only
    job = Future()
    members = _members(job, 2, pool.piped)
    with pytest.warns(RuntimeWarning, match=r"not shared memory: .*no-shm is missing.*--shm-size") as record:
        job.set_result(results)
    assert len(record) == 1 and pool.piped.count == 2
    got = members[0].result(timeout=5)
    _same_images(got.data, want.data)
    np.testing.assert_array_equal(got.params, want.params)
    monkeypatch.undo()
    ring = SlotRing(file_prefix("test_"))
    group = plan_group(0, [1], None, ring.take())  # room again: shared memory
    assert group.shared is not None and not group.plans[0].piped
    ring.close()


def test_the_batches_planned_ahead_keep_within_the_byte_budget(monkeypatch):
    """A group per worker until a batch's size is known, then two (one planning, one queued),
    but no more than AHEAD_BYTES of image bytes; always the pipeline's depth and one group."""
    from detaug.plan_ahead import batches_ahead, group_size

    monkeypatch.setattr("detaug.plan_ahead.AHEAD_BYTES", 1000)
    assert [group_size(b) for b in (1, 16, 64, 100, 256, 1024)] == [256, 16, 4, 2, 1, 1]
    assert batches_ahead(2, 0, 1, None) == batches_ahead(2, 0, 4, 10) == 2  # no workers: the depth
    assert batches_ahead(2, 8, 4, None) == 2 + 8 * 4  # size unknown: a group each
    assert batches_ahead(2, 8, 4, 0) == 2 + 2 * 8 * 4  # no bytes travel (decoded arrays)
    assert batches_ahead(2, 8, 4, 10) == 2 + 2 * 8 * 4  # 100 batches fit: two groups each
    assert batches_ahead(2, 8, 4, 25) == 40  # 1000 bytes hold 40 batches
    assert batches_ahead(2, 8, 4, 400) == 2 + 4  # 2 would fit: the depth and one group all the same
