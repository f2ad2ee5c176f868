"""The PyTorch iterator on real DALI CPU pipelines: epochs, shards, outputs."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import detaug.transforms as T
from detaug import DataWarning, ImageError
from detaug.sources import CocoSource, SampleListSource
from detaug.synthetic import write_coco_dataset
from detaug.pipeline import outputs_outlive_runs
from detaug.torch import DetectionLoader, distributed_shard
from tests.detaug.conftest import cyclic_garbage
from tests.detaug.consistency import scene_samples

RECIPE = T.Compose([T.RandomHorizontalFlip(), T.Resize((48, 64))])
DEVICE = os.environ.get("DETAUG_TEST_DEVICE", "cpu")  # the tests that say so run on a GPU with DETAUG_TEST_DEVICE=gpu


@pytest.fixture(scope="module")
def samples():
    return scene_samples(10, size=(96, 80), max_objects=3, min_size=12)[0]


@pytest.fixture(scope="module")
def coco_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("coco")
    write_coco_dataset(root, num_images=11, size=(96, 72), max_objects=4, progress=False)
    return root


def ids_of_epoch(loader):
    ids, sizes = [], []
    for images, targets in loader:
        assert len(images) == len(targets)
        sizes.append(len(targets))
        ids += [t["image_id"] for t in targets]
    return ids, sizes


def test_every_sample_once_per_epoch_and_reshuffled(samples):
    loader = DetectionLoader(SampleListSource(samples), RECIPE, 4, device="cpu", shuffle=True, seed=1)
    assert len(loader) == 3
    first, sizes = ids_of_epoch(loader)
    second, _ = ids_of_epoch(loader)
    assert sorted(first) == sorted(second) == list(range(1, 11))
    assert sizes == [4, 4, 2]
    assert first != second  # a new permutation each epoch


def test_dalis_threads_are_the_cpus_the_planning_workers_leave(samples, monkeypatch):
    from detaug import decoding

    monkeypatch.setattr(decoding, "available_cpus", lambda: 6)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    source = SampleListSource(samples)
    assert DetectionLoader(source, RECIPE, 4, device="cpu").pipeline.num_threads == 6  # no workers on the CPU
    loader = DetectionLoader(source, RECIPE, 4, device="cpu", num_workers=2)
    assert loader.pipeline.num_threads == 4
    assert DetectionLoader(source, RECIPE, 4, device="cpu", num_workers=2, num_threads=3).pipeline.num_threads == 3
    loader.close()


def test_drop_last(samples):
    loader = DetectionLoader(SampleListSource(samples), RECIPE, 4, device="cpu", drop_last=True)
    assert len(loader) == 2
    ids, sizes = ids_of_epoch(loader)
    assert sizes == [4, 4] and ids == list(range(1, 9))
    assert ids_of_epoch(loader)[0] == list(range(1, 9))  # the next epoch starts at the beginning


def test_abandoned_epoch_does_not_leak_into_the_next(samples):
    loader = DetectionLoader(SampleListSource(samples), RECIPE, 4, device="cpu")
    for _ in loader:
        break
    assert ids_of_epoch(loader)[0] == list(range(1, 11))


def test_shards_cover_the_dataset_with_equal_lengths(samples):
    seen, lengths = [], set()
    for shard in range(3):
        loader = DetectionLoader(SampleListSource(samples), RECIPE, 2, device="cpu", shuffle=True, seed=5, shard_id=shard, num_shards=3)
        lengths.add(len(loader))
        seen += ids_of_epoch(loader)[0]
    assert lengths == {2}  # ceil(10 / 3) = 4 samples per rank
    assert set(seen) == set(range(1, 11)) and len(seen) == 12  # 2 padding repeats


def test_shard_from_torchrun_environment(monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert distributed_shard() == (2, 4)


def test_outputs_follow_torchvision_conventions(samples):
    recipe = T.Compose([T.Resize((48, 64)), T.Normalize()])
    images, targets = next(iter(DetectionLoader(SampleListSource(samples), recipe, 4, device="cpu")))
    assert images.shape == (4, 3, 48, 64) and images.dtype == torch.float32 and images.device.type == "cpu"
    assert images.mean().abs() < 3  # normalised, not 0..255
    for t in targets:
        assert set(t) == {"boxes", "labels", "image_id", "area"}  # fields="all": area for every source
        assert t["boxes"].dtype == torch.float32 and t["boxes"].shape[1] == 4
        assert t["labels"].dtype == torch.int64 and len(t["labels"]) == len(t["boxes"])
        assert isinstance(t["image_id"], int)
        b = t["boxes"]
        assert (b[:, 0] >= 0).all() and (b[:, 2] <= 64).all() and (b[:, 1] >= 0).all() and (b[:, 3] <= 48).all()


def test_uint8_without_normalize_and_list_when_sizes_differ(samples):
    images, _ = next(iter(DetectionLoader(SampleListSource(samples), RECIPE, 2, device="cpu")))
    assert images.dtype == torch.uint8
    ragged = T.Compose([T.RandomZoomOut(p=1.0, side_range=(1.0, 2.0))])
    images, targets = next(iter(DetectionLoader(SampleListSource(samples), ragged, 4, device="cpu", seed=3)))
    assert isinstance(images, list) and len(images) == 4
    assert len({tuple(i.shape) for i in images}) > 1


def test_decoded_array_samples(samples):
    from PIL import Image
    import io

    arrays = [dict(image=np.array(Image.open(io.BytesIO(s.image)).convert("RGB")), boxes=s.boxes, labels=s.labels) for s in samples]
    a_images, a_targets = next(iter(DetectionLoader(SampleListSource(arrays), RECIPE, 4, device="cpu", seed=2)))
    e_images, e_targets = next(iter(DetectionLoader(SampleListSource(samples), RECIPE, 4, device="cpu", seed=2)))
    assert torch.equal(a_images, e_images)  # PNG is lossless: same pixels either way
    for a, e in zip(a_targets, e_targets):
        assert torch.equal(a["boxes"], e["boxes"])


def test_coco_source_every_image_once_and_boxes_match_json(coco_dir):
    import json

    source = CocoSource(coco_dir / "annotations.json", coco_dir / "images", shuffle=True, seed=3)
    identity = T.Compose([T.Resize((72, 96))])  # the generated images are 96x72: boxes unchanged
    loader = DetectionLoader(source, identity, 4, device="cpu")
    assert len(loader) == 3
    data = json.loads((coco_dir / "annotations.json").read_text())
    expected = {}
    for a in data["annotations"]:
        x, y, w, h = a["bbox"]
        expected.setdefault(a["image_id"], []).append([x, y, x + w, y + h])
    for epoch in range(2):
        seen = []
        for _, targets in loader:
            for t in targets:
                seen.append(t["image_id"])
                np.testing.assert_allclose(sorted(t["boxes"].tolist()), sorted(expected[t["image_id"]]), atol=1e-4)
        assert sorted(seen) == list(range(1, 12))
    assert source.categories[1] == data["categories"][0]["name"]


def test_coco_source_shards(coco_dir):
    seen = []
    for shard in range(2):
        source = CocoSource(coco_dir / "annotations.json", coco_dir / "images")
        loader = DetectionLoader(source, RECIPE, 4, device="cpu", shard_id=shard, num_shards=2)
        seen += ids_of_epoch(loader)[0]
    assert set(seen) == set(range(1, 12)) and len(seen) == 12  # 11 padded to 12


def test_missing_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.json"):
        CocoSource(tmp_path / "nope.json", tmp_path)
    with pytest.raises(ValueError, match="2 boxes but 1 labels"):
        SampleListSource([dict(image=b"x", boxes=np.zeros((2, 4)), labels=[1])])


def test_parallel_workers_give_the_same_batches(samples):
    """Planning in worker processes changes nothing but speed: the same images and targets, every
    key and dtype (a worker's plan reaches the targets through its joined columns,
    ``PlannedBatch.joined``; one planned here through its per-sample arrays)."""
    recipe = T.Compose([T.RandomIoUCrop(), T.RandomHorizontalFlip(), T.Resize((48, 64))])
    source = SampleListSource(samples)
    common = dict(device="cpu", shuffle=True, seed=9, fields=["area"], label_map="contiguous")
    inline = list(DetectionLoader(source, recipe, 4, num_workers=0, **common))
    parallel = list(DetectionLoader(source, recipe, 4, num_workers=2, **common))
    assert len(inline) == len(parallel) == 3
    for (a_images, a_targets), (b_images, b_targets) in zip(inline, parallel):
        assert torch.equal(a_images, b_images)
        for a, b in zip(a_targets, b_targets):
            assert a.keys() == b.keys() == {"boxes", "labels", "image_id", "area"} and a["image_id"] == b["image_id"]
            for key in ("boxes", "labels", "area"):
                assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key


def test_workers_planning_groups_raise_an_error_at_its_batch(samples):
    """Workers plan consecutive batches together; with on_error='raise' a broken file is still
    raised when its batch is due, after the batches before it (a group's error stays with its
    batch)."""
    from detaug.plan_ahead import group_size

    broken = [copy for copy in samples]
    broken[4] = type(samples[4])(b"not an image", samples[4].boxes, samples[4].labels, image_id=samples[4].image_id)
    source = SampleListSource(broken)
    recipe = T.Compose([T.RandomHorizontalFlip(), T.Resize((48, 64))])
    assert group_size(2) > 5  # the epoch's batches are planned by one job

    def until_error(workers):
        loader = DetectionLoader(source, recipe, 2, device="cpu", shuffle=True, seed=2, on_error="raise",
                                 num_workers=workers)
        ids = []
        with pytest.raises(ImageError, match=f"image_id {samples[4].image_id}"):
            for _, targets in loader:
                ids.append([t["image_id"] for t in targets])
        loader.close()
        return ids

    inline = until_error(0)
    assert len(inline) == 2  # the broken file is in batch 3 (the pipeline holds 2 batches ahead)
    assert until_error(2) == inline


def test_the_batches_planned_ahead_keep_within_the_byte_budget(samples, monkeypatch):
    """Once a worker's batch has shown its size, the loader submits no more batches ahead than
    AHEAD_BYTES holds (the depth and one group at least); the batches are the same."""
    recipe = T.Compose([T.RandomHorizontalFlip(), T.Resize((48, 64))])
    source = SampleListSource(samples)
    monkeypatch.setattr("detaug.plan_ahead.GROUP_SAMPLES", 1)  # a job a batch

    def ahead_of_consumer(budget):
        monkeypatch.setattr("detaug.plan_ahead.AHEAD_BYTES", budget)
        # no background feed: the batches it keeps ready would count as submitted ahead
        loader = DetectionLoader(source, recipe, 1, device="cpu", shuffle=True, seed=4, num_workers=2,
                                 ready_batches=0)
        submitted, most, ids = [], 0, []
        submit_many = loader._pool.submit_many
        loader._pool.submit_many = lambda e, steps, *a, **k: (submitted.extend(steps), submit_many(e, steps, *a, **k))[1]
        for k, (_, targets) in enumerate(loader):
            ids.append(targets[0]["image_id"])
            most = max(most, len(submitted) - (k + 1))
        loader.close()
        return most, ids

    most, ids = ahead_of_consumer(1 << 30)
    tight, same = ahead_of_consumer(1)  # one batch is over budget: the depth (2) and one group
    assert ids == same and len(ids) == 10
    assert most == 2 + 2 * 2 and tight == 2 + 1  # held beyond the batches taken: the depth and the groups


def _batches(loader, count=None):
    """``(image_ids, images, boxes)`` of the next ``count`` batches (all of an epoch: None)."""
    out = []
    for images, targets in loader:
        out.append(([t["image_id"] for t in targets], images, [t["boxes"] for t in targets]))
        if count is not None and len(out) == count:
            break
    return out


def _same_batches(a, b):
    assert len(a) == len(b)
    for (ids, images, boxes), (ids2, images2, boxes2) in zip(a, b):
        assert ids == ids2 and torch.equal(images, images2)
        assert all(torch.equal(x, y) for x, y in zip(boxes, boxes2))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_next_epoch_runs_on_in_the_pipeline_and_a_jump_drops_it(samples, num_workers):
    """When an epoch ends, the next epoch's first batches are planned and fed already (the
    pipeline does not run dry between epochs): the next iteration yields them, the batches a
    loader started at that epoch yields; a jump to another epoch drops them."""
    recipe = T.Compose([T.RandomIoUCrop(), T.RandomHorizontalFlip(), T.Resize((48, 64))])
    source = SampleListSource(samples)

    def loader_at(epoch, workers=0):  # no background feed: it would take the carry over in its thread
        loader = DetectionLoader(source, recipe, 4, device="cpu", shuffle=True, seed=5, num_workers=workers,
                                 ready_batches=0)
        loader.set_epoch(epoch)
        return loader

    loader = loader_at(0, num_workers)
    _batches(loader)
    carry = loader._carry
    assert carry.at == (1, 0)
    assert [[(b.epoch, b.step) for b in run.members] for run in carry.inflight] == [[(1, 0)], [(1, 1)]]
    _same_batches(_batches(loader), _batches(loader_at(1)))  # epoch 1, begun at the end of epoch 0
    assert loader._carry.at == (2, 0)
    loader.set_epoch(4)
    _same_batches(_batches(loader), _batches(loader_at(4)))  # epoch 2's batches dropped
    loader.close()
    assert loader._carry is None


def test_workers_left_early_resumed_and_killed_give_the_inline_batches(samples, monkeypatch):
    """Planning workers change nothing but speed: an epoch left early, resumed from its state,
    leaves no plan behind and yields what planning here yields; when a worker dies, the loader
    says so and plans the rest itself, with the same batches."""
    import os
    import signal
    import time

    from detaug.shared_arrays import SHM_DIR

    monkeypatch.setattr("detaug.plan_ahead.GROUP_SAMPLES", 1)  # a job a batch: 6 batches submitted ahead
    recipe = T.Compose([T.RandomIoUCrop(), T.RandomHorizontalFlip(), T.Resize((48, 64))])
    source = SampleListSource(samples)
    inline = DetectionLoader(source, recipe, 1, device="cpu", shuffle=True, seed=3, num_workers=0)
    want = _batches(inline) + _batches(inline)  # epochs 0 and 1
    loader = DetectionLoader(source, recipe, 1, device="cpu", shuffle=True, seed=3, num_workers=2)
    got = _batches(loader, 3)
    state = loader.state_dict()
    loader.set_epoch(0)  # ends the iteration in progress, keeping its position

    def leased(pool, wait=5.0):
        """The pool's shared-memory files still leased once the plans being made have come in
        (each is freed as its plans are dropped)."""
        deadline = time.monotonic() + wait
        while (left := pool.ring.leased) and time.monotonic() < deadline:
            time.sleep(0.02)
        return left

    assert not leased(loader._pool)  # the plans made ahead are gone, their files free

    def files(pool):
        return [n for n in os.listdir(SHM_DIR) if n.startswith(pool.prefix)]

    resumed = DetectionLoader(source, recipe, 1, device="cpu", shuffle=True, seed=3, num_workers=2)
    resumed.load_state_dict(state)
    got += _batches(resumed)
    loader.close()
    assert not files(loader._pool)  # a closed pool leaves none
    epoch = iter(resumed)  # epoch 1 (10 batches): a worker dies after the first, its plans 2 ahead at most
    batches = [next(epoch)]
    os.kill(next(iter(resumed._pool._pool._processes)), signal.SIGKILL)
    with pytest.warns(RuntimeWarning, match="planning workers stopped"):
        batches += list(epoch)
        # The feed may have planned the rest of this epoch before the kill (its look-ahead can
        # reach the epoch's end), so no plan of it need fail; the next epoch's are asked of the
        # pool after the kill, so the loss is said by the end of that epoch, whatever the timing.
        list(resumed)
    got += [([t["image_id"] for t in targets], images, [t["boxes"] for t in targets]) for images, targets in batches]
    _same_batches(got, want)
    resumed.close()
    assert not files(resumed._pool)


def test_a_missing_coco_image_is_skipped_or_raised_by_name(tmp_path):
    write_coco_dataset(tmp_path, num_images=6, size=(64, 48), max_objects=2, progress=False)
    missing = sorted((tmp_path / "images").iterdir())[2]
    missing.unlink()
    source = CocoSource(tmp_path / "annotations.json", tmp_path / "images")
    loader = DetectionLoader(source, RECIPE, 2, device="cpu")
    with pytest.warns(DataWarning, match=missing.name):
        ids = ids_of_epoch(loader)[0]
    assert 3 not in ids and len(ids) == 6
    assert [(s["image_id"], s["file"]) for s in loader.skipped] == [(3, str(missing))]
    loader = DetectionLoader(source, RECIPE, 2, device="cpu", on_error="raise")
    with pytest.raises(ImageError, match=missing.name + r".*image_id 3"):
        ids_of_epoch(loader)


def test_coco_source_workers_do_not_change_batches(coco_dir):
    def epoch(workers):
        source = CocoSource(coco_dir / "annotations.json", coco_dir / "images", shuffle=True, seed=2)
        loader = DetectionLoader(source, T.default_detection_recipe(size=48), 4, device="cpu", num_workers=workers)
        return [(images, targets) for images, targets in loader]

    one, three = epoch(0), epoch(2)
    assert len(one) == len(three) == 3
    for (a_images, a_targets), (b_images, b_targets) in zip(one, three):
        torch.testing.assert_close(a_images, b_images)
        assert [t["image_id"] for t in a_targets] == [t["image_id"] for t in b_targets]
        for a, b in zip(a_targets, b_targets):
            assert torch.equal(a["boxes"], b["boxes"])


def test_one_batch_type_whatever_the_batch(samples):
    """A list of [3, H, W] tensors without a fixed output size, also for a batch of one or of
    images of one size; a stacked tensor with one."""
    same_size = [s for s in samples[:3]]
    ragged = T.Compose([T.RandomHorizontalFlip()])
    for source, batch in ((SampleListSource(samples), 3), (SampleListSource(same_size), 2)):
        for images, targets in DetectionLoader(source, ragged, batch, device="cpu"):
            assert isinstance(images, list) and len(images) == len(targets)
            assert all(i.ndim == 3 and i.shape[0] == 3 for i in images)
    for images, targets in DetectionLoader(SampleListSource(samples), RECIPE, 3, device="cpu"):
        assert isinstance(images, torch.Tensor) and images.shape == (len(targets), 3, 48, 64)


def test_device_auto_is_the_default(samples):
    loader = DetectionLoader(SampleListSource(samples), RECIPE, 4)
    assert loader.device.type == ("cuda" if torch.cuda.is_available() and loader.device_id is not None else "cpu")
    if loader.device_id is None:
        from detaug import DeviceError

        with pytest.raises(DeviceError, match="no CUDA device"):
            DetectionLoader(SampleListSource(samples), RECIPE, 4, device="gpu")


@pytest.mark.parametrize("recipe", [RECIPE, T.Compose([T.RandomZoomOut(p=1.0, side_range=(1.0, 2.0))])],
                         ids=["stacked", "list"])
def test_batches_handed_over_without_a_copy_keep_their_pixels(samples, recipe):
    """On the CPU the images are DALI's own output buffers (DALI's default executor gives new
    ones every run), on the GPU copies: either way batches kept while later ones run, across
    epochs, keep their pixels."""
    loader = DetectionLoader(SampleListSource(samples), recipe, 3, device=DEVICE, seed=4, prefetch_queue_depth=1)
    assert outputs_outlive_runs(loader.pipeline)
    kept = [images for images, _ in loader] + [images for images, _ in loader]
    snapshots = [[i.clone() for i in images] for images in kept]
    for _ in loader:  # a third epoch while the first two are held
        pass
    for images, snapshot in zip(kept, snapshots):
        assert all(torch.equal(i, s) for i, s in zip(images, snapshot))


@pytest.mark.parametrize("ragged", [False, True])
def test_dali_images_to_torch_with_and_without_a_copy(ragged):
    from nvidia.dali import fn, pipeline_def

    from detaug.pipeline import resolve_device
    from detaug.torch import dali_images_to_torch

    device_id = resolve_device(DEVICE, None)
    shapes = [(4, 5 + ragged * k, 3) for k in range(3)]

    @pipeline_def(batch_size=3, num_threads=1, device_id=device_id, prefetch_queue_depth=1)
    def pipe_def():
        images = fn.external_source(name="x", device="gpu" if device_id is not None else "cpu")
        return images + 1

    pipe = pipe_def()
    pipe.build()
    device = torch.device("cpu") if device_id is None else torch.device("cuda", device_id)
    for run in range(2):
        pipe.feed_input("x", [np.full(shape, 10 * run + k, np.uint8) for k, shape in enumerate(shapes)])
        (out,) = pipe.run()
        copied = dali_images_to_torch(out, device)
        shared = dali_images_to_torch(out, device, copy=False)  # a copy on the GPU all the same
        assert isinstance(copied, list) == isinstance(shared, list) == ragged
        assert all(s.device == device and torch.equal(c, s) for c, s in zip(copied, shared))
        dali = [out.as_tensor()] if not ragged else [out[k] for k in range(3)]
        handed = [shared] if not ragged else shared
        # the host's images are DALI's buffers; the GPU's are copies
        assert all((h.data_ptr() == d.data_ptr()) == (device_id is None) for h, d in zip(handed, dali))
        assert [int(s.flatten()[0]) for s in shared] == [10 * run + k + 1 for k in range(3)]


@pytest.mark.parametrize("ready", [0, 1, 3])
def test_the_background_feed_changes_nothing_but_timing(samples, ready):
    """Batches made in the background thread (``ready_batches``) are the batches made inside
    ``next()``; an epoch left early and resumed from its state, too."""
    recipe = T.Compose([T.RandomIoUCrop(), T.RandomHorizontalFlip(), T.Resize((48, 64))])
    source = SampleListSource(samples)
    inline = DetectionLoader(source, recipe, 3, device=DEVICE, shuffle=True, seed=6, ready_batches=0)
    want = _batches(inline) + _batches(inline)
    loader = DetectionLoader(source, recipe, 3, device=DEVICE, shuffle=True, seed=6, ready_batches=ready)
    got = _batches(loader, 2)
    state = loader.state_dict()
    assert state["step"] == 2  # batches made ahead are not counted as taken
    resumed = DetectionLoader(source, recipe, 3, device=DEVICE, shuffle=True, seed=6, ready_batches=ready)
    resumed.load_state_dict(state)
    got += _batches(resumed) + _batches(resumed)
    _same_batches([(i, im.cpu(), [b.cpu() for b in bx]) for i, im, bx in got],
                  [(i, im.cpu(), [b.cpu() for b in bx]) for i, im, bx in want])
    feeds = list(loader._live_feeds) + list(resumed._live_feeds)
    for item in (loader, resumed, inline):
        item.close()
    assert not any(feed.alive for feed in feeds) and not loader._live_feeds and not resumed._live_feeds


@pytest.mark.parametrize("form", ["padded", "concat"])
def test_batched_targets_hold_the_per_image_targets(coco_dir, form):
    """``targets="padded"`` / ``"concat"`` carry exactly the boxes, labels and fields of the
    per-image dicts of the same seed, on the images' device."""
    source = CocoSource(coco_dir / "annotations.json", coco_dir / "images")
    recipe = T.Compose([T.RandomIoUCrop(), T.RandomHorizontalFlip(), T.Resize((48, 64))])
    per_image = DetectionLoader(source, recipe, 4, device=DEVICE, seed=2, label_map="contiguous")
    batched = DetectionLoader(source, recipe, 4, device=DEVICE, seed=2, label_map="contiguous", targets=form)
    assert "iscrowd" in per_image.fields and "area" in per_image.fields  # a CocoSource's fields ride along
    for (_, dicts), (images, joined) in zip(per_image, batched):
        assert joined["boxes"].device == images.device
        counts = [len(t["boxes"]) for t in dicts]
        assert joined["num_boxes"].tolist() == counts
        assert joined["image_id"].tolist() == [t["image_id"] for t in dicts]
        for name in ["boxes", "labels", *per_image.fields]:
            if form == "concat":
                assert torch.equal(joined[name], torch.cat([t[name] for t in dicts]))
            else:
                for k, t in enumerate(dicts):
                    assert torch.equal(joined[name][k, : counts[k]], t[name])
                    assert (joined[name][k, counts[k]:] == -1).all()
        if form == "concat":
            assert joined["batch_index"].tolist() == [k for k, c in enumerate(counts) for _ in range(c)]
    per_image.close()
    batched.close()


