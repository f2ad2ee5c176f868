"""Data sources: where images, boxes and labels come from.

Every source yields, per sample, an image (encoded bytes, or a decoded ``uint8 [H, W, 3]`` RGB
array), float32 ``[N, 4]`` absolute ``xyxy`` boxes in continuous pixel coordinates, int32 ``[N]``
category ids, and an int image id.

* :class:`CocoSource` reads a COCO JSON with DALI's own ``fn.readers.coco`` (its fast path).
* :class:`SampleListSource` takes an in-memory list of samples (file paths, encoded bytes or
  decoded arrays) and feeds them through ``fn.external_source``.
* :class:`VocSource` reads a Pascal VOC folder through the ``voc2coco`` converter, in memory.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

__all__ = ["Sample", "CocoSource", "SampleListSource", "VocSource"]

READER_NAME = "Reader"


@dataclass
class Sample:
    """One annotated image.

    Attributes:
        image: a file path, encoded bytes (JPEG, PNG, ...), or a decoded ``uint8 [H, W, 3]`` RGB
            array (``[H, W]`` grayscale is expanded to RGB).
        boxes: float32 ``[N, 4]`` absolute ``xyxy`` boxes, pixel ``i`` spanning ``[i, i + 1)``.
        labels: int ``[N]`` category ids.
        image_id: an integer id returned with the sample's target.
    """

    image: str | os.PathLike | bytes | np.ndarray
    boxes: np.ndarray = field(default_factory=lambda: np.zeros((0, 4), np.float32))
    labels: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    image_id: int = 0


class CocoSource:
    """A COCO detection dataset read by DALI's ``fn.readers.coco``.

    Args:
        annotations_file: the COCO JSON (``bbox`` as ``[x, y, w, h]`` absolute pixels).
        images_dir: folder the images' ``file_name`` are relative to.
        shuffle: shuffle samples (DALI's shuffle buffer, ``initial_fill`` samples deep).
        seed: the reader's shuffling seed (``None``: the pipeline's seed).
        skip_empty: skip images without (non-crowd, when ``include_iscrowd=False``) boxes.
        include_iscrowd: keep ``iscrowd=1`` annotations as boxes.
        shard_id, num_shards: read one shard of the dataset (``None``: from the loader, which
            takes them from ``torch.distributed`` / torchrun's ``RANK`` and ``WORLD_SIZE``).
        initial_fill: size of the shuffle buffer.
    """

    def __init__(
        self,
        annotations_file: str | os.PathLike,
        images_dir: str | os.PathLike,
        *,
        shuffle: bool = False,
        seed: int | None = None,
        skip_empty: bool = False,
        include_iscrowd: bool = True,
        shard_id: int | None = None,
        num_shards: int | None = None,
        initial_fill: int = 1024,
    ) -> None:
        self.annotations_file = Path(annotations_file)
        self.images_dir = Path(images_dir)
        if not self.annotations_file.is_file():
            raise FileNotFoundError(f"{self.annotations_file}: COCO annotations file not found")
        if not self.images_dir.is_dir():
            raise FileNotFoundError(f"{self.images_dir}: images folder not found")
        self.shuffle = shuffle
        self.seed = seed
        self.skip_empty = skip_empty
        self.include_iscrowd = include_iscrowd
        self.shard_id = shard_id
        self.num_shards = num_shards
        self.initial_fill = initial_fill
        self._categories: dict[int, str] | None = None

    @property
    def categories(self) -> dict[int, str]:
        """Category names by id, from the JSON."""
        if self._categories is None:
            with open(self.annotations_file, encoding="utf-8") as f:
                data = json.load(f)
            self._categories = {int(c["id"]): str(c["name"]) for c in data.get("categories", [])}
        return self._categories

    def to_sample_list(self) -> "SampleListSource":
        """The same dataset as an in-memory :class:`SampleListSource` (for random access), with
        this source's ``skip_empty`` and ``include_iscrowd`` applied."""
        with open(self.annotations_file, encoding="utf-8") as f:
            coco = json.load(f)
        samples = coco_to_samples(coco, self.images_dir, include_iscrowd=self.include_iscrowd)
        if self.skip_empty:
            samples = [s for s in samples if len(s.boxes)]
        return SampleListSource(samples, self.categories)

    def dali_read(self, shard_id: int, num_shards: int) -> tuple[Any, Any, Any, Any]:
        """Inside a pipeline definition: ``(encoded, boxes xyxy, labels, image_ids)`` DataNodes."""
        from nvidia.dali import fn

        kwargs = {} if self.seed is None else {"seed": self.seed}
        encoded, boxes, labels, image_ids = fn.readers.coco(
            file_root=str(self.images_dir),
            annotations_file=str(self.annotations_file),
            ltrb=True,
            ratio=False,
            image_ids=True,
            skip_empty=self.skip_empty,
            include_iscrowd=self.include_iscrowd,
            random_shuffle=self.shuffle,
            initial_fill=self.initial_fill,
            shard_id=shard_id,
            num_shards=num_shards,
            pad_last_batch=True,
            stick_to_shard=True,
            name=READER_NAME,
            **kwargs,
        )
        return encoded, boxes, labels, image_ids


class SampleListSource:
    """An in-memory list of :class:`Sample` (or dicts with the same keys), fed through
    ``fn.external_source``. All images must be of one kind: paths/bytes (decoded by DALI, on the
    GPU with ``device="gpu"``) or decoded arrays.

    Args:
        samples: the samples; ``image_id`` defaults to the 1-based position when all are 0.
        categories: optional names by category id (for previews).
    """

    def __init__(self, samples: Sequence[Sample | Mapping[str, Any]], categories: Mapping[int, str] | None = None) -> None:
        items = [s if isinstance(s, Sample) else Sample(**s) for s in samples]
        if not items:
            raise ValueError("the sample list is empty")
        decoded = [isinstance(s.image, np.ndarray) for s in items]
        if any(decoded) and not all(decoded):
            raise ValueError("samples mix decoded arrays with paths/bytes; use one kind")
        self.decoded = all(decoded)
        if all(s.image_id == 0 for s in items):
            for i, s in enumerate(items):
                s.image_id = i + 1
        for i, s in enumerate(items):
            s.boxes = np.asarray(s.boxes, dtype=np.float32).reshape(-1, 4)
            s.labels = np.asarray(s.labels).reshape(-1).astype(np.int32)
            if len(s.boxes) != len(s.labels):
                raise ValueError(f"sample {i} ({_describe(s.image)}): {len(s.boxes)} boxes but {len(s.labels)} labels")
        self.samples = items
        self.categories: dict[int, str] = dict(categories or {})

    def __len__(self) -> int:
        return len(self.samples)

    def describe(self, index: int) -> str:
        """A short description of sample ``index`` for messages (its file, or its kind)."""
        return f"sample {index} ({_describe(self.samples[index].image)})"

    def load(self, index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(image data, boxes float32 [N, 4], labels int32 [N], image_id int32 [1])`` of a sample;
        image data is uint8 encoded bytes ``[L]`` or a decoded ``[H, W, 3]`` array."""
        s = self.samples[index]
        image = s.image
        if isinstance(image, np.ndarray):
            data = image if image.ndim == 3 else np.repeat(image[..., None], 3, axis=2)
            if data.dtype != np.uint8 or data.shape[2] != 3:
                raise ValueError(f"sample {index}: decoded images must be uint8 [H, W, 3], got {image.dtype} {image.shape}")
        elif isinstance(image, (bytes, bytearray, memoryview)):
            data = np.frombuffer(image, dtype=np.uint8)
        else:
            try:
                data = np.fromfile(image, dtype=np.uint8)
            except OSError as err:
                raise OSError(f"{image}: cannot read image file: {err.strerror or err}") from err
            if data.size == 0:
                raise ValueError(f"{image}: image file is empty")
        return data, s.boxes, s.labels, np.array([s.image_id], dtype=np.int32)


class VocSource(SampleListSource):
    """A Pascal VOC folder (``Annotations/``, ``JPEGImages/``, ``ImageSets/Main/``) read with the
    ``voc2coco`` converter in memory: the same conventions, checks and skip report, no JSON on disk.

    Arguments after ``root`` are those of :func:`converters.voc2coco.convert`; ``include_iscrowd``
    drops ``iscrowd=1`` boxes (e.g. ``difficult="crowd"``) when false. ``self.report`` holds the
    converter's report of what was skipped and why.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        split: str | None = None,
        *,
        labels: str | Sequence[str] = "discover",
        coords: str = "voc",
        difficult: str = "keep",
        annotations_dir: str | os.PathLike | None = None,
        images_dir: str | os.PathLike | None = None,
        include_iscrowd: bool = True,
        verify_images: bool = False,
    ) -> None:
        from converters.voc2coco import convert

        result = convert(
            root,
            annotations_dir=annotations_dir,
            images_dir=images_dir,
            split=split,
            labels=labels,
            coords=coords,
            difficult=difficult,
            verify_images=verify_images,
        )
        self.report = result.report
        samples = coco_to_samples(result.coco, Path(result.image_root), include_iscrowd=include_iscrowd)
        if not samples:
            raise ValueError(f"{root}: no images to read (split={split!r})\n{self.report.summary()}")
        super().__init__(samples, {int(c["id"]): c["name"] for c in result.coco["categories"]})


def coco_to_samples(coco: Mapping[str, Any], image_root: Path, *, include_iscrowd: bool = True) -> list[Sample]:
    """Samples (file paths, xyxy boxes) of a COCO detection dict, in its image order."""
    by_image: dict[int, list[Mapping[str, Any]]] = {}
    for ann in coco["annotations"]:
        if include_iscrowd or not ann.get("iscrowd", 0):
            by_image.setdefault(int(ann["image_id"]), []).append(ann)
    samples = []
    for img in coco["images"]:
        anns = by_image.get(int(img["id"]), [])
        xywh = np.array([a["bbox"] for a in anns], dtype=np.float32).reshape(-1, 4)
        boxes = np.concatenate([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], axis=1)
        labels = np.array([a["category_id"] for a in anns], dtype=np.int32)
        samples.append(Sample(str(image_root / img["file_name"]), boxes, labels, int(img["id"])))
    return samples


def _describe(image: Any) -> str:
    if isinstance(image, np.ndarray):
        return f"array {image.shape}"
    if isinstance(image, (bytes, bytearray, memoryview)):
        return f"{len(image)} bytes"
    return str(image)
