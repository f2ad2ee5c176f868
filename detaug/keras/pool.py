"""The DALI pipelines of one sequence: Keras' ``workers``, one batch each, and their prefetches.

A :class:`PipelinePool` holds up to ``size`` pipelines, each *idle*, *running* a ``seq[i]``
call's batch, or *holding a prefetched batch* (fed and scheduled for a call expected next). A
call :meth:`~PipelinePool.acquire` s an idle pipeline, builds a new one (fewer than ``size``),
or takes one whose prefetched batch nobody asked for (dropped, counted in ``wasted``), else
waits for one to be released. Pipelines share the sequence's lock (a ``threading.Condition``):
the methods that say so expect the caller to hold it.

Memory: each pipeline holds its own buffers for one batch (``prefetch_queue_depth=1``); a
batch's images leave it as one copy (:meth:`~PipelinePool.collect`), since DALI reuses them.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from detaug.pipeline import feed
from detaug.planning import DecodeFailure, PlannedBatch

__all__ = ["PipelinePool", "default_pipelines"]


def default_pipelines(device: str) -> int:
    """The DALI pipelines a sequence runs at once (Keras' ``workers``) when ``workers=None``:
    4 with ``device="gpu"`` (random access as fast as an iterator), 1 with ``"cpu"`` (DALI's CPU
    threads already use the cores)."""
    return 1 if device == "cpu" else 4


class PipelinePool:
    """Up to ``size`` DALI pipelines made by ``build()``; one is built now (errors show here).

    Args:
        build: makes and builds one pipeline.
        size: the most pipelines at once (>= 1).
        lock: the owner's condition; guards the pipelines' states.
        device_id: the GPU the pipelines run on, ``None`` for the CPU.
        images_on_device: :meth:`collect` returns the images on the GPU in ``backend``'s tensor
            type (a CUDA ``torch`` tensor, a TensorFlow or JAX GPU array handed over by DLPack,
            no copy), not a NumPy array.
        backend: Keras' backend (``"torch"``, ``"tensorflow"``, ``"jax"``).

    Attributes:
        wasted: prefetched batches dropped unused.
    """

    def __init__(
        self, build: Callable[[], Any], size: int, lock: threading.Condition, *, device_id: int | None, images_on_device: bool,
        backend: str | None = "torch",
    ) -> None:
        self.build, self.size, self.lock = build, int(size), lock
        self.device_id, self.images_on_device = device_id, bool(images_on_device)
        self.backend = backend
        self.wasted = 0
        self.idle: list[Any] = [build()]  # fail here, not in the first seq[i]
        self.prefetched: dict[tuple[int, int], tuple[Any, PlannedBatch]] = {}  # (epoch, index) -> (pipeline, batch fed)
        self.count = 1  # built or being built, in any of the three states
        self._streams = CopyStreams(lambda: _cuda_stream(device_id))  # for the copies, reused across epochs

    # -- idle and running ---------------------------------------------------------------------------

    def acquire(self) -> Any:
        """An idle pipeline for the caller (takes the lock): a free one, a new one (fewer than
        ``size``), or one whose prefetched batch nobody asked for; else wait for a release."""
        with self.lock:
            while True:
                if self.idle:
                    return self.idle.pop()
                if self.count < self.size:
                    self.count += 1
                    break
                if self.prefetched:
                    pipe, _ = self.prefetched.pop(next(iter(self.prefetched)))
                    if self._reclaim(pipe):
                        return pipe
                    continue
                self.lock.wait()
        try:
            return self.build()
        except BaseException:
            self.discard(None)
            raise

    def release(self, pipe: Any) -> None:
        """Hand back a pipeline whose batch was collected (takes the lock)."""
        with self.lock:
            self.idle.append(pipe)
            self.lock.notify()

    def discard(self, pipe: Any) -> None:
        """Forget a pipeline that failed (or was never built): the next caller builds a new one
        (takes the lock)."""
        with self.lock:
            self.count -= 1
            self.lock.notify()

    def schedule(self, pipe: Any, planned: PlannedBatch) -> None:
        """Feed a batch's image data and parameter vectors and start ``pipe`` on it (returns at
        once); a pipeline that could not be fed is discarded."""
        try:
            feed(pipe, planned.data, planned.params, planned.partners)
        except BaseException:
            self.discard(pipe)  # possibly half fed: start over with a fresh pipeline
            raise

    def collect(self, pipe: Any, planned: PlannedBatch) -> Any:
        """Wait for ``pipe``'s batch: its images as float32 ``[B, H, W, 3]``, a NumPy array or a
        CUDA tensor (``images_on_device``), copied once (DALI reuses its buffers at the next run).
        :class:`~detaug.planning.DecodeFailure` when DALI failed on the batch; ``ValueError``
        when its images differ in shape."""
        try:
            images = pipe.outputs()[0]
        except (RuntimeError, IndexError) as err:  # DALI's message names the operator, not the samples
            raise DecodeFailure(planned, err) from err
        if not images.is_dense_tensor():
            shapes = sorted({tuple(images[k].shape()) for k in range(len(images))})
            raise ValueError(
                f"the batch's images have different shapes {shapes}; a Keras batch is one "
                "[B, H, W, 3] array: end the recipe with Resize((h, w)), LetterBox or RandomResizedCrop"
            )
        if self.device_id is None:
            return np.array(images.as_tensor(), dtype=np.float32)  # one pass: copy and convert
        out = _gpu_float32(images, self.device_id, self._streams, on_host=not self.images_on_device)
        return hand_over(out, self.backend) if self.images_on_device else out

    # -- prefetched batches (the caller holds the lock) ---------------------------------------------

    def hold(self, key: tuple[int, int], pipe: Any, planned: PlannedBatch) -> None:
        """Keep ``pipe``, scheduled on ``planned``, for the call that asks for ``key``
        ``(epoch, index)`` (the caller holds the lock). When another call already holds ``key``
        (two readers walking the same batches, as Keras' adapters do when they peek at the first
        batch), ``pipe``'s batch is dropped and ``pipe`` goes back to the idle ones: replacing the
        entry would lose a pipeline for good, and the pool would wait forever once all are lost."""
        if key in self.prefetched:
            if self._reclaim(pipe):
                self.idle.append(pipe)
            self.lock.notify()
            return
        self.prefetched[key] = (pipe, planned)
        self.lock.notify()  # a caller waiting in acquire may take it over (else it sleeps on)

    def take(self, key: tuple[int, int]) -> tuple[Any, PlannedBatch | None]:
        """The pipeline holding ``key``'s batch and its plan, or ``(None, None)``."""
        return self.prefetched.pop(key, (None, None))

    def drop_prefetched(self) -> None:
        """Wait for and drop the prefetched batches (counted in ``wasted``)."""
        for pipe, _ in self.prefetched.values():
            if self._reclaim(pipe):
                self.idle.append(pipe)
        self.prefetched = {}
        self.lock.notify_all()

    def close(self) -> None:
        """Drop the prefetched batches and forget the idle pipelines (their memory goes when
        collected); pipelines running a call's batch are kept by that call."""
        self.drop_prefetched()
        self.count -= len(self.idle)
        self.idle = []

    def _reclaim(self, pipe: Any) -> bool:
        """Wait for and drop the unwanted prefetched batch of ``pipe`` (counted as wasted);
        ``True`` when the pipeline is usable again, else it is forgotten."""
        self.wasted += 1
        if _drain(pipe):
            return True
        self.count -= 1
        return False


def _drain(pipe: Any) -> bool:
    """Wait for ``pipe``'s scheduled batch and drop it; ``False`` when the run failed (the
    pipeline is then unusable)."""
    try:
        pipe.outputs()
    except Exception:  # noqa: BLE001 - a batch nobody asked for: it raises again if it is
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
    far is in use and reused afterwards: as many as calls ever ran at once, for the sequence's
    lifetime.

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

    from detaug.torch import dali_images_to_torch

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
