"""The DALI pipeline of one sequence: its callers' batches, in turn, ``depth`` at once.

``seq[i]`` is called by Keras' loop (``workers=1``, the default), by Keras' worker threads
(``workers > 1``, up to ``max_queue_size`` ahead) or by your own threads. A
:class:`PipelineQueue` runs their batches through one DALI pipeline in the order they come,
``depth`` of them at once (DALI's ``prefetch_queue_depth``), as the PyTorch loader runs its epoch:

* a call :meth:`~PipelineQueue.submit` s its planned batch (a :class:`Ticket`) and waits for it
  (:meth:`~PipelineQueue.result`);
* whichever waiting call finds the pipeline free *drives* it: it feeds waiting batches up to the
  depth, takes the oldest batch's outputs, feeds again (so that DALI works on the next batches
  meanwhile), and copies the images out into that batch's ticket (DALI reuses its buffers); a
  call whose batch is done returns, the others drive in turn.

So the pipeline holds ``depth`` batches whenever calls wait, and the sequence holds one
pipeline's GPU memory, not one pipeline per Keras thread. Tickets may also be submitted for
calls expected next (the sequence's sequential prefetch), each held under its key ``(epoch,
index)`` (:meth:`~PipelineQueue.hold`) until that call :meth:`~PipelineQueue.take` s it; one
that nobody asks for is dropped (counted in ``wasted``).

When DALI fails on a batch (an image whose header was fine), that batch's ticket gets the
:class:`~detaug.decode_failures.DecodeFailure` (its caller plans the batch again without the culprit)
and the pipeline is replaced, DALI's being unusable after an error: the other batches in flight
are fed again to the new one. The queue shares the sequence's lock (a ``threading.Condition``).
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from detaug.pipeline import feed, feed_first_run, outputs_outlive_runs, take_outputs
from detaug.decode_failures import DecodeFailure
from detaug.planned_batch import PlannedBatch

__all__ = ["PIPELINE_DEPTH", "PipelineQueue", "Ticket"]

PIPELINE_DEPTH = 2
"""Batches a sequence's pipeline works on at once (its ``prefetch_queue_depth``), as the loader's default."""


@dataclass(eq=False)
class Ticket:
    """One batch submitted to a :class:`PipelineQueue`: its plan, then its images or its error.

    ``wanted`` is ``False`` for a batch whose images nobody will take (a filler that completes a
    fresh pipeline's first run, a prefetch dropped): they are not copied out."""

    planned: PlannedBatch
    wanted: bool = True
    done: bool = False
    images: Any = None
    error: BaseException | None = None


class PipelineQueue:
    """One DALI pipeline made by ``build()`` (built now: errors show here), fed by many threads.

    Args:
        build: makes and builds the pipeline (``prefetch_queue_depth=depth``); called again
            after a failure, or after :meth:`close`.
        depth: batches in the pipeline at once (>= 1).
        lock: the owner's condition; guards the queue's state.
        device_id: the GPU the pipeline runs on, ``None`` for the CPU.
        images_on_device: :meth:`result` gives the images on the GPU in ``backend``'s tensor
            type (a CUDA ``torch`` tensor, a TensorFlow or JAX GPU array handed over by DLPack,
            no copy), not a NumPy array (:meth:`to_device` does the same for the targets).
        backend: Keras' backend (``"torch"``, ``"tensorflow"``, ``"jax"``).

    Attributes:
        wasted: prefetched batches dropped unused.
        waiting, inflight: tickets submitted and not fed yet; fed and not collected (oldest first).
    """

    def __init__(
        self, build: Callable[[], Any], depth: int, lock: threading.Condition, *, device_id: int | None,
        images_on_device: bool, backend: str | None = "torch",
    ) -> None:
        self.build, self.depth, self.lock = build, max(1, int(depth)), lock
        self.device_id, self.images_on_device = device_id, bool(images_on_device)
        self.backend = backend
        self.wasted = 0
        self.pipe: Any = build()  # fail here, not in the first seq[i]
        self.waiting: deque[Ticket] = deque()
        self.inflight: deque[Ticket] = deque()
        self.prefetched: dict[tuple[int, int], Ticket] = {}  # (epoch, index) -> its ticket
        self._fresh = True  # the pipeline's first schedule_run runs ``depth`` batches (DALI's prefetch)
        self._stale = False  # a run failed or a feed broke off: build anew, feed the batches in flight again
        self._driving = False  # a thread is feeding or collecting
        # CUDA streams, reused across epochs and sequences (copy_streams): the images' copies (one
        # driver at a time: one stream, so the blocks PyTorch caches for them serve every batch), and
        # the calling threads' target copies
        self._streams = copy_streams(device_id, "images")
        self._target_streams = copy_streams(device_id, "targets")

    # -- calls ----------------------------------------------------------------------------------------

    def submit(self, planned: PlannedBatch) -> Ticket:
        """Queue a planned batch (takes the lock); :meth:`result` waits for it."""
        ticket = Ticket(planned)
        with self.lock:
            self.waiting.append(ticket)
        return ticket

    def result(self, ticket: Ticket) -> Any:
        """Wait for ``ticket``'s images, driving the pipeline whenever it is free: float32
        ``[B, H, W, 3]``, a NumPy array or a device tensor (``images_on_device``). Raises the
        batch's error: :class:`~detaug.decode_failures.DecodeFailure` when DALI failed on it,
        ``ValueError`` when its images differ in shape."""
        try:
            while True:
                with self.lock:
                    while self._driving and not ticket.done:
                        self.lock.wait()
                    if ticket.done:
                        break
                    self._driving = True
                try:
                    self._step()
                finally:
                    self._stop_driving()
        except BaseException:  # the pipeline could not be built, Ctrl-C: nobody takes this batch
            with self.lock:
                self._abandon(ticket)
            raise
        if ticket.error is not None:
            raise ticket.error
        return ticket.images

    def feed_waiting(self) -> None:
        """Feed the waiting batches now if the pipeline is free (else its driver feeds them
        before it stops): a prefetch then runs while its caller is away."""
        with self.lock:
            if self._driving:
                return
            self._driving = True
        try:
            self._fill()
        finally:
            self._stop_driving()

    # -- prefetched batches (the caller holds the lock) ---------------------------------------------

    def hold(self, key: tuple[int, int], ticket: Ticket) -> None:
        """Keep ``ticket`` for the call that asks for ``key`` ``(epoch, index)``. When one is held
        for ``key`` already (two readers walking the same batches, as Keras' adapters do when they
        peek at the first batches), ``ticket`` is dropped."""
        if key in self.prefetched:
            self._drop(ticket)
            return
        self.prefetched[key] = ticket

    def take(self, key: tuple[int, int]) -> Ticket | None:
        """The ticket held for ``key``, or ``None``."""
        return self.prefetched.pop(key, None)

    def drop_prefetched(self, keep: int | None = None) -> None:
        """Drop the prefetched batches (counted in ``wasted``) but those of epoch ``keep``:
        those not fed yet are not fed, the images of those in flight are not copied."""
        for key, ticket in self.prefetched.items():
            if key[0] != keep:
                self._drop(ticket)
        self.prefetched = {key: t for key, t in self.prefetched.items() if key[0] == keep}

    def close(self) -> None:
        """Drop the prefetched batches and the pipeline (its memory goes when collected); the
        next :meth:`result` builds a new one. Call it when no call is in progress."""
        with self.lock:
            self.drop_prefetched()
            if self._driving:
                return
            pipe, self.pipe = self.pipe, None
            count = 0 if self._stale else len(self.inflight)
            for ticket in [*self.waiting, *self.inflight]:
                ticket.wanted = False
            self.waiting.clear()
            self.inflight.clear()
            self._stale = False
        for _ in range(count if pipe is not None else 0):  # runs scheduled: let them end before the pipeline goes
            if not _drain(pipe):
                break
        del pipe

    def _drop(self, ticket: Ticket) -> None:
        self.wasted += 1
        self._abandon(ticket)

    def _abandon(self, ticket: Ticket) -> None:
        """Nobody takes ``ticket``'s images: not fed if it waits, not copied if in flight."""
        ticket.wanted = False
        if ticket in self.waiting:
            self.waiting.remove(ticket)
            ticket.done = True

    # -- driving (one thread at a time: the one that set ``_driving``) -------------------------------

    def _stop_driving(self) -> None:
        """Stop driving, after feeding what came meanwhile (a prefetch submitted while this
        thread collected would otherwise wait for the next call)."""
        try:
            while True:
                with self.lock:
                    if not (self.waiting and self.pipe is not None and not self._stale
                            and len(self.inflight) < self.depth):
                        return
                self._fill()
        finally:
            with self.lock:
                self._driving = False
                self.lock.notify_all()

    def _step(self) -> None:
        """Feed, collect the oldest batch in flight, feed again, copy its images out."""
        self._fill()
        with self.lock:
            if self._stale or not self.inflight:
                return
            oldest = self.inflight[0]
        try:
            images = take_outputs(self.pipe)[0]
        except (RuntimeError, IndexError) as err:  # IndexError: DALI's "critical error"
            with self.lock:
                self.inflight.popleft()
                oldest.error, oldest.done = DecodeFailure(oldest.planned, err), True
                self._stale = True  # DALI: "Current pipeline object is no longer valid"
            return
        with self.lock:
            self.inflight.popleft()
        self._fill()  # DALI runs the next batches while these images are copied (its buffers stay ours until the next outputs())
        out, error = None, None
        if oldest.wanted:
            try:
                out = self._copy(images)
            except Exception as err:  # noqa: BLE001 - the batch's error, raised by its call
                error = err
        with self.lock:
            oldest.images, oldest.error, oldest.done = out, error, True

    def _fill(self) -> None:
        """Feed waiting batches until ``depth`` are in flight (a fresh pipeline's first run takes
        ``depth`` batches at once: fillers, the last batch again, complete it); a pipeline that
        failed is replaced first, and its batches in flight go back to the front of the queue."""
        if self._stale or self.pipe is None:
            self._renew()
        with self.lock:
            room = self.depth - len(self.inflight)
            batch = [self.waiting.popleft() for _ in range(min(room, len(self.waiting)))]
        if not batch:
            return
        fed: list[Ticket] = []
        try:
            if self._fresh:
                fillers = feed_first_run(self.pipe, [t.planned for t in batch], self.depth)
                self._fresh = False
                fed = batch + [Ticket(batch[-1].planned, wanted=False) for _ in range(fillers)]
            else:
                for ticket in batch:
                    feed(self.pipe, ticket.planned.data, ticket.planned.params, ticket.planned.partners)
                    fed.append(ticket)
        except Exception as err:  # noqa: BLE001 - the batch's error, raised by its call
            failed = batch[len(fed)] if len(fed) < len(batch) else batch[0]
            with self.lock:
                failed.error, failed.done = err, True
                self.waiting.extendleft(reversed([t for t in batch if t is not failed and t not in fed]))
                self.inflight.extend(t for t in fed if t is not failed)
                self._stale = True  # possibly half fed
            return
        with self.lock:
            self.inflight.extend(fed)

    def _renew(self) -> None:
        """A new pipeline; the wanted batches in flight are fed to it again first."""
        with self.lock:
            again = [t for t in self.inflight if t.wanted]
            for ticket in self.inflight:
                if not ticket.wanted:
                    ticket.done = True
            self.inflight.clear()
            self.waiting.extendleft(reversed(again))
            self.pipe = None
        self.pipe = self.build()
        self._fresh, self._stale = True, False

    def _copy(self, images: Any) -> Any:
        """A batch's images as float32 ``[B, H, W, 3]``, a NumPy array or a device tensor
        (``images_on_device``), copied once (DALI's legacy executors reuse their buffers at a
        later run; on the host, float32 images of its default executor are not copied)."""
        if not images.is_dense_tensor():
            shapes = sorted({tuple(images[k].shape()) for k in range(len(images))})
            raise ValueError(
                f"the batch's images have different shapes {shapes}; a Keras batch is one "
                "[B, H, W, 3] array: end the recipe with Resize((h, w)), LetterBox or RandomResizedCrop"
            )
        if self.device_id is None:
            # one pass: copy and convert; float32 outputs that outlive their run are taken as they are
            convert = np.asarray if outputs_outlive_runs(self.pipe) else np.array
            return convert(images.as_tensor(), dtype=np.float32)
        out = _gpu_float32(images, self.device_id, self._streams, on_host=not self.images_on_device)
        return hand_over(out, self.backend) if self.images_on_device else out

    def to_device(self, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
        """``arrays`` (a batch's padded targets) as tensors of ``backend`` on the pipeline's GPU,
        copied here, in the calling thread, on a stream of its own: else Keras' ``fit`` copies
        them in its main thread, on the default stream, behind the model's queued work (3 ms a
        batch of 64 with no model, H100, 2026-11-24)."""
        import torch

        device = torch.device("cuda", self.device_id)
        with self._target_streams.use() as stream:
            with torch.cuda.stream(stream):
                out = {name: torch.from_numpy(a).to(device, non_blocking=True) for name, a in arrays.items()}
            stream.synchronize()  # complete when returned (and the host arrays free to go)
        default = torch.cuda.default_stream(device)
        for tensor in out.values():
            tensor.record_stream(default)  # not reused while the caller's work runs
        return {name: hand_over(tensor, self.backend) for name, tensor in out.items()}


def _drain(pipe: Any) -> bool:
    """Wait for ``pipe``'s oldest scheduled batch and drop it; ``False`` when the run failed
    (the pipeline is then unusable)."""
    try:
        take_outputs(pipe)
    except Exception:  # noqa: BLE001 - a batch nobody asked for
        return False
    return True


#: Backends whose GPU tensors take a torch CUDA tensor through DLPack without a copy.
DLPACK_BACKENDS = ("torch", "tensorflow", "jax")


def hand_over(images: Any, backend: str | None) -> Any:
    """A ``torch`` tensor as ``backend``'s tensor through DLPack (same memory, no copy):
    ``tf.experimental.dlpack.from_dlpack`` for TensorFlow, ``jax.dlpack.from_dlpack`` for JAX;
    the tensor itself for torch (or no Keras). Works on the host and on the GPU alike."""
    if backend in (None, "torch"):
        return images
    import torch.utils.dlpack

    if backend == "tensorflow":
        import tensorflow as tf

        return tf.experimental.dlpack.from_dlpack(torch.utils.dlpack.to_dlpack(images.contiguous()))
    if backend == "jax":
        import jax.dlpack

        return jax.dlpack.from_dlpack(images.contiguous())
    raise ValueError(f"images_on_device: no DLPack hand-over to Keras backend {backend!r}; "
                     f"supported: {', '.join(DLPACK_BACKENDS)}")


class CopyStreams:
    """CUDA streams for the copies of concurrent calls, made by ``make`` when every one made so
    far is in use and reused afterwards: as many as calls ever ran at once (one pool per GPU and
    purpose in the process, :func:`copy_streams`).

    A stream per calling thread would not do: Keras starts new threads every epoch, and PyTorch's
    caching allocator keeps what a stream's tensors freed for that stream alone, so each epoch's
    new streams reserved GPU memory anew: in ``fit`` at batch 64 of 512x512 images, PyTorch's
    reserved memory grew from 1.5 to 13.4 GB over 6 epochs, against 1.9 to 5.6 GB with the
    streams reused (H100, 2026-11-24)."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self.make = make
        self.made = 0
        self._free: deque[Any] = deque()
        self._making = threading.Lock()

    @contextlib.contextmanager
    def use(self) -> Iterator[Any]:
        """A stream nobody else uses until the block ends."""
        try:
            stream = self._free.pop()  # atomic: two threads never get the same stream
        except IndexError:
            with self._making:
                stream = self.make()
                self.made += 1
        try:
            yield stream
        finally:
            self._free.append(stream)


_COPY_STREAMS: dict[tuple[int | None, str], CopyStreams] = {}
_COPY_STREAMS_LOCK = threading.Lock()


def copy_streams(device_id: int | None, purpose: str) -> CopyStreams:
    """The process's :class:`CopyStreams` for ``purpose`` (``"images"``, ``"targets"``) on GPU
    ``device_id``, shared by every sequence: a sequence made after another one closed copies on
    the streams it used, so the memory PyTorch cached for them serves it (PyTorch reuses memory
    freed on a stream only on that stream)."""
    with _COPY_STREAMS_LOCK:
        pool = _COPY_STREAMS.get((device_id, purpose))
        if pool is None:
            pool = _COPY_STREAMS[(device_id, purpose)] = CopyStreams(lambda: _cuda_stream(device_id))
    return pool


def _cuda_stream(device_id: int | None) -> Any:
    import torch

    return torch.cuda.Stream(torch.device("cuda", device_id))


def _gpu_float32(images: Any, device_id: int, streams: CopyStreams, *, on_host: bool) -> Any:
    """A dense DALI GPU ``TensorList`` copied as float32 ``[B, H, W, 3]``: a NumPy array on the
    host (``on_host``), else a ``torch`` tensor on its GPU, ready to use on the default stream.

    Concurrent calls copy on streams of their own (``streams``), so one call's ~200 MB host copy
    (64 float images of 512x512) does not hold up another's device copy. The host copy goes
    into page-locked memory, several times faster than a pageable one."""
    import torch

    from detaug.handover import dali_images_to_torch

    device = torch.device("cuda", device_id)
    with streams.use() as stream:
        with torch.cuda.stream(stream):
            on_gpu = dali_images_to_torch(images, device).float()  # uint8 (float32 after Normalize: no second copy)
            if on_host:
                host = torch.empty(on_gpu.shape, dtype=torch.float32, pin_memory=True)
                host.copy_(on_gpu, non_blocking=True)
        stream.synchronize()  # complete when returned
    if on_host:
        return host.numpy()
    on_gpu.record_stream(torch.cuda.default_stream(device))  # not reused while the caller's work runs
    return on_gpu
