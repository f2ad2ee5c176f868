"""Epochs, shards, seeds and resume through real DALI CPU pipelines, for both adapters and both
source kinds (a COCO file and the same samples as a list). The combinatorics live in
test_epochs.py on the pure functions; here each rule is checked once end to end."""

from __future__ import annotations

import json
import os
from collections import Counter

import numpy as np
import pytest
import torch

import detaug.transforms as T
from detaug.keras import DetectionSequence
from detaug.sources import CocoSource, SampleListSource
from detaug.synthetic import write_coco_dataset
from detaug.torch import DetectionLoader

DEVICE = os.environ.get("DETAUG_TEST_DEVICE", "cpu")  # DETAUG_TEST_DEVICE=gpu: the same tests on a GPU
RECIPE = T.Compose([T.RandomIoUCrop(), T.RandomHorizontalFlip(), T.RandomAffine(degrees=10, fill=114), T.Resize((40, 48))])
N = 7


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    root = tmp_path_factory.mktemp("coco")
    write_coco_dataset(root, num_images=N, size=(64, 48), max_objects=3, progress=False)
    return root


def sources(coco):
    """The same dataset as a CocoSource and as a sample list (made from the JSON by hand)."""
    data = json.loads((coco / "annotations.json").read_text())
    by_image = {}
    for a in data["annotations"]:
        x, y, w, h = a["bbox"]
        by_image.setdefault(a["image_id"], []).append(([x, y, x + w, y + h], a["category_id"]))
    samples = [
        dict(image=str(coco / "images" / im["file_name"]), boxes=[b for b, _ in by_image[im["id"]]],
             labels=[c for _, c in by_image[im["id"]]], image_id=im["id"])
        for im in data["images"]
    ]
    return {"coco": CocoSource(coco / "annotations.json", coco / "images"), "list": SampleListSource(samples)}


def run(loader, epochs=3):
    """``{epoch: [(image_id, boxes array), ...]}`` in yield order, checking batch counts."""
    out = {}
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        seen, batches = [], 0
        for _, targets in loader:
            batches += 1
            seen += [(t["image_id"], t["boxes"].cpu().numpy()) for t in targets]
        assert batches == len(loader)
        out[epoch] = seen
    return out


@pytest.mark.parametrize("kind", ["coco", "list"])
@pytest.mark.parametrize("drop_last", [False, True])
def test_equal_ranks_and_exact_epochs(coco, kind, drop_last):
    world, batch = 3, 2
    runs = [run(DetectionLoader(sources(coco)[kind], RECIPE, batch, device=DEVICE, shuffle=True, seed=4,
                                shard_id=r, num_shards=world, drop_last=drop_last)) for r in range(world)]
    for epoch in range(3):
        counts = Counter(i for r in runs for i, _ in r[epoch])
        per_rank = {len(r[epoch]) for r in runs}
        if drop_last:  # 7 // 3 = 2 per rank, one batch of 2
            assert per_rank == {2} and max(counts.values()) == 1
        else:  # ceil(7 / 3) = 3 per rank; the union is the dataset; 2 repeats
            assert per_rank == {3} and set(counts) == set(range(1, N + 1)) and sum(counts.values()) - N == 2
    orders = [[i for r in runs for i, _ in r[e]] for e in range(3)]
    assert orders[0] != orders[1] != orders[2]  # a new permutation each epoch


def test_seed_contract_across_sources_batch_sizes_ranks_and_workers(coco):
    """A sample's boxes are a pure function of (seed, epoch, image_id)."""
    reference = {}
    for kind, batch, world, workers in [("coco", 4, 1, 0), ("list", 1, 1, 0), ("list", 3, 2, 0), ("coco", 2, 3, 2)]:
        for rank in range(world):
            loader = DetectionLoader(sources(coco)[kind], RECIPE, batch, device=DEVICE, shuffle=True, seed=11,
                                     shard_id=rank, num_shards=world, num_workers=workers)
            for epoch, seen in run(loader, epochs=2).items():
                for image_id, boxes in seen:
                    key = (epoch, image_id)
                    if key in reference:
                        np.testing.assert_array_equal(boxes, reference[key], err_msg=f"{kind} {batch} {world} {key}")
                    else:
                        reference[key] = boxes
            loader.close()
    assert len(reference) == 2 * N
    # and the augmentation does change with the epoch
    assert any(not np.array_equal(reference[0, i], reference[1, i]) for i in range(1, N + 1))


