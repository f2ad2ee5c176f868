"""Arrays from planning workers to their parent through shared memory, not the result pipe.

A planned batch carries its images' bytes (``PlannedBatch.data`` and ``partners``: about 2.5 MB
for 64 photos of 40 KB). Sent back through a worker's result pipe, they are pickled, read in
64 KiB pieces and unpickled in the parent, holding its interpreter lock for about 5 ms a batch:
more than the GPU pipeline needs for the batch (docs/benchmarks.md, "Where the loader's time
went"). Instead the worker writes them, with one ``writev``, into a file of the shared-memory
file system (``/dev/shm``) and sends only where each array lies (:class:`SharedArrays`: a few
hundred bytes); the parent reads them as NumPy views of its mapping of the file: no copy, no
pickling of image bytes.

The files are a ring (:class:`SlotRing`), made and owned by the parent: a job is given a free
file (a *slot*) to write into, and the slot is free again once no view of what the job wrote is
left (the views' one base array is collected). A slot's file is written again and again and
mapped once, its pages allocated once: a new file for every job cost a worker 22 us an image
(creating, allocating, writing) against 6 to write an existing one, and the parent 12-20 us
an image to map and unmap it (docs/benchmarks.md, "Planning in groups of batches"). A slot
grows (never shrinks) to the largest job written into it; the ring holds as many slots as were
ever leased at once, that is the plans a loader holds ahead (``detaug.plan_ahead.batches_ahead``),
until the pool closes.

Where ``/dev/shm`` is missing, not writable or full, :meth:`SlotRing.take` returns ``None`` or
:func:`write_arrays` fails and the arrays go through the pipe: the same batches, only slower
(the pool warns once: :class:`detaug.plan_ahead.PlanPool`). Files are named
``detaug_batch_<parent pid>_<pool>_...``; each is registered with multiprocessing's resource
tracker from its creation until the ring removes it (:meth:`SlotRing.close`), so that a run
killed outright (SIGKILL) leaves none: the tracker removes them when the run's processes are
gone (and warns of them). :func:`sweep` removes those of a prefix; at exit, and on a ``SIGTERM``
that kills the process (:func:`detaug.sigterm.on_sigterm`), a process removes those of all its
pools itself, and the tracker has nothing to warn of.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import mmap
import multiprocessing.resource_tracker as resource_tracker
import os
import secrets
import threading
import weakref
from dataclasses import dataclass, field

import numpy as np

from detaug.sigterm import on_sigterm
from detaug.worker_payload import SHARED_MEMORY_PREFIX

__all__ = ["SHM_DIR", "SharedArrays", "SlotRing", "file_prefix", "sweep", "write_arrays"]

SHM_DIR = "/dev/shm"
"""Where the files live: a memory file system (Linux; elsewhere :meth:`SlotRing.take` returns ``None``)."""

_ALIGN = 64  # each array starts at a multiple of this (bytes)
_IOV_MAX = 1024  # buffers per writev (POSIX's minimum IOV_MAX)


def file_prefix(owner: str = "") -> str:
    """The name prefix of the files written for this process and ``owner`` (a pool's token;
    empty: every pool of this process)."""
    return f"{SHARED_MEMORY_PREFIX}batch_{os.getpid()}_{owner}"


@dataclass
class SharedArrays:
    """Where a worker put a list of arrays: the slot file's ``path``, the bytes written
    (``size``: the file may be larger), and per array its byte ``offset``, ``shape`` and
    ``dtype`` (NumPy's ``dtype.str``)."""

    path: str
    size: int
    offsets: list[int]
    shapes: list[tuple[int, ...]]
    dtypes: list[str]


def write_arrays(path: str, arrays: list[np.ndarray]) -> SharedArrays | None:
    """In a worker: write ``arrays`` from the start of the slot file ``path`` (made by the
    parent's :class:`SlotRing`), growing it when they need more room than it has. ``None`` when
    that cannot be done (no arrays or no bytes, ``/dev/shm`` full): the caller sends the arrays
    as they are. :class:`FileNotFoundError` when the slot is gone: its ring was closed, and
    nobody will read the job's result."""
    arrays = [np.ascontiguousarray(a) for a in arrays]
    buffers: list[memoryview | bytes] = []
    offsets: list[int] = []
    end = 0
    for a in arrays:
        pad = -end % _ALIGN
        if pad:
            buffers.append(bytes(pad))
            end += pad
        offsets.append(end)
        if a.nbytes:
            buffers.append(memoryview(a.reshape(-1).view(np.uint8)))
        end += a.nbytes
    if end == 0:
        return None
    try:
        fd = os.open(path, os.O_WRONLY)  # never created here: a slot the ring removed stays gone
    except FileNotFoundError:
        raise
    except OSError:
        return None
    try:
        # Pages allocated once: a full /dev/shm fails here, not later with SIGBUS in the parent.
        if os.fstat(fd).st_size < end and hasattr(os, "posix_fallocate"):
            os.posix_fallocate(fd, 0, end)
        _write_all(fd, buffers)
    except OSError:
        return None
    finally:
        os.close(fd)
    return SharedArrays(path, end, offsets, [a.shape for a in arrays], [a.dtype.str for a in arrays])


@dataclass(eq=False)
class _Slot:
    path: str
    tracked: bool
    leased: bool = True
    mapped: mmap.mmap | None = None  # the parent's mapping of the whole file, as large as it was
    views: weakref.ref | None = field(default=None, repr=False)  # the base array of the lease's views


class SlotRing:
    """The shared-memory files (slots) one pool's workers write into, in the parent.

    :meth:`take` leases a free slot to a job (making a new file when none is free); :meth:`open`
    gives the arrays the job wrote as read-only views of the slot, which stays leased until the
    last of those views is collected; :meth:`give_back` frees a slot whose job wrote nothing
    that will be read (cancelled, failed, or sent through the pipe). Thread-safe: jobs are
    delivered in the pool's result thread, views are dropped anywhere.
    """

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix + secrets.token_hex(3) + "_"  # a ring of its own: a closed one's names stay unused
        self._slots: dict[str, _Slot] = {}
        self._free: list[_Slot] = []
        self._lock = threading.RLock()  # a collection inside a locked call may free a slot (give_back)
        self._closed = False

    def __len__(self) -> int:
        """The slots made so far."""
        return len(self._slots)

    @property
    def leased(self) -> int:
        """The slots leased now (to a job, or to the views of what it wrote)."""
        with self._lock:
            return sum(slot.leased for slot in self._slots.values())

    def take(self) -> str | None:
        """A slot for one job to write into (its file's path), leased until its views are gone or
        it is given back; ``None`` where no file can be made (no ``/dev/shm``, or the ring closed)."""
        with self._lock:
            if self._closed:
                return None
            if self._free:
                slot = self._free.pop()
                slot.leased = True
                return slot.path
            path = os.path.join(SHM_DIR, f"{self.prefix}{len(self._slots)}")
            tracked = _track(path)  # before the file exists: a process killed in between leaves none
            try:
                os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600))
            except OSError:
                if tracked:
                    _untrack(path)
                return None
            self._slots[path] = _Slot(path, tracked)
            return path

    def give_back(self, path: str) -> None:
        """Free the slot ``path``; a no-op while views of it live (they free it when collected),
        when it is free already, or once the ring is closed."""
        with self._lock:
            slot = self._slots.get(path)
            if slot is None or not slot.leased or self._closed:
                return
            if slot.views is not None and slot.views() is not None:
                return
            slot.leased, slot.views = False, None
            self._free.append(slot)

    def open(self, shared: SharedArrays) -> list[np.ndarray]:
        """The arrays a job wrote into its slot (``shared``), as read-only views of this
        process's mapping of the file; the slot stays leased while any of them (or any view of
        them) lives. Opening it again meanwhile gives views of the same base."""
        with self._lock:
            slot = self._slots[shared.path]
            whole = slot.views() if slot.views is not None else None
            if whole is None:
                whole = self._map(slot, shared.size)
                slot.views = weakref.ref(whole)
                # Every view below has ``whole`` as its base (NumPy stops there, the mapping not
                # being an array): the slot is free once it is collected.
                weakref.finalize(whole, self.give_back, slot.path)
        arrays = []
        kinds: dict[str, np.dtype] = {}
        for offset, shape, dtype in zip(shared.offsets, shared.shapes, shared.dtypes):
            if dtype == "|u1" and len(shape) == 1:  # encoded image bytes, nearly every array: a slice
                arrays.append(whole[offset:offset + shape[0]])
                continue
            kind = kinds.get(dtype)
            if kind is None:
                kind = kinds[dtype] = np.dtype(dtype)
            flat = whole[offset:offset + math.prod(shape) * kind.itemsize]
            arrays.append((flat if kind == np.uint8 else flat.view(kind)).reshape(shape))
        return arrays

    @staticmethod
    def _map(slot: _Slot, size: int) -> np.ndarray:
        """One uint8 array over the first ``size`` bytes of ``slot``'s mapping, mapped again when
        the file outgrew it."""
        if slot.mapped is None or len(slot.mapped) < size:  # the first job, or a larger one
            fd = os.open(slot.path, os.O_RDONLY)
            try:
                # MAP_POPULATE: every page mapped in this one call (Linux), not one fault per page later
                flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
                slot.mapped = mmap.mmap(fd, os.fstat(fd).st_size, flags=flags, prot=mmap.PROT_READ)
            finally:
                os.close(fd)
        return np.frombuffer(slot.mapped, dtype=np.uint8, count=size)

    def close(self) -> None:
        """Remove every slot's file (views held stay valid: the mapping outlives the name); the
        ring takes nothing more."""
        with self._lock:
            self._closed = True
            slots, self._free = list(self._slots.values()), []
        for slot in slots:
            _remove(slot.path, slot.tracked)
            slot.tracked = False


