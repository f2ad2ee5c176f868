"""Batches made in a process of its own (``DetectionLoader(feed_process=True)``,
detaug.process_feed): the same batches, targets, epochs, resumes, findings and errors as the
loader in the caller's process; real DALI CPU pipelines in a real child process (on a GPU with
``DETAUG_TEST_DEVICE=gpu``, through CUDA IPC)."""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time
import warnings

import pytest
import torch

import detaug.transforms as T
from detaug import DataWarning, ImageError
from detaug.process_feed import _segments, _view
from detaug.sources import Sample, SampleListSource
from detaug.torch import DetectionLoader
from tests.detaug.consistency import scene_samples
from tests.detaug.test_bad_images import RECIPE as BAD_RECIPE
from tests.detaug.test_bad_images import good_jpeg, header_fine_body_broken
from tests.detaug.test_masks import scene
from tests.detaug.test_pipeline_runs import RECIPES, SAME_DECODER, _epochs, _equal, over_max_boxes
from tests.detaug.test_tv_tensors import _torchvision_works

DEVICE = os.environ.get("DETAUG_TEST_DEVICE", "cpu")  # DETAUG_TEST_DEVICE=gpu: the same tests on a GPU


@pytest.fixture(scope="module")
def samples():
    return scene_samples(23, size=(96, 80), max_objects=4, min_size=12)[0]


def _loader(source, recipe, *, feed_process, **kwargs):
    return DetectionLoader(source, recipe, 4, device=DEVICE, shuffle=True, seed=3, hw_decoder_load=SAME_DECODER,
                           feed_process=feed_process, **kwargs)


@pytest.mark.parametrize("recipe", ["crop-flip-resize", "ragged"])
@pytest.mark.parametrize("targets", ["dict", "padded", "concat"])
def test_a_child_process_yields_what_the_loader_in_this_process_does(samples, recipe, targets):
    """Two shuffled epochs of 6 batches (the last of 3): ids, images and every target tensor
    equal, in every form, for stacked images and for lists of images."""
    source = SampleListSource(samples)
    here = _loader(source, RECIPES[recipe], feed_process=False, targets=targets)
    expected = _epochs(here)
    here.close()
    child = _loader(source, RECIPES[recipe], feed_process=True, targets=targets)
    try:
        assert child.pipeline is None and child._process is not None
        made = _epochs(child)
        assert [ids for ids, *_ in made] == [ids for ids, *_ in expected]
        assert len(made) == 12 and child.epoch == 2
        for (_, images, tg), (_, images1, tg1) in zip(made, expected):
            assert _equal(images, images1) and _equal(tg, tg1)
        assert child.feed_stats.taken >= 1
    finally:
        child.close()


def test_without_a_thread_the_childs_batches_are_taken_inside_next(samples):
    """``ready_batches=0``: no background thread takes the child's batches (each is taken and
    given its targets inside ``next()``), and they are the loader in this process's."""
    source = SampleListSource(samples)
    here = _loader(source, RECIPES["crop-flip-resize"], feed_process=False)
    expected = _epochs(here)
    here.close()
    child = _loader(source, RECIPES["crop-flip-resize"], feed_process=True, ready_batches=0)
    try:
        made = _epochs(child)
        assert not child._live_feeds and child._kept_feed is None
        assert [ids for ids, *_ in made] == [ids for ids, *_ in expected]
        for (_, images, tg), (_, images1, tg1) in zip(made, expected):
            assert _equal(images, images1) and _equal(tg, tg1)
    finally:
        child.close()


def test_the_next_epochs_first_batches_are_made_while_an_epoch_ends(samples):
    """The thread that takes the child's batches runs on into the next epoch: once an epoch
    is done, the next one's first batch is ready before it is asked for (the take is not
    counted as waited for), and it is the next epoch's."""
    source = SampleListSource(samples)
    whole = _epochs(_loader(source, RECIPES["ragged"], feed_process=False), epochs=2)
    loader = _loader(source, RECIPES["ragged"], feed_process=True)
    try:
        first = [[t["image_id"] for t in targets] for _, targets in loader]
        kept = loader._kept_feed
        deadline = time.monotonic() + 30
        while kept._queue.empty() and time.monotonic() < deadline:
            time.sleep(0.05)
        waited = loader.feed_stats.not_ready
        images, targets = next(iter(loader))
        assert loader.feed_stats.not_ready == waited
        assert first == [ids for ids, *_ in whole[:6]] and [t["image_id"] for t in targets] == whole[6][0]
    finally:
        loader.close()
    assert loader._kept_feed is None and not loader._live_feeds