def test_the_background_feed_runs_into_the_next_epoch_and_goes_with_the_loader(samples):
    """After an epoch the feed thread keeps making the next epoch's batches (they are the
    batches of that epoch); a jump drops them; a loader nobody holds is collected with it."""
    import gc
    import weakref

    recipe = T.Compose([T.RandomIoUCrop(), T.RandomHorizontalFlip(), T.Resize((48, 64))])
    source = SampleListSource(samples)

    inline = DetectionLoader(source, recipe, 4, device=DEVICE, shuffle=True, seed=8, ready_batches=0)
    want = [_batches(inline) for _ in range(4)]
    loader = DetectionLoader(source, recipe, 4, device=DEVICE, shuffle=True, seed=8)
    _same_batches(_batches(loader), want[0])
    kept = loader._kept_feed
    assert kept is not None and kept.alive and loader._feed_at == (1, 0) and loader._live_feeds == [kept]
    _same_batches(_batches(loader), want[1])  # epoch 1 from the kept feed
    assert loader._kept_feed is kept
    loader.set_epoch(3)  # a jump: the kept feed (at epoch 2) is stopped, epoch 3 made anew
    _same_batches(_batches(loader), want[3])
    assert loader._kept_feed is not kept and not kept.alive
    last = loader._kept_feed
    assert last is not None and last.alive
    ref = weakref.ref(loader)
    del loader
    gc.collect()
    last._thread.join(timeout=10)  # a collection run by the feed thread itself stops it without a join
    assert ref() is None and not last.alive
    inline.close()


