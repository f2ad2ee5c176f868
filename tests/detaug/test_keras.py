"""Tests of detaug.keras: index semantics, epochs, padding and overflow, box formats, prefetching,
planning workers, pixel consistency, agreement with the PyTorch loader, and ``model.fit`` (Keras
on PyTorch), on DALI CPU pipelines; DETAUG_TEST_DEVICE=gpu runs the same tests on a GPU.

DALI CPU pipelines are slow on small machines: the datasets are a dozen small images, and the
module builds few pipelines (``seq`` is shared; tests that move its epoch put it back).
"""

from __future__ import annotations

import gc
import os
import pickle
import threading
import time

os.environ.setdefault("KERAS_BACKEND", "torch")  # before Keras is imported, here or by detaug.keras

import warnings
from concurrent.futures import ThreadPoolExecutor, wait
from multiprocessing.connection import wait as wait_sentinels

import numpy as np
import pytest

keras = pytest.importorskip("keras", reason="Keras 3 is not installed (pip install detaug[keras])")

import detaug.keras as dk
import detaug.transforms as T
import detaug.plan_jobs as plan_jobs
from detaug.decoded_shapes import DecodedShapes
from detaug.epochs import EpochSpec
from detaug.planning import BatchPlanner
from detaug import ImageError
from detaug.keras import (
    KERAS_BOX_FORMATS,
    BoxOverflowWarning,
    DetectionSequence,
    to_keras_boxes,
)
from detaug.sources import CocoSource, SampleListSource, VocSource
from detaug.synthetic import write_coco_dataset, write_voc_dataset
from tests.detaug.conftest import cyclic_garbage
from tests.detaug.consistency import (
    RecordingCompose,
    check_boxes_match_pixels,
    scene_samples,
)

DEVICE = os.environ.get("DETAUG_TEST_DEVICE", "cpu")
FILL = 114
NUM_IMAGES, BATCH = 11, 4  # batches of 4, 4 and 3
OUT_HW = (64, 80)


def recipe() -> T.Compose:
    return T.Compose([T.RandomHorizontalFlip(), T.RandomAffine(degrees=10, scale=(0.9, 1.1), fill=FILL), T.Resize(OUT_HW)])


def make_sequence(source, **kwargs) -> DetectionSequence:
    """A test sequence: NumPy images unless asked otherwise (the GPU default is torch tensors)."""
    kwargs = {"shuffle": True, "seed": 0, "device": DEVICE, "num_threads": 2, "images_on_device": False, **kwargs}
    return DetectionSequence(source, kwargs.pop("transforms", recipe()), kwargs.pop("batch_size", BATCH), **kwargs)


def assert_batches_equal(a, b):
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1]["boxes"], b[1]["boxes"])
    np.testing.assert_array_equal(a[1]["labels"], b[1]["labels"])


@pytest.fixture(scope="module")
def voc_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("voc")
    write_voc_dataset(root, num_images=NUM_IMAGES, size=((128, 160), (112, 128)), image_format="png", splits={"train": 1.0})
    return root


@pytest.fixture(scope="module")
def source(voc_root):
    return VocSource(voc_root, "train")


@pytest.fixture(scope="module")
def seq(source):
    return make_sequence(source)


@pytest.fixture(scope="module")
def epoch0(seq):
    """Every batch of epoch 0, fetched in order."""
    seq.set_epoch(0)
    return [seq[i] for i in range(len(seq))]


class TestProtocol:
    def test_is_a_keras_pydataset_with_the_classic_protocol(self, seq):
        assert isinstance(seq, keras.utils.PyDataset)
        assert seq.workers == 1 and not seq.use_multiprocessing  # workers=None: Keras' loop calls seq[i]
        for name in ("__len__", "__getitem__", "on_epoch_end"):
            assert callable(getattr(seq, name))

    def test_len_and_the_last_partial_batch(self, seq, epoch0):
        assert len(seq) == 3
        assert [len(images) for images, _ in epoch0] == [4, 4, 3]
        images, targets = epoch0[-1]
        assert images.shape == (3, *OUT_HW, 3)
        assert targets["boxes"].shape == (3, seq.max_boxes, 4) and targets["labels"].shape == (3, seq.max_boxes)

    def test_drop_last(self, source):
        short = make_sequence(source, drop_last=True, prefetch=False)
        assert len(short) == 2
        assert len(short[-1][0]) == BATCH
        with pytest.raises(IndexError):
            short[2]

    def test_dtypes_and_layout(self, epoch0):
        images, targets = epoch0[0]
        assert images.dtype == np.float32 and images.shape == (BATCH, *OUT_HW, 3)
        assert 0 <= images.min() and images.max() <= 255 and images.max() > 1  # no Normalize: 0..255
        assert targets["boxes"].dtype == np.float32 and targets["labels"].dtype == np.int32
        assert list(targets) == ["boxes", "labels"]  # the default: no per-box fields (fields="none")


class TestIndexing:
    def test_random_order_gives_the_same_batches(self, seq, epoch0):
        seq.set_epoch(0)
        for i in (2, 0, 1, 0, 2):
            assert_batches_equal(seq[i], epoch0[i])

    def test_negative_indexes_count_from_the_end(self, seq, epoch0):
        seq.set_epoch(0)
        assert_batches_equal(seq[-1], epoch0[2])
        assert_batches_equal(seq[-3], epoch0[0])
        np.testing.assert_array_equal(seq.batch_indices(-2), seq.batch_indices(1))

    def test_index_errors(self, seq):
        for bad in (3, -4, 100):
            with pytest.raises(IndexError, match="out of range for a sequence of 3 batches"):
                seq[bad]
        with pytest.raises(TypeError, match="integers"):
            seq[1.0]
        assert len(seq[np.int64(1)][0]) == BATCH

    def test_an_epoch_visits_every_sample_once(self, seq):
        seq.set_epoch(0)
        visited = np.concatenate([seq.batch_indices(i) for i in range(len(seq))])
        assert sorted(visited.tolist()) == list(range(NUM_IMAGES))

    def test_concurrent_access_from_threads(self, seq, epoch0):
        seq.set_epoch(0)
        with ThreadPoolExecutor(3) as pool:
            batches = list(pool.map(seq.__getitem__, [2, 1, 0, 2, 1, 0]))
        for i, batch in zip([2, 1, 0, 2, 1, 0], batches):
            assert_batches_equal(batch, epoch0[i])


