"""A loader's batches made in a process of its own (``DetectionLoader(feed_process=True)``).

In the training process a loader's feed (feeding DALI, collecting its outputs, building the
targets) is Python that shares the interpreter lock with the training thread; a fast model whose
host work paces its step loses that time (docs/loader.md, "Feeding a fast model"). Here the
whole loader - its DALI pipeline, planning workers and feed - runs in one spawned process (a
:func:`detaug.workers.start_pool` pool of one worker: parent-death signal, ``SIGINT`` left to
the parent, the main script not imported), and its batches reach the trainer through a ring of
fixed slots the two processes share.

The ring: ``JOB_BATCHES * (depth + 1)`` slots, each one byte buffer on the batches' device
(CUDA IPC on a GPU, shared memory on the CPU) that the child makes, and sends once, when a slot
is first used or has to grow. The child copies a batch's images and the one allocation its
targets view into a slot the parent gave its job, and records the slot's "ready" event (an
inter-process CUDA event, sent once); a batch then crosses as its slot number, where each
tensor lies in the slot, and its findings - no tensor is unpickled or IPC handle opened per
batch. The parent waits for "ready" on its current stream, copies the slot's bytes into one new
allocation there (the caller owns what it is handed, as from the loader in its own process: a
batch may be kept for as long as the caller likes), records the slot's "release" event (made by
the parent, sent once) and gives the slot to a later job; the child's copy stream waits for
"release" before it writes into the slot again. The loader takes its batches here in a
background thread of the parent's, on the feed stream (:mod:`detaug.feeder`), and hands each
over to the training stream as the loader in the caller's process does; with
``ready_batches=0``, inside ``next()`` on the caller's stream. Neither process waits on the host
for the other's GPU work.

On a GPU the two processes' kernels share the GPU the way two processes do: without NVIDIA's
Multi-Process Service (MPS) they take turns in time slices, which can cost a GPU-bound model
more than the feed's interpreter time saves; under MPS they run side by side (figures:
docs/loader.md, "Feeding a fast model").

The child (:func:`_open`, :func:`_take`) keeps one :class:`~detaug.torch.DetectionLoader`
(the class is passed in: this module imports no loader) made from the parent's arguments, with
``feed_process=False`` and the targets ``"concat"`` for the per-image forms, which the parent
splits into views. It hands over batches in order from any ``(epoch, step)`` the parent asks
for. Warnings and findings are not said in the child: each batch carries its
:class:`~detaug.planned_batch.BatchFindings` and the worker pool's deferred messages, which the
parent records as its own loader would.
"""

from __future__ import annotations

import faulthandler
import pickle
import signal
import time
import warnings
from collections import deque
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable

import torch

from detaug.streams import shared_stream
from detaug.workers import start_pool, stop_pool

__all__ = ["ProcessFeed"]

#: Batches a job of the child returns at most (one DALI run's worth is typical).
JOB_BATCHES = 4

#: The signals whose Python stacks :mod:`faulthandler` prints in the child.
_FAULTS = {signal.SIGSEGV, signal.SIGFPE, signal.SIGABRT, signal.SIGBUS, signal.SIGILL}

#: Where a segment starts in a slot (bytes): keeps every tensor's alignment in its allocation.
_ALIGN = 256

#: A tensor's place in a slot: ``(dtype, shape, stride, byte offset)``; the offset is ``None``
#: for a tensor with no elements.
Entry = tuple[torch.dtype, tuple[int, ...], tuple[int, ...], "int | None"]

#: The child's state: "loader" (or "error", what building it raised), "iterator", "at" (epoch, step)
#: of the iterator's next batch, what the loader recorded of the batch it yielded last
#: ("findings", "deferred": the worker pool's messages), and the ring: "slots" (slot -> [buffer,
#: ready event, generation]), "release" (the parent's events, by slot), "stream" (the copies').
_CHILD: dict[str, Any] = {}


