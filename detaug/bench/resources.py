"""What a run uses: the resident memory of a process and its descendants (proportional set size,
:func:`process_tree_rss`), the process tree itself (:func:`process_tree`), and a sampler of
their peak and of the device's GPU memory while a variant runs (:class:`ResourceSampler`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

__all__ = ["ResourceSampler", "process_tree", "process_tree_rss"]


class ResourceSampler:
    """Peak host memory (this process and its descendants, :func:`process_tree_rss`) and peak
    device-wide GPU memory used above the level at :meth:`start`, sampled by a daemon thread:
    the GPU every ``interval`` seconds, the host every :attr:`HOST_EVERY` intervals.

    :meth:`stop` returns ``(host_peak_rss_mib, gpu_peak_mib)``; either is ``None`` when it could
    not be read (no ``/proc``; ``gpu=False``). Sampling costs a few ``/proc`` reads and one
    ``cudaMemGetInfo`` per interval.
    """

    def __init__(self, *, gpu: bool, interval: float = 0.05) -> None:
        import threading

        self._gpu = gpu
        self._interval = interval
        self._stop = threading.Event()
        self._thread: Any = None
        self._host_peak: int | None = None
        self._gpu_peak: int | None = None
        self._gpu_start = 0
        self._result: tuple[float | None, float | None] | None = None

    def start(self) -> None:
        import threading

        if self._gpu:
            try:
                import torch

                self._gpu_start = torch.cuda.mem_get_info()[0]
                self._gpu_peak = 0
            except Exception:  # noqa: BLE001 - no figure rather than no run
                self._gpu = False
        self._sample()
        self._thread = threading.Thread(target=self._run, name="detaug-bench-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> tuple[float | None, float | None]:
        if self._result is None:
            self._stop.set()
            if self._thread is not None:
                self._thread.join()
                self._sample()
            mib = 1024.0 * 1024.0
            self._result = (
                None if self._host_peak is None else self._host_peak / mib,
                None if self._gpu_peak is None else self._gpu_peak / mib,
            )
        return self._result

    def _run(self) -> None:
        tick = 0
        while not self._stop.wait(self._interval):
            tick += 1
            self._sample(host=tick % self.HOST_EVERY == 0)

    #: Host memory is read every this many intervals (a process tree's ``smaps_rollup`` costs
    #: about a millisecond a process); the GPU's every interval.
    HOST_EVERY = 4

    def _sample(self, host: bool = True) -> None:
        rss = process_tree_rss(os.getpid()) if host else None
        if rss is not None:
            self._host_peak = max(self._host_peak or 0, rss)
        if self._gpu:
            try:
                import torch

                used = self._gpu_start - torch.cuda.mem_get_info()[0]
                self._gpu_peak = max(self._gpu_peak or 0, used)
            except Exception:  # noqa: BLE001, S110 - keep the peak seen so far
                pass


def process_tree(pid: int) -> Iterator[int]:
    """``pid`` and its descendants, each once (``/proc/<pid>/task/*/children``; only ``pid``
    where ``/proc`` cannot be read). A process is yielded before its children are looked up, so
    a caller may read it first."""
    seen, todo = set(), [pid]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        yield p
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children", encoding="ascii") as f:
                    todo.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            pass


def process_tree_rss(pid: int) -> int | None:
    """Resident bytes of process ``pid`` and its descendants (:func:`process_tree`), or ``None``
    where ``/proc`` cannot be read. Each process counts its proportional set size
    (``/proc/<pid>/smaps_rollup``: a page shared by n processes counts 1/n in each, so forked
    DataLoader workers and their shared-memory batches are not counted n times), or its resident
    set size (``statm``) where the kernel has no ``smaps_rollup``."""
    total = 0
    for p in process_tree(pid):
        size = _pss(p)
        if size is None:
            if p == pid:
                return None
            continue
        total += size
    return total

def _pss(pid: int) -> int | None:
    """Proportional set size of ``pid`` in bytes (resident set size without ``smaps_rollup``)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
