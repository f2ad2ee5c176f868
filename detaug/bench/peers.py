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
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from detaug.bench.dataset import BenchDataset, Record, load_records
from detaug.bench.harness import BenchSettings, VariantUnavailable
from detaug.bench.recipe import RecipeSpec, YoloSpec

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

#: The extra with the CPU peers that do not depend on torch (albumentations, OpenCV, globox):
#: installing it leaves the installed torch as it is. Run from the detaug clone.
PEERS_PIP = 'python3 -m pip install -e ".[peers]"'
ALBUMENTATIONS_PIP = PEERS_PIP
#: torchvision must be the build of the installed torch; :func:`torchvision_pip` fills in the version.
TORCHVISION_PIP = 'python3 -m pip install torchvision "torch==<your torch version>"'
#: Seconds a DataLoader peer may take for one batch before its row ends in an error (a worker that
#: hangs, e.g. in a thread pool copied by ``fork``, must not stop the whole run).
PEER_BATCH_TIMEOUT = 120.0
ALBUMENTATIONS_CROP_NOTE = "no IoU crop in albumentations: BBoxSafeRandomCrop stands in"
ALBUMENTATIONS_MOSAIC_NOTE = (
    "albumentations 2.0.8 has no MixUp: none here (detaug blends 10% of its samples); Mosaic crops "
    "the output from the grid, then Perspective, Affine, HSV, flip, letterbox"
)


# ------------------------------------------------------------------------------------------
# torchvision.transforms.v2
# ------------------------------------------------------------------------------------------


def torchvision_transform(spec: RecipeSpec):
    """The recipe as a ``v2.Compose`` taking ``(tv_tensors.Image, {"boxes", "labels"})``."""
    from torchvision.transforms import v2

    return v2.Compose(
        [
            v2.RandomIoUCrop(
                min_scale=spec.crop_scale[0],
                max_scale=spec.crop_scale[1],
                min_aspect_ratio=spec.crop_aspect_ratio[0],
                max_aspect_ratio=spec.crop_aspect_ratio[1],
                sampler_options=spec.torchvision_sampler_options,
                trials=spec.crop_trials,
            ),
            # RandomIoUCrop leaves the boxes it cut away degenerate; drop them before the
            # affine step can turn them into small real-looking boxes.
            v2.SanitizeBoundingBoxes(min_size=spec.min_box_size),
            v2.RandomHorizontalFlip(p=spec.flip_p),
            v2.RandomAffine(
                degrees=spec.rotate_deg,
                translate=(spec.translate_frac, spec.translate_frac),
                scale=spec.scale_range,
                shear=(-spec.shear_x_deg, spec.shear_x_deg),
                interpolation=v2.InterpolationMode.BILINEAR,
                fill=spec.fill,
            ),
            v2.Resize((spec.size, spec.size), interpolation=v2.InterpolationMode.BILINEAR),
            v2.ColorJitter(
                brightness=spec.brightness,
                contrast=spec.contrast,
                saturation=spec.saturation,
                hue=spec.hue,
            ),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(mean=list(spec.mean), std=list(spec.std)),
            v2.SanitizeBoundingBoxes(min_size=spec.min_box_size),
        ]
    )


class TorchvisionDetection(Dataset):
    """Reads a JPEG with ``torchvision.io``, returns ``(float32 [3, S, S], target dict)``."""

    def __init__(self, records: list[Record], spec: RecipeSpec) -> None:
        self.records = records
        self.transform = torchvision_transform(spec)

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int):
        from torchvision import io, tv_tensors

        record = self.records[index]
        image = io.decode_jpeg(io.read_file(record.path), mode=io.ImageReadMode.RGB)
        target = {
            "boxes": tv_tensors.BoundingBoxes(
                torch.from_numpy(record.boxes_xyxy),
                format=tv_tensors.BoundingBoxFormat.XYXY,
                canvas_size=tuple(image.shape[-2:]),
            ),
            "labels": torch.from_numpy(record.labels),
        }
        image, target = self.transform(tv_tensors.Image(image), target)
        return image.as_subclass(torch.Tensor), {
            "boxes": target["boxes"].as_subclass(torch.Tensor),
            "labels": target["labels"],
        }