def test_each_ranks_child_yields_that_ranks_shard(samples):
    """Two ranks' loaders (``shard_id`` 0 and 1 of 2, as under torchrun): each child yields the
    ids the loader in the rank's process does, two epochs, equal steps, the union the dataset."""
    source = SampleListSource(samples)
    shards = []
    for rank in (0, 1):
        here = _loader(source, RECIPES["crop-flip-resize"], feed_process=False, shard_id=rank, num_shards=2)
        expected = [ids for ids, *_ in _epochs(here)]
        here.close()
        child = _loader(source, RECIPES["crop-flip-resize"], feed_process=True, shard_id=rank, num_shards=2)
        try:
            assert [ids for ids, *_ in _epochs(child)] == expected
        finally:
            child.close()
        shards.append(expected)
    assert len(shards[0]) == len(shards[1]) == 6  # 12 samples a rank: 3 batches an epoch, on each rank
    for epoch in (slice(0, 3), slice(3, 6)):
        seen = {i for shard in shards for ids in shard[epoch] for i in ids}
        assert seen == {s.image_id for s in samples}


@pytest.mark.parametrize("targets", ["dict", "padded"])
def test_masks_cross_with_their_boxes_and_are_cut_to_each_image(targets):
    """Per-box masks (the largest part of a target, padded to the batch's largest image) through
    the child: the same masks as the loader in this process gives, each image's cut to its size."""
    source = SampleListSource([scene(0), scene(1, hw=(120, 150)), scene(2), scene(3, hw=(100, 90))])
    recipe = T.Compose([T.RandomHorizontalFlip()])  # no output size: images of several sizes
    made = []
    for feed_process in (False, True):
        loader = DetectionLoader(source, recipe, 2, device=DEVICE, shuffle=True, seed=5, fields=["masks"],
                                 targets=targets, feed_process=feed_process)
        try:
            made.append(_epochs(loader))
        finally:
            loader.close()
    assert len(made[1]) == 4 and [ids for ids, *_ in made[1]] == [ids for ids, *_ in made[0]]
    for (_, images, tg), (_, images1, tg1) in zip(*made):
        assert _equal(images, images1) and _equal(tg, tg1)
        if targets == "dict":
            assert all(t["masks"].shape[-2:] == image.shape[-2:] for t, image in zip(tg, images))


def test_tv_tensors_through_the_child_are_the_loaders(samples):
    """``targets="tv_tensors"``: the parent wraps what the child made as the loader in this
    process does (images, boxes with their canvas size); torchvision imports on the GPU machine."""
    reason = _torchvision_works()
    if reason is not None:
        pytest.skip(reason)
    from torchvision import tv_tensors

    source = SampleListSource(samples)
    made = []
    for feed_process in (False, True):
        loader = _loader(source, RECIPES["crop-flip-resize"], feed_process=feed_process, targets="tv_tensors")
        try:
            made.append([batch for _ in range(2) for batch in loader])
        finally:
            loader.close()
    assert len(made[1]) == len(made[0]) == 12
    for (images, targets), (images1, targets1) in zip(*made):
        assert type(images) is type(images1) and _equal(images, images1)
        for t, t1 in zip(targets, targets1):
            assert isinstance(t["boxes"], tv_tensors.BoundingBoxes)
            assert t["boxes"].canvas_size == t1["boxes"].canvas_size
            assert t.keys() == t1.keys() and all(_equal(t[k], t1[k]) for k in t if isinstance(t[k], torch.Tensor))