@pytest.mark.parametrize("stop_after", [0, 1, 3])
def test_resume_gives_exactly_the_rest(coco, stop_after):
    def batches(loader, n):
        out = []
        for images, targets in loader:
            out.append((images.clone(), [(t["image_id"], t["boxes"]) for t in targets]))
            if len(out) == n:
                break
        return out

    make = lambda: DetectionLoader(sources(coco)["list"], RECIPE, 2, device=DEVICE, shuffle=True, seed=8)  # noqa: E731
    unbroken = make()
    unbroken.set_epoch(1)
    expected = batches(unbroken, 4) + batches(unbroken, 4)  # epoch 1, then epoch 2
    first = make()
    first.set_epoch(1)
    head = batches(first, stop_after) if stop_after else []
    state = json.loads(json.dumps(first.state_dict()))  # a checkpoint survives JSON
    assert state["epoch"] == 1 and state["step"] == stop_after
    resumed = make()
    resumed.load_state_dict(state)
    resumed.set_epoch(1)  # the usual training loop calls it: the position is kept
    rest = batches(resumed, 4) + batches(resumed, 4)
    got = head + rest
    assert len(got) == len(expected) == 8
    for (a_images, a_targets), (b_images, b_targets) in zip(got, expected):
        assert torch.equal(a_images, b_images)
        assert [i for i, _ in a_targets] == [i for i, _ in b_targets]
        for (_, a), (_, b) in zip(a_targets, b_targets):
            assert torch.equal(a, b)


def test_a_state_from_other_settings_is_refused(coco):
    a = DetectionLoader(sources(coco)["list"], RECIPE, 2, device=DEVICE, seed=1)
    b = DetectionLoader(sources(coco)["list"], RECIPE, 3, device=DEVICE, seed=1)
    with pytest.raises(ValueError, match="batch_size"):
        b.load_state_dict(a.state_dict())


def test_early_break_then_next_epoch(coco):
    loader = DetectionLoader(sources(coco)["list"], RECIPE, 2, device=DEVICE)
    for _ in loader:
        break
    assert loader.state_dict()["epoch"] == 0 and loader.state_dict()["step"] == 1
    ids = [t["image_id"] for _, targets in loader for t in targets]  # the next epoch, whole
    assert ids == list(range(1, N + 1)) and loader.epoch == 2


def test_keras_sequence_follows_the_same_rules(coco):
    """Shards, padding and the seed contract are those of the PyTorch loader."""
    world, batch = 2, 2
    torch_boxes = {}
    for rank in range(world):
        loader = DetectionLoader(sources(coco)["list"], RECIPE, batch, device=DEVICE, shuffle=True, seed=5, shard_id=rank, num_shards=world)
        loader.set_epoch(1)
        for _, targets in loader:
            for t in targets:
                torch_boxes[t["image_id"]] = t["boxes"].cpu().numpy()
    lengths, seen = set(), Counter()
    for rank in range(world):
        seq = DetectionSequence(sources(coco)["coco"], RECIPE, batch, max_boxes=8, shuffle=True, seed=5, device=DEVICE,
                                shard_id=rank, num_shards=world, plan_workers=0)
        seq.set_epoch(1)
        lengths.add(len(seq))
        for i in range(len(seq)):
            _, targets = seq[i]
            boxes, labels = (t.cpu().numpy() if hasattr(t, "cpu") else np.asarray(t) for t in (targets["boxes"], targets["labels"]))
            ids = seq.batch_indices(i)
            for k, position in enumerate(ids):
                image_id = seq.source.samples[position].image_id
                seen[image_id] += 1
                np.testing.assert_array_equal(boxes[k][labels[k] >= 0], torch_boxes[image_id])
    assert lengths == {2} and set(seen) == set(range(1, N + 1)) and sum(seen.values()) == 8


def test_close_and_garbage_collection_release_the_workers(coco):
    import gc
    import time

    from tests.detaug.test_processes import alive

    def all_gone(pids, timeout=10.0):
        deadline = time.monotonic() + timeout
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        return not any(alive(p) for p in pids)

    loader = DetectionLoader(sources(coco)["list"], RECIPE, 2, device=DEVICE, num_workers=2)
    first = [t["image_id"] for _, targets in loader for t in targets]
    pids = list(loader._pool._pool._processes)
    assert len(pids) == 2 and all(alive(p) for p in pids)
    loader.close()
    assert loader.pipeline is None and all_gone(pids, timeout=0.5)  # close() waits for them
    assert [t["image_id"] for _, targets in loader for t in targets] == first  # usable again: epoch 1, unshuffled
    pids = list(loader._pool._pool._processes)
    del loader
    gc.collect()
    assert all_gone(pids)  # stopped in the background once the loader is collected


def test_no_batches_is_the_same_length_everywhere(coco):
    """drop_last with fewer samples per rank than a batch: len 0 on every rank, in both adapters."""
    for rank in range(2):
        with pytest.warns(UserWarning, match="no batches"):
            loader = DetectionLoader(sources(coco)["list"], RECIPE, 4, device=DEVICE, shard_id=rank, num_shards=2, drop_last=True)
        assert len(loader) == 0 and list(loader) == []
        with pytest.warns(UserWarning, match="no batches"):
            seq = DetectionSequence(sources(coco)["list"], RECIPE, 4, max_boxes=8, device=DEVICE, shard_id=rank,
                                    num_shards=2, drop_last=True, plan_workers=0)
        assert len(seq) == 0
