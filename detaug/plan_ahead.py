"""Planning in worker processes, ahead of the pipeline: the pool both adapters share.

A :class:`PlanPool` holds ``workers`` processes (started by :func:`detaug.workers.start_pool`:
they work from a script without a main guard, from ``python -c`` and from Jupyter, and die
with their parent), each with a copy of one :class:`~detaug.planning.BatchPlanner`, and
returns :class:`~detaug.planning.PlannedBatch` futures for ``(epoch, step)``: with the image
bytes the worker read, or without them (``keep_data=False``: the caller reads them, which spares
the copies through the result pipe and the memory of plans held long before they are used).
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

from detaug.planning import (
    BatchPlanner,
    PlannedBatch,
    init_plan_worker,
    plan_job,
    planner_payload,
)
from detaug.workers import start_pool, stop_pool

__all__ = ["PlanPool"]


class PlanPool:
    """Worker processes planning one rank's batches.

    Args:
        planner: the planner each worker gets a copy of (decoded arrays stay here: workers plan
            them from their shapes).
        workers: the number of processes (> 0).

    The workers start on the first :meth:`submit` (or :meth:`start`), and stop on :meth:`close`
    or when the pool is collected. A planner that cannot be pickled (a recipe holding a lambda)
    disables the pool with a warning: :meth:`submit` then returns ``None`` and the caller plans
    in its own process (the results are the same).
    """

    def __init__(self, planner: BatchPlanner, workers: int) -> None:
        self.planner, self.workers = planner, int(workers)
        self.disabled = False
        self._pool: Any = None
        self._finalizer: weakref.finalize | None = None

    def start(self) -> bool:
        """Start the workers now; ``False`` when they cannot be used."""
        if self._pool is not None or self.disabled:
            return not self.disabled
        try:
            payload = planner_payload(self.planner)
        except Exception as err:  # noqa: BLE001 - e.g. a recipe holding a lambda
            self.give_up(f"the source and recipe cannot be pickled for the planning workers ({err})")
            return False
        try:
            self._pool = start_pool(self.workers, initializer=init_plan_worker, initargs=(payload,))
        except ValueError as err:  # the recipe or source refers to __main__ with no script to import
            self.give_up(str(err))
            return False
        self._finalizer = weakref.finalize(self, stop_pool, self._pool, False)
        return True

    def submit(self, epoch: int, step: int, bad: Mapping[int, str] | None = None, *, keep_data: bool = True) -> Future | None:
        """A future of batch ``step`` of ``epoch``; ``None`` when the pool is disabled. With
        ``keep_data=False`` the plan's ``data`` is ``None`` (load it with
        :meth:`~detaug.planning.BatchPlanner.load_data`)."""
        if not self.start():
            return None
        try:
            return self._pool.submit(plan_job if keep_data else plan_job_without_data, epoch, step, bad)
        except RuntimeError as err:  # BrokenProcessPool is a RuntimeError too
            self.give_up(f"the planning workers stopped ({err})")
            return None

    def give_up(self, why: str) -> None:
        """Stop using workers (a warning says why); the caller plans in its own process."""
        warnings.warn(f"{why}; batches are planned in the calling process from now on", RuntimeWarning, stacklevel=3)
        self.close(wait=False)
        self.disabled = True

    def close(self, wait: bool = True) -> None:
        """Stop the workers (queued jobs are cancelled, running ones get a short grace), waiting
        for them to end unless ``wait=False``; a later :meth:`submit` starts new ones."""
        if self._finalizer is not None and self._finalizer.detach() is not None:
            stop_pool(self._pool, wait)
        self._pool = self._finalizer = None


def plan_job_without_data(epoch: int, step: int, bad: Mapping[int, str] | None = None) -> PlannedBatch:
    """In a planning worker: :func:`~detaug.planning.plan_job` less the image data (``None``)."""
    planned = plan_job(epoch, step, bad)
    planned.data = None
    return planned
