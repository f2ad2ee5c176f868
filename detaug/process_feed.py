"""A loader's batches made in a process of its own (``DetectionLoader(feed_process=True)``).

In the training process a loader's feed (feeding DALI, collecting its outputs, building the
targets) is Python that shares the interpreter lock with the training thread; a fast model whose
host work paces its step loses that time (docs/loader.md, "Feeding a fast model"). Here the
whole loader - its DALI pipeline, planning workers and feed - runs in one spawned process (a
:func:`detaug.workers.start_pool` pool of one worker: parent-death signal, ``SIGINT`` left to
the parent, the main script not imported), and its batches reach the trainer through PyTorch's
own inter-process sharing (``torch.multiprocessing``: CUDA IPC on the GPU, shared memory on the
CPU), with the producer's event waited for on the caller's stream.

On a GPU the two processes' kernels share the GPU the way two processes do: without NVIDIA's
Multi-Process Service (MPS) they take turns in time slices, which can cost a GPU-bound model
more than the feed's interpreter time saves; under MPS they run side by side. Measured with the
bench's fast detector at batch 64, per-image dicts, side by side under MPS
(docs/notes/2026-11-benchmark-log.md, 2026-11-28): 0.89 and 0.92x of the model's ceiling against
0.79 and 0.85x for the loader in the training process on an H100, 0.79 and 0.82x against 0.72
and 0.75x on a slower H200.

Memory: a batch handed out is kept (:meth:`ProcessFeed.hold`) until the caller's stream has run
the work queued on it, since the child may reuse the memory once this process lets it go; up to
``2 * JOB_BATCHES * depth`` batches are held, besides the jobs in flight.

The child (:func:`_open`, :func:`_take`) keeps one :class:`~detaug.torch.DetectionLoader`
(the class is passed in: this module imports no loader) made from the parent's arguments, with
``feed_process=False`` and the targets ``"concat"`` for the per-image forms, which the parent
splits into views; a batch crosses as its images and the one allocation its targets view
(:func:`_pack`). It hands over batches in order from any ``(epoch, step)`` the parent asks for. Warnings and findings are not
said in the child: each batch carries its :class:`~detaug.planned_batch.BatchFindings` and the
worker pool's deferred messages, which the parent records as its own loader would.
"""

from __future__ import annotations

import time
import warnings
from collections import deque
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable

import torch

from detaug.workers import start_pool, stop_pool

__all__ = ["ProcessFeed"]

#: Batches a job of the child returns at most (one DALI run's worth is typical).
JOB_BATCHES = 4

#: The child's state: "loader" (or "error", what building it raised), "iterator", "at" (epoch, step)
#: of the iterator's next batch, and what the loader recorded of the batch it yielded last
#: ("findings", "deferred": the worker pool's messages).
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
        self._pool = start_pool(1, _open, (make, loader_args, loader_kwargs))
        self._jobs: deque[tuple[tuple[int, int], Future]] = deque()  # (epoch, first step) of each job in flight
        self._held: deque[tuple[Any, Any]] = deque()  # batches handed out, with the event that frees them
        self._failed: tuple[tuple[int, int], BaseException] | None = None  # where a job's error is raised
        self.pid: int = next(iter(self._pool._processes))  # start_pool started it
        try:
            self._pool.submit(_built).result()  # raises what building the loader raised
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
        return f"(pid {self.pid}) was killed by signal {-code}" if code < 0 else f"(pid {self.pid}) exited with status {code}"

    def take(self, epoch: int, step: int, steps: int, stats: Any = None) -> list[tuple]:
        """The batches from ``(epoch, step)`` on (at least one, at most a job's), made by the
        child: ``(step, findings, deferred, images, targets, counts, image_ids)`` each; jobs for
        the batches after them are submitted up to ``depth`` ahead (none past ``steps``, the
        epoch's batches). Jobs in flight for other positions are dropped. ``stats`` (a
        :class:`~detaug.feeder.FeedStats`) counts the take and any wait for the child."""
        if self._failed is not None and self._failed[0] == (epoch, step):  # the batch after a job's last one
            failed, self._failed = self._failed[1], None
            raise failed
        while self._jobs and self._jobs[0][0] != (epoch, step):
            self._jobs.popleft()[1].cancel()  # a stale job's batches are freed when its result is dropped
        if not self._jobs:
            self._jobs.append(((epoch, step), self._pool.submit(_take, epoch, step, JOB_BATCHES)))
        (_, future) = self._jobs[0]
        if stats is not None:
            if not future.done():
                started = time.perf_counter()
                future.exception()  # waits
                stats.not_ready += 1
                stats.waited_s += time.perf_counter() - started
        batches, failed = future.result()
        made = [(step_, findings, deferred, images, _unpack(*packed), counts, ids)
                for step_, findings, deferred, images, packed, counts, ids in batches]
        self._jobs.popleft()
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
            self._jobs.append(((epoch, at), self._pool.submit(_take, epoch, at, JOB_BATCHES)))
        if self.device.type == "cuda":  # the pool's result thread rebuilt the tensors on the default stream
            torch.cuda.current_stream(self.device).wait_stream(torch.cuda.default_stream(self.device))
        return made

    def hold(self, batch: Any) -> None:
        """Keep a batch handed out until the caller's stream has run what it queued on it (the
        child may reuse its memory as soon as the last tensor here is freed)."""
        event = None
        if self.device.type == "cuda":
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.device))
        self._held.append((event, batch))
        while self._held and (len(self._held) > 2 * JOB_BATCHES * self.depth
                              or self._held[0][0] is None or self._held[0][0].query()):
            event, _ = self._held.popleft()
            if event is not None:
                event.synchronize()  # done already but for the oldest beyond the bound

    def drop_ahead(self) -> None:
        """Forget the jobs in flight and an error not raised yet (an iteration ended early)."""
        self._failed = None
        while self._jobs:
            self._jobs.popleft()[1].cancel()

    def close(self) -> None:
        """Stop the child (its loader and workers with it)."""
        self.drop_ahead()
        while self._held:
            event, _ = self._held.popleft()
            if event is not None:
                event.synchronize()
        stop_pool(self._pool, wait=True)