def torchvision_pip(torch_version: str | None = None) -> str:
    """The one line that installs the torchvision of the installed torch (``torch_version``,
    default ``torch.__version__``) without changing it: pinning torch makes pip pick the
    torchvision release built for it. A CPU-only torch (``+cpu``) gets a note: PyPI's torchvision
    needs PyPI's (CUDA) torch; the ``+cpu`` torchvision comes from PyTorch's CPU wheel index."""
    version = torch.__version__ if torch_version is None else torch_version
    base, _, local = str(version).partition("+")
    line = f'python3 -m pip install torchvision "torch=={base}"'
    if local and not local.startswith("cu"):
        line += (f" (your torch is the {local} build {version}: take the {local} torchvision of the "
                 f"same release from PyTorch's wheel index, --index-url https://download.pytorch.org/whl/{local})")
    return line


def iter_torchvision(dataset: BenchDataset, settings: BenchSettings) -> Iterator[tuple]:
    """The ``torchvision`` variant: endless ``(images, targets)`` batches."""
    _import_torchvision()
    data = TorchvisionDetection(load_records(dataset), RecipeSpec(size=settings.size))
    yield from _iterate(data, settings, worker_init_fn=pin_worker_threads)


def _import_torchvision() -> None:
    """Import torchvision, or raise :class:`VariantUnavailable` with the line that installs it."""
    try:
        import torchvision  # noqa: F401
        from torchvision.transforms import v2  # noqa: F401
    except ImportError as exc:
        raise VariantUnavailable(f"not installed ({torchvision_pip()}): {exc}") from exc
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise VariantUnavailable(
            f"the installed torchvision does not load with torch {torch.__version__} ({first}); "
            f"install the torchvision of your torch: {torchvision_pip()}"
        ) from exc


class _FileBytes(Dataset):
    """``(encoded bytes as a uint8 NumPy array, record index)`` of each record: the GPU peer's
    workers only read files. NumPy arrays travel to the main process pickled, by value: a list
    of torch tensors would take one shared-memory file descriptor each, and a batch of 256 runs
    out of them."""

    def __init__(self, records: list[Record]) -> None:
        self.records = records

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int):
        return np.fromfile(self.records[index].path, dtype=np.uint8), index


def _collate_bytes(items: list[tuple]) -> tuple[list[np.ndarray], list[int]]:
    return [data for data, _ in items], [index for _, index in items]