class TestConcurrency:
    """Concurrent calls share one pipeline, ``PIPELINE_DEPTH`` batches at once; results never
    depend on what ran beside them."""

    def test_calls_from_threads_share_one_pipeline(self, source, epoch0):
        four = make_sequence(source, workers=4, prefetch=False)
        pipe = four._queue.pipe
        with ThreadPoolExecutor(4) as pool:
            batches = list(pool.map(four.__getitem__, [1, 0, 2, 1, 2, 0, 0, 2]))
        for i, batch in zip([1, 0, 2, 1, 2, 0, 0, 2], batches):
            assert_batches_equal(batch, epoch0[i])
        assert four._queue.pipe is pipe and not four._queue.inflight and not four._queue.waiting

    def test_waiting_batches_run_depth_at_once_in_the_order_they_came(self, source, epoch0):
        from detaug.keras.pipeline_queue import PIPELINE_DEPTH

        seq = make_sequence(source, workers=3, prefetch=False)
        queue = seq._queue
        tickets = [queue.submit(seq._plan(i, 0)) for i in (2, 0, 1)]
        queue.feed_waiting()  # as a prefetch does: fed now, nobody collects yet
        assert list(queue.inflight) == tickets[:PIPELINE_DEPTH] and list(queue.waiting) == tickets[PIPELINE_DEPTH:]
        np.testing.assert_array_equal(queue.result(tickets[2]), epoch0[1][0])  # collects the older ones on the way
        assert all(t.done for t in tickets) and not queue.inflight
        for i, ticket in zip((2, 0), tickets):
            np.testing.assert_array_equal(queue.result(ticket), epoch0[i][0])

    def test_a_prefetch_nobody_asks_for_next_is_dropped(self, source, epoch0):
        one = make_sequence(source, workers=1)
        one[0], one[1]  # sequential: batch 2 and the next epoch's batch 0 are prefetched
        assert list(one._queue.prefetched) == [(0, 2), (1, 0)]
        assert_batches_equal(one[0], epoch0[0])  # not batch 2: the prefetches are dropped
        assert (one.prefetch_wasted, one._queue.prefetched) == (2, {})
        assert not one._queue.waiting and not any(t.wanted for t in one._queue.inflight)

    def test_two_prefetches_of_one_batch_keep_one(self, source, epoch0):
        """Two readers walking the same batches (Keras' adapters peek at the first batches with
        one iterator, then train with another) both prefetch batch 2: the second finds it held
        and plans nothing; one that raced past that check (planned meanwhile) is dropped when
        held (never fed, or its images not copied)."""
        two = make_sequence(source, workers=2)
        two.set_epoch(0)
        two._prefetch_next(2, 0)
        two._prefetch_next(2, 0)
        assert list(two._queue.prefetched) == [(0, 2)] and two.prefetch_wasted == 0
        with two._lock:
            two._queue.hold((0, 2), two._queue.submit(two._plan(2, 0)))
        assert list(two._queue.prefetched) == [(0, 2)] and two.prefetch_wasted == 1
        assert_batches_equal(two[2], epoch0[2])
        assert two.prefetch_hits == 1 and not two._queue.waiting
        assert not any(t.wanted for t in two._queue.inflight)  # at most the filler of the fresh pipeline's first run

    def test_a_call_waits_while_another_drives_the_pipeline(self, seq, epoch0):
        seq.set_epoch(0)
        with seq._lock:
            seq._queue._driving = True  # as a call collecting a batch would
        try:
            with ThreadPoolExecutor(1) as pool:
                waiting = pool.submit(seq.__getitem__, 1)
                time.sleep(0.5)
                assert not waiting.done()
                with seq._lock:
                    seq._queue._driving = False
                    seq._lock.notify_all()
                assert_batches_equal(waiting.result(timeout=60), epoch0[1])
        finally:
            with seq._lock:
                seq._queue._driving = False
                seq._lock.notify_all()

    def test_max_queue_size_defaults_to_workers(self, source):
        assert make_sequence(source, workers=3).max_queue_size == 3
        assert make_sequence(source, workers=3, max_queue_size=7).max_queue_size == 7
        for bad in (0, 1.5, True):
            with pytest.raises(ValueError, match="max_queue_size must be an integer >= 1 or None"):
                make_sequence(source, max_queue_size=bad)

    def test_workers_must_be_a_positive_integer(self, source):
        for bad in (0, -1, 1.5, True):
            with pytest.raises(ValueError, match="workers must be an integer >= 1 or None"):
                make_sequence(source, workers=bad)


class TestEpochs:
    def test_on_epoch_end_reshuffles_and_set_epoch_goes_back(self, seq, epoch0):
        seq.set_epoch(0)
        order0 = [seq.batch_indices(i) for i in range(len(seq))]
        seq.on_epoch_end()
        assert seq.epoch == 1
        order1 = [seq.batch_indices(i) for i in range(len(seq))]
        assert not all(np.array_equal(a, b) for a, b in zip(order0, order1))
        assert sorted(np.concatenate(order1).tolist()) == list(range(NUM_IMAGES))
        seq.set_epoch(0)
        assert_batches_equal(seq[1], epoch0[1])

    def test_without_shuffle_the_order_stays_and_augmentations_change(self, source):
        plain = make_sequence(source, shuffle=False, prefetch=False)
        first = plain[0]
        np.testing.assert_array_equal(plain.batch_indices(0), np.arange(BATCH))
        plain.on_epoch_end()
        np.testing.assert_array_equal(plain.batch_indices(0), np.arange(BATCH))
        assert not np.array_equal(plain[0][0], first[0])  # keys (seed, epoch, image_id) changed

    def test_same_seed_same_batches_other_seed_other_order(self, source, epoch0):
        again = make_sequence(source, prefetch=False)
        assert_batches_equal(again[1], epoch0[1])
        other = make_sequence(source, seed=1, prefetch=False)
        assert not all(np.array_equal(other.batch_indices(i), again.batch_indices(i)) for i in range(len(other)))


