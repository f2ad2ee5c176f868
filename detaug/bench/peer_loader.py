"""The DataLoader plumbing of the peers (:mod:`detaug.bench.peers`): an endless seeded sampler,
the collate function, one thread per worker, and the loop that yields the batches.

There are as many workers as CPUs (:func:`detaug.bench.harness.default_workers`), each pinned to
one thread of OpenCV, OpenMP/MKL and torch (:func:`pin_worker_threads`): the workers are the
parallelism. The sampler draws fresh permutations forever, so the timed window never crosses the
end of an epoch (where a DataLoader's workers drain and restart).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from detaug.bench.harness import BenchSettings

__all__ = ["PEER_BATCH_TIMEOUT", "THREAD_ENV", "EndlessRandomSampler", "collate_detection", "pin_worker_threads"]

#: Seconds a DataLoader peer may take for one batch before its row ends in an error (a worker that
#: hangs, e.g. in a thread pool copied by ``fork``, must not stop the whole run).
PEER_BATCH_TIMEOUT = 120.0


class EndlessRandomSampler(Sampler[int]):
    """Indices of fresh random permutations of ``range(n)``, one after another, forever."""

    def __init__(self, n: int, seed: int) -> None:
        if n < 1:
            raise ValueError(f"the dataset is empty (n={n})")
        self.n = n
        self.seed = seed

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed)
        while True:
            yield from torch.randperm(self.n, generator=generator).tolist()


def collate_detection(samples: list[tuple]) -> tuple[torch.Tensor, list[dict]]:
    """Stack the images, keep the targets as a list (their box counts differ)."""
    return torch.stack([image for image, _ in samples]), [target for _, target in samples]


#: The environment variables that cap OpenMP, MKL and BLAS thread pools; a worker sets them to 1.
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS")


def pin_worker_threads(worker_id: int | None = None) -> None:
    """A DataLoader ``worker_init_fn``: one thread for everything in this worker process, the
    workers being the parallelism: OpenCV (``cv2.setNumThreads(1)``, where OpenCV is installed),
    torch's intra-op and OpenMP pools (``torch.set_num_threads(1)``), and the OpenMP / MKL /
    OpenBLAS environment variables for pools created later in the worker."""
    for name in THREAD_ENV:
        os.environ[name] = "1"
    torch.set_num_threads(1)
    try:
        import cv2
    except ImportError:
        return
    cv2.setNumThreads(1)



#: Set once a peer ran in this process (``workers=0``): OpenCV's thread pool is then live here.
_RAN_IN_PROCESS = False


def _worker_context(workers: int) -> str | None:
    """How DataLoader workers start: forked (the default, what the recorded GPU runs used) unless a
    peer already ran in this process. A fork copies OpenCV's thread pool in whatever state it is,
    and a worker then waits forever on one of its locks; a fork server starts them clean."""
    global _RAN_IN_PROCESS
    if workers == 0:
        _RAN_IN_PROCESS = True
        return None
    return "forkserver" if _RAN_IN_PROCESS else None


def _iterate(data: Dataset, settings: BenchSettings, worker_init_fn=None,
             sampler: Sampler | None = None) -> Iterator[tuple]:
    gpu = settings.device == "gpu"
    loader = DataLoader(
        data,
        batch_size=settings.batch_size,
        sampler=EndlessRandomSampler(len(data), settings.seed) if sampler is None else sampler,
        num_workers=settings.workers,
        collate_fn=collate_detection,
        pin_memory=gpu,
        worker_init_fn=worker_init_fn if settings.workers > 0 else None,
        # a batch that takes longer ends the row with an error instead of hanging the run
        timeout=PEER_BATCH_TIMEOUT if settings.workers > 0 else 0,
        multiprocessing_context=_worker_context(settings.workers),
        persistent_workers=False,
        drop_last=True,
    )
    torch.manual_seed(settings.seed)
    batches = iter(loader)
    try:
        for images, targets in batches:
            if gpu:
                images = images.to("cuda", non_blocking=True)
            yield images, targets
    finally:
        # shut the workers down now, not whenever the garbage collector gets to it
        shutdown = getattr(batches, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        del batches