class ProcessFeed:
    """The parent's side: a child process with the loader, ``depth`` jobs in flight.

    Args:
        make: the child's loader's class (:class:`~detaug.torch.DetectionLoader`), called there.
        loader_args: ``(source, transforms, batch_size)`` of the child's loader.
        loader_kwargs: its keyword arguments (resolved device, shard, workers, ...).
        depth: jobs of up to :data:`JOB_BATCHES` batches the child works on ahead of the caller.
        device: the batches' device (where the caller's stream waits for the child's copies).
    """

    def __init__(self, make: Callable[..., Any], loader_args: tuple, loader_kwargs: dict[str, Any], depth: int,
                 device: torch.device) -> None:
        self.device, self.depth = device, max(1, int(depth))
        slots = JOB_BATCHES * (self.depth + 1)  # a job's worth more than in flight: a slot rests before reuse
        self._free: deque[int] = deque(range(slots))
        self._slots: list[torch.Tensor | None] = [None] * slots  # each slot's buffer, as received
        self._ready: list[Any] = [None] * slots  # the child's events, as received
        self._known = [0] * slots  # the generation of each buffer received (0: none)
        cuda = device.type == "cuda"
        self._release = [_interprocess_event(device) for _ in range(slots)] if cuda else None
        try:
            self._pool = start_pool(1, _open, (make, loader_args, loader_kwargs))  # pickles them first
        except (pickle.PicklingError, TypeError, AttributeError) as err:
            raise TypeError(
                f"feed_process=True: the source, transforms and loader arguments go to the loader's process pickled, "
                f"and they cannot be ({err}); make them picklable (classes and functions defined at a module's top "
                "level, no locks or open files) or use feed_process=False") from err
        self._jobs: deque[tuple[tuple[int, int], list[int], Future]] = deque()  # (epoch, first step), slots
        self._failed: tuple[tuple[int, int], BaseException] | None = None  # where a job's error is raised
        self.pid: int = next(iter(self._pool._processes))  # start_pool started it
        try:
            self._pool.submit(_built, self._release).result()  # raises what building the loader raised
        except BrokenProcessPool as err:
            why = self.ended()
            self.close()
            raise RuntimeError(f"the loader's process {why} while it built its loader") from err
        except BaseException:
            self.close()
            raise

    def ended(self) -> str:
        """How the child ended, for messages: ``"(pid 123) was killed by signal 9"``."""
        process = next((p for p in getattr(self._pool, "_detaug_state").processes if p.pid == self.pid), None)
        code = None
        for _ in range(100):  # the pool's manager thread may be reaping it: its status shows up there
            code = None if process is None else process.exitcode
            if code is not None or process is None:
                break
            time.sleep(0.01)
        if code is None:
            return f"(pid {self.pid}) stopped answering"
        if code >= 0:
            return f"(pid {self.pid}) exited with status {code}"
        stacks = " (its Python stacks are on standard error)" if -code in _FAULTS else ""
        return f"(pid {self.pid}) was killed by signal {-code}{stacks}"

    def take(self, epoch: int, step: int, steps: int, stats: Any = None) -> list[tuple]:
        """The batches from ``(epoch, step)`` on (at least one, at most a job's), made by the
        child: ``(step, findings, deferred, images, targets, counts, image_ids, base)`` each, in
        memory of this process's (copied on the caller's current stream; ``base``: the one
        allocation the batch's images and targets view); jobs for the batches
        after them are submitted up to ``depth`` ahead (none past ``steps``, the epoch's
        batches). Jobs in flight for other positions are dropped. ``stats`` (a
        :class:`~detaug.feeder.FeedStats`) counts the take and any wait for the child."""
        if self._failed is not None and self._failed[0] == (epoch, step):  # the batch after a job's last one
            failed, self._failed = self._failed[1], None
            raise failed
        while self._jobs and self._jobs[0][0] != (epoch, step):
            self._drop(self._jobs.popleft())
        if not self._jobs:
            self._submit(epoch, step)
        future = self._jobs[0][2]
        if stats is not None:
            if not future.done():
                started = time.perf_counter()
                future.exception()  # waits
                stats.not_ready += 1
                stats.waited_s += time.perf_counter() - started
        _, slots, _ = self._jobs.popleft()
        try:
            batches, failed = future.result()
            made = []
            for step_, findings, deferred, slot, sent, layout, counts, ids in batches:
                images, targets, base = self._receive(slot, sent, layout)
                made.append((step_, findings, deferred, images, targets, counts, ids, base))
        finally:
            self._free.extend(slots)
        if failed is not None:  # raised when the batch it failed on is asked for, after those before it
            self.drop_ahead()
            self._failed = ((epoch, step + len(made)), failed)
            if not made:
                return self.take(epoch, step, steps, stats)
        if stats is not None:
            stats.taken += len(made)
        last = step + len(made)
        for _ in range(self.depth - len(self._jobs)):
            at = self._jobs[-1][0][1] + JOB_BATCHES if self._jobs else last
            if at >= steps:
                break
            self._submit(epoch, at)
        return made

    def _submit(self, epoch: int, step: int) -> None:
        slots = [self._free.popleft() for _ in range(JOB_BATCHES)]
        future = self._pool.submit(_take, epoch, step, slots, [self._known[k] for k in slots])
        self._jobs.append(((epoch, step), slots, future))

    def _drop(self, job: tuple[tuple[int, int], list[int], Future]) -> None:
        """Forget a job: its slots are free again (the child writes them in order, and a later
        job's buffers are sent again if this one's grew them: ``known``)."""
        job[2].cancel()
        self._free.extend(job[1])

    def _receive(self, slot: int, sent: tuple | None,
                 layout: tuple) -> tuple[Any, dict[str, torch.Tensor], torch.Tensor]:
        """A batch's images and targets copied out of ``slot`` into one new allocation (returned
        third: what they view), on the caller's stream after the child's copies into it; the
        slot released after the copy."""
        if sent is not None:  # a new or grown buffer, with its ready event
            self._slots[slot], self._ready[slot], self._known[slot] = sent
        image_entries, stacked, target_entries, size = layout
        buffer = self._slots[slot]
        stream = torch.cuda.current_stream(self.device) if self._release is not None else None
        if stream is not None:
            stream.wait_event(self._ready[slot])
        out = torch.empty(size, dtype=torch.uint8, device=self.device)
        out.copy_(buffer[:size], non_blocking=True)
        if stream is not None:
            self._release[slot].record(stream)
        images = [_view(out, entry) for entry in image_entries]
        return (images[0] if stacked else images), {name: _view(out, entry) for name, entry in target_entries}, out

    def drop_ahead(self) -> None:
        """Forget the jobs in flight and an error not raised yet (an iteration ended early)."""
        self._failed = None
        while self._jobs:
            self._drop(self._jobs.popleft())

    def close(self) -> None:
        """Stop the child (its loader and workers with it) and let go of the ring's buffers and
        events opened here (the batches handed out are this process's own)."""
        self.drop_ahead()
        self._slots, self._ready = [None] * len(self._slots), [None] * len(self._ready)
        stop_pool(self._pool, wait=True)


