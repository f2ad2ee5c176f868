"""Plan-ahead for a random-access sequence: the plans of the current and the next epoch.

A Keras ``Sequence`` may ask for any batch in any order (``fit(shuffle=True)`` permutes them),
but which samples and seeds each batch of an epoch has is known in advance
(:mod:`detaug.planning`). :class:`PlanAhead` has a :class:`~detaug.plan_ahead.PlanPool` of
worker processes plan them, in batch order, ahead of the ``seq[i]`` calls; a call takes its
batch's plan, waiting for it when a worker has it in hand, and plans the batch itself when its
job has not started (the results are the same).

Memory: a plan is small (parameter vectors, boxes, labels: ~40 KB for a batch of 64 with a few
boxes each) but a worker's plan of encoded images also holds the bytes it read (~10 MB for 64
COCO JPEGs). Plans carry them for at most :data:`PLAN_AHEAD_DATA_BYTES` held at once (the first
plans of a run, and again as those are taken); the others are planned without them and the
calling thread reads the files when it feeds the batch (:meth:`BatchPlanner.load_data`, as it
does for decoded arrays), so a whole epoch planned ahead does not hold the dataset's bytes.
"""

from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, BrokenExecutor, Future, wait

from detaug.plan_ahead import PlanPool
from detaug.planned_batch import PlannedBatch
from detaug.planning import BatchPlanner

__all__ = ["PLAN_AHEAD_BATCHES", "PLAN_AHEAD_DATA_BYTES", "PlanAhead", "any_planned"]

#: Planned batches (done or in flight) held at most, per sequence: the current and the next epoch
#: are planned ahead whole up to this many batches; past it, further plans wait for the held ones
#: to be used.
PLAN_AHEAD_BATCHES = 4096

#: Image bytes (read by the workers) that the held plans carry at most, per sequence; plans past
#: it are made without them, and the calling thread reads the files when it feeds the batch.
PLAN_AHEAD_DATA_BYTES = 256 * 1024 * 1024


