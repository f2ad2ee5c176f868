"""Planning in worker processes, ahead of the pipeline: the pool both adapters share.

A :class:`PlanPool` holds ``workers`` processes (started by :func:`detaug.workers.start_pool`:
they work from a script without a main guard, from ``python -c`` and from Jupyter, and die
with their parent), each with a copy of one :class:`~detaug.planning.BatchPlanner`, and
returns :class:`~detaug.planned_batch.PlannedBatch` futures for ``(epoch, step)``, or for several
consecutive steps planned by one job (:meth:`PlanPool.submit_many`: one ``plan_batch`` call for
the group, :meth:`~detaug.planning.BatchPlanner.plan_many`): with the image
bytes the worker read, or without them (``keep_data=False``: the caller reads them, which spares
the memory of plans held long before they are used). The image bytes come back through shared
memory (:mod:`detaug.shared_arrays`), not the result pipe: each job writes its batches' bytes
into a file of the pool's :class:`~detaug.shared_arrays.SlotRing`, and the futures hold plans
whose ``data`` and ``partners`` are read-only views of it (the file is written again by a later
job once no view of it is left). Where shared memory cannot take them (``/dev/shm``
missing, read-only or full, as in a container started with Docker's default 64 MB), they come
through the pipe, slower, and the pool says so once (a ``RuntimeWarning`` naming the folder).
Where ``/dev/shm`` cannot even hold the worker pool's semaphores (multiprocessing's queues need
them), no worker starts: the pool says so once, naming the folder, and the caller plans in its
own process (the same batches, slower). Either way the loader runs on.
"""

from __future__ import annotations

import os
import secrets
import warnings
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Any

import numpy as np

from detaug.masks import MASKS, PackedMasks, pack_masks
from detaug.plan_jobs import init_plan_worker, plan_group_job, planner_payload
from detaug.planned_batch import PlannedBatch
from detaug.planning import BatchPlanner
from detaug.sample_rows import SampleRows, row_ends
from detaug import shared_arrays
from detaug.shared_arrays import SharedArrays, SlotRing, file_prefix, sweep, write_arrays
from detaug.workers import start_pool, stop_pool

__all__ = ["AHEAD_BYTES", "GROUP_SAMPLES", "PlanPool", "batches_ahead", "group_size"]

#: Samples a planning job plans at once (:meth:`PlanPool.submit_many`): the recipe's per-call
#: costs are paid once for them. On the development machine, 4 batches of 64 planned together
#: cost 85 us an image against 119 one by one (docs/benchmarks.md, "Planning in groups of
#: batches"); past 256 the saving is smaller, and the plans held ahead (in /dev/shm) grow with
#: the group.
GROUP_SAMPLES = 256


#: Image bytes that the batches a loader has planned ahead carry, at most (they wait in shared
#: memory, which is the host's RAM): 1 GiB.
AHEAD_BYTES = 1 << 30


