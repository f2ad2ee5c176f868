"""Timing plumbing shared by every variant.

A variant is a generator function ``variant(dataset, settings) -> Iterator[batch]``: it builds
its loader before the first ``yield`` (raising :class:`VariantUnavailable` when a package is
missing), then yields batches as a training loop receives them (images on the target device,
boxes in a list of targets), forever. :func:`measure` drives it, counting the images of each
batch with :func:`count_images`:

1. warm-up: ``warmup_batches >= 1`` batches (the generator builds its loader on the first one;
   then worker start-up, memory pools);
2. CUDA synchronize, start the clock;
3. take batches until at least ``images`` images are done and the batch count is a multiple of
   ``batch_quantum`` (the DataLoader peers use ``num_workers``: their workers deliver batches in
   waves, so only whole waves are a fair sample);
4. CUDA synchronize, stop the clock; read the GPU memory figures; close the generator.

Modules: :mod:`detaug.bench.resources` samples the memory of the process tree during a
measurement; :mod:`detaug.bench.tables` prints the tables. Their public names are importable
from here too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from detaug.bench.resources import (  # noqa: F401 - importable from here
    ResourceSampler,
    process_tree,
    process_tree_rss,
)
from detaug.bench.tables import format_table  # noqa: F401 - importable from here

__all__ = [
    "BenchSettings",
    "Measurement",
    "ResourceSampler",
    "VariantUnavailable",
    "adapter_cpu_use",
    "available_cpus",
    "count_images",
    "cuda_available",
    "default_threads",
    "default_workers",
    "measure",
    "process_tree_rss",
]

Device = Literal["gpu", "cpu"]


class VariantUnavailable(RuntimeError):
    """A variant cannot run here (a package is missing); the message says how to get it."""


def available_cpus() -> int:
    """The CPUs this process may use (:func:`detaug.decoding.available_cpus`: affinity mask,
    cgroup v2 quota); at least 1."""
    from detaug import decoding

    return decoding.available_cpus()


def default_threads(cpus: int | None = None) -> int:
    """DALI CPU threads for ``cpus`` CPUs (default: the CPUs this process may use), shared by the
    ranks of this host (``LOCAL_WORLD_SIZE``): :func:`detaug.decoding.default_num_threads`'s
    rule, one per CPU, at least 1, at most 16 (16 on a 16-core host, 2 on a 2-core machine)."""
    from detaug import decoding

    if cpus is None:
        return decoding.default_num_threads()
    return decoding.threads_for(cpus, decoding.local_ranks())


def adapter_cpu_use(variant: str, settings: BenchSettings) -> tuple[int, int]:
    """``(DALI threads, planning workers)`` of detaug variant ``variant`` (``detaug``,
    ``detaug-list``, ``detaug-cpu``, ``sequence``, ``sequence-shuffled``, ``sequence-numpy``; each
    runs one pipeline) with ``settings``: the adapters' defaults (planning workers on a GPU,
    :func:`detaug.decoding.default_planning_workers`; the rest of the CPUs for DALI,
    :func:`detaug.decoding.threads_beside`), the threads ``settings.adapter_threads`` where given."""
    from detaug import decoding

    workers = decoding.default_planning_workers(on_gpu=settings.device == "gpu" and variant != "detaug-cpu")
    return settings.adapter_threads or decoding.threads_beside(workers), workers


def default_workers(cpus: int | None = None) -> int:
    """DataLoader workers of the CPU peers for ``cpus`` CPUs (default :func:`available_cpus`):
    one per CPU (each pinned to one OpenCV / OpenMP thread), at least 1."""
    return max(1, available_cpus() if cpus is None else cpus)


@dataclass(frozen=True)
class BenchSettings:
    """What every variant is given.

    Attributes:
        device: ``"gpu"`` (images end on CUDA) or ``"cpu"``.
        batch_size: images per batch.
        workers: DataLoader worker processes of the CPU peers (default :func:`default_workers`).
        threads: DALI CPU threads of the decode limit and raw DALI (default :func:`default_threads`).
        adapter_threads: DALI CPU threads of detaug's adapters (``--threads``); ``None``: their own
            default, the CPUs their planning workers leave (:func:`adapter_cpu_use`).
        size: output side in pixels.
        seed: seed of every random draw and shuffle.
        recipe: the benchmarked recipe, ``"default"`` or ``"yolo"`` (:data:`detaug.bench.recipe.RECIPES`).
    """

    device: Device = "gpu"
    batch_size: int = 64
    workers: int = field(default_factory=default_workers)
    threads: int = field(default_factory=default_threads)
    adapter_threads: int | None = None
    size: int = 512
    seed: int = 0
    recipe: str = "default"

    def __post_init__(self) -> None:
        from detaug.bench.recipe import RECIPES

        if self.device not in ("gpu", "cpu"):
            raise ValueError(f"device should be 'gpu' or 'cpu', got {self.device!r}")
        if self.recipe not in RECIPES:
            raise ValueError(f"recipe should be one of {', '.join(RECIPES)}, got {self.recipe!r}")
        for name, low in (("batch_size", 1), ("workers", 0), ("threads", 1), ("size", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or value < low:
                raise ValueError(f"{name} should be an int >= {low}, got {value!r}")
        if self.adapter_threads is not None and (not isinstance(self.adapter_threads, int) or self.adapter_threads < 1):
            raise ValueError(f"adapter_threads should be None or an int >= 1, got {self.adapter_threads!r}")

    @property
    def torch_device(self) -> str:
        return "cuda" if self.device == "gpu" else "cpu"


@dataclass
class Measurement:
    """The outcome of one timed variant.

    Attributes:
        images: images in the timed window.
        batches: batches in the timed window.
        seconds: wall time of the timed window (CUDA synchronized at both ends).
        warmup_seconds: time from building the loader to the end of the warm-up.
        gpu_mem_mib: device-wide GPU memory taken during the variant (``cudaMemGetInfo`` delta
            at the end of the timed window: DALI's pools and PyTorch's cache), or ``None``.
        torch_peak_mib: ``torch.cuda.max_memory_allocated`` during the variant, or ``None``.
        gpu_peak_mib: the peak of device-wide used GPU memory above its level at the start
            (``cudaMemGetInfo`` sampled every 50 ms from the build of the loader to the end of the
            timed window: DALI's pools, decoder buffers and PyTorch's cache), or ``None``.
        host_peak_rss_mib: the peak resident memory of this process plus its child processes
            (DataLoader and planning workers), each its proportional set size (shared pages
            split between the processes sharing them; :func:`process_tree_rss`), sampled every
            200 ms from ``/proc``, or ``None`` where ``/proc`` cannot be read.
    """

    images: int
    batches: int
    seconds: float
    warmup_seconds: float
    gpu_mem_mib: float | None = None
    torch_peak_mib: float | None = None
    gpu_peak_mib: float | None = None
    host_peak_rss_mib: float | None = None

    @property
    def images_per_second(self) -> float:
        return self.images / self.seconds if self.seconds > 0 else float("inf")


def cuda_available() -> bool:
    """Whether the GPU variants can run: PyTorch sees a CUDA device and so does DALI."""
    try:
        import torch
    except ImportError:
        return False
    if not torch.cuda.is_available():
        return False
    from detaug.pipeline import cuda_devices

    return cuda_devices() > 0


def count_images(batch: Any) -> int:
    """Images in a batch: the leading dimension of its first array (of a tuple, list or dict)."""
    while isinstance(batch, (tuple, list, dict)):
        if not batch:
            raise ValueError("empty batch structure")
        batch = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
    shape = getattr(batch, "shape", None)
    if shape is not None and len(shape) > 0:
        return int(shape[0])
    raise TypeError(f"cannot count the images of a batch of {type(batch).__name__}")


def measure(
    batches: Iterator[Any],
    *,
    images: int,
    warmup_batches: int,
    batch_quantum: int = 1,
    device: Device = "cpu",
    clock: Callable[[], float] = time.perf_counter,
) -> Measurement:
    """Warm up, then time at least ``images`` images of ``batches`` (see the module docstring).

    ``batches`` is a variant's generator; it is closed at the end (its ``finally`` blocks shut
    its loader down), also when a batch raises.
    """
    if images < 1:
        raise ValueError(f"images should be >= 1, got {images}")
    if warmup_batches < 1:
        # a generator builds its loader on the first next(): that must happen before the clock
        raise ValueError(f"warmup_batches should be >= 1, got {warmup_batches}")
    if batch_quantum < 1:
        raise ValueError(f"batch_quantum should be >= 1, got {batch_quantum}")
    sync = _synchronizer(device)
    memory = _GpuMemoryProbe() if device == "gpu" else None
    sampler = ResourceSampler(gpu=device == "gpu")
    try:
        if memory is not None:
            memory.start()
        sampler.start()
        t_build = clock()
        iterator = iter(batches)
        for _ in range(warmup_batches):
            next(iterator)
        sync()
        t_start = clock()
        done_images = done_batches = 0
        while done_images < images or done_batches % batch_quantum:
            done_images += count_images(next(iterator))
            done_batches += 1
        sync()
        t_stop = clock()
        result = Measurement(
            images=done_images,
            batches=done_batches,
            seconds=t_stop - t_start,
            warmup_seconds=t_start - t_build,
        )
        if memory is not None:
            result.gpu_mem_mib, result.torch_peak_mib = memory.read()
        result.host_peak_rss_mib, result.gpu_peak_mib = sampler.stop()
        return result
    finally:
        sampler.stop()
        close = getattr(batches, "close", None)
        if close is not None:
            close()
        _release_gpu_memory(device)


def _synchronizer(device: Device) -> Callable[[], None]:
    if device != "gpu":
        return lambda: None
    import torch

    return torch.cuda.synchronize


class _GpuMemoryProbe:
    """Device-wide used memory (``cudaMemGetInfo``) relative to the start, and torch's peak."""

    def start(self) -> None:
        import torch

        _release_gpu_memory("gpu")
        torch.cuda.reset_peak_memory_stats()
        self._free_at_start = torch.cuda.mem_get_info()[0]

    def read(self) -> tuple[float, float]:
        import torch

        free_now = torch.cuda.mem_get_info()[0]
        mib = 1024.0 * 1024.0
        return (self._free_at_start - free_now) / mib, torch.cuda.max_memory_allocated() / mib


