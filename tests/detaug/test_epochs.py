"""The epoch and shard rules (detaug.epochs) on their pure functions, over every combination the
issue names: n in {7, 993}, world in {1, 2, 3, 5}, batch sizes 1, 4, 16, shuffle and drop_last on
and off, three epochs each. The loaders run the same functions (tests/detaug/test_loading.py
checks that once through real pipelines)."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
import pytest

from detaug.epochs import batch_slice, check_shard, num_batches, shard_order, shard_size
from detaug.epochs import EpochSpec

CASES = list(itertools.product([7, 993], [1, 2, 3, 5], [1, 4, 16], [False, True], [False, True]))


@pytest.mark.parametrize("n, batch, drop_last", [(7, 2, False), (7, 2, True), (993, 16, False), (1, 4, False)])
def test_the_batch_after_the_last_of_an_epoch_is_the_first_of_the_next(n, batch, drop_last):
    """EpochSpec.after walks the steps of every epoch in order, then into the next epoch."""
    spec = EpochSpec(n, batch, 0, 1, True, drop_last, seed=0)
    walk = [(0, 0)]
    for _ in range(4 * len(spec) - 1):
        walk.append(spec.after(*walk[-1]))
    assert walk == [(e, s) for e in range(4) for s in range(len(spec))]
    for ahead in range(2 * len(spec) + 1):  # several steps at once: the same as one by one
        assert spec.after(1, 0, ahead) == walk[len(spec) + ahead]


@pytest.mark.parametrize("n, world, batch, shuffle, drop_last", CASES)
def test_ranks_are_equal_and_epochs_exact(n, world, batch, shuffle, drop_last):
    lengths = {len(EpochSpec(n, batch, r, world, shuffle, drop_last, seed=3)) for r in range(world)}
    assert len(lengths) == 1  # len(loader) is the same on every rank
    length = lengths.pop()
    orders = []
    for epoch in range(3):
        ranks = [shard_order(n, epoch, shard_id=r, num_shards=world, shuffle=shuffle, seed=3, drop_last=drop_last)
                 for r in range(world)]
        per_rank = {len(o) for o in ranks}
        assert per_rank == {shard_size(n, world, drop_last=drop_last)}
        # the batches a rank yields: `length` of them, covering its samples (all but a dropped tail)
        for order in ranks:
            batches = [order[batch_slice(s, batch, len(order))] for s in range(length)]
            assert all(0 < len(b) <= batch for b in batches)
            covered = sum(len(b) for b in batches)
            assert covered == len(order) if not drop_last else len(order) - covered < batch
        seen = Counter(int(i) for o in ranks for i in o)
        if drop_last:
            assert len(seen) == (n // world) * world and max(seen.values()) == 1
        else:
            assert set(seen) == set(range(n))  # the union is the whole dataset
            repeats = sum(seen.values()) - n
            assert repeats == math.ceil(n / world) * world - n <= world - 1
        orders.append(np.concatenate(ranks))
    if shuffle:  # a new permutation every epoch
        assert not np.array_equal(orders[0], orders[1]) and not np.array_equal(orders[1], orders[2])
    else:
        assert np.array_equal(orders[0], orders[1])


def test_the_permutation_is_shared_by_the_ranks_before_sharding():
    n, world = 993, 3
    order = np.concatenate([shard_order(n, 4, shard_id=r, num_shards=world, shuffle=True, seed=9, drop_last=False)
                            for r in range(world)])
    one = shard_order(n, 4, shard_id=0, num_shards=1, shuffle=True, seed=9, drop_last=False)
    # rank r takes positions r::W of the one permutation
    for r in range(world):
        assert np.array_equal(shard_order(n, 4, shard_id=r, num_shards=world, shuffle=True, seed=9, drop_last=False), one[r::world])
    assert sorted(order.tolist()) == list(range(n))


def test_padding_repeats_the_start_of_the_order():
    order = shard_order(7, 0, shard_id=4, num_shards=5, shuffle=False, seed=0, drop_last=False)
    assert order.tolist() == [4, 2]  # padded list: 0..6, 0, 1, 2; rank 4 takes positions 4 and 9


def test_the_issue_examples():
    # 37 images on 5 ranks at batch 4 with drop_last: 7 per rank, one full batch each
    assert {num_batches(37, 5, 4, drop_last=True)} == {1}
    # 7 images on 2 ranks at batch 4 with drop_last: 3 per rank, no full batch: 0 on both
    assert num_batches(7, 2, 4, drop_last=True) == 0
    assert num_batches(7, 2, 4, drop_last=False) == 1
    assert num_batches(993, 2, 16, drop_last=False) == 32  # was 31 and 32


def test_fewer_samples_than_ranks_still_pads_every_rank():
    orders = [shard_order(2, 0, shard_id=r, num_shards=5, shuffle=False, seed=0, drop_last=False) for r in range(5)]
    assert [o.tolist() for o in orders] == [[0], [1], [0], [1], [0]]


@pytest.mark.parametrize("shard_id, num_shards", [(2, 2), (-1, 2), (0, 0), (0.5, 2), (True, 2)])
def test_bad_shards_are_refused(shard_id, num_shards):
    with pytest.raises(ValueError, match="shard"):
        check_shard(shard_id, num_shards)


def source_of(kind: str, n: int, folder):
    """A dataset of ``n`` images as a CocoSource or a sample list (no image is read here)."""
    from detaug.sources import CocoSource, SampleListSource

    ids = [10 + 3 * i for i in range(n)]  # ids that are not positions
    if kind == "coco":
        coco = {
            "images": [{"id": i, "file_name": f"{i}.jpg", "width": 64, "height": 48} for i in ids],
            "annotations": [{"id": k + 1, "image_id": i, "category_id": 1, "bbox": [1, 1, 8, 8]} for k, i in enumerate(ids)],
            "categories": [{"id": 1, "name": "thing"}],
        }
        return CocoSource(coco, folder)  # an empty folder: no image is read
    return SampleListSource([{"image": f"/nonexistent/{i}.jpg", "boxes": [[1, 1, 9, 9]], "labels": [1], "image_id": i} for i in ids])


@pytest.mark.parametrize("kind", ["coco", "list"])
@pytest.mark.parametrize("n", [7, 993])
def test_the_adapters_planners_follow_the_rules_for_both_source_kinds(kind, n, tmp_path):
    """What the loaders' planners ask for, batch by batch (image ids, before any image is read),
    over every world size, batch size, shuffle and drop_last setting and three epochs."""
    from detaug.planning import BatchPlanner
    from detaug.transforms import Compose, Resize

    source = source_of(kind, n, tmp_path)
    every = {s.image_id for s in source.samples}
    for world, batch, shuffle, drop_last in itertools.product([1, 2, 3, 5], [1, 4, 16], [False, True], [False, True]):
        planners = [BatchPlanner(source, Compose([Resize((8, 8))]), EpochSpec(n, batch, r, world, shuffle, drop_last, seed=2))
                    for r in range(world)]
        assert len({len(p.spec) for p in planners}) == 1
        for epoch in range(3):
            seen = Counter()
            for p in planners:
                for step in range(len(p.spec)):
                    seen.update(source.samples[int(i)].image_id for i in p.positions(epoch, step))
            if drop_last:
                assert max(seen.values(), default=1) == 1 and len(seen) == (n // world) // batch * batch * world
            else:
                assert set(seen) == every and sum(seen.values()) - n <= world - 1
