"""Planning in worker processes, ahead of the pipeline: the pool both adapters share.

A :class:`PlanPool` holds ``workers`` processes (started by :func:`detaug.workers.start_pool`:
they work from a script without a main guard, from ``python -c`` and from Jupyter, and die
with their parent), each with a copy of one :class:`~detaug.planning.BatchPlanner`, and
returns :class:`~detaug.planning.PlannedBatch` futures for ``(epoch, step)``: with the image
bytes the worker read, or without them (``keep_data=False``: the caller reads them, which spares
the memory of plans held long before they are used). The image bytes come back through shared
memory (:mod:`detaug.shared_arrays`), not the result pipe: the futures hold plans whose ``data``
and ``partners`` are read-only views of it.
"""

from __future__ import annotations

import contextlib
import secrets
import warnings
import weakref
from collections.abc import Mapping
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Any

from detaug.planning import (
    BatchPlanner,
    PlannedBatch,
    init_plan_worker,
    plan_job,
    planner_payload,
)
from detaug.shared_arrays import SharedArrays, file_prefix, share, sweep
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
        self.prefix = file_prefix(secrets.token_hex(4) + "_")  # this pool's shared-memory files
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
        self._finalizer = weakref.finalize(self, _stop, self._pool, self.prefix)
        return True

    def submit(self, epoch: int, step: int, bad: Mapping[int, str] | None = None, *, keep_data: bool = True) -> Future | None:
        """A future of batch ``step`` of ``epoch``; ``None`` when the pool is disabled. With
        ``keep_data=False`` the plan's ``data`` is ``None`` (load it with
        :meth:`~detaug.planning.BatchPlanner.load_data`)."""
        if not self.start():
            return None
        try:
            if not keep_data:
                return self._pool.submit(plan_job_without_data, epoch, step, bad)
            return _Unpacked(self._pool.submit(plan_job_shared, epoch, step, bad, self.prefix))
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
            if wait:
                sweep(self.prefix)
        self._pool = self._finalizer = None


def _stop(pool: Any, prefix: str) -> None:
    """The finalizer of a pool collected or alive at exit: stop it, remove its files."""
    stop_pool(pool, False)
    sweep(prefix)


def plan_job_without_data(epoch: int, step: int, bad: Mapping[int, str] | None = None) -> PlannedBatch:
    """In a planning worker: :func:`~detaug.planning.plan_job` less the image data (``None``)."""
    planned = plan_job(epoch, step, bad)
    planned.data = None
    return planned


@dataclass
class _Packed:
    """A plan whose image arrays (``data``, then each partner slot's, ``B`` each) are in
    ``shared``; ``slots[k]``: whether partner slot ``k`` had arrays (not ``None``)."""

    planned: PlannedBatch
    shared: SharedArrays
    slots: list[bool]

    def unpack(self) -> PlannedBatch:
        arrays = self.shared.open()
        b = len(arrays) // (1 + sum(self.slots))
        chunks = (arrays[k:k + b] for k in range(b, len(arrays), b))
        self.planned.data = arrays[:b]
        self.planned.partners = [next(chunks) if had else None for had in self.slots]
        return self.planned


def plan_job_shared(epoch: int, step: int, bad: Mapping[int, str] | None, prefix: str) -> PlannedBatch | _Packed:
    """In a planning worker: :func:`~detaug.planning.plan_job` with its image arrays written to
    shared memory (files named ``prefix`` ...); the plan as it is where that cannot be done."""
    planned = plan_job(epoch, step, bad)
    partners = planned.partners or []
    arrays = list(planned.data or []) + [a for images in partners if images is not None for a in images]
    shared = share(arrays, prefix) if planned.data is not None and arrays else None
    if shared is None:
        return planned
    planned.data = planned.partners = None  # back from the shared file on unpacking
    return _Packed(planned, shared, [images is not None for images in partners])


class _Unpacked(Future):
    """The future of a plan job whose result, once there, is unpacked from shared memory (in
    the pool's result thread, so that results nobody takes are unpacked too and their files
    removed). Cancelling it cancels the job where it has not started."""

    def __init__(self, job: Future) -> None:
        super().__init__()
        self._job = job
        job.add_done_callback(self._transfer)

    def cancel(self) -> bool:
        self._job.cancel()
        return super().cancel()

    def _transfer(self, job: Future) -> None:
        if job.cancelled():
            super().cancel()
            return
        error = job.exception()
        try:
            if error is not None:
                self.set_exception(error)
                return
            result = job.result()
            self.set_result(result.unpack() if isinstance(result, _Packed) else result)
        except InvalidStateError:  # cancelled meanwhile: nobody wants it (unpacked, so its file is gone)
            pass
        except OSError as err:  # the mapping failed: the caller stops using workers, saying why
            with contextlib.suppress(InvalidStateError):
                self.set_exception(RuntimeError(f"a planned batch could not be read from shared memory ({err})"))
