"""The machine ``detaug bench`` runs on: the device it picks (:func:`pick_bench_device`), what it
runs there when not told otherwise (:data:`DEFAULTS`), the environment its report records, a
warning about a small ``/dev/shm``."""

from __future__ import annotations

import os
import platform
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Literal

from detaug.bench.harness import BenchSettings, available_cpus, cuda_available
from detaug.mps import mps_control_pipe


@dataclass(frozen=True)
class Defaults:
    """What ``detaug bench`` runs when not told otherwise, by device (:data:`DEFAULTS`).

    Attributes:
        num_images: images of the generated dataset.
        batch_size: images per batch (the first of ``batch_sizes``).
        warmup: warm-up batches per variant.
        images: images timed per variant; ``None``: ``epochs`` epochs of the dataset.
        epochs: ``(DALI-based, CPU peers)`` epochs timed when ``images`` is ``None``.
        batch_sizes: the batch sizes every variant runs at.
        scaling_images: images timed per ``--scaling`` row.
        scaling_unique: distinct photos resized for each megapixel row.
    """

    num_images: int
    batch_size: int
    warmup: int
    images: int | None = None
    epochs: tuple[int, int] = (1, 1)
    batch_sizes: tuple[int, ...] = ()
    scaling_images: int = 4096
    scaling_unique: int = 32


#: A GPU run is the full run of docs/benchmarks.md; a CPU run is short (under a minute on 2
#: cores with every variant, 192 images timed each: fewer move the ratios by a fifth;
#: ``images=`` / ``--images`` for a longer one).
DEFAULTS: dict[str, Defaults] = {
    "gpu": Defaults(num_images=2048, batch_size=64, warmup=5, epochs=(10, 2), batch_sizes=(64, 256)),
    "cpu": Defaults(num_images=256, batch_size=16, warmup=2, images=192, batch_sizes=(16,),
                    scaling_images=32, scaling_unique=8),
}


def pick_bench_device(device: str | None) -> Literal["gpu", "cpu"]:
    """``"gpu"`` or ``"cpu"`` for ``device`` (``None`` or ``"auto"``: the GPU when PyTorch and
    DALI both see a CUDA device). ``ValueError`` for ``"gpu"`` without one."""
    if device in (None, "auto"):
        return "gpu" if cuda_available() else "cpu"
    if device not in ("gpu", "cpu"):
        raise ValueError(f"--device should be auto, gpu or cpu, got {device!r}")
    if device == "gpu" and not cuda_available():
        raise ValueError(
            "--device gpu: no CUDA GPU that both PyTorch and DALI can use (looked for an NVIDIA "
            "driver, a CUDA build of torch and DALI's CUDA build); use --device cpu"
        )
    return device  # type: ignore[return-value]


def _warn_about_shared_memory(settings: BenchSettings, log: Callable[[str], None]) -> None:
    """DataLoader workers hand their float32 batches over in /dev/shm (two per worker in flight);
    containers often give it 64 MiB, which ends in a bus error."""
    if settings.workers == 0:
        return
    try:
        free = shutil.disk_usage("/dev/shm").free
    except OSError:
        return
    batch_bytes = settings.batch_size * 3 * settings.size * settings.size * 4
    need = 2 * settings.workers * batch_bytes
    if free < need:
        log(
            f"warning: /dev/shm has {free / 2**20:,.0f} MiB free; {settings.workers} DataLoader "
            f"workers keep about {need / 2**20:,.0f} MiB of batches there (docker: --shm-size)"
        )


def _environment(device: str) -> dict:
    gpu = "none"
    if device == "gpu":
        import torch

        gpu = torch.cuda.get_device_name(0)
    usable = available_cpus()
    cpus = f"{os.cpu_count()}" if usable == os.cpu_count() else f"{usable} of {os.cpu_count()}"
    versions = {"python": platform.python_version()}
    for name, dists in (
        ("torch", ("torch",)),
        ("DALI", ("nvidia-dali-cuda120", "nvidia-dali-cuda130")),
        ("torchvision", ("torchvision",)),
        ("albumentations", ("albumentations",)),
        ("opencv", ("opencv-python-headless", "opencv-python")),
        ("keras", ("keras",)),
    ):
        versions[name] = _version(dists) or _module_version(name)
    return {"gpu": gpu, "cpus": cpus, "platform": platform.platform(), "versions": versions,
            # where the loaders' default feed ran: a process of their own under NVIDIA MPS
            "mps_control_pipe": mps_control_pipe() if device == "gpu" else None}


def _version(dists: Sequence[str]) -> str | None:
    for dist in dists:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def _module_version(name: str) -> str | None:
    """The version of an already-imported module (DALI unpacked outside site-packages has no
    distribution metadata)."""
    module = {"DALI": "nvidia.dali", "opencv": "cv2"}.get(name, name)
    return getattr(sys.modules.get(module), "__version__", None)