class TestTargets:
    def test_padding_with_minus_one(self, seq, epoch0):
        seq.set_epoch(0)
        assert seq.max_boxes == max(len(s.boxes) for s in seq.source.samples)  # max_boxes=None
        for images, targets in epoch0:
            labels, boxes = targets["labels"], targets["boxes"]
            valid = labels >= 0
            counts = valid.sum(axis=1)
            assert (counts > 0).any()
            for k, n in enumerate(counts):  # valid rows first, then padding
                assert valid[k, :n].all() and not valid[k, n:].any()
            assert (boxes[~valid] == -1).all() and (labels[~valid] == -1).all()
            real = boxes[valid]
            assert (real[:, 2] > real[:, 0]).all() and (real[:, 3] > real[:, 1]).all()
            eps = 1e-4  # the planner's float64 clipping can leave -4e-16 for an edge on the border
            assert (real >= -eps).all() and (real[:, [0, 2]] <= OUT_HW[1] + eps).all() and (real[:, [1, 3]] <= OUT_HW[0] + eps).all()

    def test_overflow_raise_warn_truncate(self, source):
        crowded = make_sequence(source, max_boxes=1, prefetch=False)
        assert crowded.overflow == "raise"
        with pytest.raises(ValueError, match=r"more than max_boxes=1 boxes .*image_id .*overflow='warn'"):
            crowded[0]
        assert crowded.boxes_truncated == 0

        crowded.overflow = "warn"
        with pytest.warns(BoxOverflowWarning, match="beyond max_boxes=1"):
            _, targets = crowded[0]
        assert targets["boxes"].shape == (BATCH, 1, 4)
        assert crowded.boxes_truncated > 0 and crowded.samples_truncated > 0
        cut = crowded.boxes_truncated

        crowded.overflow = "truncate"
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            _, again = crowded[0]
        np.testing.assert_array_equal(again["boxes"], targets["boxes"])
        assert crowded.boxes_truncated == 2 * cut  # counted, not silent

    @pytest.mark.parametrize("fmt", KERAS_BOX_FORMATS)
    def test_box_formats_match_keras(self, fmt):
        rng = np.random.default_rng(0)
        xy = rng.uniform(0, 60, size=(7, 2))
        boxes = np.concatenate([xy, xy + rng.uniform(1, 20, size=(7, 2))], axis=1).astype(np.float32)
        ours = to_keras_boxes(boxes, fmt, (64, 80))
        theirs = keras.utils.bounding_boxes.convert_format(boxes, "xyxy", fmt, height=64, width=80)
        theirs = theirs.cpu().numpy() if hasattr(theirs, "cpu") else np.asarray(theirs)  # a torch tensor here
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-4)

    def test_sequence_box_format(self, source, epoch0):
        rel = make_sequence(source, bounding_box_format="REL_YXYX", prefetch=False)
        _, targets = rel[1]
        _, reference = epoch0[1]
        valid = reference["labels"] >= 0
        np.testing.assert_array_equal(targets["labels"], reference["labels"])
        expected = to_keras_boxes(reference["boxes"][valid], "rel_yxyx", OUT_HW)
        np.testing.assert_allclose(targets["boxes"][valid], expected, rtol=1e-6)
        assert (targets["boxes"][~valid] == -1).all()


class TestPrefetch:
    def test_sequential_access_is_prefetched_across_epochs(self, source, epoch0):
        fresh = make_sequence(source)
        batches = list(fresh)  # in order
        assert (fresh.prefetch_hits, fresh.prefetch_wasted) == (len(fresh) - 1, 0)
        for a, b in zip(batches, epoch0):
            assert_batches_equal(a, b)
        assert sorted(fresh._queue.prefetched) == [(1, 0), (1, 1)]  # the next epoch's first batches
        fresh.on_epoch_end()  # epoch 1: kept, and taken
        epoch1 = list(fresh)
        assert (fresh.prefetch_hits, fresh.prefetch_wasted) == (2 * len(fresh) - 1, 0)  # all of epoch 1
        fresh.batch(0, epoch=2)  # another epoch's batch (the next one's too) does not count as sequential
        assert sorted(fresh._queue.prefetched) == [(2, 1)] and fresh._last == len(fresh) - 1  # (2, 0) taken, nothing new
        fresh.set_epoch(3)  # not the epoch prefetched: dropped
        assert (fresh._queue.prefetched, fresh.prefetch_wasted) == ({}, 1)
        other = make_sequence(source, prefetch=False)
        other.set_epoch(1)
        for i, batch in enumerate(epoch1):
            assert_batches_equal(batch, other[i])
        other.set_epoch(3)
        assert_batches_equal(fresh[0], other[0])

    def test_random_access_wastes_at_most_the_batches_prefetched(self, seq, epoch0):
        from detaug.keras.pipeline_queue import PIPELINE_DEPTH

        seq.set_epoch(0)
        hits, wasted = seq.prefetch_hits, seq.prefetch_wasted
        assert_batches_equal(seq[0], epoch0[0])  # looks sequential: the next PIPELINE_DEPTH batches are prefetched
        assert sorted(seq._queue.prefetched) == [(0, k) for k in range(1, 1 + PIPELINE_DEPTH)] == [(0, 1), (0, 2)]
        assert_batches_equal(seq[2], epoch0[2])  # a prefetched batch, taken out of order
        assert_batches_equal(seq[0], epoch0[0])  # not batch 1: its prefetch is dropped
        assert (seq.prefetch_hits - hits, seq.prefetch_wasted - wasted) == (1, 1)
        assert not seq._queue.prefetched and not any(t.wanted for t in seq._queue.inflight)
        seq.on_epoch_end()  # nothing pending: nothing wasted
        assert seq.prefetch_wasted - wasted == 1
        seq.set_epoch(0)


