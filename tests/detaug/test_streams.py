"""``detaug.torch.training_stream``: a loop's steps on a CUDA stream of their own, ordered with the
code around the block; a no-op without CUDA."""

from __future__ import annotations

import pytest
import torch

import detaug.torch
from detaug.streams import TRAINING_STREAM_PRIORITY, training_stream

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA stream needs a GPU")


def test_it_is_the_torch_faces():
    assert detaug.torch.training_stream is training_stream and "training_stream" in detaug.torch.__all__


def test_on_the_cpu_nothing_changes():
    """A CPU device: the block runs as it would, and is given no stream; so does a machine
    without CUDA where no device is named."""
    with training_stream("cpu") as stream:
        assert stream is None
        assert torch.ones(2).add(1).tolist() == [2.0, 2.0]
    if not torch.cuda.is_available():
        with training_stream() as stream:
            assert stream is None


def test_an_error_in_the_block_comes_through():
    with pytest.raises(KeyError, match="inside"), training_stream("cpu"):
        raise KeyError("inside")


@CUDA
def test_the_block_runs_on_a_high_priority_stream_ordered_with_the_code_around_it():
    """A new stream of priority -1 is current inside; it waits for what was queued before (a
    long kernel then a write: a race would read the old values), and the stream current before
    waits for the block's work after it."""
    before = torch.cuda.current_stream()
    x = torch.zeros(1 << 24, device="cuda")
    torch.cuda._sleep(50_000_000)  # keeps the first stream busy while the block is queued
    x += 1
    with training_stream() as stream:
        assert torch.cuda.current_stream() == stream != before
        assert stream.priority == TRAINING_STREAM_PRIORITY < before.priority
        torch.cuda._sleep(50_000_000)
        y = x * 2
    assert torch.cuda.current_stream() == before
    z = y + 1  # on the first stream again, after the block's work
    assert torch.equal(z, torch.full_like(z, 3.0))


@CUDA
def test_a_device_index_and_a_priority_are_taken():
    with training_stream(torch.cuda.current_device(), priority=0) as stream:
        assert stream.priority == 0 and stream.device == torch.device("cuda", torch.cuda.current_device())


@CUDA
def test_every_block_on_a_device_gets_the_same_stream_of_its_priority():
    """One stream per device and priority in the process: PyTorch reuses memory freed on a stream
    only on that stream, so a new stream each epoch would keep the model's cached memory apart."""
    with training_stream() as first:
        pass
    with training_stream() as second:
        pass
    with training_stream(priority=0) as other:
        pass
    assert first is second and other is not first and other.priority == 0


@CUDA
def test_a_shared_stream_is_one_per_role_device_and_priority():
    """The loaders' feeds and the training loop never share a stream (a feed waits for its stream
    before it hands a batch over: it would wait for the training steps)."""
    from detaug.streams import shared_stream

    device = torch.device("cuda", torch.cuda.current_device())
    feed = shared_stream("feed", device, -1)
    assert shared_stream("feed", device, -1) is feed and shared_stream("feed", torch.device("cuda"), -1) is feed
    assert shared_stream("training", device, -1) is not feed
    with training_stream() as training:
        assert training is shared_stream("training", device, -1)


# -- a loader's iteration on the training stream (DetectionLoader(training_stream=True)) ------------


def test_a_loop_stream_on_the_cpu_touches_no_stream():
    """A CPU loader's iteration: entering and leaving change nothing (and need no CUDA)."""
    from detaug.streams import LoopStream

    switch = LoopStream(torch.device("cpu"))
    switch.enter()
    assert torch.ones(2).add(1).tolist() == [2.0, 2.0]
    switch.exit()
    switch.exit()  # a second exit (close() after the epoch ended) is nothing


def _gpu_loader(**kwargs):
    import detaug.transforms as T
    from detaug.sources import SampleListSource
    from detaug.torch import DetectionLoader
    from tests.detaug.consistency import scene_samples

    samples = scene_samples(12, size=(96, 80), max_objects=3, min_size=12)[0]
    recipe = T.Compose([T.RandomHorizontalFlip(), T.Resize((48, 64))])
    return DetectionLoader(SampleListSource(samples), recipe, 4, device="gpu", num_workers=0, **kwargs)


@CUDA
@pytest.mark.parametrize("ready_batches", [2, 0])
def test_a_loop_on_the_default_stream_runs_on_the_training_stream_ordered_with_the_code_around_it(ready_batches):
    """Taken on the default stream, each batch arrives and the loop body runs on the shared
    training stream; after the epoch the default stream is current again and waits for the loop's
    work (a long kernel then a write on the last batch: a race would read the old values)."""
    from detaug.streams import shared_stream

    device = torch.device("cuda", torch.cuda.current_device())
    default = torch.cuda.default_stream(device)
    ours = shared_stream("training", device, TRAINING_STREAM_PRIORITY)
    loader = _gpu_loader(ready_batches=ready_batches)
    marker = torch.zeros(1 << 20, device=device)
    for epoch in range(2):
        assert torch.cuda.current_stream(device) == default
        seen = []
        for step, (images, targets) in enumerate(loader):
            seen.append(torch.cuda.current_stream(device))
            total = images.float().sum() + sum(t["boxes"].sum() for t in targets)  # used on the loop's stream
            if step == len(loader) - 1:
                torch.cuda._sleep(50_000_000)
                marker.fill_(epoch + 1)
        assert seen == [ours] * len(loader) and torch.isfinite(total).item()
        assert torch.cuda.current_stream(device) == default
        assert marker.sum().item() == (epoch + 1) * marker.numel()  # read on the default stream
    loader.close()


@CUDA
def test_a_stream_the_caller_chose_is_kept_and_the_switch_can_be_turned_off():
    device = torch.device("cuda", torch.cuda.current_device())
    default = torch.cuda.default_stream(device)
    mine = torch.cuda.Stream(device)
    loader = _gpu_loader()
    with torch.cuda.stream(mine):
        assert {torch.cuda.current_stream(device) for _ in loader} == {mine}
    loader.close()
    off = _gpu_loader(training_stream=False)
    assert {torch.cuda.current_stream(device) for _ in off} == {default}
    off.close()


@CUDA
def test_after_a_break_the_default_stream_comes_back_with_the_next_iteration_or_close():
    """A loop left with ``break`` stays on the training stream until the iteration ends: the next
    ``iter(loader)`` (which then enters again at its first batch) or ``close()``."""
    from detaug.streams import shared_stream

    device = torch.device("cuda", torch.cuda.current_device())
    default = torch.cuda.default_stream(device)
    ours = shared_stream("training", device, TRAINING_STREAM_PRIORITY)
    loader = _gpu_loader()
    for _ in loader:
        break
    assert torch.cuda.current_stream(device) == ours
    it = iter(loader)
    assert torch.cuda.current_stream(device) == default
    next(it)
    assert torch.cuda.current_stream(device) == ours
    loader.close()
    assert torch.cuda.current_stream(device) == default