def _pack(tensors: dict[str, torch.Tensor]) -> tuple[list[torch.Tensor], list[tuple]]:
    """``tensors`` as the few allocations they view (one on a GPU: :mod:`detaug.handover`'s
    buffer) and where each tensor lies in them: what crosses the process boundary (each tensor
    sent on its own would cost an IPC event and a reference count of its own)."""
    bases: list[torch.Tensor] = []
    where: dict[int, int] = {}
    layout = []
    for name, tensor in tensors.items():
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key not in where:
            where[key] = len(bases)
            bases.append(torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(storage))
        layout.append((name, where[key], tensor.dtype, tuple(tensor.shape), tuple(tensor.stride()),
                       tensor.storage_offset()))
    return bases, layout


def _unpack(bases: list[torch.Tensor], layout: list[tuple]) -> dict[str, torch.Tensor]:
    """The tensors :func:`_pack` packed, viewing the allocations received."""
    return {name: torch.empty(0, dtype=dtype, device=bases[k].device).set_(bases[k].untyped_storage(), offset, shape,
                                                                          stride)
            for name, k, dtype, shape, stride, offset in layout}


# -- the child -------------------------------------------------------------------------------


def _open(make: Callable[..., Any], loader_args: tuple, loader_kwargs: dict[str, Any]) -> None:
    """The child's initializer: build the loader, ``make(*loader_args, **loader_kwargs)`` (an
    error is kept for the first job to raise: an initializer's error would break the pool with
    no message), its findings kept for the parent instead of warned of."""
    warnings.simplefilter("ignore")  # the parent says what the child finds
    try:
        loader = make(*loader_args, **loader_kwargs)
    except BaseException as err:  # noqa: BLE001 - raised by the first job
        _CHILD["error"] = err
        return

    def record(findings: Any) -> None:  # instead of the loader's own, which warns
        deferred = loader._pool.deferred if loader._pool is not None else []
        _CHILD["findings"], _CHILD["deferred"], deferred[:] = findings, list(deferred), []

    loader._record = record
    _CHILD["loader"] = loader


def _built() -> None:
    """Raise what building the child's loader raised, if anything."""
    if "error" in _CHILD:
        raise _CHILD["error"]


def _take(epoch: int, step: int, count: int) -> tuple[list[tuple], BaseException | None]:
    """Up to ``count`` batches of ``epoch`` from ``step`` on (fewer at the epoch's end), and the
    error that ended them early (``None``): the batches before a failed one are handed out first,
    as the loader in the caller's process does."""
    loader = _CHILD["loader"]
    if _CHILD.get("at") != (epoch, step):
        iterator = _CHILD.pop("iterator", None)
        if iterator is not None:
            iterator.close()
        loader.load_state_dict({"epoch": epoch, "step": step})
        _CHILD["iterator"] = iter(loader)
    iterator, made = _CHILD["iterator"], []
    try:
        for _ in range(count):
            try:
                images, targets = next(iterator)
            except StopIteration:
                break
            counts = targets["num_boxes"].tolist()
            image_ids = targets["image_id"].tolist()
            made.append((loader._step - 1, _CHILD["findings"], _CHILD["deferred"], images, _pack(targets), counts,
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