def test_batches_kept_by_the_caller_are_not_overwritten_when_the_ring_turns(samples):
    """Three epochs' batches kept as handed out (not cloned), more than the ring has slots, with
    images of changing sizes (slots grow): each still equal to the loader in this process's."""
    source = SampleListSource(samples)
    here = _loader(source, RECIPES["ragged"], feed_process=False, targets="padded")
    expected = _epochs(here, epochs=3)
    here.close()
    child = _loader(source, RECIPES["ragged"], feed_process=True, targets="padded")
    try:
        kept = [batch for _ in range(3) for batch in child]
        assert len(kept) == 18 > len(child._process._slots)
        assert max(child._process._known) >= 1  # every batch came through a slot
        for (images, targets), (ids, images1, targets1) in zip(kept, expected):
            assert targets["image_id"].tolist() == ids
            assert _equal(images, images1) and _equal(targets, targets1)
    finally:
        child.close()


def test_a_batch_crosses_as_the_byte_spans_it_views():
    """detaug.process_feed's packing: views at odd offsets into a shared allocation, another
    dtype, a strided view and an empty tensor come back equal, each aligned as before."""
    whole = torch.arange(1000, dtype=torch.float32)
    labels = torch.arange(7, dtype=torch.int64)
    tensors = [whole[3:40].view(37), whole[100:160].view(6, 10)[:, ::2], labels, torch.empty(0, 4), whole[500:501]]
    segments, entries, size = _segments(tensors)
    assert len(segments) == 2 and size % 256 == 0  # two allocations viewed: two spans
    out = torch.zeros(size, dtype=torch.uint8)
    for source, at in segments:
        out[at : at + source.numel()] = source
    for tensor, entry in zip(tensors, entries):
        back = _view(out, entry)
        assert back.dtype == tensor.dtype and back.shape == tensor.shape and torch.equal(back, tensor)
        assert back.data_ptr() % tensor.element_size() == 0


def test_a_break_then_resume_from_a_state_gives_the_unbroken_batches(samples):
    """Stopped after 2 batches, saved, resumed by a new loader: the batches an unbroken run
    yields; a loader iterated again after close() starts a new child."""
    source = SampleListSource(samples)
    whole = _epochs(_loader(source, RECIPES["crop-flip-resize"], feed_process=False), epochs=3)
    loader = _loader(source, RECIPES["crop-flip-resize"], feed_process=True)
    it = iter(loader)
    first = [next(it), next(it)]
    state = loader.state_dict()
    it.close()
    loader.close()
    assert [t["image_id"] for t in first[1][1]] == whole[1][0]
    resumed = _loader(source, RECIPES["crop-flip-resize"], feed_process=True)
    resumed.load_state_dict(state)
    rest = _epochs(resumed, epochs=1)
    assert [ids for ids, *_ in rest] == [ids for ids, *_ in whole[2:6]]
    again = _epochs(resumed, epochs=1)  # the next epoch, after the resumed one
    assert [ids for ids, *_ in again] == [ids for ids, *_ in whole[6:12]]
    resumed.close()
    assert resumed._process is None
    assert [ids for ids, *_ in _epochs(resumed, epochs=1)] == [ids for ids, *_ in whole[12:]]  # epoch 2
    assert resumed._process is not None and resumed.pipeline is None  # made by a new child, not here
    resumed.close()


def test_a_bad_image_is_skipped_and_warned_of_in_the_callers_process(tmp_path):
    """The child's findings are the parent's: one DataWarning naming the file, ``skipped``
    filled; with ``on_error="raise"`` the ImageError reaches the caller."""
    good = [good_jpeg(tmp_path / f"good{i}.jpg") for i in range(5)]
    bad = header_fine_body_broken(tmp_path / "broken.jpg")
    samples = [Sample(str(p), [[4, 4, 20, 20]], [1], image_id=i) for i, p in enumerate([*good[:2], bad, *good[2:]])]
    source = SampleListSource(samples)
    loader = DetectionLoader(source, BAD_RECIPE, 3, device=DEVICE, feed_process=True)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ids = [t["image_id"] for _, targets in loader for t in targets]
        said = [w for w in caught if issubclass(w.category, DataWarning)]
        assert len(said) == 1 and "broken.jpg" in str(said[0].message) and "image_id 2" in str(said[0].message)
        assert 2 not in ids and len(ids) == 6
        assert [s["image_id"] for s in loader.skipped] == [2]
    finally:
        loader.close()
    strict = DetectionLoader(source, BAD_RECIPE, 3, device=DEVICE, feed_process=True, on_error="raise")
    try:
        with pytest.raises(ImageError, match="broken.jpg"):
            for _ in strict:
                pass
    finally:
        strict.close()