@pytest.mark.parametrize("targets, ready_batches", [("dict", 2), ("padded", 2), ("dict", 0)])
def test_batches_leave_no_garbage_for_the_cycle_collector(samples, targets, ready_batches):
    """A batch's objects are freed as they go: a training loop gets no garbage collections from
    the loader (DALI's public run calls left ~18 objects a batch: a class each)."""
    loader = DetectionLoader(SampleListSource(samples), RECIPE, 2, device=DEVICE, shuffle=True, seed=1,
                             targets=targets, ready_batches=ready_batches)
    batches = iter(loader)
    for _ in range(2):  # past the pipeline's first (public) run
        next(batches)
    garbage = cyclic_garbage(lambda: next(batches), 3)
    loader.close()
    assert not [o for o in garbage if isinstance(o, type)], "a class made per batch"
    assert len(garbage) < 3, sorted({type(o).__name__ for o in garbage})


@pytest.mark.parametrize("targets", ["dict", "padded"])
def test_the_targets_a_loop_let_go_of_are_freed_in_the_feeds_thread(samples, targets):
    """A loop lets go of a batch when it takes the next; the loader then holds its targets, which
    the feed's thread frees (not the training thread), two batches later."""
    import threading
    import weakref

    loader = DetectionLoader(SampleListSource(samples), RECIPE, 2, device=DEVICE, shuffle=True, seed=1,
                             targets=targets)
    freed_in: dict[int, str] = {}
    for step, (images, batch_targets) in enumerate(loader):  # 5 batches, as a training loop takes them
        boxes = batch_targets[0]["boxes"] if targets == "dict" else batch_targets["boxes"]
        weakref.finalize(boxes, lambda s=step: freed_in.setdefault(s, threading.current_thread().name))
        assert step - 2 not in freed_in or freed_in[step - 2] == "detaug-feed"
        del boxes
    del images, batch_targets
    for _ in range(100):  # batches 0-2 are retired by the yields of 2-4; the feed drops them at its next turn
        if all(s in freed_in for s in range(3)):
            break
        threading.Event().wait(0.02)
    assert [freed_in.get(s) for s in range(3)] == ["detaug-feed"] * 3
    loader.close()


