"""Arrays from a planning worker to its parent through shared memory, not the result pipe.

A planned batch carries its images' bytes (``PlannedBatch.data`` and ``partners``: about 2.5 MB
for 64 photos of 40 KB). Sent back through a worker's result pipe, they are pickled, read in
64 KiB pieces and unpickled in the parent, holding its interpreter lock for about 5 ms a batch:
more than the GPU pipeline needs for the batch (docs/benchmarks.md, "Where the loader's time
went"). Instead the worker writes them, with one ``writev``, into a new file of the shared-memory
file system (``/dev/shm``) and sends only where each array lies (:class:`SharedArrays`: a few
hundred bytes). The parent maps the file read-only, removes its name at once and gets NumPy
views of the mapping: no copy, no pickling of image bytes; the memory is freed when the last
view is collected.

Where ``/dev/shm`` is missing, not writable or full, :func:`share` returns ``None`` and the
arrays go through the pipe as before: the same batches, only slower (the pool warns once:
:class:`detaug.plan_ahead.PlanPool`). Files are named
``detaug_batch_<parent pid>_<pool>_...``; :func:`sweep` removes those a stopped pool left
behind (a result being written when its worker was stopped); at exit, a process removes those
of all its pools. Each file is registered with multiprocessing's resource tracker from its
creation until the parent unlinks it, so that a run killed outright (SIGKILL, SIGTERM) leaves
none either: the tracker removes them when the run's processes are gone.
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
from dataclasses import dataclass

import numpy as np

from detaug.workers import SHARED_MEMORY_PREFIX

__all__ = ["SHM_DIR", "SharedArrays", "file_prefix", "share", "sweep"]

SHM_DIR = "/dev/shm"
"""Where the files live: a memory file system (Linux; elsewhere :func:`share` returns ``None``)."""

_ALIGN = 64  # each array starts at a multiple of this (bytes)
_IOV_MAX = 1024  # buffers per writev (POSIX's minimum IOV_MAX)
_LOCK = threading.Lock()  # opening is idempotent: a done-callback and the caller may race


def file_prefix(owner: str = "") -> str:
    """The name prefix of the files written for this process and ``owner`` (a pool's token;
    empty: every pool of this process)."""
    return f"{SHARED_MEMORY_PREFIX}batch_{os.getpid()}_{owner}"


@dataclass
class SharedArrays:
    """Where a worker put a list of arrays: the file's ``path``, and per array its byte
    ``offset``, ``shape`` and ``dtype`` (NumPy's ``dtype.str``)."""

    path: str
    size: int
    offsets: list[int]
    shapes: list[tuple[int, ...]]
    dtypes: list[str]
    tracked: bool = False
    _arrays: list[np.ndarray] | None = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_arrays"] = None  # views never travel
        return state

    def open(self) -> list[np.ndarray]:
        """The arrays, read-only views of the file mapped into this process (the file's name is
        removed at once; the memory lives as long as the views). Idempotent and thread-safe."""
        with _LOCK:
            if self._arrays is None:
                fd = os.open(self.path, os.O_RDONLY)
                try:
                    # MAP_POPULATE: every page mapped in this one call (Linux), not one fault per page later
                    flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
                    mapped = mmap.mmap(fd, self.size, flags=flags, prot=mmap.PROT_READ)
                finally:
                    os.close(fd)
                    _remove(self.path, self.tracked)
                # One uint8 array over the mapping, sliced and viewed per array (a few hundred
                # nanoseconds each: a batch has one per image).
                whole = np.frombuffer(mapped, dtype=np.uint8)
                arrays = []
                for offset, shape, dtype in zip(self.offsets, self.shapes, self.dtypes):
                    kind = np.dtype(dtype)
                    flat = whole[offset:offset + math.prod(shape) * kind.itemsize]
                    arrays.append((flat if kind == np.uint8 else flat.view(kind)).reshape(shape))
                self._arrays = arrays
            return self._arrays


def share(arrays: list[np.ndarray], prefix: str) -> SharedArrays | None:
    """Write ``arrays`` into one new file under :data:`SHM_DIR` named ``prefix`` + a random
    suffix; ``None`` (nothing left behind) when that cannot be done: the caller sends the
    arrays as they are."""
    if not arrays or not os.path.isdir(SHM_DIR):
        return None
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
    path = os.path.join(SHM_DIR, f"{prefix}{secrets.token_hex(6)}")
    tracked = _track(path)  # before the file exists: a process killed in between leaves none
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except OSError:
        if tracked:
            _untrack(path)
        return None
    try:
        try:
            if hasattr(os, "posix_fallocate"):  # a full /dev/shm fails here, not later with SIGBUS
                os.posix_fallocate(fd, 0, end)
            _write_all(fd, buffers)
        finally:
            os.close(fd)
    except OSError:
        _remove(path, tracked)
        return None
    return SharedArrays(path, end, offsets, [a.shape for a in arrays], [a.dtype.str for a in arrays], tracked)


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
    """Unlink ``path`` and, if it was registered, unregister it; whether it was there."""
    try:
        os.unlink(path)
        removed = True
    except OSError:
        removed = False
    if tracked:
        _untrack(path)
    return removed


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
            if name.startswith(prefix):  # written by this process's workers, each registered
                removed += _remove(os.path.join(SHM_DIR, name), True)
    return removed


atexit.register(lambda: sweep(file_prefix()))  # a pool stopped without waiting may have left some