def iter_torchvision_gpu(dataset: BenchDataset, settings: BenchSettings) -> Iterator[tuple]:
    """The ``torchvision-gpu`` variant: endless ``(images, targets)`` batches, decoded and
    augmented on the GPU by torchvision (see the module docstring)."""
    if settings.device != "gpu":
        raise VariantUnavailable("needs a CUDA GPU (torchvision.io.decode_jpeg(device='cuda')); this is a CPU run")
    _import_torchvision()
    from torchvision import io, tv_tensors

    records = load_records(dataset)
    transform = torchvision_transform(RecipeSpec(size=settings.size))
    loader = DataLoader(
        _FileBytes(records),
        batch_size=settings.batch_size,
        sampler=EndlessRandomSampler(len(records), settings.seed),
        num_workers=settings.workers,
        collate_fn=_collate_bytes,
        worker_init_fn=pin_worker_threads if settings.workers > 0 else None,
        drop_last=True,
    )
    torch.manual_seed(settings.seed)
    batches = iter(loader)
    try:
        for datas, indices in batches:
            encoded = [torch.from_numpy(data) for data in datas]
            decoded = io.decode_jpeg(encoded, mode=io.ImageReadMode.RGB, device="cuda")
            images, targets = [], []
            for image, index in zip(decoded, indices):
                record = records[index]
                target = {
                    "boxes": tv_tensors.BoundingBoxes(
                        torch.from_numpy(record.boxes_xyxy).cuda(non_blocking=True),
                        format=tv_tensors.BoundingBoxFormat.XYXY,
                        canvas_size=tuple(image.shape[-2:]),
                    ),
                    "labels": torch.from_numpy(record.labels).cuda(non_blocking=True),
                }
                image, target = transform(tv_tensors.Image(image), target)
                images.append(image.as_subclass(torch.Tensor))
                targets.append({"boxes": target["boxes"].as_subclass(torch.Tensor), "labels": target["labels"]})
            yield torch.stack(images), targets
    finally:
        shutdown = getattr(batches, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        del batches


# ------------------------------------------------------------------------------------------
# albumentations 2.x
# ------------------------------------------------------------------------------------------


def albumentations_transform(spec: RecipeSpec):
    """The recipe as an ``A.Compose`` taking ``image=`` (RGB uint8 HWC), ``bboxes=`` (pascal_voc
    xyxy pixels) and ``labels=``; returns a float32 CHW tensor."""
    import albumentations as A
    import cv2
    from albumentations.pytorch import ToTensorV2

    return A.Compose(
        [
            A.BBoxSafeRandomCrop(erosion_rate=0.0, p=1.0),
            A.HorizontalFlip(p=spec.flip_p),
            A.Affine(
                rotate=(-spec.rotate_deg, spec.rotate_deg),
                translate_percent={
                    "x": (-spec.translate_frac, spec.translate_frac),
                    "y": (-spec.translate_frac, spec.translate_frac),
                },
                scale=spec.scale_range,
                keep_ratio=True,
                shear={"x": (-spec.shear_x_deg, spec.shear_x_deg), "y": (0.0, 0.0)},
                interpolation=cv2.INTER_LINEAR,
                border_mode=cv2.BORDER_CONSTANT,
                fill=spec.fill,
                p=1.0,
            ),
            A.Resize(spec.size, spec.size, interpolation=cv2.INTER_LINEAR),
            A.ColorJitter(
                brightness=spec.brightness,
                contrast=spec.contrast,
                saturation=spec.saturation,
                hue=spec.hue,
                p=1.0,
            ),
            A.Normalize(mean=spec.mean, std=spec.std, max_pixel_value=255.0),
            ToTensorV2(),
        ],
        bbox_params=_bbox_params(spec.min_box_size),
    )


def _bbox_params(min_box_size: float, min_visibility: float = 0.0):
    """``A.BboxParams`` of both albumentations recipes: xyxy pixels, clipped to the image, boxes
    under ``min_box_size`` pixels a side or ``min_visibility`` of their area dropped."""
    import albumentations as A

    return A.BboxParams(format="pascal_voc", label_fields=["labels"], clip=True, min_width=min_box_size,
                        min_height=min_box_size, min_visibility=min_visibility)


class AlbumentationsDetection(Dataset):
    """Reads a JPEG with ``cv2.imdecode``, returns ``(float32 [3, S, S], target dict)``. The
    transform's random state starts from ``seed`` (:func:`seed_albumentations_worker` gives each
    DataLoader worker its own)."""

    def __init__(self, records: list[Record], spec: RecipeSpec, seed: int = 0) -> None:
        self.records = records
        self.transform = albumentations_transform(spec)
        self.transform.set_random_seed(seed)

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int):
        import cv2

        record = self.records[index]
        image = cv2.imdecode(np.fromfile(record.path, dtype=np.uint8), cv2.IMREAD_COLOR)
        image = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
        out = self.transform(image=image, bboxes=record.boxes_xyxy, labels=record.labels)
        boxes = np.asarray(out["bboxes"], dtype=np.float32).reshape(-1, 4)
        labels = np.asarray(out["labels"], dtype=np.int64).reshape(-1)
        return out["image"], {"boxes": torch.from_numpy(boxes), "labels": torch.from_numpy(labels)}


def iter_albumentations(dataset: BenchDataset, settings: BenchSettings) -> Iterator[tuple]:
    """The ``albumentations`` variant: endless ``(images, targets)`` batches."""
    _import_albumentations()
    data = AlbumentationsDetection(load_records(dataset), RecipeSpec(size=settings.size), settings.seed)
    yield from _iterate(data, settings, worker_init_fn=seed_albumentations_worker)


