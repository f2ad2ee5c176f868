"""A background feed: the next batches made in a thread while the caller trains on this one.

:class:`BackgroundFeed` runs a generator of batches in a daemon thread and keeps up to ``depth``
finished batches in a queue. On a CUDA device the thread makes its tensors on a stream of its own
(the feed stream: one per device in the process, shared by every feed and never the training
loop's, so that the memory a closed feed's batches leave in PyTorch's cache serves the next
feed's; :func:`detaug.streams.shared_stream`) and waits for that stream before it queues a
batch, so that:

- the training thread never waits for the feed's copies, nor the feed for the training step;
- a batch taken from the queue is complete: the caller reads it on its own stream without a wait;
- the caller marks each tensor as used on its stream (:meth:`BackgroundFeed.hand_over`,
  ``Tensor.record_stream``), so that PyTorch's allocator reuses its memory only once the
  caller's kernels that read it have run.

What the caller is done with can be handed back (:meth:`BackgroundFeed.retire`): the feed's thread
drops it, so that where the caller held the last reference the objects are freed there, not in
the training thread: freeing a batch of 64 per-image target dicts (128 tensor views) in the
training loop was most of the loader's "data wait" in ``detaug bench --train`` (7.6-7.8% of the
step time, 1.9-2.1% with the targets retired; H200, 2026-11-27).

What the caller found at each take is counted (:class:`FeedStats`): a batch not yet made is the
caller waiting for data; the time ``next()`` takes otherwise is the hand-over's own.

Errors raised by the generator come out of :meth:`BackgroundFeed.take` at the position where
they happened (after the batches made before them). :meth:`BackgroundFeed.stop` ends the thread
and closes the generator *in that thread* (its ``finally`` blocks run there), whatever it was
doing; feeds still running when the interpreter exits are stopped first (``atexit``, registered
with the first feed: after DALI's own exit hook, so that it runs before DALI shuts its pipelines
down).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import queue
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from detaug.streams import shared_stream

__all__ = ["BackgroundFeed", "FeedStats"]

_ITEM, _END, _ERROR = "item", "end", "error"

#: CUDA priority of the feed stream (``torch.cuda.Stream(priority=...)``: lower runs first; 0 is
#: PyTorch's default). High (-1): the feed's copies are not queued behind a GPU-bound training
#: step (H200, 2026-11-27: 0.72 -> 0.77x of the ceiling with padded targets, 0.69 -> 0.75x with
#: dicts, docs/notes/2026-11-benchmark-log.md). Read when a feed starts.
STREAM_PRIORITY = -1

#: Feeds whose thread may still run: stopped at exit, before DALI's and CUDA's own clean-up.
_LIVE: weakref.WeakSet[BackgroundFeed] = weakref.WeakSet()
_EXIT_STOP: list[Any] = []  # the exit hook, once registered (atexit runs the last registered first)


@dataclass
class FeedStats:
    """What the caller found when it took items from background feeds (kept across feeds).

    Attributes:
        taken: items taken.
        not_ready: of them, those not yet made when asked for: the caller waited.
        waited_s: seconds the caller waited for those (wall time).
    """

    taken: int = 0
    not_ready: int = 0
    waited_s: float = 0.0


class BackgroundFeed:
    """Run ``produce()`` (a generator of batches) in a thread, ``depth`` batches ahead.

    Args:
        produce: called once in the thread; its items are yielded by :meth:`__iter__` in order.
        depth: finished items kept ready (``>= 1``).
        device: the device of the items' tensors; a CUDA device gets a feed stream.
        stats: where the takes are counted (:class:`FeedStats`; ``None``: a new one,
            :attr:`stats`).
    """

    def __init__(self, produce: Callable[[], Iterator[Any]], depth: int, device: torch.device,
                 stats: FeedStats | None = None) -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.stats = stats if stats is not None else FeedStats()
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=depth)
        self._stopping = threading.Event()
        self._retired: collections.deque[Any] = collections.deque()  # dropped by the feed's thread
        self.device = device
        self.stream = shared_stream("feed", device, STREAM_PRIORITY) if device.type == "cuda" else None
        self._done = False
        self._thread = threading.Thread(target=self._run, args=(produce,), name="detaug-feed", daemon=True)
        self._thread.start()
        if not _EXIT_STOP:  # registered after DALI's own exit hook (DALI comes with the first pipeline): runs first
            _EXIT_STOP.append(atexit.register(_stop_live_feeds))
        _LIVE.add(self)

    def _run(self, produce: Callable[[], Iterator[Any]]) -> None:
        try:
            context = (torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext())
            with context:
                items = produce()
                try:
                    for item in items:
                        self._drop_retired()
                        if self.stream is not None:
                            self.stream.synchronize()  # the feeds' copies only, not the trainer's work
                        if not self._put((_ITEM, item)):
                            break
                finally:
                    close = getattr(items, "close", None)  # a generator's clean-up runs here, in its thread
                    if close is not None:
                        close()
            self._put((_END, None))
        except BaseException as err:  # noqa: BLE001 - handed to the caller, raised there
            self._put((_ERROR, err))

    def _put(self, message: tuple[str, Any]) -> bool:
        """Queue ``message`` unless the feed is stopping (then ``False``)."""
        while not self._stopping.is_set():
            try:
                self._queue.put(message, timeout=0.05)
                return True
            except queue.Full:
                self._drop_retired()  # woken by a take (or the timeout): what the caller retired since
                continue
        return False

    def retire(self, item: Any) -> None:
        """Hand ``item``, something the caller is done with (a batch's targets it has let go of),
        to the feed's thread, which drops it at its next turn: where this was the last reference,
        the objects are freed in that thread. Objects the caller still holds stay alive."""
        self._retired.append(item)

    def _drop_retired(self) -> None:
        """Drop what the caller retired (in the feed's thread: where those were the last
        references, the objects are freed here; ``deque.clear`` is atomic beside the caller's
        ``append``)."""
        self._retired.clear()

    def take(self) -> Any:
        """The next item (waits for it); ``StopIteration`` once the generator has ended, or the
        generator's error, raised here."""
        if self._done:
            raise StopIteration
        try:
            kind, value = self._queue.get_nowait()
            waited = None
        except queue.Empty:
            start = time.perf_counter()
            kind, value = self._queue.get()
            waited = time.perf_counter() - start
        if kind == _ITEM:
            self.stats.taken += 1
            if waited is not None:
                self.stats.not_ready += 1
                self.stats.waited_s += waited
            return value
        self._done = True
        if kind == _ERROR:
            raise value
        raise StopIteration

    def hand_over(self, tensors: list[torch.Tensor]) -> None:
        """Mark ``tensors`` (made on the feed stream) as used by the caller's current stream."""
        if self.stream is None:
            return
        current = torch.cuda.current_stream(self.device)
        for tensor in tensors:
            tensor.record_stream(current)

    def stop(self) -> None:
        """End the thread (the generator is closed in it) and drop the batches not taken."""
        self._stopping.set()
        if threading.current_thread() is self._thread:  # a finalizer run by the feed's own thread
            return
        with contextlib.suppress(queue.Empty):
            while True:
                self._queue.get_nowait()
        self._thread.join()
        self._retired.clear()
        self._done = True
        _LIVE.discard(self)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()


def _stop_live_feeds() -> None:
    for feed in list(_LIVE):
        feed.stop()
