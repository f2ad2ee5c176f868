"""The peers: torchvision.transforms.v2 and albumentations 2.x in a PyTorch DataLoader on the
CPU, and torchvision.transforms.v2 on the GPU; for the YOLO-style recipe, albumentations' Mosaic
(``albumentations-mosaic``).

CPU peers (``torchvision``, ``albumentations``): each sample is read and decoded in a worker
with its library's usual decoder (``torchvision.io.decode_jpeg`` / ``cv2.imdecode``), augmented
there with the recipe of :mod:`detaug.bench.recipe`, and collated into an image batch plus a
list of target dicts; the main process moves the images to the GPU when there is one. There are
as many workers as CPUs (:func:`detaug.bench.harness.default_workers`), each pinned to one
thread of OpenCV, OpenMP/MKL and torch (:func:`pin_worker_threads`): the workers are the
parallelism. The sampler draws fresh permutations forever, so the timed window never crosses the
end of an epoch (where a DataLoader's workers drain and restart).

GPU peer (``torchvision-gpu``): DataLoader workers only read the files; the main process decodes
each batch with ``torchvision.io.decode_jpeg(list, device="cuda")`` (nvJPEG, batched) and runs the
same v2 recipe per sample on the CUDA tensors, then stacks them.

:func:`peer_description` says what each runs; the report prints it.

Differences forced by the libraries, printed with the results:

* albumentations has no IoU crop; ``A.BBoxSafeRandomCrop`` (a random window that keeps every
  box) stands in for it.
* albumentations resizes with ``cv2.INTER_LINEAR`` without antialiasing (its normal); DALI and
  torchvision antialias when shrinking.
* YOLO recipe (``albumentations-mosaic``): albumentations 2.0.8 has no MixUp, so that peer blends
  nothing (detaug blends ``YoloSpec.mixup`` of its samples); its Mosaic crops the output straight
  from the 2x2 grid and the perspective and affine steps run on that output, where detaug warps the
  ``2 size`` mosaic canvas once into the output (less work for albumentations, not more); its HSV
  jitter shifts where detaug's multiplies (see :func:`albumentations_mosaic_transform`).

Modules: :mod:`detaug.bench.torchvision_peers` and :mod:`detaug.bench.albumentations_peers` hold
the peers, :mod:`detaug.bench.peer_loader` the DataLoader plumbing they share; their public names
are importable from here too.
"""

from __future__ import annotations

from detaug.bench.albumentations_peers import (  # noqa: F401 - the peers' names, importable from here
    ALBUMENTATIONS_CROP_NOTE,
    ALBUMENTATIONS_MOSAIC_NOTE,
    ALBUMENTATIONS_PIP,
    PEERS_PIP,
    AlbumentationsDetection,
    AlbumentationsMosaic,
    MosaicSampler,
    albumentations_mosaic_transform,
    albumentations_transform,
    iter_albumentations,
    iter_albumentations_mosaic,
    seed_albumentations_worker,
)
from detaug.bench.harness import BenchSettings
from detaug.bench.peer_loader import (  # noqa: F401 - the peers' names, importable from here
    PEER_BATCH_TIMEOUT,
    THREAD_ENV,
    EndlessRandomSampler,
    collate_detection,
    pin_worker_threads,
)
from detaug.bench.torchvision_peers import (  # noqa: F401 - the peers' names, importable from here
    TORCHVISION_PIP,
    TorchvisionDetection,
    iter_torchvision,
    iter_torchvision_gpu,
    torchvision_pip,
    torchvision_transform,
)

__all__ = [
    "ALBUMENTATIONS_CROP_NOTE",
    "ALBUMENTATIONS_MOSAIC_NOTE",
    "ALBUMENTATIONS_PIP",
    "PEERS_PIP",
    "TORCHVISION_PIP",
    "albumentations_mosaic_transform",
    "albumentations_transform",
    "iter_albumentations",
    "iter_albumentations_mosaic",
    "iter_torchvision",
    "iter_torchvision_gpu",
    "peer_description",
    "pin_worker_threads",
    "torchvision_pip",
    "torchvision_transform",
]


def peer_description(name: str, settings: BenchSettings) -> str:
    """What peer ``name`` runs with ``settings``: loader, workers and threads, decoder, recipe."""
    workers = f"DataLoader, {settings.workers} workers of 1 thread (OpenCV, OpenMP, torch)" if settings.workers else (
        "DataLoader in the main process (0 workers)")
    if name == "torchvision":
        return (f"{workers}; torchvision.io.decode_jpeg on the CPU; v2 RandomIoUCrop, flip, RandomAffine, "
                "Resize (antialiased), ColorJitter, Normalize")
    if name == "albumentations":
        return (f"{workers}; cv2.imdecode; BBoxSafeRandomCrop (no IoU crop in albumentations), flip, Affine, "
                "Resize (cv2 INTER_LINEAR, no antialiasing), ColorJitter, Normalize")
    if name == "albumentations-mosaic":
        return (f"{workers}; cv2.imdecode of the sample and 3 partners; Mosaic (2x2, contain), Perspective, "
                "Affine, HueSaturationValue, flip, LongestMaxSize + PadIfNeeded; no MixUp (albumentations "
                "has none)")
    if name == "torchvision-gpu":
        return (f"{workers} reading files; torchvision.io.decode_jpeg(device='cuda') per batch; the v2 recipe "
                "per sample on CUDA tensors")
    raise ValueError(f"unknown peer {name!r}")
