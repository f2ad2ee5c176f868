"""The albumentations peers: albumentations 2.x in a PyTorch DataLoader on the CPU
(``albumentations``), and its Mosaic for the YOLO-style recipe (``albumentations-mosaic``).

Each sample is read and decoded in a worker with ``cv2.imdecode``, augmented there with the
recipe of :mod:`detaug.bench.recipe`, and collated into an image batch plus a list of target
dicts (:mod:`detaug.bench.peer_loader`). The differences forced by albumentations are listed in
:mod:`detaug.bench.peers` and printed with the results.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

from detaug.bench.dataset import BenchDataset, Record, load_records
from detaug.bench.harness import BenchSettings, VariantUnavailable
from detaug.bench.peer_loader import _iterate, pin_worker_threads
from detaug.bench.recipe import RecipeSpec, YoloSpec

__all__ = [
    "ALBUMENTATIONS_CROP_NOTE",
    "ALBUMENTATIONS_MOSAIC_NOTE",
    "ALBUMENTATIONS_PIP",
    "PEERS_PIP",
    "albumentations_mosaic_transform",
    "albumentations_transform",
    "iter_albumentations",
    "iter_albumentations_mosaic",
]

#: The extra with the CPU peers that do not depend on torch (albumentations, OpenCV, globox):
#: installing it leaves the installed torch as it is. Run from the detaug clone.
PEERS_PIP = 'python3 -m pip install -e ".[peers]"'
ALBUMENTATIONS_PIP = PEERS_PIP
ALBUMENTATIONS_CROP_NOTE = "no IoU crop in albumentations: BBoxSafeRandomCrop stands in"
ALBUMENTATIONS_MOSAIC_NOTE = (
    "albumentations 2.0.8 has no MixUp: none here (detaug blends 10% of its samples); Mosaic crops "
    "the output from the grid, then Perspective, Affine, HSV, flip, letterbox"
)


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
                **_warp_pixels(spec.fill),
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


def _warp_pixels(fill: float) -> dict:
    """The pixel options of the recipes' warps (``A.Affine``, ``A.Perspective``), as detaug's:
    bilinear, ``fill`` outside the image."""
    import cv2

    return {"interpolation": cv2.INTER_LINEAR, "border_mode": cv2.BORDER_CONSTANT, "fill": fill}


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
                **_warp_pixels(spec.fill),
                p=0.5,
            ),
            A.Affine(
                translate_percent={"x": (-spec.translate, spec.translate), "y": (-spec.translate, spec.translate)},
                scale=(1.0 - spec.scale, 1.0 + spec.scale),
                keep_ratio=True,
                **_warp_pixels(spec.fill),
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



def seed_albumentations_worker(worker_id: int) -> None:
    """:func:`pin_worker_threads`, then the worker's albumentations transform seeded from the
    worker's own seed (PyTorch's, drawn from the seed of the run): albumentations keeps a random
    state of its own, which every forked or spawned worker would otherwise start from the same
    place, or, unseeded, from a different one every run."""
    pin_worker_threads(worker_id)
    info = torch.utils.data.get_worker_info()
    info.dataset.transform.set_random_seed(info.seed % 2**32)
