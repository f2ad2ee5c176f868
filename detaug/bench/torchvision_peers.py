"""The torchvision peers: torchvision.transforms.v2 in a PyTorch DataLoader on the CPU
(``torchvision``), and on the GPU (``torchvision-gpu``).

CPU: each sample is read and decoded in a worker with ``torchvision.io.decode_jpeg``, augmented
there with the recipe of :mod:`detaug.bench.recipe`, and collated into an image batch plus a list
of target dicts (:mod:`detaug.bench.peer_loader`).

GPU: DataLoader workers only read the files; the main process decodes each batch with
``torchvision.io.decode_jpeg(list, device="cuda")`` (nvJPEG, batched) and runs the same v2 recipe
per sample on the CUDA tensors, then stacks them.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from detaug.bench.dataset import BenchDataset, Record, load_records
from detaug.bench.harness import BenchSettings, VariantUnavailable
from detaug.bench.peer_loader import EndlessRandomSampler, _iterate, pin_worker_threads
from detaug.bench.recipe import RecipeSpec

__all__ = ["TORCHVISION_PIP", "iter_torchvision", "iter_torchvision_gpu", "torchvision_pip", "torchvision_transform"]

#: torchvision must be the build of the installed torch; :func:`torchvision_pip` fills in the version.
TORCHVISION_PIP = 'python3 -m pip install torchvision "torch==<your torch version>"'


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

