"""Spawning :mod:`detaug.workers`' processes: without the main module (in the threads that spawn
them), from a thread that lives as long as the process, with SIGINT blocked."""

from __future__ import annotations

import multiprocessing.spawn
import queue
import signal
import threading
from collections.abc import Callable
from typing import Any


_spawning = threading.local()  # .hide_main: this thread is spawning workers that must not import main


def _install_main_hiding() -> None:
    """Wrap :func:`multiprocessing.spawn.get_preparation_data` (once) so that, in a thread that
    spawns our workers, it leaves out what makes the child import the main module. Other
    threads' spawns are not affected."""
    original = multiprocessing.spawn.get_preparation_data
    if getattr(original, "_detaug_hides_main", False):
        return

    def get_preparation_data(name: str) -> dict[str, Any]:
        data = original(name)
        if getattr(_spawning, "hide_main", False):
            data.pop("init_main_from_name", None)
            data.pop("init_main_from_path", None)
        return data

    get_preparation_data._detaug_hides_main = True  # type: ignore[attr-defined]
    get_preparation_data.__wrapped__ = original  # type: ignore[attr-defined]
    multiprocessing.spawn.get_preparation_data = get_preparation_data


class _LastingThread:
    """A daemon thread that runs callables for other threads and lives as long as the process.

    Workers are spawned from it (or from the main thread): Linux's parent-death signal fires
    when the *thread* that created a child ends, not the process, so workers spawned from a
    short-lived thread (a Keras worker thread, say) would be killed with it. The executor's
    manager thread is started from it too, and so is a daemon (threads inherit that): the
    interpreter's exit then never waits for a manager thread that cannot end (see :func:`detaug.pool_stop._reap`).
    """

    _lock = threading.Lock()
    _queue: queue.SimpleQueue | None = None
    _thread: threading.Thread | None = None

    @classmethod
    def call(cls, fn: Callable[[], Any], *, anywhere: bool = True) -> Any:
        """``fn()`` in the lasting thread (or here, in the main thread, when ``anywhere``)."""
        here = threading.current_thread()
        if here is cls._thread or (anywhere and here is threading.main_thread()):
            return fn()
        with cls._lock:
            if cls._queue is None:
                cls._queue = queue.SimpleQueue()
                cls._thread = threading.Thread(target=cls._serve, args=(cls._queue,), name="detaug-spawner", daemon=True)
                cls._thread.start()
        done = threading.Event()
        box: list[Any] = []
        cls._queue.put((fn, box, done))
        try:
            done.wait()
        except BaseException:  # Ctrl-C: let it finish (so that no worker starts after this returns)
            done.wait(30)
            raise
        ok, value = box
        if not ok:
            raise value
        return value

    @staticmethod
    def _serve(jobs: queue.SimpleQueue) -> None:
        while True:
            fn, box, done = jobs.get()
            try:
                box[:] = [True, fn()]
            except BaseException as err:  # noqa: BLE001 - handed to the caller
                box[:] = [False, err]
            finally:
                done.set()
                del fn, box, done


def _block_sigint() -> Any:
    """Block SIGINT in this thread (the mask is inherited by a spawned child, which then cannot
    be interrupted before its initializer ignores SIGINT); the previous mask, or ``None``."""
    if not hasattr(signal, "pthread_sigmask"):
        return None
    return signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