class TestConstruction:
    def test_argument_errors(self, source):
        with pytest.raises(ValueError, match="overflow must be one of"):
            make_sequence(source, overflow="clip")
        with pytest.raises(ValueError, match="unknown bounding_box_format 'cxcy'"):
            make_sequence(source, bounding_box_format="cxcy")
        with pytest.raises(ValueError, match="use_multiprocessing=True is not supported"):
            make_sequence(source, use_multiprocessing=True)
        with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
            make_sequence(source, batch_size=0)
        with pytest.raises(ValueError, match="max_boxes must be an integer >= 1"):
            make_sequence(source, max_boxes=0)
        with pytest.raises(TypeError, match="Compose"):
            make_sequence(source, transforms=[T.Resize(OUT_HW)])
        with pytest.raises(ValueError, match="shard_id must be an integer in"):
            make_sequence(source, shard_id=2, num_shards=2)
        padded = make_sequence(source, shard_id=NUM_IMAGES, num_shards=NUM_IMAGES + 1, prefetch=False, shuffle=False)
        assert len(padded) == 1 and padded.batch_indices(0).tolist() == [0]  # padded like DistributedSampler

    def test_images_of_different_sizes_need_a_fixed_output_size(self, source):
        ragged = make_sequence(source, transforms=T.Compose([T.RandomHorizontalFlip()]), prefetch=False)
        with pytest.raises(ValueError, match=r"different shapes .*Resize\(\(h, w\)\)"):
            ragged[0]

    def test_coco_source_is_read_for_random_access(self, tmp_path):
        write_coco_dataset(tmp_path, num_images=5, size=(96, 80), max_objects=3, progress=False)
        coco = CocoSource(tmp_path / "annotations.json", tmp_path / "images", shuffle=True, seed=0)
        assert not make_sequence(coco, shuffle=False, prefetch=False).shuffle  # the sequence's argument wins
        from_coco = make_sequence(coco, shuffle=None, batch_size=2, max_boxes=3, prefetch=False)
        assert from_coco.shuffle and len(from_coco) == 3
        assert from_coco[-1][0].shape == (1, *OUT_HW, 3)
        assert set(from_coco.categories.values()) >= {"cat"}


def test_boxes_match_object_pixels():
    """The pipeline test's pixel-consistency check on ``seq[i]`` (random order, xyxy boxes)."""
    samples, scenes = scene_samples(8, seed=4)
    transforms = RecordingCompose(
        [T.RandomIoUCrop(), T.RandomHorizontalFlip(), T.RandomAffine(degrees=15, translate=(0.1, 0.1), scale=(0.8, 1.2), shear=5, fill=FILL), T.Resize((96, 120))]
    )
    checked = make_sequence(  # plan_workers=0: the recipe records its plans in this process
        SampleListSource(samples), transforms=transforms, batch_size=3, max_boxes=5, prefetch=False, plan_workers=0
    )
    problems, boxes_seen = [], 0
    for i in (2, 0, 1):
        images, targets = checked[i]
        scales = transforms.area_scales(transforms.records[-1])  # prefetch=False: one plan per seq[i]
        for k, j in enumerate(checked.batch_indices(i)):
            valid = targets["labels"][k] >= 0
            boxes_seen += int(valid.sum())
            image = images[k].astype(np.uint8)  # 0..255 floats of a uint8 image: exact
            found = check_boxes_match_pixels(image, targets["boxes"][k][valid], targets["labels"][k][valid], scenes[j], area_scale=scales[k])
            problems += [f"batch {i}, sample {j}: {p}" for p in found]
    assert boxes_seen > 0
    assert not problems, "\n".join(problems)


def test_same_batches_as_the_pytorch_loader(source, epoch0):
    """Same seed, shuffle and batch size: seq[i] holds the PyTorch loader's i-th batch."""
    from detaug.torch import DetectionLoader

    loader = DetectionLoader(source, recipe(), BATCH, device=DEVICE, num_threads=2, shuffle=True, seed=0)
    for (images, targets), (k_images, k_targets) in zip(loader, epoch0):
        np.testing.assert_array_equal(images.cpu().numpy().transpose(0, 2, 3, 1).astype(np.float32), k_images)
        for k, target in enumerate(targets):
            n = len(target["boxes"])
            np.testing.assert_array_equal(k_targets["boxes"][k, :n], target["boxes"].cpu().numpy())
            np.testing.assert_array_equal(k_targets["labels"][k, :n], target["labels"].cpu().numpy())
            assert (k_targets["labels"][k, n:] == -1).all()


class TinyDetector(keras.Model):
    """Conv, global pooling and a dense head regressing every box slot; loss on real boxes only."""

    def __init__(self, max_boxes: int):
        super().__init__()
        self.max_boxes = max_boxes
        self.conv = keras.layers.Conv2D(4, 3, strides=2, activation="relu")
        self.pool = keras.layers.GlobalAveragePooling2D()
        self.head = keras.layers.Dense(max_boxes * 4)

    def call(self, images):
        x = self.pool(self.conv(images / 255.0))
        return keras.ops.reshape(self.head(x), (-1, self.max_boxes, 4))

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        mask = keras.ops.cast(y["labels"] >= 0, "float32")
        error = keras.ops.mean(keras.ops.abs(y_pred - y["boxes"]), axis=-1) * mask
        return keras.ops.sum(error) / keras.ops.maximum(keras.ops.sum(mask), 1.0)


def boxes_and_labels_model(max_boxes: int, size: tuple[int, int]):
    """A functional Keras model whose outputs are exactly ``{"boxes", "labels"}``, compiled with a
    loss per output: Keras then checks that the targets have the outputs' structure."""
    images = keras.Input((*size, 3))
    x = keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(4, 3, strides=4, activation="relu")(images / 255.0))
    boxes = keras.layers.Reshape((max_boxes, 4), name="boxes")(keras.layers.Dense(max_boxes * 4)(x))
    labels = keras.layers.Dense(max_boxes, name="labels")(x)
    model = keras.Model(images, {"boxes": boxes, "labels": labels})
    model.compile(optimizer=keras.optimizers.SGD(1e-3), loss={"boxes": "mae", "labels": "mse"})
    return model