# ------------------------------------------------------------------------------------------
# albumentations 2.x: the YOLO-style recipe (Mosaic)
# ------------------------------------------------------------------------------------------


def albumentations_mosaic_transform(spec: YoloSpec):
    """The YOLO-style recipe as an ``A.Compose`` taking ``image=`` (RGB uint8 HWC), ``bboxes=``
    (pascal_voc xyxy pixels), ``labels=`` and ``mosaic_metadata=`` (the 3 partners, each a dict
    of ``image``, ``bboxes``, ``labels``); returns a uint8 CHW tensor of ``size x size``.

    The closest albumentations 2.0.8 has to :class:`~detaug.bench.recipe.YoloSpec`:

    * ``A.Mosaic(grid_yx=(2, 2), cell_shape=(size, size), target_size=(size, size),
      fit_mode="contain", center_range=(0, 1))``: each image fit into a ``size`` cell (aspect
      kept, as ultralytics' load letterbox), the ``size`` output cut from the ``2 size`` grid
      with the junction anywhere in it (ultralytics' centre range ``0.5 .. 1.5 size``);
    * ``A.Perspective(scale=(0, perspective / 2), p=0.5)``: corners moved by ``|N(0, sigma)|`` of
      each side (detaug: uniform up to ``perspective / 2``);
    * ``A.Affine(translate_percent=translate, scale=(1 - scale, 1 + scale))``, ``fill`` outside;
    * ``A.HueSaturationValue`` with shifts for YOLO's gains: hue ``hsv_h * 180`` (OpenCV's hue
      runs over 180), saturation and value ``hsv_s * 128`` and ``hsv_v * 128`` (the gains at
      mid-range), ``p=1``;
    * ``A.HorizontalFlip(flip_p)``; ``A.LongestMaxSize(size)`` + ``A.PadIfNeeded(size, size)``
      (the letterbox; the mosaic output is already ``size`` square);
    * no MixUp: albumentations 2.0.8 has none.

    Boxes: clipped, dropped under ``min_box_size`` pixels or ``min_visibility`` of their area.
    """
    import albumentations as A
    import cv2
    from albumentations.pytorch import ToTensorV2

    size = spec.size
    return A.Compose(
        [
            A.Mosaic(
                grid_yx=(2, 2),
                target_size=(size, size),
                cell_shape=(size, size),
                center_range=(0.0, 1.0),
                fit_mode="contain",
                interpolation=cv2.INTER_LINEAR,
                fill=spec.fill,
                metadata_key="mosaic_metadata",
                p=1.0,
            ),
            A.Perspective(
                scale=(0.0, spec.perspective / 2),
                keep_size=True,
                interpolation=cv2.INTER_LINEAR,
                border_mode=cv2.BORDER_CONSTANT,
                fill=spec.fill,
                p=0.5,
            ),
            A.Affine(
                translate_percent={"x": (-spec.translate, spec.translate), "y": (-spec.translate, spec.translate)},
                scale=(1.0 - spec.scale, 1.0 + spec.scale),
                keep_ratio=True,
                interpolation=cv2.INTER_LINEAR,
                border_mode=cv2.BORDER_CONSTANT,
                fill=spec.fill,
                p=1.0,
            ),
            A.HueSaturationValue(
                hue_shift_limit=spec.hsv_h * 180.0,
                sat_shift_limit=spec.hsv_s * 128.0,
                val_shift_limit=spec.hsv_v * 128.0,
                p=1.0,
            ),
            A.HorizontalFlip(p=spec.flip_p),
            A.LongestMaxSize(max_size=size, interpolation=cv2.INTER_LINEAR),
            A.PadIfNeeded(min_height=size, min_width=size, border_mode=cv2.BORDER_CONSTANT, fill=spec.fill),
            ToTensorV2(),
        ],
        bbox_params=_bbox_params(spec.min_box_size, spec.min_visibility),
    )


