"""Running the per-file step over many XML files: in this process, or in a pool of processes
whose results come back in input order, a bounded number of chunks ahead.

Input order makes the output deterministic: ``workers=1`` and ``workers=N`` give the same bytes.
The pool is :func:`detaug.workers.start_pool`'s (spawned, not forked: a fork of a process whose
other threads hold a lock, DALI's or OpenCV's, can hang the child; no re-run of a main script
without a main guard; workers die with the parent).
At most :data:`WINDOW_PER_WORKER` chunks per worker are in flight (sent and not yet consumed),
so that a main process slower than the workers does not pile results up in memory: memory is
bounded by the window, not by the dataset.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

from converters.convert_file import FileOptions, FileResult, convert_file, file_names
from detaug.workers import start_pool, stop_pool

#: Below this many XML files the parsing runs in the calling process (``workers=None``).
PARALLEL_MIN_FILES = 2000
#: XML files sent to a worker at once (fewer when there are few files per worker).
CHUNK = 256
#: Chunks in flight per worker.
WINDOW_PER_WORKER = 4


def available_cores() -> int:
    """The CPUs this process may run on (its affinity mask, e.g. a container's or ``taskset``'s
    cpuset), else ``os.cpu_count()``."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_workers(n_files: int) -> int:
    """``workers=None``: one process per available core for :data:`PARALLEL_MIN_FILES` files or
    more (starting processes costs more than it saves below that), else 1 (this process)."""
    return available_cores() if n_files >= PARALLEL_MIN_FILES else 1


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector: the conversion allocates millions of small tuples,
    strings and dicts and no reference cycles, and collections triggered by those allocations
    cost a fifth of the time for nothing (measured with converters.bench). Restored after."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class Runner:
    """Converts XML files with :func:`converters.convert_file.convert_file` (or reads only their
    label names), in ``workers`` processes (1: this process). A context manager: the pool lives
    from ``__enter__`` to ``__exit__`` (terminated there, also on errors and Ctrl-C).

    ``progress``: anything with ``update(n)`` (:class:`converters.progress.Progress`).
    """

    def __init__(self, options: FileOptions, workers: int, progress: Any) -> None:
        self.options = options
        self.workers = workers
        self.progress = progress
        self._pool: Any = None

    def __enter__(self) -> Runner:
        if self.workers > 1:
            self._pool = start_pool(self.workers, _init_worker, (self.options,))
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            stop_pool(self._pool, grace=0.0)
            self._pool = None

    def results(self, xml_files: Sequence[str]) -> Iterator[FileResult]:
        """The :class:`FileResult` of each file, in the order given."""
        if self._pool is None:
            for name in xml_files:
                result = convert_file(name, self.options)
                self.progress.update(1)
                yield result
            return
        for chunk in self._chunks(_convert_chunk, xml_files):
            yield from map(FileResult._make, chunk)

    def names(self, xml_files: Sequence[str]) -> set[str]:
        """Every object name in the files (:func:`converters.convert_file.file_names`)."""
        found: set[str] = set()
        if self._pool is None:
            for name in xml_files:
                found.update(file_names(name, self.options))
                self.progress.update(1)
            return found
        for chunk in self._chunks(_names_chunk, xml_files):
            found.update(chunk)
        return found

    def _chunks(self, function: Any, items: Sequence[str]) -> Iterator[Any]:
        """``function(chunk)`` for consecutive chunks of ``items``, in order, with at most
        ``WINDOW_PER_WORKER * workers`` chunks in flight."""
        size = max(1, min(CHUNK, len(items) // (self.workers * 4)))
        window = WINDOW_PER_WORKER * self.workers
        pending: deque[tuple[Any, int]] = deque()
        for start in range(0, len(items), size):
            part = items[start:start + size]
            pending.append((self._pool.submit(function, part), len(part)))
            if len(pending) >= window:
                yield self._take(pending.popleft())
        while pending:
            yield self._take(pending.popleft())

    def _take(self, entry: tuple[Any, int]) -> Any:
        result, n = entry
        value = result.result()
        self.progress.update(n)
        return value


_worker_options: FileOptions | None = None


def _init_worker(options: FileOptions) -> None:
    # start_pool's workers ignore Ctrl-C already (the main process handles it and stops the pool)
    gc.disable()  # see gc_paused; the worker ends with the conversion
    global _worker_options
    _worker_options = options


def _convert_chunk(xml_files: list[str]) -> list[tuple[Any, ...]]:
    assert _worker_options is not None
    # plain tuples: cheaper to pickle than NamedTuples
    return [tuple(convert_file(name, _worker_options)) for name in xml_files]


def _names_chunk(xml_files: list[str]) -> set[str]:
    assert _worker_options is not None
    found: set[str] = set()
    for name in xml_files:
        found.update(file_names(name, _worker_options))
    return found
