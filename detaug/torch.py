"""PyTorch iterator: batches of images and torchvision-style detection targets."""

from __future__ import annotations

import math
import os
import weakref
from typing import Any, Iterator

import numpy as np
import torch

from detaug.feeding import BatchFeeder, ReaderFeeder, shard_range
from detaug.pipeline import build_pipeline, resolve_device
from detaug.sources import CocoSource, SampleListSource
from detaug.transforms import Compose

__all__ = ["DetectionLoader", "distributed_shard"]

Target = dict[str, Any]


def distributed_shard() -> tuple[int, int]:
    """``(rank, world_size)`` from ``torch.distributed`` when initialised, else from torchrun's
    ``RANK`` / ``WORLD_SIZE`` environment variables, else ``(0, 1)``."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


class DetectionLoader:
    """Iterate over augmented batches: ``for images, targets in loader``.

    Args:
        source: a :class:`~detaug.sources.CocoSource`, :class:`~detaug.sources.VocSource` or
            :class:`~detaug.sources.SampleListSource`.
        transforms: the :class:`~detaug.transforms.Compose` recipe.
        batch_size: samples per batch.
        device: ``"gpu"`` (decode with nvJPEG, augment on the GPU) or ``"cpu"``.
        shuffle: reshuffle every epoch (sample-list sources; a ``CocoSource`` has its own flag).
        drop_last: drop the last, smaller batch of an epoch instead of yielding it.
        seed: seeds the pipeline and the augmentations; one seed gives the same boxes on both devices.
        shard_id, num_shards: default to ``torch.distributed`` / torchrun's ``RANK``, ``WORLD_SIZE``.
        num_workers: for sample-list sources, processes that load and plan batches ahead of
            DALI (``None``: 0 on the CPU, where DALI needs the cores, else up to 8). A
            ``CocoSource`` is read by DALI's COCO reader and planned in ``num_workers // 2``
            processes (at least one).

    Yields:
        ``images``: one tensor ``[B, 3, H, W]`` on the pipeline's device (float32 when the recipe
        normalises, else uint8), or a list of ``[3, H, W]`` tensors when the recipe does not fix
        the output size; ``targets``: a list of ``{"boxes": float32 [N, 4] xyxy output-image
        pixels, "labels": int64 [N], "image_id": int}``.

    Every sample of the shard appears exactly once per epoch; ``len(loader)`` is the number of
    batches per epoch; iterating again starts the next epoch.
    """

    def __init__(
        self,
        source: CocoSource | SampleListSource,
        transforms: Compose,
        batch_size: int,
        *,
        device: str = "gpu",
        device_id: int | None = None,
        num_threads: int = 4,
        shuffle: bool = False,
        drop_last: bool = False,
        seed: int = 0,
        shard_id: int | None = None,
        num_shards: int | None = None,
        prefetch_queue_depth: int = 2,
        num_workers: int | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        rank, world = distributed_shard()
        if isinstance(source, CocoSource):
            shard_id = source.shard_id if shard_id is None else shard_id
            num_shards = source.num_shards if num_shards is None else num_shards
        shard_id = rank if shard_id is None else shard_id
        num_shards = world if num_shards is None else num_shards
        if not 0 <= shard_id < num_shards:
            raise ValueError(f"shard_id must be in [0, {num_shards}), got {shard_id}")
        if device in ("gpu", "cuda") and device_id is None:
            device_id = int(os.environ.get("LOCAL_RANK", torch.cuda.current_device() if torch.cuda.is_available() else 0))
        self.device_id = resolve_device(device, device_id)
        self.device = torch.device("cpu") if self.device_id is None else torch.device("cuda", self.device_id)
        self.source, self.transforms, self.batch_size, self.drop_last = source, transforms, batch_size, drop_last
        self.categories = source.categories
        if num_workers is None:
            num_workers = 0 if self.device_id is None else min(8, os.cpu_count() or 1)
        if isinstance(source, SampleListSource):
            feed = BatchFeeder(source, transforms, batch_size, shuffle=shuffle, seed=seed, shard_id=shard_id, num_shards=num_shards)
            self.shard_size = feed.end - feed.begin
        else:
            feed = ReaderFeeder(source, transforms, batch_size, seed=seed, shard_id=shard_id, num_shards=num_shards,
                                num_workers=max(1, num_workers // 2))
            begin, end = shard_range(feed.epoch_size, shard_id, num_shards)
            self.shard_size = end - begin
        self._feed = feed
        self._finalizer = weakref.finalize(self, getattr(feed, "close", lambda: None))
        self.pipeline = build_pipeline(
            source, transforms, batch_size=batch_size, device=device, device_id=self.device_id,
            num_threads=num_threads, seed=seed, shard_id=shard_id, num_shards=num_shards,
            feed=feed, num_workers=num_workers, prefetch_queue_depth=prefetch_queue_depth,
        )
        self.pipeline.build()
        if self.shard_size == 0:
            raise ValueError(f"shard {shard_id} of {num_shards} holds no samples")
        self._left_in_epoch = 0  # batches of an unfinished epoch still in the pipeline

    def close(self) -> None:
        """Stop background work (the COCO reader's processes). Also done when the loader is collected."""
        self._finalizer()

    def __len__(self) -> int:
        full, rest = divmod(self.shard_size, self.batch_size)
        return full if (self.drop_last or rest == 0) else full + 1

    def __iter__(self) -> Iterator[tuple[torch.Tensor | list[torch.Tensor], list[Target]]]:
        for _ in range(self._left_in_epoch):  # a previous epoch was abandoned: skip its rest
            self.pipeline.run()
        steps = math.ceil(self.shard_size / self.batch_size)
        self._left_in_epoch = steps
        for step in range(steps):
            outputs = self.pipeline.run()
            self._left_in_epoch -= 1
            count = min(self.batch_size, self.shard_size - step * self.batch_size)
            if count < self.batch_size and self.drop_last:
                continue
            yield self._to_torch(outputs, count)

    def _to_torch(self, outputs: Any, count: int) -> tuple[torch.Tensor | list[torch.Tensor], list[Target]]:
        images, boxes, labels, image_ids = outputs
        batch = dali_images_to_torch(images, self.device)[:count]
        targets = [
            {
                "boxes": torch.from_numpy(np.array(boxes[i], dtype=np.float32).reshape(-1, 4)),
                "labels": torch.from_numpy(np.array(labels[i]).reshape(-1).astype(np.int64)),
                "image_id": int(np.array(image_ids[i]).ravel()[0]),
            }
            for i in range(count)
        ]
        return batch, targets


def dali_images_to_torch(images: Any, device: torch.device) -> torch.Tensor | list[torch.Tensor]:
    """A DALI ``TensorList`` as one ``torch`` tensor (uniform shapes) or a list of tensors,
    copied (DALI reuses its buffers) onto ``device``."""
    from nvidia.dali.backend import TensorListGPU

    if isinstance(images, TensorListGPU):
        from nvidia.dali.plugin.pytorch import feed_ndarray, to_torch_type

        stream = torch.cuda.current_stream(device)
        if images.is_dense_tensor():
            tensor = images.as_tensor()
            out = torch.empty(tensor.shape(), dtype=to_torch_type[tensor.dtype], device=device)
            feed_ndarray(tensor, out, cuda_stream=stream)
            return out
        result = []
        for i in range(len(images)):
            t = images[i]
            out = torch.empty(t.shape(), dtype=to_torch_type[t.dtype], device=device)
            feed_ndarray(t, out, cuda_stream=stream)
            result.append(out)
        return result
    if images.is_dense_tensor():
        return torch.from_numpy(np.array(images.as_tensor()))
    return [torch.from_numpy(np.array(images[i])) for i in range(len(images))]
