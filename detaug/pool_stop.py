"""Stopping :mod:`detaug.workers`' pools without hanging: the state a stop needs (:class:`_PoolState`),
the live pools, cancelling, reaping the workers, unblocking the executor's manager thread, and
stopping every pool at the interpreter's exit."""

from __future__ import annotations

import concurrent.futures.process  # imported before registering our exit hook: see _register_exit_hook
import contextlib
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from detaug.worker_payload import _SharedPayload
    from detaug.workers import WorkerPool


class _PoolState:
    """What stopping a pool needs, without a reference to the pool (so that a finalizer holding
    it does not keep the pool, or whatever owns the pool, alive)."""

    def __init__(self, pool: WorkerPool) -> None:
        self.pool_ref = weakref.ref(pool)
        self.processes: list[Any] = []  # every worker started (multiprocessing.Process)
        self.manager: threading.Thread | None = None
        self.pending: dict[int, Any] = pool._pending_work_items  # work id -> _WorkItem (shared)
        self.call_queue = pool._call_queue
        self.result_queue = pool._result_queue
        self.shared: _SharedPayload | None = None  # the payload's segment, until unlinked
        self.stopped = False
        self.lock = threading.Lock()


_live: set[_PoolState] = set()  # pools to stop at the interpreter's exit
_live_lock = threading.Lock()


def _stop_state(state: _PoolState, grace: float, wait: bool) -> None:
    """Cancel and shut down, then reap (here, or in a daemon thread when not ``wait``)."""
    if not _begin_stop(state):
        return
    if wait:
        _reap(state, grace)
    else:
        threading.Thread(target=_reap, args=(state, grace), name="detaug-pool-reaper", daemon=True).start()


def _begin_stop(state: _PoolState) -> bool:
    """Cancel the jobs not started and shut the pool down; ``False`` when that was done before."""
    for item in list(state.pending.values()):  # as cancel_futures does (also for a collected pool)
        item.future.cancel()
    with state.lock:
        if state.stopped:
            return False
        state.stopped = True
    pool = state.pool_ref()
    if pool is not None:
        with contextlib.suppress(Exception):  # best effort
            pool.shutdown(wait=False, cancel_futures=True)
    return True


def _reap(state: _PoolState, grace: float, patience: float = 1.0) -> None:
    """Workers gone within ``grace`` (then terminated, killed), the executor's manager thread
    ended (given ``patience`` seconds twice), files closed."""
    try:
        processes = list(state.processes)
        _wait_processes(processes, grace)
        for signum_method in ("terminate", "kill"):
            alive = [p for p in processes if _alive(p)]
            if not alive:
                break
            for p in alive:
                try:
                    getattr(p, signum_method)()
                except (OSError, ValueError, AttributeError):
                    pass
            _wait_processes(alive, patience)
        manager = state.manager
        if manager is not None and manager.is_alive() and manager is not threading.current_thread():
            manager.join(patience)
            if manager.is_alive():
                _unblock_manager(state)
                manager.join(patience)
            if manager.is_alive():  # stuck on a lock a Ctrl-C left locked: do not wait for it at exit
                getattr(concurrent.futures.process, "_threads_wakeups", {}).pop(manager, None)
                with contextlib.suppress(Exception):
                    state.call_queue.cancel_join_thread()
    finally:
        if state.shared is not None:
            state.shared.release()
        with _live_lock:
            _live.discard(state)


def _alive(process: Any) -> bool:
    try:
        return process.is_alive()
    except ValueError:  # closed
        return False


def _wait_processes(processes: list[Any], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for p in processes:
        try:
            p.join(max(0.0, deadline - time.monotonic()))
        except (ValueError, AssertionError):
            pass


def _unblock_manager(state: _PoolState) -> None:
    """The workers are dead, the executor's manager thread is not: it is reading a result a
    killed worker did not finish writing (the parent's write end keeps the pipe open), or its
    call queue's feeder thread is writing to a pipe no worker reads. End both."""
    with contextlib.suppress(Exception):
        state.result_queue._writer.close()  # the read then ends (EOF): the pool is marked broken
    reader = getattr(state.call_queue, "_reader", None)
    deadline = time.monotonic() + 2.0
    with contextlib.suppress(Exception):
        while reader is not None and time.monotonic() < deadline and reader.poll(0.05):
            reader.recv_bytes()


def _stop_all_at_exit() -> None:
    """Before ``concurrent.futures`` joins its manager threads at exit (which waits for every
    queued job): cancel, give running jobs a moment, terminate the rest."""
    with _live_lock:
        states = list(_live)
    for state in states:
        _begin_stop(state)  # all of them first: their workers then wind down together
    for state in states:
        _reap(state, 0.5, 0.3)


def _register_exit_hook() -> None:
    # threading's exit hooks run in reverse order of registration, before non-daemon threads are
    # joined: concurrent.futures.process registered its hook (joining manager threads) when it
    # was imported, above, so this one runs first.
    try:
        threading._register_atexit(_stop_all_at_exit)  # type: ignore[attr-defined]
    except (AttributeError, RuntimeError):  # another Python; or imported during the exit itself
        import atexit

        atexit.register(_stop_all_at_exit)


_register_exit_hook()