# Keras' torch backend turns its logs to NumPy with np.array(tensor), which NumPy 2 flags for torch.
@pytest.mark.filterwarnings("ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning")
def test_default_targets_fit_a_boxes_and_labels_model(source):
    """The README's contract: a default sequence's targets are ``{"boxes", "labels"}`` only (a
    VocSource has iscrowd and difficult, given only when asked for with ``fields=``), so a model
    whose outputs are ``{"boxes", "labels"}`` trains on it with ``fit`` (partial last batch included)."""
    train = DetectionSequence(source, recipe(), BATCH, device=DEVICE, num_threads=2, images_on_device=False)
    assert train.fields == () and train.field_specs == {}
    _, targets = train[len(train) - 1]  # the last, partial batch
    assert list(targets) == ["boxes", "labels"] and len(targets["labels"]) == NUM_IMAGES % BATCH
    keras.utils.set_random_seed(0)
    model = boxes_and_labels_model(train.max_boxes, OUT_HW)
    history = model.fit(train, epochs=1, verbose=0, shuffle=False)
    assert len(history.history["loss"]) == 1 and np.isfinite(history.history["loss"]).all()
    asked = DetectionSequence(source, recipe(), BATCH, device=DEVICE, num_threads=2, images_on_device=False,
                              prefetch=False, fields="all")
    _, fields = asked[0]
    assert list(fields) == ["boxes", "labels", "iscrowd", "difficult", "area"]  # the fields, when asked for
    assert fields["iscrowd"].dtype == np.int32 and fields["iscrowd"].shape == fields["labels"].shape
    assert ((fields["difficult"] == -1) == (fields["labels"] == -1)).all()  # padded like the labels
    for one in (train, asked):
        one.close()


class RecordingSequence(DetectionSequence):
    """Records ``(epoch, index)`` of every ``seq[i]``."""

    def __init__(self, *args, **kwargs):
        self.calls: list[tuple[int, int]] = []
        super().__init__(*args, **kwargs)

    def __getitem__(self, index):
        self.calls.append((self.epoch, int(index)))
        return super().__getitem__(index)


# Keras' torch backend turns its logs to NumPy with np.array(tensor), which NumPy 2 flags for torch.
@pytest.mark.filterwarnings("ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning")
def test_model_fit_two_epochs(source):
    keras.utils.set_random_seed(0)
    # workers=1: Keras calls seq[i] from its own loop, one at a time (threads: `threaded` below)
    train = RecordingSequence(source, recipe(), BATCH, shuffle=True, seed=0, device=DEVICE, num_threads=2, workers=1)
    model = TinyDetector(train.max_boxes)
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    # fit shuffles the batch order (random access); the callback numbers the epochs as Keras does
    history = model.fit(train, epochs=2, verbose=0, callbacks=[train.epoch_callback()])
    losses = history.history["loss"]
    assert len(losses) == 2 and np.isfinite(losses).all()
    epochs = [e for e, _ in train.calls[-2 * len(train) :]]
    assert epochs == [0] * len(train) + [1] * len(train)
    for e in (0, 1):
        assert sorted(i for epoch, i in train.calls[-2 * len(train) :] if epoch == e) == list(range(len(train)))

    hits = train.prefetch_hits
    model.fit(train, epochs=1, verbose=0, shuffle=False)  # in order: every batch after the first is prefetched
    assert train.prefetch_hits - hits == len(train) - 1
    assert [i for _, i in train.calls[-len(train) :]] == list(range(len(train)))

    threaded = RecordingSequence(source, recipe(), BATCH, shuffle=True, seed=0, device=DEVICE, num_threads=2, workers=2)
    history = model.fit(threaded, epochs=1, verbose=0)  # Keras' ordered enqueuer: 2 threads, random order
    assert np.isfinite(history.history["loss"]).all()
    assert sorted(i for _, i in threaded.calls) == list(range(len(threaded)))


def test_errors_belong_to_the_batch_that_has_them():
    """With on_error="raise", a bad sample in batch 1 does not fail batch 0 (which prefetches
    batch 1), names itself when batch 1 is asked for, and the sequence goes on working afterwards."""
    samples, _ = scene_samples(6, seed=1)
    samples[3].image = b"not an image"
    broken = make_sequence(SampleListSource(samples), batch_size=2, max_boxes=5, shuffle=False, on_error="raise")
    first = broken[0]
    with pytest.raises(ImageError, match=r"sample 3 \(12 bytes\) \(image_id 4\): not an image"):
        broken[1]  # found while reading the image header, before DALI sees the batch
    assert_batches_equal(broken[0], first)  # a fresh pipeline
    assert len(broken[2][0]) == 2

    samples[3].image = "/nonexistent/image.png"
    missing = make_sequence(SampleListSource(samples), batch_size=2, max_boxes=5, shuffle=False, on_error="raise")
    assert len(missing[0][0]) == 2
    with pytest.raises(ImageError, match="nonexistent/image.png .image_id 4.: cannot read"):
        missing[1]
    assert len(missing[2][0]) == 2


def assert_same_batch_or_error(ahead, inline, i, bad_batch):
    """``ahead[i]`` and ``inline[i]`` give the same arrays, or both raise the bad sample's error."""
    if i == bad_batch:
        for seq in (ahead, inline):
            with pytest.raises(ImageError, match=r"image_id 6\): not an image"):
                seq[i]
    else:
        assert_batches_equal(ahead[i], inline[i])


def wait_for_plans(seq):
    wait(list(seq._planner.plans.values()), timeout=60)


def all_ended(processes, timeout: float) -> bool:
    """Whether every process has ended within ``timeout`` seconds. Watches their sentinels:
    ``is_alive()`` can say True for a process that the pool's thread is reaping at the time."""
    deadline = time.monotonic() + timeout
    left = [p.sentinel for p in processes]
    while left:
        left = [s for s in left if s not in wait_sentinels(left, timeout=max(0.0, deadline - time.monotonic()))]
        if left and time.monotonic() >= deadline:
            return False
    return True