def test_an_error_in_a_batch_comes_after_the_batches_before_it():
    """As in the caller's process (tests/detaug/test_pipeline_runs.py): the batch before the one
    that cannot be handed over comes out, then the error naming the image, though the child made
    them in one job."""
    loader = DetectionLoader(SampleListSource(over_max_boxes()), BAD_RECIPE, 4, device=DEVICE, targets="padded",
                             max_boxes=2, feed_process=True)
    got = []
    try:
        with pytest.raises(ValueError, match="image 6 has 3 boxes, more than max_boxes=2"):
            for _, targets in loader:
                got.append(targets["image_id"].tolist())
        assert got == [[1, 2, 3, 4]]
    finally:
        loader.close()


def test_the_childs_errors_when_built_are_raised_here_and_the_flag_is_checked(samples):
    source = SampleListSource(samples)
    unpicklable = SampleListSource(samples)
    unpicklable.lock = threading.Lock()
    with pytest.raises(TypeError, match=r"feed_process=True: the source, .* cannot be \(cannot pickle '_thread.lock'"):
        DetectionLoader(unpicklable, RECIPES["ragged"], 4, device=DEVICE, feed_process=True)
    with pytest.raises(TypeError, match="feed_process must be True, False or None, got 1"):
        DetectionLoader(source, RECIPES["ragged"], 4, device=DEVICE, feed_process=1)
    with pytest.raises(ValueError, match="num_classes"):  # checked in this process, before any child
        DetectionLoader(source, RECIPES["ragged"], 4, device=DEVICE, feed_process=True, num_classes=1)


@pytest.mark.skipif(DEVICE != "gpu" or torch.cuda.device_count() < 2, reason="needs a second GPU")
def test_on_the_second_gpu_the_child_yields_what_the_loader_in_this_process_does(samples):
    """``device_id=1`` (a rank's GPU under torchrun): the ring's buffers and events live on
    ``cuda:1`` in both processes; the batches there equal the in-process loader's."""
    source = SampleListSource(samples)
    here = DetectionLoader(source, RECIPES["crop-flip-resize"], 4, device="gpu", device_id=1, shuffle=True, seed=3,
                           hw_decoder_load=SAME_DECODER)
    expected = _epochs(here)
    here.close()
    child = DetectionLoader(source, RECIPES["crop-flip-resize"], 4, device="gpu", device_id=1, shuffle=True, seed=3,
                            hw_decoder_load=SAME_DECODER, feed_process=True)
    try:
        made = _epochs(child)
        assert [ids for ids, *_ in made] == [ids for ids, *_ in expected] and len(made) == 12
        for (_, images, tg), (_, images1, tg1) in zip(made, expected):
            assert images.device == torch.device("cuda", 1) and all(t["boxes"].device == images.device for t in tg)
            assert _equal(images, images1) and _equal(tg, tg1)
    finally:
        child.close()


def test_the_default_is_the_loaders_own_process_on_a_gpu_under_mps_only(tmp_path, monkeypatch):
    """``feed_process=None`` decides by the device and by an MPS daemon's control pipe (found as
    the CUDA driver finds it); a CPU loader stays in the caller's process under MPS too."""
    from detaug.torch import process_by_default

    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    assert not process_by_default(torch.device("cuda", 1))  # no daemon
    os.mkfifo(tmp_path / "control")
    assert not process_by_default(torch.device("cuda", 1))  # a pipe left behind: nobody reads it
    daemon = os.open(tmp_path / "control", os.O_RDONLY | os.O_NONBLOCK)  # a daemon reading its pipe
    try:
        assert process_by_default(torch.device("cuda", 1)) and not process_by_default(torch.device("cpu"))
        loader = DetectionLoader(SampleListSource(scene_samples(4, size=(32, 32))[0]), RECIPES["ragged"], 2,
                                 device="cpu")
        try:
            assert loader.feed_process is False and loader._process is None and loader.pipeline is not None
        finally:
            loader.close()
    finally:
        os.close(daemon)


