"""Worker processes that behave: a spawned process pool for detaug's planning jobs.

:func:`start_pool` returns a :class:`WorkerPool`, a :class:`~concurrent.futures.ProcessPoolExecutor`
over the ``"spawn"`` start method (``fork`` is unsafe next to CUDA and DALI's threads) that

* does not re-run the user's main script in its workers, so a script without an
  ``if __name__ == "__main__":`` guard, ``python -c``, a script on standard input and Jupyter
  work as they do with a torch ``DataLoader`` on Linux. The workers are spawned with the main
  module hidden from :func:`multiprocessing.spawn.get_preparation_data`, which is what makes a
  spawned child import it. This holds while nothing the workers are sent refers to ``__main__``:
  when the pickled initializer or its arguments do (a function or class defined in the script,
  also inside bytes pickled ahead), the pool falls back to the usual spawn behaviour (the
  workers import the main script, which then needs the main guard; with ``python -c``, standard
  input or Jupyter there is no script to import and :func:`start_pool` raises ``ValueError``).
  A job that refers to ``__main__`` is refused by :meth:`WorkerPool.submit` with a
  ``ValueError`` instead of breaking the pool. ``import_main=True``/``False`` forces either way.
* starts all its workers at once (``ProcessPoolExecutor`` otherwise starts them one per
  :meth:`submit`), each from a thread that lives as long as the process;
* ties each worker to the parent: on Linux a worker gets ``SIGKILL`` when the parent dies, by
  any signal (``prctl(PR_SET_PDEATHSIG)``, set first thing in the worker; elsewhere a thread
  polls the parent's pid). Workers ignore ``SIGINT``: Ctrl-C in a terminal reaches the whole
  process group, and only the parent acts on it (raising ``KeyboardInterrupt`` where it is);
* removes what it made in ``/dev/shm`` when the process gets ``SIGTERM`` with Python's default
  action (death): :func:`start_pool`, called from the main thread where ``SIGTERM``'s handler is
  ``SIG_DFL``, installs one (kept for the process's lifetime) that removes the pools' payload
  segments, runs :func:`~detaug.sigterm.on_sigterm`'s callbacks (the shared-memory files of
  :mod:`detaug.shared_arrays`) and unlinks multiprocessing's semaphores of this process, then
  restores ``SIG_DFL`` and sends itself ``SIGTERM`` again: the process still dies of that signal at
  once (exit status ``-15``), its workers with it, but the resource tracker finds nothing left to
  clean up and warns of no leak. A handler of the user's, installed before or after, is left
  alone; one that exits (``sys.exit``) ends the run through the usual exit hooks, which remove the
  same. (Killed outright, with ``SIGKILL``, the tracker still removes everything, warning.)
* stops without hanging: :func:`stop_pool` cancels the jobs not started, lets the running ones
  finish for ``grace`` seconds, then terminates (and kills) the workers left, and unblocks the
  executor's manager thread if a worker died half way through sending a result. Leaving a
  ``with`` block does this too, and so do garbage collection of the pool and the interpreter's
  exit (before ``concurrent.futures`` would wait for every queued job to run). The manager
  thread is a daemon, and one that cannot end (blocked on a lock that a Ctrl-C left locked in
  the main thread: ``threading.Condition.__enter__`` is Python code and can be interrupted right
  after taking its lock) is not waited for at exit.

Payloads: the initializer and its arguments are pickled once in the parent. When that is more
than :data:`PIPE_PAYLOAD_LIMIT` bytes they reach the workers through a shared memory segment
(:class:`multiprocessing.shared_memory.SharedMemory`, named ``detaug_<pid>_<random>``): a
spawned child reads its start-up data from a pipe, and more than a pipe's 64 KiB would make the
parent wait for each worker's start in turn. Each worker attaches to the segment by name,
copies the payload out and detaches, then says so on a semaphore; once every worker has, a
daemon thread of the parent unlinks the segment (so its memory is freed while the pool runs);
stopping the pool unlinks it too if some worker never got that far. The segment is registered
with multiprocessing's resource tracker by the parent only, so that it is removed even if the
parent is killed before it unlinks it. Where the segment cannot be made or filled (no
``/dev/shm``, or too little room in it: the space is reserved before it is written), the
payload goes through the pipe. A job's arguments and result travel through pipes, pickled:
keep arguments small (indices, seeds) and put what every job needs in the initializer's
arguments.

The workers import only what the initializer, the jobs and this module (standard library
only) import: no DALI, torch or Keras unless a job does.

The parts: :mod:`detaug.main_pickles` (which pickles refer to ``__main__``),
:mod:`detaug.spawning` (spawning without the main module), :mod:`detaug.worker_payload` (the
payload and a worker's start), :mod:`detaug.pool_stop` (stopping), :mod:`detaug.sigterm`
(``SIGTERM``); this module holds the pool (:class:`WorkerPool`, :func:`start_pool`, :func:`stop_pool`).
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

from detaug.main_pickles import _job_references_main, _main_is_importable, main_references
from detaug.pool_stop import _live, _live_lock, _PoolState, _stop_state
from detaug.sigterm import _clean_up_on_sigterm
from detaug.spawning import _block_sigint, _install_main_hiding, _LastingThread, _spawning
from detaug.worker_payload import _SharedPayload, _worker_init

__all__ = ["PIPE_PAYLOAD_LIMIT", "SEMAPHORE_DIR", "DEFAULT_GRACE", "WorkerPool", "start_pool", "stop_pool"]

PIPE_PAYLOAD_LIMIT = 32 * 1024
"""Pickled initializer + arguments larger than this (bytes) go to the workers through shared memory."""

SEMAPHORE_DIR = "/dev/shm"
"""Where Linux (glibc) makes the POSIX named semaphores of multiprocessing's queues, which every
pool needs: a pool cannot start where this folder is missing, read-only or full."""

DEFAULT_GRACE = 1.0
"""Seconds :func:`stop_pool` lets running jobs finish before terminating their workers."""


class WorkerPool(ProcessPoolExecutor):
    """A :class:`~concurrent.futures.ProcessPoolExecutor` made by :func:`start_pool` (read its
    documentation and this module's). ``with`` blocks end with :func:`stop_pool` (wait=True):
    jobs not started are cancelled and workers still busy after a short grace are terminated."""

    hides_main: bool
    """Whether the workers were started without importing the main script."""

    def __init__(self, workers: int, payload: bytes | _SharedPayload, hide_main: bool) -> None:
        super().__init__(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_init, initargs=(os.getpid(), payload))
        self.hides_main = hide_main
        self._detaug_state = _PoolState(self)
        if isinstance(payload, _SharedPayload):
            self._detaug_state.shared = payload

    def _spawn_process(self) -> None:
        state = self._detaug_state

        def spawn() -> None:
            before = set(self._processes)
            mask = _block_sigint()
            _spawning.hide_main = self.hides_main
            try:
                super(WorkerPool, self)._spawn_process()
            finally:
                _spawning.hide_main = False
                state.processes.extend(p for pid, p in self._processes.items() if pid not in before)
                if mask is not None:  # a SIGINT that came meanwhile is raised from here on
                    signal.pthread_sigmask(signal.SIG_SETMASK, mask)

        _LastingThread.call(spawn)

    def _adjust_process_count(self) -> None:
        # submit() calls this for each job: all the workers are started already, and skipping it
        # keeps the caller off a threading.Semaphore that a Ctrl-C can leave locked (its Python
        # __enter__ may be interrupted after taking the lock), which hangs the manager thread.
        if len(self._processes) < self._max_workers:
            super()._adjust_process_count()

    def _launch(self) -> None:
        """Start every worker and the manager thread (in the lasting thread: see there)."""

        def launch() -> None:
            start = getattr(self, "_launch_processes", None)
            if callable(start):
                start()
            else:  # other Python versions
                while len(self._processes) < self._max_workers:
                    self._spawn_process()
            start_manager = getattr(self, "_start_executor_manager_thread", None)
            if callable(start_manager):
                start_manager()
            self._detaug_state.manager = getattr(self, "_executor_manager_thread", None)

        _LastingThread.call(launch, anywhere=False)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        """As :meth:`ProcessPoolExecutor.submit`; a ``ValueError`` for a job referring to
        ``__main__`` (its function or arguments) when the workers have not imported the main
        script (the worker could not load it; the executor would break)."""
        if self.hides_main and _job_references_main(fn, args, kwargs):
            raise ValueError(
                f"a job for detaug's worker processes refers to the main script ({getattr(fn, '__qualname__', fn)!r} "
                "or its arguments are defined in __main__), which these workers do not import: define it in a module "
                "(or start the pool with import_main=True, and then guard the script with if __name__ == '__main__':)"
            )
        return super().submit(fn, *args, **kwargs)

    def __exit__(self, *exc: object) -> bool:
        stop_pool(self, wait=True)
        return False


def start_pool(workers: int, initializer: Callable[..., Any] | None = None, initargs: tuple = (), *, import_main: bool | None = None) -> WorkerPool:
    """Start ``workers`` spawned worker processes (all of them, now) that run
    ``initializer(*initargs)`` once each, after they have armed their parent-death signal and
    ignored SIGINT.

    ``import_main``: whether the workers import the main script (which then needs an
    ``if __name__ == "__main__":`` guard). ``None`` (default): only when the pickled
    ``initializer``/``initargs`` refer to ``__main__``. Raises what pickling them raises.
    Stop the pool with :func:`stop_pool` (or a ``with`` block); it is stopped anyway when
    garbage collected or when the interpreter exits.
    """
    if int(workers) < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if initializer is not None and not callable(initializer):
        raise TypeError("initializer must be callable")
    data = pickle.dumps((initializer, tuple(initargs)), protocol=pickle.HIGHEST_PROTOCOL)
    if import_main is None:
        names = main_references(data)
        if names and not _main_is_importable():
            raise ValueError(
                f"the worker initializer or its arguments refer to {', '.join(names)} defined in __main__, which worker "
                "processes cannot import when the main program is python -c, standard input or an interactive session "
                "(Jupyter): define them in a module"
            )
        hide_main = not names
    else:
        hide_main = not import_main
    _install_main_hiding()
    payload: bytes | _SharedPayload = data
    if len(data) > PIPE_PAYLOAD_LIMIT:
        try:
            payload = _SharedPayload(data, int(workers))
        except OSError:  # no /dev/shm, or too little room in it: through the pipe, then
            payload = data
    try:
        pool = WorkerPool(int(workers), payload, hide_main)
    except OSError as err:  # the executor's queues' semaphores: POSIX named semaphores, in /dev/shm
        if isinstance(payload, _SharedPayload):
            payload.release()
        raise OSError(err.errno, f"the worker processes' semaphores cannot be made in {SEMAPHORE_DIR} "
                                 f"({err.strerror or err}): it is missing, read-only or full") from err
    _clean_up_on_sigterm()
    state = pool._detaug_state
    with _live_lock:
        _live.add(state)
    weakref.finalize(pool, _stop_state, state, DEFAULT_GRACE, False)
    try:
        pool._launch()
    except BaseException:
        stop_pool(pool, wait=True, grace=0.0)
        raise
    if state.shared is not None:  # unlinked once every worker has read it (or when the pool stops)
        threading.Thread(target=state.shared.unlink_when_read, args=(state,), name="detaug-payload-unlink", daemon=True).start()
    return pool


def stop_pool(pool: ProcessPoolExecutor, wait: bool = True, *, grace: float = DEFAULT_GRACE) -> None:
    """Stop ``pool``: cancel its jobs not started, let running jobs finish for ``grace`` seconds,
    then terminate the workers left (SIGTERM, then SIGKILL a second later). ``wait=False``
    returns at once (a daemon thread does the rest): safe in a ``weakref.finalize`` callback or
    ``__del__``. Idempotent; also takes a plain ``ProcessPoolExecutor`` (then just shut down
    with ``cancel_futures=True``)."""
    state: _PoolState | None = getattr(pool, "_detaug_state", None)
    if state is None:
        pool.shutdown(wait=wait, cancel_futures=True)
        return
    if state.manager is None:  # its start was interrupted
        state.manager = getattr(pool, "_executor_manager_thread", None)
    _stop_state(state, grace, wait)