class TestPlanningWorkers:
    def test_same_batches_and_errors_as_planning_inline_and_close_stops_the_workers(self):
        """plan_workers=2 against plan_workers=0 on a source with a broken image: epochs 0 and 1 in
        random order (epoch 1 planned during epoch 0), then a jump to epoch 5 read in order with
        prefetching and at most PLAN_AHEAD_BATCHES=3 plans held; then close() and garbage
        collection stop the workers. One test, so that the workers start only twice (spawning
        takes a while on small machines)."""
        samples, _ = scene_samples(14, seed=2)
        samples[5].image = b"not an image"
        source = SampleListSource(samples)
        common = {"batch_size": 2, "max_boxes": 5, "prefetch": False, "on_error": "raise"}
        inline = make_sequence(source, plan_workers=0, **common)
        ahead = make_sequence(source, plan_workers=2, **common)
        n = len(ahead)
        assert (inline.plan_workers, ahead.plan_workers, n) == (0, 2, 7)
        assert ahead._planner.pool._pool is None  # started by the first seq[i]

        def bad_batch(seq):
            return int(np.flatnonzero(seq.planner.order(seq.epoch) == 5)[0]) // 2

        rng = np.random.default_rng(0)
        for epoch in (0, 1):
            assert ahead.epoch == inline.epoch == epoch
            bad = bad_batch(ahead)
            order = [i for i in rng.permutation(n) if i != bad]
            order.insert(3, bad)
            before = ahead.planned_ahead
            assert_same_batch_or_error(ahead, inline, order[0], bad)
            if epoch == 0:  # planned here; the rest of epoch 0 and all of epoch 1 in the workers
                assert sorted(ahead._planner.plans) == sorted([(0, i) for i in range(n) if i != order[0]] + [(1, i) for i in range(n)])
            wait_for_plans(ahead)
            for i in order[1:]:
                assert_same_batch_or_error(ahead, inline, i, bad)
            assert ahead.planned_ahead - before == (n - 2 if epoch == 0 else n - 1)  # not the bad one, nor epoch 0's first
            ahead.on_epoch_end()
            inline.on_epoch_end()
        assert (ahead.planned_inline, inline.planned_inline) == (1, 2 * (n - 1))
        assert sorted(ahead._planner.plans) == [(2, i) for i in range(n)]

        ahead._planner.limit = 3
        ahead.prefetch = inline.prefetch = True  # each batch prefetched after the one before
        ahead.set_epoch(5)  # not the next epoch: epoch 2's plans are dropped
        inline.set_epoch(5)
        assert not ahead._planner.plans
        bad, before = bad_batch(ahead), ahead.planned_ahead
        for i in range(n):
            assert_same_batch_or_error(ahead, inline, i, bad)
            assert len(ahead._planner.plans) <= 3
            wait_for_plans(ahead)
        assert ahead.planned_ahead > before
        assert (ahead.prefetch_hits, ahead.prefetch_wasted) == (inline.prefetch_hits, inline.prefetch_wasted)
        assert ahead.prefetch_hits >= n - 4  # not the bad batch, nor the two after it
        ahead._planner.limit = dk.PLAN_AHEAD_BATCHES

        pool = ahead._planner.pool._pool
        assert not pool.submit(eval, "'keras' in __import__('sys').modules").result(timeout=60)  # left out there
        processes = list(pool._processes.values())
        assert len(processes) == 2 and all(p.is_alive() for p in processes)
        ahead.close()
        assert ahead._planner.pool._pool is None and all_ended(processes, timeout=0)

        ahead.set_epoch(0)
        inline.set_epoch(0)
        assert not inline.start_workers() and ahead._planner.pool._pool is None  # plan_workers=0: nothing to start
        assert ahead.start_workers(timeout=60)  # started again, before any seq[i], with a plan done
        assert any(f.done() for f in ahead._planner.plans.values())
        good = (bad_batch(ahead) + 1) % n
        wait_for_plans(ahead)
        before = ahead.planned_ahead
        assert_batches_equal(ahead[good], inline[good])
        assert ahead.planned_ahead == before + 1
        processes = list(ahead._planner.pool._pool._processes.values())
        assert processes
        del ahead
        gc.collect()
        assert all_ended(processes, timeout=30)  # stopped in the background

    def test_workers_plan_what_the_planner_plans(self):
        """The workers' job, run here: BatchPlanner.plan_many of one batch (what plan gives),
        image bytes included; for decoded arrays (sent to the workers as shapes only, grayscale
        included) less the image data."""
        samples, _ = scene_samples(9, seed=3)
        encoded = SampleListSource(samples)
        decoded = SampleListSource(
            [{"image": _decode(s.image, gray=k == 1), "boxes": s.boxes, "labels": s.labels, "image_id": s.image_id} for k, s in enumerate(samples)]
        )
        transforms = recipe()
        spec = EpochSpec(n=9, batch_size=4, shuffle=True, seed=7)
        for source in (encoded, decoded):
            planner = BatchPlanner(source, transforms, spec)
            try:
                plan_jobs.init_plan_worker(plan_jobs.planner_payload(planner))
                [planned] = plan_jobs.plan_group_job(1, [2])
            finally:
                plan_jobs._PLANNER = None
            expected = planner.plan(1, 2)
            if source.decoded:  # the workers have the shapes, not the pixels
                assert planned.data is None
            else:
                assert all(np.array_equal(a, b) for a, b in zip(planned.data, expected.data))
            np.testing.assert_array_equal(planned.params, expected.params)
            np.testing.assert_array_equal(planned.image_ids, expected.image_ids)
            for a, b in zip(planned.boxes + planned.labels, expected.boxes + expected.labels):
                np.testing.assert_array_equal(a, b)
        with pytest.raises(RuntimeError, match="init_plan_worker did not run"):
            plan_jobs.plan_group_job(1, [2])
        shapes = DecodedShapes(decoded)
        assert shapes.load(1)[0].shape == (160, 200, 3) and len(pickle.dumps(shapes)) < 20_000

    def test_the_next_epochs_batches_prefetched_at_the_end_of_an_epoch_are_the_workers_plans(self, source, epoch0):
        """In order, the last calls of epoch 0 prefetch epoch 1's first batches with the plans
        the workers made (not planned in the calling thread); the batches are the same."""
        seq = make_sequence(source, plan_workers=1)
        seq.set_epoch(0)
        assert seq.start_workers(timeout=60)
        wait_for_plans(seq)  # epochs 0 and 1
        for i, batch in enumerate(seq):
            assert_batches_equal(batch, epoch0[i])
        assert sorted(seq._queue.prefetched) == [(1, 0), (1, 1)]
        assert (seq.planned_ahead, seq.planned_inline) == (len(seq) + 2, 0)
        seq.on_epoch_end()
        other = make_sequence(source, prefetch=False, plan_workers=0)
        other.set_epoch(1)
        assert_batches_equal(seq[0], other[0])
        assert seq.prefetch_hits == len(seq)
        seq.close()

    def test_held_plans_carry_image_bytes_within_the_budget(self, source, epoch0):
        """Workers keep the image bytes they read for at most PLAN_AHEAD_DATA_BYTES of held plans
        (``workers`` plans until a plan's size is known); the others come without them and the
        calling thread reads the files. The batches are the same either way."""
        ahead = make_sequence(source, plan_workers=1, prefetch=False)
        planner = ahead._planner
        assert planner.data_bytes == dk.PLAN_AHEAD_DATA_BYTES
        ahead.set_epoch(0)
        assert ahead.start_workers(timeout=60)
        wait_for_plans(ahead)
        n = len(ahead)
        assert sorted(planner.plans) == [(e, i) for e in (0, 1) for i in range(n)]
        assert planner.with_data == {(0, 0)}  # one worker: one plan with bytes until their size is known
        for key, future in planner.plans.items():
            assert (future.result().data is not None) == (key in planner.with_data)
        assert_batches_equal(ahead[0], epoch0[0])
        assert planner.batch_bytes == sum(len(d) for d in ahead.planner.plan(0, 0).data)
        planner.data_bytes = planner.batch_bytes * 2  # room for two batches' bytes from now on
        for i in range(1, n):  # planned without the bytes: read here
            assert_batches_equal(ahead[i], epoch0[i])
        assert (ahead.planned_ahead, ahead.planned_inline) == (n, 0)
        ahead.on_epoch_end()
        ahead.set_epoch(5)  # not the next epoch: planned afresh, two plans with bytes
        assert planner._data_slots() == 2
        ahead[0]
        wait_for_plans(ahead)
        assert len(planner.with_data) == 2
        assert all((f.result().data is not None) == (k in planner.with_data) for k, f in planner.plans.items())
        ahead.close()

    def test_a_plan_a_worker_has_in_hand_is_waited_for_not_made_again(self, source):
        """take() waits for a plan whose job runs (a worker is ahead of planning it again here),
        and plans here only where its job has not started."""
        from concurrent.futures import Future

        from detaug.keras.plan_ahead import PlanAhead
        from detaug.plan_ahead import _Group, _members, _Packed

        planner = BatchPlanner(source, recipe(), EpochSpec(n=len(source), batch_size=2, seed=3))
        ahead = PlanAhead(planner, 1, num_batches=len(planner.spec))
        ahead.limit = 0  # no jobs of its own: the two below are the only plans
        ahead.set_epoch(0)
        running, waiting = Future(), Future()
        running.set_running_or_notify_cancel()
        [ahead.plans[0, 1]], [ahead.plans[0, 2]] = _members(running, 1), _members(waiting, 1)
        want = planner.plan(0, 1)
        finisher = threading.Timer(0.2, lambda: running.set_result(_Group([_Packed(want, None, [])])))
        finisher.start()
        try:
            assert ahead.take(1, 0) is want  # waited for the worker's plan
        finally:
            finisher.join()
        assert ahead.take(2, 0) is None and waiting.cancelled()  # not started: planned by the caller
        ahead.close()

    def test_a_next_epoch_batch_taken_before_its_turn_is_not_planned_again(self, source):
        """A batch of the next epoch taken (the prefetch across an epoch's end) before the
        submission cursor reached it is not submitted when the cursor gets there, nor after the
        move to that epoch: a plan is used once."""
        from detaug.keras.plan_ahead import PlanAhead

        planner = BatchPlanner(source, recipe(), EpochSpec(n=len(source), batch_size=2, seed=3))
        n = len(planner.spec)
        ahead = PlanAhead(planner, 1, num_batches=n)
        try:
            ahead.limit = 0  # nothing submitted yet: the cursor stays at epoch 0's first batch
            ahead.set_epoch(0)
            assert ahead.take(1, 1) is None and ahead.epoch == 0  # not submitted: the caller plans it
            ahead.limit = dk.PLAN_AHEAD_BATCHES
            ahead._top_up()
            assert sorted(ahead.plans) == [(0, i) for i in range(n)] + [(1, i) for i in range(n) if i != 1]
            ahead.set_epoch(1)
            ahead._top_up()
            assert sorted(ahead.plans) == [(1, i) for i in range(n) if i != 1] + [(2, i) for i in range(n)]
        finally:
            ahead.close()

    def test_arguments_and_fallback(self, source):
        assert make_sequence(source, prefetch=False).plan_workers == (0 if DEVICE == "cpu" else min(8, os.cpu_count()))
        for bad in (-1, True, 1.5):
            with pytest.raises(ValueError, match="plan_workers must be an integer >= 0 or None"):
                make_sequence(source, plan_workers=bad)
        unpicklable = recipe()
        unpicklable.hook = lambda: None
        fallback = make_sequence(source, transforms=unpicklable, plan_workers=2, prefetch=False)
        with pytest.warns(RuntimeWarning, match="cannot be pickled for the planning workers"):
            fallback[0]
        fallback[1]
        assert (fallback.planned_ahead, fallback.planned_inline) == (0, 2) and fallback._planner.pool._pool is None