def group_size(batch_size: int) -> int:
    """Consecutive batches a planning job plans together: :data:`GROUP_SAMPLES` samples, at
    least one batch (4 batches of 64, 1 of 256)."""
    return max(1, GROUP_SAMPLES // max(1, int(batch_size)))


def batches_ahead(depth: int, workers: int, group: int, batch_bytes: int | None) -> int:
    """Batches a loader keeps submitted to its workers or fed to its pipeline: the pipeline's
    ``depth``, and per worker a group of ``group`` batches to plan and one queued. Until the
    image bytes a worker's batch carries are known (``batch_bytes`` ``None``), one group per
    worker; then as many as :data:`AHEAD_BYTES` holds, but always the depth and one group (0:
    the workers send no bytes, decoded arrays). Without workers, the depth."""
    if workers <= 0:
        return depth
    full = depth + 2 * workers * group
    if batch_bytes is None:
        return depth + workers * group
    if batch_bytes == 0:
        return full
    return min(full, max(depth + group, AHEAD_BYTES // batch_bytes))


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
        self.piped = _PipedNotice()  # plans whose image bytes came through the result pipe
        self.ring: SlotRing | None = None  # the files the workers write the image bytes into
        self._pool: Any = None
        self._finalizer: weakref.finalize | None = None
        #: Where :meth:`give_up` puts its message instead of warning (``None``: it warns): a
        #: loader whose batches are made in a background thread says it in the caller's thread.
        self.deferred: list[str] | None = None

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
        except OSError as err:  # /dev/shm missing, read-only or full: no semaphore, no worker pool
            self.give_up(f"the planning workers cannot start: {err}")
            return False
        self.ring = SlotRing(self.prefix)
        self._finalizer = weakref.finalize(self, _stop, self._pool, self.prefix, self.ring)
        return True

    def submit(self, epoch: int, step: int, bad: Mapping[int, str] | None = None, *, keep_data: bool = True) -> Future | None:
        """A future of batch ``step`` of ``epoch``; ``None`` when the pool is disabled. With
        ``keep_data=False`` the plan's ``data`` is ``None`` (load it with
        :meth:`~detaug.planning.BatchPlanner.load_data`)."""
        futures = self.submit_many(epoch, [step], bad, keep_data=keep_data)
        return None if futures is None else futures[0]

    def submit_many(self, epoch: int, steps: list[int], bad: Mapping[int, str] | None = None, *,
                    keep_data: bool = True) -> list[Future] | None:
        """Futures of batches ``steps`` of ``epoch``, planned by one job
        (:meth:`~detaug.planning.BatchPlanner.plan_many`: the same plans as one job each, for
        less CPU); ``None`` when the pool is disabled. Each future gets its batch's plan or its
        error. Cancelling one cancels the job while it waits, and with it the others; once the
        job runs, none can be cancelled (:meth:`submit`)."""
        if not self.start():
            return None
        ring = self.ring
        slot = ring.take() if keep_data else None  # None with keep_data: no shared memory, the pipe
        try:
            job = self._pool.submit(plan_group, epoch, list(steps), bad, slot, keep_data)
        except RuntimeError as err:  # BrokenProcessPool is a RuntimeError too
            if slot is not None:
                ring.give_back(slot)
            self.give_up(f"the planning workers stopped ({err})")
            return None
        return _members(job, len(steps), self.piped, ring, slot)

    def give_up(self, why: str) -> None:
        """Stop using workers (a warning says why, or :attr:`deferred` gets it); the caller plans
        in its own process."""
        message = f"{why}; batches are planned in the calling process from now on"
        if self.deferred is not None:
            self.deferred.append(message)
        else:
            warnings.warn(message, RuntimeWarning, stacklevel=3)
        self.close(wait=False)
        self.disabled = True

    def close(self, wait: bool = True) -> None:
        """Stop the workers (queued jobs are cancelled, running ones get a short grace), waiting
        for them to end unless ``wait=False``; a later :meth:`submit` starts new ones."""
        if self._finalizer is not None and self._finalizer.detach() is not None:
            stop_pool(self._pool, wait)
            self.ring.close()  # plans still held keep their views; results still to come are dropped
        if wait:  # also what workers stopped earlier (a pool given up) left
            sweep(self.prefix)
        self._pool = self._finalizer = None


class _PipedNotice:
    """Counts the plans whose image bytes came through the result pipe (shared memory refused
    them) and warns the first time. The jobs' callbacks hold this, not the pool, so that they
    do not keep the pool (and its workers) alive."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1
        if self.count == 1:
            warnings.warn(
                f"planned batches come back through the planning workers' pipes, not shared memory: "
                f"{_shm_state()}; the loader runs slower. In a container, give it more shared memory "
                f"(docker run --ipc=host, or --shm-size of 1 GB per training process)", RuntimeWarning, stacklevel=2)


def _stop(pool: Any, prefix: str, ring: SlotRing) -> None:
    """The finalizer of a pool collected or alive at exit: stop it, remove its files."""
    stop_pool(pool, False)
    ring.close()
    sweep(prefix)


@dataclass
class _Packed:
    """A plan on its way from a worker, in few objects: its image arrays (``data``, then each
    partner slot's, ``B`` each) at ``span`` of its job's arrays in shared memory (``slots[k]``:
    whether partner slot ``k`` had arrays, not ``None``), and its per-sample box arrays
    (``boxes``, ``labels``, each field) concatenated in ``joined`` (``counts[i]``: sample ``i``'s
    boxes). Unpickling and unpacking then cost the parent a few objects a batch, not several
    hundred small arrays."""

    planned: PlannedBatch
    span: tuple[int, int] | None
    slots: list[bool]
    counts: list[int] | None = None
    joined: dict[str, np.ndarray] | None = None
    piped: bool = False  # image arrays that shared memory could not take, in ``planned`` instead

    def unpack(self, shared: list[np.ndarray] | None = None) -> PlannedBatch:
        """The plan, its image arrays views of ``shared`` (its job's arrays) where they travelled there."""
        planned = self.planned
        if self.span is not None:
            arrays = shared[self.span[0]:self.span[1]]
            b = len(arrays) // (1 + sum(self.slots))
            chunks = (arrays[k:k + b] for k in range(b, len(arrays), b))
            planned.data = arrays[:b]
            planned.partners = [next(chunks) if had else None for had in self.slots]
        if self.joined is not None:
            if isinstance(self.joined.get(MASKS), PackedMasks):  # packed for the trip (pack)
                self.joined[MASKS] = self.joined[MASKS].unpack()
            joined, counts = self.joined, list(self.counts)  # per sample, views made when read:
            ends = row_ends(counts)
            planned.boxes = SampleRows(joined, name="boxes", ends=ends)
            planned.labels = SampleRows(joined, name="labels", ends=ends)
            if len(joined) > 2:
                planned.fields = SampleRows({k: a for k, a in joined.items() if k not in ("boxes", "labels")}, ends=ends)
            planned.joined = (counts, joined)  # the loader's targets take these as they are
        else:
            for values in planned.fields or []:  # masks packed for the trip (pack)
                if isinstance(values.get(MASKS), PackedMasks):
                    values[MASKS] = values[MASKS].unpack()
        return planned


@dataclass
class _Group:
    """What a plan job returns: per batch its :class:`_Packed` plan (a plan without its data
    where the job was asked so; an error where the batch could not be planned), and where the
    batches' image arrays lie in shared memory (``shared``, ``None`` where none went there)."""

    plans: list[_Packed | PlannedBatch | Exception]
    shared: SharedArrays | None = None


def _joined(arrays: list[Any]) -> np.ndarray | None:
    """``arrays`` concatenated along their first axis, where slicing the result gives each back
    as it was (all arrays of one dtype and trailing shape); else ``None``."""
    if not arrays or not all(isinstance(a, np.ndarray) and a.ndim for a in arrays):
        return None
    first = arrays[0]
    if any(a.dtype != first.dtype or a.shape[1:] != first.shape[1:] for a in arrays):
        return None
    return np.concatenate(arrays)


def _pack_boxes(planned: PlannedBatch) -> tuple[list[int], dict[str, np.ndarray]] | None:
    """The per-sample ``boxes``, ``labels`` and fields of ``planned`` joined (and the sample
    counts), or ``None`` where they cannot be rebuilt exactly by slicing."""
    counts = [len(labels) for labels in planned.labels]
    names = list(planned.fields[0]) if planned.fields else []
    if planned.fields and any(list(f) != names for f in planned.fields):
        return None
    columns = {"boxes": planned.boxes, "labels": planned.labels}
    columns.update((name, [f[name] for f in planned.fields]) for name in names)
    joined = {}
    for name, arrays in columns.items():
        if [len(a) for a in arrays] != counts or (flat := _joined(arrays)) is None:
            return None
        joined[name] = flat
    return counts, joined


def plan_group(epoch: int, steps: list[int], bad: Mapping[int, str] | None, slot: str | None,
               keep_data: bool = True) -> _Group:
    """In a planning worker: batches ``steps`` of ``epoch`` (:func:`~detaug.plan_jobs.plan_group_job`),
    each packed for the trip (:func:`pack`), their image arrays written together into the shared
    memory file ``slot`` (``None``, or no room there: they travel in the plans); without their
    image data where ``keep_data`` is false; a batch that could not be planned as its error."""
    plans: list[_Packed | PlannedBatch | Exception] = []
    arrays: list[np.ndarray] = []
    for planned in plan_group_job(epoch, steps, bad):
        if isinstance(planned, Exception):
            plans.append(planned)
        elif not keep_data:
            planned.data = None
            plans.append(planned)
        else:
            packed = pack(planned)
            images = planned.image_arrays() if planned.data is not None else []
            if images:
                packed.span = (len(arrays), len(arrays) + len(images))
                arrays.extend(images)
            plans.append(packed)
    try:
        shared = write_arrays(slot, arrays) if slot is not None and arrays else None
        piped = shared is None and any(a.nbytes for a in arrays)
    except FileNotFoundError:  # the pool was closed meanwhile: nobody takes these plans
        shared, piped = None, False
    for packed in plans:
        if isinstance(packed, _Packed) and packed.span is not None:
            if shared is None:
                packed.span, packed.piped = None, piped
            else:
                packed.planned.data = packed.planned.partners = None  # back from shared memory on unpacking
    return _Group(plans, shared)


def pack(planned: PlannedBatch) -> _Packed:
    """``planned`` packed for the trip (:class:`_Packed`): its box arrays joined (as they are
    where that cannot be done); its image arrays are placed by :func:`plan_group`."""
    packed = _Packed(planned, None, [images is not None for images in planned.partners or []])
    if (boxes := _pack_boxes(planned)) is not None:
        packed.counts, packed.joined = boxes
        planned.boxes = planned.labels = []  # back from ``joined`` on unpacking
        if planned.fields and planned.fields[0]:
            planned.fields = []
        if MASKS in packed.joined:  # 0/1 masks, eight pixels a byte (detaug.masks.PackedMasks)
            packed.joined[MASKS] = pack_masks(packed.joined[MASKS])
    else:
        planned.fields = [{**f, MASKS: pack_masks(f[MASKS])} if MASKS in f else f for f in planned.fields]
    return packed


class _Member(Future):
    """The future of one plan of a plan job (which plans one batch or several: :func:`_members`).
    It can be cancelled while its job can, which cancels the job's other plans too: not once
    the job runs."""

    def __init__(self, job: Future) -> None:
        super().__init__()
        self._job: Future | None = job  # None once delivered (no cycle through the job's callback)

    def cancel(self) -> bool:
        """Cancel the job if it has not started, as a job's own future does: ``False`` once it
        runs (its results will come, unpacked, and their files removed) or is done."""
        job = self._job
        if job is None or not job.cancel():
            return False
        return super().cancel()  # already cancelled by _deliver, as the job's callback: True


def _members(job: Future, count: int, on_piped: Callable[[], None] | None = None,
             ring: SlotRing | None = None, slot: str | None = None) -> list[_Member]:
    """The futures of the ``count`` plans ``job`` returns (a :class:`_Group`). Once the job is
    done they are unpacked from ``ring``'s ``slot`` in the pool's result thread, so that results
    nobody takes are unpacked too and the slot freed when they are dropped (given back at once
    when the job wrote nothing there); ``on_piped`` is called for each plan whose image bytes
    came through the pipe instead."""
    members = [_Member(job) for _ in range(count)]
    job.add_done_callback(lambda done: _deliver(done, members, on_piped, ring, slot))
    return members


def _shm_state() -> str:
    """What :data:`~detaug.shared_arrays.SHM_DIR` has room for, in words."""
    where = shared_arrays.SHM_DIR
    try:
        stat = os.statvfs(where)
    except OSError:
        return f"{where} is missing"
    if stat.f_flag & os.ST_RDONLY or not os.access(where, os.W_OK):
        return f"{where} is read-only"
    return f"{where} has {_in_words(stat.f_bavail * stat.f_frsize)} free of {_in_words(stat.f_blocks * stat.f_frsize)}"


def _in_words(size: int) -> str:
    """A byte count in MiB (KiB below 10 MiB)."""
    return f"{size / 2**20:,.0f} MiB" if size >= 10 * 2**20 else f"{size / 2**10:,.0f} KiB"


def _deliver(job: Future, members: list[_Member], on_piped: Callable[[], None] | None = None,
             ring: SlotRing | None = None, slot: str | None = None) -> None:
    try:
        _settle(job, members, on_piped, ring)
    finally:
        for member in members:  # the job keeps this callback, and with it the members: let them go
            member._job = None
        if ring is not None and slot is not None:
            ring.give_back(slot)  # a no-op while views of what the job wrote live: they free it


def _settle(job: Future, members: list[_Member], on_piped: Callable[[], None] | None, ring: SlotRing | None) -> None:
    if job.cancelled():
        for member in members:
            Future.cancel(member)
        return
    error = job.exception()
    group = None if error is not None else job.result()
    results = [error] * len(members) if group is None else group.plans
    try:
        shared = ring.open(group.shared) if group is not None and group.shared is not None else None
    except (OSError, KeyError) as err:  # the mapping failed: the caller stops using workers, saying why
        error = RuntimeError(f"planned batches could not be read from shared memory ({err})")
        results, shared = [error] * len(members), None
    for member, result in zip(members, results):
        try:
            if isinstance(result, BaseException):
                member.set_exception(result)
            else:
                if on_piped is not None and getattr(result, "piped", False):
                    on_piped()
                member.set_result(result.unpack(shared) if isinstance(result, _Packed) else result)
        except InvalidStateError:  # cancelled meanwhile: nobody wants it (its views go with it)
            pass
