"""SIGTERM: die as before, leaving nothing for the resource tracker (see :mod:`detaug.workers`):
the handler :func:`detaug.workers.start_pool` installs, and :func:`on_sigterm` callbacks."""

from __future__ import annotations

import contextlib
import multiprocessing.resource_tracker
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from detaug.pool_stop import _live

__all__ = ["on_sigterm"]


_sigterm_callbacks: list[Callable[[], Any]] = []
_sigterm_pid: int | None = None  # the process whose SIGTERM handler is ours (a forked child's is not)


def on_sigterm(callback: Callable[[], Any]) -> None:
    """Run ``callback()`` (no locks taken, quick, exceptions ignored) when this process gets
    ``SIGTERM`` with the handler :func:`detaug.workers.start_pool` installs, before it dies."""
    _sigterm_callbacks.append(callback)


def _clean_up_on_sigterm() -> None:
    """Install :func:`_die_clean` as ``SIGTERM``'s handler where that is the default action and
    this is the main thread (where Python runs signal handlers); else leave it as it is."""
    global _sigterm_pid
    if _sigterm_pid == os.getpid() or threading.current_thread() is not threading.main_thread():
        return
    try:
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return
        signal.signal(signal.SIGTERM, _die_clean)
    except (ValueError, OSError, AttributeError):  # no SIGTERM here, or an embedded interpreter
        return
    _sigterm_pid = os.getpid()


def _die_clean(signum: int, frame: Any) -> None:
    """``SIGTERM``'s handler: remove this process's shared-memory names, then die of the signal
    as the default action would have."""
    try:
        if os.getpid() == _sigterm_pid and _tracker_free():
            with contextlib.suppress(Exception):  # no lock taken: this thread may hold it
                for state in tuple(_live):
                    if state.shared is not None:
                        state.shared.release()
            for callback in tuple(_sigterm_callbacks):
                with contextlib.suppress(Exception):
                    callback()
            _unlink_semaphores()
    finally:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        time.sleep(5.0)  # the signal is delivered before this returns; a last resort otherwise
        os._exit(128 + signum)


def _tracker_free(timeout: float = 1.0) -> bool:
    """Whether the resource tracker's lock can be taken: the handler may have interrupted this
    very thread inside a (un)registration, and unregistering from here would then wait forever."""
    lock = getattr(getattr(multiprocessing.resource_tracker, "_resource_tracker", None), "_lock", None)
    if lock is None:
        return True
    try:
        if not lock.acquire(timeout=timeout):
            return False
    except Exception:  # noqa: BLE001 - another Python's tracker
        return False
    lock.release()
    return True


def _unlink_semaphores() -> None:
    """Unlink (and unregister) the named semaphores multiprocessing made in this process (the
    pools' queues), through their own finalizers: what the resource tracker would do, warning,
    once the process is gone. Other processes that opened them keep them."""
    import multiprocessing.synchronize as synchronize
    import multiprocessing.util as util

    cleanup = getattr(synchronize.SemLock, "_cleanup", None)
    registry = getattr(util, "_finalizer_registry", None)
    if cleanup is None or registry is None:
        return
    for finalizer in list(registry.values()):
        if getattr(finalizer, "_callback", None) is cleanup:
            with contextlib.suppress(Exception):
                finalizer()