def _decode(data: bytes, gray: bool) -> np.ndarray:
    import io

    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("L" if gray else "RGB"))


def test_importing_the_package_imports_no_keras_or_torch():
    """``import detaug.keras`` (and the old ``detaug.keras_data``) import neither Keras nor torch;
    ``DetectionSequence`` brings its Keras when it is first asked for."""
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import sys, detaug.keras as k, detaug.keras_data as kd, detaug.keras.data as d\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('keras', 'tf_keras', 'torch', 'tensorflow', 'jax')))\n"
        "print(kd.to_tf_dataset is d.to_tf_dataset and kd.GrainBatchSource is d.GrainBatchSource, k.KERAS_FLAVOR)\n"
        "from detaug.keras import DetectionSequence, BoxOverflowWarning, to_keras_boxes, KERAS_BOX_FORMATS\n"
        "print('keras' in sys.modules, DetectionSequence.__mro__[1] is k._Base, DetectionSequence.__module__)\n"
    )
    repo = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "KERAS_BACKEND": "torch", "PYTHONPATH": os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))}
    env.pop("DETAUG_KERAS", None)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.splitlines() == ["[]", "True keras", "True True detaug.keras.sequence"], run.stdout


def test_batches_kept_while_later_ones_run_keep_their_pixels(source):
    """Float32 host images of DALI's default executor are its own output buffers (no copy): a
    batch kept while later batches and epochs run keeps its pixels."""
    normalised = T.Compose([*recipe().transforms, T.Normalize()])
    sequence = make_sequence(source, transforms=normalised)
    kept = []
    for epoch in range(2):
        sequence.set_epoch(epoch)
        kept += [sequence[i] for i in range(len(sequence))]
    snapshots = [images.copy() for images, _ in kept]
    sequence.set_epoch(2)
    for i in range(len(sequence)):
        sequence[i]
    for (images, _), snapshot in zip(kept, snapshots):
        assert images.dtype == np.float32
        np.testing.assert_array_equal(images, snapshot)
    sequence.close()


