"""A worker's start (:mod:`detaug.workers`): the pickled initializer and its arguments, through a
shared memory segment when large (:class:`_SharedPayload`), and the first thing a worker runs
(:func:`_worker_init`: die with the parent, ignore SIGINT, read the payload, run the initializer)."""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import multiprocessing.resource_tracker
import multiprocessing.shared_memory
import os
import pickle
import secrets
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from detaug.pool_stop import _PoolState

__all__ = ["SHARED_MEMORY_PREFIX"]


SHARED_MEMORY_PREFIX = "detaug_"
"""Names of the payload segments: ``detaug_<parent pid>_<random hex>`` (in ``/dev/shm`` on Linux)."""

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class _SharedPayload:
    """The pickled initializer and arguments in a shared memory segment, made and filled in the
    parent; pickled (while a worker is spawned) as a :class:`_PayloadRef`. ``OSError`` when the
    segment cannot be made or has not room for ``payload`` (the caller sends it by pipe then)."""

    def __init__(self, payload: bytes, workers: int) -> None:
        self.size = len(payload)
        self.workers = workers
        self.name = f"{SHARED_MEMORY_PREFIX}{os.getpid()}_{secrets.token_hex(6)}"
        self.sem_name: str | None = None
        self.attached: Any = None
        self._lock = threading.Lock()
        # Registered with the resource tracker (here only): removed even if this process is killed.
        self.shm: multiprocessing.shared_memory.SharedMemory | None = multiprocessing.shared_memory.SharedMemory(
            self.name, create=True, size=max(1, self.size)
        )
        try:
            fd = getattr(self.shm, "_fd", -1)
            if fd >= 0 and hasattr(os, "posix_fallocate"):  # a full /dev/shm fails here, not with SIGBUS on write
                os.posix_fallocate(fd, 0, max(1, self.size))
            self.shm.buf[: self.size] = payload
            # Each worker releases it once, when it has its copy (spawn context: workers open it by name).
            self.attached = multiprocessing.get_context("spawn").Semaphore(0)
        except BaseException:
            self.release()
            raise
        self.sem_name = getattr(getattr(self.attached, "_semlock", None), "name", None)

    def __reduce__(self) -> tuple:
        return _PayloadRef, (self.name, self.size, self.attached)

    def unlink_when_read(self, state: _PoolState) -> None:
        """(A daemon thread) wait until every worker has its copy, then unlink the segment; give
        up when the pool stops first (stopping unlinks it)."""
        attached, got = self.attached, 0
        while attached is not None and got < self.workers and not state.stopped:
            if attached.acquire(timeout=0.2):
                got += 1
        del attached
        if got == self.workers:
            self.release()

    def release(self) -> None:
        """Close and unlink the segment and drop the semaphore (idempotent)."""
        with self._lock:
            shm, self.shm = self.shm, None
            self.attached = None  # its name is unlinked when collected (multiprocessing's finalizer)
        if shm is None:
            return
        with contextlib.suppress(OSError):
            shm.close()
        with contextlib.suppress(OSError):  # FileNotFoundError: gone already
            shm.unlink()


class _PayloadRef:
    """A worker's handle on the parent's :class:`_SharedPayload`: the segment's name and size,
    and the semaphore to release once read."""

    def __init__(self, name: str, size: int, attached: Any) -> None:
        self.name, self.size, self.attached = name, size, attached

    def read(self) -> bytearray:
        """The payload, copied out of the segment (which is closed, not unlinked: the parent does)."""
        try:
            shm = _attach_untracked(self.name)
            try:
                with shm.buf[: self.size] as view:
                    data = bytearray(view)
            finally:
                shm.close()
        finally:
            if self.attached is not None:  # also on failure: the parent does not wait for this worker in vain
                self.attached.release()
        return data  # pickle.loads takes it as is (no copy)


def _attach_untracked(name: str) -> multiprocessing.shared_memory.SharedMemory:
    """Attach to segment ``name`` without registering it with the resource tracker, which a
    spawned worker shares with its parent: the parent registered it, and unregisters it when it
    unlinks it; a second registration from here could reach the tracker after that and make it
    warn of a leak at exit. Python 3.13+ says so with ``track=False``; before, the registration
    is skipped for this one call (a worker is single-threaded while it starts)."""
    try:
        return multiprocessing.shared_memory.SharedMemory(name, track=False)  # type: ignore[call-arg]
    except TypeError:  # Python < 3.13
        pass
    tracker = multiprocessing.resource_tracker
    register = tracker.register
    tracker.register = lambda name, rtype: None if rtype == "shared_memory" else register(name, rtype)  # type: ignore[assignment]
    try:
        return multiprocessing.shared_memory.SharedMemory(name)
    finally:
        tracker.register = register  # type: ignore[assignment]


def _die_with_parent(parent_pid: int) -> None:
    """Get SIGKILL when the parent dies (Linux), or poll for it (elsewhere)."""
    armed = False
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            armed = libc.prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)) == 0
        except (OSError, AttributeError):
            armed = False
    if os.getppid() != parent_pid:  # it died before the signal was armed
        os._exit(1)
    if not armed:

        def watch() -> None:
            while os.getppid() == parent_pid:
                time.sleep(0.5)
            os._exit(1)

        threading.Thread(target=watch, name="detaug-parent-watch", daemon=True).start()


def _worker_init(parent_pid: int, payload: bytes | _PayloadRef) -> None:
    """First thing in a worker: die with the parent, ignore SIGINT, read the payload (from shared
    memory when it is there), then the user's initializer."""
    _die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # also drops a SIGINT pending since the spawn
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    if isinstance(payload, _PayloadRef):
        payload = payload.read()
    initializer, initargs = pickle.loads(payload)
    if initializer is not None:
        initializer(*initargs)
