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
  segments, runs :func:`on_sigterm`'s callbacks (the shared-memory files of
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
"""

from __future__ import annotations

import concurrent.futures.process  # imported before registering our exit hook: see _register_exit_hook
import contextlib
import ctypes
import multiprocessing
import multiprocessing.connection
import multiprocessing.resource_tracker
import multiprocessing.shared_memory
import multiprocessing.spawn
import os
import pickle
import pickletools
import queue
import secrets
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

__all__ = ["PIPE_PAYLOAD_LIMIT", "SEMAPHORE_DIR", "WorkerPool", "main_references", "on_sigterm", "references_main", "start_pool", "stop_pool"]

PIPE_PAYLOAD_LIMIT = 32 * 1024
"""Pickled initializer + arguments larger than this (bytes) go to the workers through shared memory."""

SHARED_MEMORY_PREFIX = "detaug_"
"""Names of the payload segments: ``detaug_<parent pid>_<random hex>`` (in ``/dev/shm`` on Linux)."""

SEMAPHORE_DIR = "/dev/shm"
"""Where Linux (glibc) makes the POSIX named semaphores of multiprocessing's queues, which every
pool needs: a pool cannot start where this folder is missing, read-only or full."""

DEFAULT_GRACE = 1.0
"""Seconds :func:`stop_pool` lets running jobs finish before terminating their workers."""

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


# -- which pickles refer to __main__ ----------------------------------------------------------------


def references_main(data: bytes) -> bool:
    """Whether the pickle ``data`` refers to a global (function, class, ...) of ``__main__``,
    which a worker can load only by importing the main script. Strings that merely read
    ``"__main__"`` are data, not references; bytes that are themselves a pickle (a payload
    pickled ahead) are looked into. Conservative: ``True`` for a pickle it cannot read."""
    return bool(main_references(data))


def main_references(data: bytes, limit: int = 5) -> list[str]:
    """The names of ``__main__``'s globals that the pickle ``data`` refers to (at most ``limit``;
    ``["?"]`` for a pickle it cannot read); see :func:`references_main`."""
    if b"__main__" not in data:  # a reference spells the module name out at least once
        return []
    mark = pickletools.markobject
    stack: list[Any] = []
    memo: dict[int, Any] = {}
    found: list[str] = []
    try:
        for op, arg, _pos in pickletools.genops(data):
            name = op.name
            if name in ("GLOBAL", "INST") and str(arg).split(" ", 1)[0] == "__main__":
                found.append(str(arg).split(" ", 1)[1])
            elif name == "STACK_GLOBAL" and len(stack) >= 2 and stack[-2] == "__main__":
                found.append(str(stack[-1]))
            elif isinstance(arg, (bytes, bytearray)) and arg[:1] == b"\x80" and b"__main__" in arg:
                found += main_references(bytes(arg), limit)  # a pickle inside the pickle
            elif isinstance(arg, str) and arg[:1] == "\x80" and "__main__" in arg:  # ... as protocols < 3 store bytes
                found += main_references(arg.encode("latin-1", "replace"), limit)
            if len(found) >= limit:
                return found[:limit]
            if name == "MEMOIZE":
                memo[len(memo)] = stack[-1]
                continue
            if name in ("PUT", "BINPUT", "LONG_BINPUT"):
                memo[int(arg)] = stack[-1]
                continue
            # The stack effect, as pickletools.dis simulates it.
            before, after = op.stack_before, op.stack_after
            if mark in before or (name == "POP" and stack and stack[-1] is mark):
                while stack[-1] is not mark:
                    stack.pop()
                stack.pop()
                numtopop = before.index(mark) if mark in before else 0
            else:
                numtopop = len(before)
            if numtopop:
                del stack[-numtopop:]
            if name in ("GET", "BINGET", "LONG_BINGET"):
                stack.append(memo.get(int(arg)))
            elif isinstance(arg, str) and after == [pickletools.pyunicode]:
                stack.append(arg)
            else:
                stack.extend(mark if item is mark else None for item in after)
    except Exception:  # noqa: BLE001 - unreadable: assume the worst
        return found or ["?"]
    return found


def _main_is_importable() -> bool:
    """Whether a spawned child can import the main module: a script file or a ``-m`` module;
    not ``python -c``, standard input (``__file__`` is ``"<stdin>"``) or an interactive session."""
    main = sys.modules.get("__main__")
    if getattr(getattr(main, "__spec__", None), "name", None) is not None:
        return True
    path = getattr(main, "__file__", None)
    if path is None:
        return False
    return os.path.isfile(os.path.join(multiprocessing.process.ORIGINAL_DIR or "", path))


def _job_references_main(fn: Callable[..., Any], args: tuple, kwargs: dict) -> bool:
    """Whether a job's function or arguments refer to ``__main__`` (``False`` when they cannot
    be pickled here: the executor reports that itself)."""
    if getattr(fn, "__module__", None) == "__main__":
        return True
    try:
        data = pickle.dumps((fn, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - e.g. objects only multiprocessing's pickler handles
        return False
    return references_main(data)


# -- spawning without the main module -------------------------------------------------------------

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
    interpreter's exit then never waits for a manager thread that cannot end (see :func:`_reap`).
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


# -- in the worker ----------------------------------------------------------------------------------


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


# -- the pool ---------------------------------------------------------------------------------------


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


# -- SIGTERM: die as before, leaving nothing for the resource tracker ---------------------------------

_sigterm_callbacks: list[Callable[[], Any]] = []
_sigterm_pid: int | None = None  # the process whose SIGTERM handler is ours (a forked child's is not)


def on_sigterm(callback: Callable[[], Any]) -> None:
    """Run ``callback()`` (no locks taken, quick, exceptions ignored) when this process gets
    ``SIGTERM`` with the handler :func:`start_pool` installs, before it dies."""
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