def test_images_on_device_needs_a_gpu(source):
    with pytest.raises(ValueError, match="images_on_device=True needs device='gpu'"):
        DetectionSequence(source, recipe(), batch_size=2, device="cpu", images_on_device=True)
    assert not DetectionSequence(source, recipe(), batch_size=2, device="cpu", num_threads=1).images_on_device


def test_the_pipeline_gets_the_cpus_the_planning_workers_leave(source, monkeypatch):
    from detaug import decoding

    monkeypatch.setattr(decoding, "available_cpus", lambda: 12)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    seq = DetectionSequence(source, recipe(), batch_size=2, device="cpu", workers=3, plan_workers=3)
    assert seq.num_threads == 9  # 12 - 3, whatever Keras' workers: they share one pipeline
    assert seq[0][0].shape[0] == 2
    assert DetectionSequence(source, recipe(), batch_size=2, device="cpu").num_threads == 12  # no workers
    assert DetectionSequence(source, recipe(), batch_size=2, device="cpu", num_threads=5).num_threads == 5
    seq.close()


@pytest.mark.skipif(DEVICE != "gpu", reason="needs DETAUG_TEST_DEVICE=gpu and a GPU")
def test_images_on_device_equal_the_host_arrays(source):
    import torch

    on_host = make_sequence(source, shuffle=True)
    on_device = make_sequence(source, shuffle=True, images_on_device=None)
    assert on_device.images_on_device  # the default on a GPU with Keras' torch backend
    for i in (2, 0, 1):
        (a, a_targets), (b, b_targets) = on_host[i], on_device[i]
        assert isinstance(b, torch.Tensor) and b.is_cuda and b.dtype == torch.float32
        np.testing.assert_array_equal(a, b.cpu().numpy())
        assert set(b_targets) == set(a_targets)
        for name, want in a_targets.items():  # the targets go with the images, same dtypes
            got = b_targets[name]
            assert isinstance(got, torch.Tensor) and got.is_cuda and str(got.dtype) == f"torch.{want.dtype}"
            np.testing.assert_array_equal(want, got.cpu().numpy())


def test_copy_streams_are_as_many_as_concurrent_calls_across_epochs_of_new_threads():
    """Keras starts new threads every epoch; the GPU copies' streams are reused across them (a
    stream per thread made new streams, hence new cached memory, every epoch)."""
    import threading

    from detaug.keras.pipeline_queue import CopyStreams

    streams = CopyStreams(object)
    for _epoch in range(5):
        barrier = threading.Barrier(4)
        held = []

        def call():
            with streams.use() as stream:
                held.append(stream)
                barrier.wait(timeout=10)  # all four hold a stream at once

        threads = [threading.Thread(target=call) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len({id(s) for s in held}) == 4  # no two calls at once share one
    assert streams.made == 4


@pytest.mark.skipif(DEVICE != "gpu", reason="PyTorch's cache of device memory: DETAUG_TEST_DEVICE=gpu and a GPU")
def test_a_sequence_after_another_reuses_the_device_memory_the_last_one_left(source):
    """Every sequence copies on the process's copy streams for its GPU: PyTorch reuses memory freed
    on a stream only on that stream, so with streams of its own each new sequence's batches took
    memory anew while the last one's stayed cached."""
    import torch

    reserved = []
    for _ in range(4):
        seq = make_sequence(source, transforms=T.Compose([T.Resize((512, 512))]), images_on_device=True)
        for i in range(len(seq)):
            seq[i]
        seq.close()
        del seq
        gc.collect()
        torch.cuda.synchronize()
        reserved.append(torch.cuda.memory_reserved())
    assert reserved[-1] - reserved[0] <= 4 * 2**20, [r >> 20 for r in reserved]  # MiB; a batch is 12 MiB


def test_the_former_module_name_is_the_same_module(monkeypatch):
    """``detaug.keras.prefetch`` (docs/keras.md's name before issue 40) is ``detaug.keras.plan_ahead``
    itself: a limit set through it is the one a sequence's planner reads."""
    import detaug.keras.plan_ahead as plan_ahead
    import detaug.keras.prefetch as former

    assert former is plan_ahead
    monkeypatch.setattr(former, "PLAN_AHEAD_DATA_BYTES", 12345)
    assert plan_ahead.PLAN_AHEAD_DATA_BYTES == 12345


def test_batches_leave_no_garbage_for_the_cycle_collector():
    """The Sequence's batches are freed as they go (as the PyTorch loader's): Keras' fit gets
    no garbage collections from it."""
    samples = scene_samples(16, size=(96, 80), max_objects=3, min_size=12)[0]
    seq = make_sequence(SampleListSource(samples), batch_size=2, shuffle=False)
    seq.set_epoch(0)
    for i in range(2):  # past the pipeline's first (public) run
        seq[i]
    position = iter(range(2, 6))
    garbage = cyclic_garbage(lambda: seq[next(position)], 4)
    seq.close()
    assert not [o for o in garbage if isinstance(o, type)], "a class made per batch"
    assert len(garbage) < 4, sorted({type(o).__name__ for o in garbage})