class PlanAhead:
    """The planning workers of one sequence and the plans of its current and next epochs.

    Args:
        planner: the sequence's planner (the workers get a copy).
        workers: planning processes (> 0).
        num_batches: batches per epoch.

    Jobs are submitted in batch order, the current epoch's first (those not yet taken), then the
    next epoch's, with at most ``window`` jobs in flight and ``limit`` plans held
    (:data:`PLAN_AHEAD_BATCHES`); each :meth:`take` tops them up. Moving to the next epoch keeps
    its plans; any other epoch change drops them all. A plan is used once: a batch taken again
    (or one whose job has not started when taken) is planned by the caller. Holds no reference to the
    sequence, so the pool's finalizer does not keep the sequence (and its DALI pipeline) alive.
    Not thread-safe: the sequence calls it under its lock.
    """

    def __init__(self, planner: BatchPlanner, workers: int, *, num_batches: int) -> None:
        self.pool = PlanPool(planner, workers)
        self.workers = int(workers)
        self.num_batches = num_batches
        self.window = max(64, 4 * self.workers)
        self.limit = PLAN_AHEAD_BATCHES
        self.data_bytes = PLAN_AHEAD_DATA_BYTES
        self.batch_bytes = 0  # the most image bytes a plan taken so far carried (0: none seen)
        self.plans: dict[tuple[int, int], Future] = {}  # (epoch, batch) -> job
        self.with_data: set[tuple[int, int]] = set()  # keys of the plans whose workers keep the image bytes
        self.reset()

    @property
    def disabled(self) -> bool:
        """The workers could not start or died: the caller plans everything."""
        return self.pool.disabled

    def reset(self) -> None:
        """Forget every plan (jobs not started are cancelled)."""
        for future in self.plans.values():
            future.cancel()
        self.plans = {}
        self.with_data = set()
        self.in_flight: list[Future] = []
        self.taken: set[tuple[int, int]] = set()  # (epoch, batch) taken, this epoch and the next: not to plan any more
        self.epoch: int | None = None
        self.cursor: tuple[int, int, int] | None = None  # (epoch, next batch to submit, batches left)

    def set_epoch(self, epoch: int) -> None:
        """Move to ``epoch``: the next epoch keeps its plans, any other starts afresh."""
        if epoch == self.epoch:
            return
        if self.epoch is None or epoch != self.epoch + 1:
            self.reset()
        else:
            for key in [k for k in self.plans if k[0] != epoch]:
                self.plans.pop(key).cancel()
                self.with_data.discard(key)
            self.taken = {k for k in self.taken if k[0] == epoch}
        self.epoch = epoch
        if self.cursor is None or self.cursor[0] != epoch:
            self.cursor = (epoch, 0, self.num_batches)

    def take(self, i: int, epoch: int) -> PlannedBatch | None:
        """Batch ``i``'s plan in ``epoch`` (its ``data`` ``None`` when the caller reads the
        images), ``None`` when the caller must plan it; raises the error of its job (an image
        that cannot be read, with ``on_error="raise"``). A plan of the next epoch (the
        sequence's prefetch across the end of an epoch) is taken without moving to it."""
        if self.disabled:
            return None
        if self.epoch is None or epoch != self.epoch + 1:
            self.set_epoch(epoch)
        self.taken.add((epoch, i))
        future = self.plans.pop((epoch, i), None)
        self.with_data.discard((epoch, i))
        self._top_up()
        if future is None or future.cancel():
            return None  # not submitted, or queued behind other jobs: planning here is as soon as waiting
        # Running (or done): its worker is ahead of planning here, so wait for it. Planning it
        # again here cost a batch of 256 tens of ms of the calling thread (docs/benchmarks.md,
        # "The main thread's cost per batch").
        err = future.exception()
        if isinstance(err, BrokenExecutor):
            self.pool.give_up(f"the planning workers stopped ({err})")
            return None
        planned = future.result()
        if planned.data is not None:
            self.batch_bytes = max(self.batch_bytes, sum(int(d.nbytes) for d in planned.data))
        return planned

    def start(self, epoch: int) -> list[Future]:
        """Submit ``epoch``'s plans (starting the workers); the jobs in flight."""
        if self.disabled:
            return []
        self.set_epoch(epoch)
        self._top_up()
        return list(self.in_flight)

    def close(self) -> None:
        """Stop the workers; the next :meth:`take` starts new ones."""
        self.reset()
        self.pool.close()

    def _data_slots(self) -> int:
        """Plans that may carry image bytes at once: ``workers`` until a plan's size is known,
        then as many as :attr:`data_bytes` holds (at least one)."""
        if not self.batch_bytes:
            return self.workers
        return max(1, self.data_bytes // self.batch_bytes)

    def _top_up(self) -> None:
        self.in_flight = [f for f in self.in_flight if not f.done()]
        while len(self.in_flight) < self.window and len(self.plans) < self.limit:
            epoch, j, left = self.cursor
            if not left:
                if epoch != self.epoch:
                    return  # the next epoch is submitted: no further
                epoch, j, left = epoch + 1, 0, self.num_batches
            self.cursor = (epoch, j + 1, left - 1)
            if (epoch, j) in self.taken:
                continue
            keep_data = len(self.with_data) < self._data_slots()
            future = self.pool.submit(epoch, j, keep_data=keep_data)
            if future is None:  # the pool is disabled (it said why)
                return
            self.plans[epoch, j] = future
            if keep_data:
                self.with_data.add((epoch, j))
            self.in_flight.append(future)


def any_planned(futures: list[Future], timeout: float | None) -> bool:
    """Whether one of the jobs ``futures`` (:meth:`PlanAhead.start`'s) planned its batch within
    ``timeout`` seconds: the workers are up (``False`` for none, or when they could not start)."""
    if not futures:
        return False
    done, _ = wait(futures, timeout=timeout, return_when=FIRST_COMPLETED)
    return any(not f.cancelled() and not isinstance(f.exception(), BrokenExecutor) for f in done)