def _release_gpu_memory(device: Device) -> None:
    """Give cached blocks back (torch's device cache and its cache of page-locked host memory,
    DALI's pools), so the next variant starts clean."""
    import gc

    gc.collect()
    if device != "gpu":
        return
    import torch

    try:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        from nvidia.dali import backend

        backend.ReleaseUnusedMemory()
        _empty_host_cache(torch)
    except Exception:  # noqa: BLE001, S110 - a failed variant's CUDA error shows in its own row
        pass


#: torch's private calls that free its cache of page-locked host memory (torch 2.11, 2.13).
HOST_CACHE_EMPTIERS = ("_host_emptyCache", "_accelerator_emptyHostCache")


def _empty_host_cache(torch: Any) -> None:
    """Free the page-locked host memory torch keeps cached. A CPU peer's DataLoader pins every
    batch (``pin_memory=True``; at batch 256 of 512x512 float images ~800 MB each, a wave of 16
    workers pins 16), and torch keeps those blocks for reuse. Left there, the Keras Sequence
    timed after the peers ran 15.2-15.5k img/s at batch 256; emptied after each variant,
    20.6-21.0k (H100, 2026-11-24; docs/benchmarks.md). torch has no public call for it: the
    private one of this torch (:data:`HOST_CACHE_EMPTIERS`), where there is one."""
    for name in HOST_CACHE_EMPTIERS:
        empty = getattr(torch._C, name, None)
        if empty is not None:
            empty()
            return