@pytest.mark.parametrize("batches_per_run", [1, 3, None])
def test_feed_stats_count_the_batches_taken_and_those_not_ready(samples, batches_per_run):
    """Counted batch by batch, also where the feed hands over runs of several batches."""
    loader = DetectionLoader(SampleListSource(samples), RECIPE, 4, device=DEVICE, seed=1, batches_per_run=batches_per_run)
    first = iter(loader)
    next(first)  # the first batch: asked for before it was made
    assert loader.feed_stats.taken == 1 and loader.feed_stats.not_ready == 1 and loader.feed_stats.waited_s > 0
    list(first)
    list(loader)  # a second epoch: the stats run on over the loader's life
    stats = loader.feed_stats
    assert stats.taken == 2 * len(loader) and 1 <= stats.not_ready <= stats.taken
    loader.close()
    inline = DetectionLoader(SampleListSource(samples), RECIPE, 4, device=DEVICE, seed=1, ready_batches=0)
    list(inline)
    assert inline.feed_stats.taken == 0  # no background feed: nothing to wait for but next() itself


@pytest.mark.skipif(DEVICE != "gpu", reason="CUDA streams: a GPU (DETAUG_TEST_DEVICE=gpu)")
def test_the_feed_copies_on_a_stream_that_is_not_the_training_loops(samples):
    """The feed waits for its own stream before it hands a batch over: on the training loop's
    stream it would wait for the queued steps too."""
    from detaug.streams import training_stream

    loader = DetectionLoader(SampleListSource(samples), RECIPE, 4, device=DEVICE, seed=1)
    with training_stream() as training:
        batches = iter(loader)
        next(batches)
        feeds = list(loader._live_feeds)
        assert feeds and all(f.stream is not None and f.stream != training for f in feeds)
    loader.close()