def test_where_the_default_chooses_the_child_and_it_cannot_start_the_loader_runs_here(samples, monkeypatch):
    """The default's child (forced here: no GPU under MPS in CI) for a source that does not
    pickle: a RuntimeWarning says why and the loader yields, in this process, what a loader
    with ``feed_process=False`` does; a picklable source gets its child."""
    import detaug.torch as loader_module

    monkeypatch.setattr(loader_module, "process_by_default", lambda device: True)
    source = SampleListSource(samples)
    expected = _epochs(_loader(source, RECIPES["ragged"], feed_process=False), epochs=1)
    unpicklable = SampleListSource(samples)
    unpicklable.lock = threading.Lock()
    with pytest.warns(RuntimeWarning, match=r"the loader runs in this process: its own process, the default under "
                                            r"NVIDIA MPS, did not start \(feed_process=True: .*'_thread.lock'"):
        here = _loader(unpicklable, RECIPES["ragged"], feed_process=None)
    try:
        assert here.feed_process is False and here._process is None
        made = _epochs(here, epochs=1)
        assert [ids for ids, *_ in made] == [ids for ids, *_ in expected]
        for (_, images, tg), (_, images1, tg1) in zip(made, expected):
            assert _equal(images, images1) and _equal(tg, tg1)
    finally:
        here.close()
    child = _loader(source, RECIPES["ragged"], feed_process=None)
    try:
        assert child.feed_process is True and child._process is not None and child.pipeline is None
        assert [ids for ids, *_ in _epochs(child, epochs=1)] == [ids for ids, *_ in expected]
    finally:
        child.close()


def test_a_killed_child_is_replaced_and_the_epoch_goes_on_with_the_same_batches(samples):
    """SIGKILL to the child before the first batch is asked for: a RuntimeWarning names its pid
    and the signal, and a new child yields the epoch as an unbroken run does."""
    source = SampleListSource(samples)
    whole = _epochs(_loader(source, RECIPES["ragged"], feed_process=False), epochs=1)
    loader = _loader(source, RECIPES["ragged"], feed_process=True)
    try:
        pid = loader._process.pid
        os.kill(pid, signal.SIGKILL)
        with pytest.warns(RuntimeWarning, match=rf"the loader's process \(pid {pid}\) was killed by signal 9; a new one "
                                                r"\(pid \d+\) goes on from batch 0 of epoch 0"):
            made = [[t["image_id"] for t in targets] for _, targets in loader]
        assert loader._process.pid != pid
        assert made == [ids for ids, *_ in whole] and loader.epoch == 1
    finally:
        loader.close()


class _ExitsInAChild(SampleListSource):
    """A source that ends any process but the one that made it when it is unpickled there."""

    def __getstate__(self):
        return {**self.__dict__, "_maker": os.getpid()}

    def __setstate__(self, state):
        if state["_maker"] != os.getpid():
            os._exit(3)
        self.__dict__.update(state)


def test_a_child_that_dies_while_building_its_loader_is_named(samples):
    with pytest.raises(RuntimeError, match=r"the loader's process \(pid \d+\) exited with status 3 while it built its "
                                           r"loader"):
        DetectionLoader(_ExitsInAChild(samples), RECIPES["ragged"], 4, device=DEVICE, feed_process=True)


class _CrashesInAChild(SampleListSource):
    """A source whose length, asked for in any process but the one that made it, crashes it
    (a read of address 0: SIGSEGV)."""

    def __init__(self, samples):
        super().__init__(samples)
        self._maker = os.getpid()

    def __len__(self):
        if self._maker != os.getpid():
            ctypes.string_at(0)
        return super().__len__()


def test_a_child_that_crashes_says_where_on_standard_error(samples, capfd):
    """SIGSEGV in the child while it builds its loader: the RuntimeError names the signal and
    points at standard error, where faulthandler printed the child's Python stack."""
    with pytest.raises(RuntimeError, match=r"killed by signal 11 \(its Python stacks are on standard error\) while"):
        DetectionLoader(_CrashesInAChild(samples), RECIPES["ragged"], 4, device=DEVICE, feed_process=True)
    err = capfd.readouterr().err
    assert "Fatal Python error: Segmentation fault" in err and "__len__" in err