def _interprocess_event(device: torch.device) -> torch.cuda.Event:
    """An inter-process CUDA event made on ``device`` now: one made lazily would be made on the
    device current in the thread that first pickles it (the pool's queue thread: the first GPU)."""
    event = torch.cuda.Event(interprocess=True)
    with torch.cuda.device(device):
        event.ipc_handle()
    return event


def _view(out: torch.Tensor, entry: Entry) -> torch.Tensor:
    """The tensor ``entry`` places in ``out`` (a byte buffer)."""
    dtype, shape, stride, offset = entry
    if offset is None:
        return torch.empty(shape, dtype=dtype, device=out.device)
    return torch.empty(0, dtype=dtype, device=out.device).set_(out.untyped_storage(), offset // dtype.itemsize,
                                                             shape, stride)


def _segments(tensors: list[torch.Tensor]) -> tuple[list[tuple[torch.Tensor, int]], list[Entry], int]:
    """Where ``tensors`` go in a slot: the byte spans of the allocations they view, each
    ``(bytes, offset in the slot)``, each tensor's :data:`Entry`, and the bytes in all. A
    span starts at a multiple of :data:`_ALIGN` in its allocation and in the slot, so every
    tensor keeps its alignment."""
    spans: dict[int, list] = {}  # storage pointer -> [storage, first byte, end byte]
    for tensor in tensors:
        if tensor.numel() == 0:
            continue
        first = tensor.storage_offset() * tensor.element_size()
        end = first + (1 + sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride()))) * tensor.element_size()
        span = spans.setdefault(tensor.untyped_storage().data_ptr(), [tensor.untyped_storage(), first, end])
        span[1], span[2] = min(span[1], first), max(span[2], end)
    where, segments, size = {}, [], 0
    for key, (storage, first, end) in spans.items():
        first -= first % _ALIGN
        source = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage, first, (end - first,), (1,))
        where[key] = size - first
        segments.append((source, size))
        size += -(-(end - first) // _ALIGN) * _ALIGN
    entries = [(t.dtype, tuple(t.shape), tuple(t.stride()), None if t.numel() == 0 else
                where[t.untyped_storage().data_ptr()] + t.storage_offset() * t.element_size()) for t in tensors]
    return segments, entries, size


# -- the child -------------------------------------------------------------------------------


def _open(make: Callable[..., Any], loader_args: tuple, loader_kwargs: dict[str, Any]) -> None:
    """The child's initializer: build the loader, ``make(*loader_args, **loader_kwargs)`` (an
    error is kept for the first job to raise: an initializer's error would break the pool with
    no message), its findings kept for the parent instead of warned of."""
    warnings.simplefilter("ignore")  # the parent says what the child finds
    faulthandler.enable()  # a crash (a signal) prints the child's Python stacks to standard error
    try:
        if loader_kwargs.get("device_id") is not None:  # the loader's GPU is current here too, as in a
            torch.cuda.set_device(loader_kwargs["device_id"])  # rank's process: code that uses it finds it
        loader = make(*loader_args, **loader_kwargs)
    except BaseException as err:  # noqa: BLE001 - raised by the first job
        _CHILD["error"] = err
        return

    def record(findings: Any) -> None:  # instead of the loader's own, which warns
        deferred = loader._pool.deferred if loader._pool is not None else []
        _CHILD["findings"], _CHILD["deferred"], deferred[:] = findings, list(deferred), []

    loader._record = record
    _CHILD["loader"] = loader
    _CHILD["slots"] = {}
    cuda = loader.device.type == "cuda"
    _CHILD["stream"] = shared_stream("ring", loader.device, 0) if cuda else None


def _built(release: list[Any] | None) -> None:
    """Raise what building the child's loader raised, if anything; keep the parent's release
    events (by slot; ``None`` on the CPU)."""
    if "error" in _CHILD:
        raise _CHILD["error"]
    _CHILD["release"] = release


def _to_slot(slot: int, known: int, images: Any, targets: dict[str, torch.Tensor]) -> tuple[tuple | None, tuple]:
    """Copy a batch into ``slot``: what the parent needs of the slot (its buffer and ready
    event when the parent's generation ``known`` is not the slot's, else ``None``) and the
    batch's layout ``(image entries, stacked, target entries, bytes)``."""
    stacked = isinstance(images, torch.Tensor)
    tensors = ([images] if stacked else list(images)) + list(targets.values())
    segments, entries, size = _segments(tensors)
    loader, release, stream = _CHILD["loader"], _CHILD["release"], _CHILD["stream"]
    held = _CHILD["slots"].get(slot)
    if held is None or held[0].numel() < size:  # a new buffer: room for a batch with a few more boxes, and
        if held is not None and release is not None:  # a quarter more where a batch outgrew its slot
            release[slot].synchronize()  # the parent has copied out of the old one
        room = size + size // 64 if held is None else size * 5 // 4
        buffer = torch.empty(-(-room // 2**16) * 2**16 or 2**16, dtype=torch.uint8, device=loader.device)
        if stream is None:
            buffer.share_memory_()
        ready = torch.cuda.Event(interprocess=True) if stream is not None else None
        held = _CHILD["slots"][slot] = [buffer, ready, (held[2] if held is not None else 0) + 1]
    buffer, ready, generation = held
    if stream is None:
        for source, at in segments:
            buffer[at : at + source.numel()].copy_(source)
    else:
        stream.wait_stream(torch.cuda.current_stream(loader.device))  # where the loader made the batch
        stream.wait_event(release[slot])  # the parent's copy out of it
        with torch.cuda.stream(stream):
            for source, at in segments:
                buffer[at : at + source.numel()].copy_(source, non_blocking=True)
                source.record_stream(stream)
        ready.record(stream)
    layout = (entries[: len(tensors) - len(targets)], stacked,
              list(zip(targets, entries[len(tensors) - len(targets) :])), size)
    return ((buffer, ready, generation) if generation != known else None), layout


def _take(epoch: int, step: int, slots: list[int], known: list[int]) -> tuple[list[tuple], BaseException | None]:
    """Up to ``len(slots)`` batches of ``epoch`` from ``step`` on (fewer at the epoch's end),
    each copied into its slot, and the error that ended them early (``None``): the batches
    before a failed one are handed out first, as the loader in the caller's process does."""
    loader = _CHILD["loader"]
    if _CHILD.get("at") != (epoch, step):
        iterator = _CHILD.pop("iterator", None)
        if iterator is not None:
            iterator.close()
        loader.load_state_dict({"epoch": epoch, "step": step})
        _CHILD["iterator"] = iter(loader)
    iterator, made = _CHILD["iterator"], []
    try:
        for slot, generation in zip(slots, known):
            try:
                images, targets = next(iterator)
            except StopIteration:
                break
            counts = targets["num_boxes"].tolist()
            image_ids = targets["image_id"].tolist()
            sent, layout = _to_slot(slot, generation, images, targets)
            made.append((loader._step - 1, _CHILD["findings"], _CHILD["deferred"], slot, sent, layout, counts,
                         image_ids))
    except Exception as err:  # noqa: BLE001 - the parent raises it after the batches before it
        _CHILD.pop("at", None)
        _CHILD.pop("iterator", None)
        return made, err
    _CHILD["at"] = (epoch, step + len(made))
    if made and made[-1][0] == len(loader) - 1:  # the epoch's last batch: end the iteration, which
        next(iterator, None)  # keeps the loader's feed running into the next epoch
        _CHILD["at"], _CHILD["iterator"] = (epoch + 1, 0), iter(loader)
    return made, None
