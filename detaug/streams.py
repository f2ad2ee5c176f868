"""The CUDA stream a training loop runs its steps on, beside a detaug loader.

A loop on CUDA's default stream (PyTorch's, unless it picks another) shares the GPU with DALI's
work less well than a loop on a stream of its own: the default stream is the legacy one, which
CUDA orders with the work of the process's blocking streams, and DALI's streams run at its
priority, where a stream of the loop's own can run at a higher one. On an H200 at batch 64 a
fast model's steps on a high-priority stream of their own ran 5-19% faster beside the loader
than on the default stream (no change at batch 256; how much each reason gives is not pinned
down: docs/loader.md, "Feeding a fast model"; docs/benchmarks.md)::

    with detaug.torch.training_stream():
        for images, targets in loader:
            train_step(images, targets)

``DetectionLoader`` does this by itself (``training_stream=True``, its default): an iteration
taken on the default stream runs the loop on that stream until the iteration ends
(:class:`LoopStream`).

Streams here are made once per role (the training loop's, the loaders' feeds'), device and
priority in a process (:func:`shared_stream`) and handed out again: PyTorch's caching allocator
reuses the memory freed on a stream only for later allocations on that same stream, so a new
stream for every block (or every loader's feed) would keep the memory cached on the old ones and
the process's share of the GPU would grow with each.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

__all__ = ["TRAINING_STREAM_PRIORITY", "LoopStream", "shared_stream", "training_stream"]

#: CUDA priority of :func:`training_stream` (``torch.cuda.Stream(priority=...)``: lower runs
#: first; 0 is the default streams' and DALI's).
TRAINING_STREAM_PRIORITY = -1

_SHARED: dict[tuple[str, int, int], torch.cuda.Stream] = {}
_SHARED_LOCK = threading.Lock()


def shared_stream(role: str, device: torch.device, priority: int) -> torch.cuda.Stream:
    """The process's one CUDA stream for ``role`` (``"training"``, ``"feed"``, ``"ring"``: the
    copies into :mod:`detaug.process_feed`'s slots; work that must not wait for each other gets
    streams of different roles) of ``priority`` on ``device`` (a CUDA device), made at the first
    call and the same object after. (``torch.cuda.Stream()`` takes the next of PyTorch's 32
    pooled streams at each call, and memory freed on one stream is reused only on that stream: a
    new one for each use would leave the memory of the old ones cached, unused.)"""
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (role, int(index), int(priority))
    with _SHARED_LOCK:
        stream = _SHARED.get(key)
        if stream is None:
            stream = _SHARED[key] = torch.cuda.Stream(torch.device("cuda", key[1]), priority=key[2])
    return stream


@contextlib.contextmanager
def training_stream(device: torch.device | str | int | None = None,
                    priority: int = TRAINING_STREAM_PRIORITY) -> Iterator[torch.cuda.Stream | None]:
    """Run the block on a CUDA stream of ``priority`` (default high, -1) made current for
    ``device`` (default: the current CUDA device); yields that stream, the same one for every
    block of that device and priority in the process (:func:`shared_stream`).

    The stream first waits for the work queued on the stream that was current (the model's
    weights, a batch moved before the block), and that stream waits for the block's work when
    it ends, so code before and after the block needs no synchronisation. The PyTorch loader
    (:class:`detaug.torch.DetectionLoader`) hands its batches over to whatever stream is current
    when they are taken; the Keras ``DetectionSequence`` hands its device batches to CUDA's
    default stream, so keep Keras' ``fit`` out of the block. A tensor made in the block and used
    on another stream later follows PyTorch's rules for any ``torch.cuda.stream`` block
    (``Tensor.record_stream``). Where CUDA is not available, or ``device`` is not a CUDA device,
    nothing changes and it yields ``None``.
    """
    if device is None:
        if not torch.cuda.is_available():
            yield None
            return
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if device.type != "cuda":
        yield None
        return
    before = torch.cuda.current_stream(device)
    stream = shared_stream("training", device, priority)
    stream.wait_stream(before)
    try:
        with torch.cuda.stream(stream):
            yield stream
    finally:
        before.wait_stream(stream)


class LoopStream:
    """The training stream made current for a loader's iteration, as if the loop were inside
    :func:`training_stream` (``DetectionLoader(training_stream=True)``).

    :meth:`enter` (at the iteration's first batch, in the thread that iterates): where that
    thread's current stream on ``device`` is CUDA's default stream and ``device`` is the current
    CUDA device, the training stream (priority :data:`TRAINING_STREAM_PRIORITY`, the one
    :func:`training_stream` yields) waits for the work queued so far and is made current, so the
    loop body runs on it. A stream the caller chose, another device, a CPU device, or
    ``enabled=False``: nothing changes. :meth:`exit` (when the iteration ends: the epoch's last
    batch was trained on, an error, ``close()``, or the next iteration after a ``break``): the
    default stream waits for the training stream's work, and is made current again if the
    training stream still is, in the thread that entered (a generator finalised in another
    thread only orders the streams).
    """

    def __init__(self, device: torch.device, enabled: bool = True) -> None:
        self.device, self.enabled = device, enabled
        self._before: torch.cuda.Stream | None = None
        self._stream: torch.cuda.Stream | None = None
        self._thread: int | None = None

    def enter(self) -> None:
        if not self.enabled or self.device.type != "cuda" or self._stream is not None:
            return
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        if torch.cuda.current_device() != index:
            return
        device = torch.device("cuda", index)
        before = torch.cuda.current_stream(device)
        if before != torch.cuda.default_stream(device):
            return
        stream = shared_stream("training", device, TRAINING_STREAM_PRIORITY)
        stream.wait_stream(before)
        torch.cuda.set_stream(stream)
        self._before, self._stream, self._thread = before, stream, threading.get_ident()

    def exit(self) -> None:
        if self._stream is None:
            return
        before, stream, self._before, self._stream = self._before, self._stream, None, None
        before.wait_stream(stream)
        if threading.get_ident() == self._thread and torch.cuda.current_stream(stream.device) == stream:
            with torch.cuda.device(stream.device):
                torch.cuda.set_stream(before)