class MosaicSampler(Sampler[tuple[int, ...]]):
    """``(index, partner_1, ..., partner_k)`` forever: the indices of fresh random permutations of
    ``range(n)``, one after another, each with ``partners`` positions drawn uniformly from the
    whole dataset (with replacement, as ultralytics and detaug draw them), from one seeded
    generator in the main process."""

    def __init__(self, n: int, seed: int, partners: int = 3) -> None:
        if n < 1:
            raise ValueError(f"the dataset is empty (n={n})")
        self.n, self.seed, self.partners = n, seed, partners

    def __iter__(self) -> Iterator[tuple[int, ...]]:
        generator = torch.Generator().manual_seed(self.seed)
        while True:
            order = torch.randperm(self.n, generator=generator)
            partners = torch.randint(self.n, (self.n, self.partners), generator=generator)
            yield from (tuple(row) for row in torch.cat([order[:, None], partners], dim=1).tolist())


class AlbumentationsMosaic(Dataset):
    """Reads the sample's JPEG and its 3 partners' with ``cv2.imdecode``; returns ``(uint8
    [3, S, S], target dict)`` of :func:`albumentations_mosaic_transform`. Indexed by the tuples
    of :class:`MosaicSampler`."""

    def __init__(self, records: list[Record], spec: YoloSpec, seed: int = 0) -> None:
        self.records = records
        self.transform = albumentations_mosaic_transform(spec)
        self.transform.set_random_seed(seed)  # per worker: seed_albumentations_worker

    def __len__(self) -> int:
        return len(self.records)

    def _read(self, index: int) -> dict:
        import cv2

        record = self.records[index]
        image = cv2.imdecode(np.fromfile(record.path, dtype=np.uint8), cv2.IMREAD_COLOR)
        return {"image": cv2.cvtColor(image, cv2.COLOR_BGR2RGB), "bboxes": record.boxes_xyxy, "labels": record.labels}

    def __getitem__(self, indices: tuple[int, ...]):
        first, *partners = indices
        sample = self._read(first)
        out = self.transform(**sample, mosaic_metadata=[self._read(i) for i in partners])
        boxes = np.asarray(out["bboxes"], dtype=np.float32).reshape(-1, 4)
        labels = np.asarray(out["labels"], dtype=np.int64).reshape(-1)
        return out["image"], {"boxes": torch.from_numpy(boxes), "labels": torch.from_numpy(labels)}


def iter_albumentations_mosaic(dataset: BenchDataset, settings: BenchSettings) -> Iterator[tuple]:
    """The ``albumentations-mosaic`` variant (YOLO recipe): endless ``(images, targets)``
    batches, uint8 ``[B, 3, size, size]`` images."""
    _import_albumentations()
    spec = YoloSpec(size=settings.size)
    records = load_records(dataset)
    data = AlbumentationsMosaic(records, spec, settings.seed)
    sampler = MosaicSampler(len(records), settings.seed, partners=spec.mosaic_images - 1)
    yield from _iterate(data, settings, worker_init_fn=seed_albumentations_worker, sampler=sampler)


def _import_albumentations() -> None:
    """Import albumentations and OpenCV, or raise :class:`VariantUnavailable` with the install line."""
    try:
        import albumentations  # noqa: F401
        import cv2  # noqa: F401
    except ImportError as exc:
        raise VariantUnavailable(f"not installed ({PEERS_PIP}, from the detaug clone): {exc}") from exc


# ------------------------------------------------------------------------------------------
# DataLoader plumbing
# ------------------------------------------------------------------------------------------


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


def seed_albumentations_worker(worker_id: int) -> None:
    """:func:`pin_worker_threads`, then the worker's albumentations transform seeded from the
    worker's own seed (PyTorch's, drawn from the seed of the run): albumentations keeps a random
    state of its own, which every forked or spawned worker would otherwise start from the same
    place, or, unseeded, from a different one every run."""
    pin_worker_threads(worker_id)
    info = torch.utils.data.get_worker_info()
    info.dataset.transform.set_random_seed(info.seed % 2**32)


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