def _track(path: str) -> bool:
    """Register ``path`` with the resource tracker (POSIX shared memory names are the file
    names under /dev/shm); ``False`` where that cannot be done."""
    try:
        resource_tracker.register("/" + os.path.basename(path), "shared_memory")
    except Exception:  # noqa: BLE001 - no tracker here: the sweeps still remove leftovers
        return False
    return True


def _untrack(path: str) -> None:
    with contextlib.suppress(Exception):
        resource_tracker.unregister("/" + os.path.basename(path), "shared_memory")


def _remove(path: str, tracked: bool) -> bool:
    """Unlink ``path`` and, if it was there and registered, unregister it; whether it was there."""
    try:
        os.unlink(path)
    except OSError:
        return False
    if tracked:
        _untrack(path)
    return True


def _write_all(fd: int, buffers: list[memoryview | bytes]) -> None:
    """Write every buffer, in order, from the file's start (``writev`` in groups, short writes
    finished)."""
    for start in range(0, len(buffers), _IOV_MAX):
        group = buffers[start:start + _IOV_MAX]
        left = sum(len(b) for b in group)
        written = os.writev(fd, group)
        if written == left:
            continue
        rest = b"".join(bytes(b) for b in group)[written:]  # a short write (rare): the remainder
        while rest:
            rest = rest[os.write(fd, rest):]


def sweep(prefix: str) -> int:
    """Remove the files whose names start with ``prefix`` (:func:`file_prefix`); how many."""
    removed = 0
    with contextlib.suppress(OSError):
        for name in os.listdir(SHM_DIR):
            if name.startswith(prefix):  # slots of this process's rings, each registered
                removed += _remove(os.path.join(SHM_DIR, name), True)
    return removed


atexit.register(lambda: sweep(file_prefix()))  # a pool not closed may have left some
on_sigterm(lambda: sweep(file_prefix()))  # ... and so may a process killed by SIGTERM