@pytest.mark.skipif(DEVICE != "gpu", reason="PyTorch's cache of device memory: a GPU (DETAUG_TEST_DEVICE=gpu)")
def test_a_loader_after_another_reuses_the_device_memory_the_last_one_left(coco_dir):
    """Every loader's feed copies on the process's one feed stream: PyTorch reuses memory freed on
    a stream only on that stream, so with a stream per feed each new loader's batches took memory
    anew while the last one's stayed cached (its share of the GPU grew loader by loader)."""
    import gc

    recipe = T.Compose([T.Resize((512, 512)), T.Normalize()])  # float32: 3 MB an image
    reserved = []
    for _ in range(4):
        loader = DetectionLoader(CocoSource(coco_dir / "annotations.json", coco_dir / "images"), recipe, 4,
                                 device=DEVICE, seed=0, batches_per_run=3)
        for _ in range(2):
            for _images, _targets in loader:
                pass
        loader.close()
        del loader, _images, _targets
        gc.collect()
        torch.cuda.synchronize()
        reserved.append(torch.cuda.memory_reserved())
    # A loader's peak may hold one run more than the first one's did (when the loop lets go of a
    # run against when the feed makes the next: 0 or 36 MiB here, H200, 2026-11-27); a stream per
    # feed grew by two to three runs a loader (70, 140, 244, 348 MiB).
    run = 3 * 4 * 512 * 512 * 3 * 4  # bytes: a run of 3 batches of 4 float32 images
    grown = reserved[-1] - reserved[0]
    assert grown < 2 * run, [r >> 20 for r in reserved]  # MiB


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_training_stream_is_true_or_false(samples, bad):
    with pytest.raises(TypeError, match=f"training_stream must be True or False, got {bad!r}"):
        DetectionLoader(SampleListSource(samples), RECIPE, 4, device="cpu", num_workers=0, training_stream=bad)


def test_either_training_stream_yields_the_same_batches_on_the_cpu(samples):
    """On the CPU there is no stream to switch: the batches are the same either way."""
    def epoch(flag):
        loader = DetectionLoader(SampleListSource(samples), RECIPE, 4, device="cpu", num_workers=0, seed=3,
                                 shuffle=True, training_stream=flag)
        out = [(images.clone(), [t["boxes"].clone() for t in targets]) for images, targets in loader]
        loader.close()
        return out

    for (a, boxes_a), (b, boxes_b) in zip(epoch(True), epoch(False), strict=True):
        assert torch.equal(a, b) and all(torch.equal(x, y) for x, y in zip(boxes_a, boxes_b, strict=True))
