"""The measured detaug variants: the PyTorch iterator and the Keras Sequence.

Both run ``detaug.transforms.default_detection_recipe(size)`` on a shuffled ``CocoSource``.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterator

import numpy as np

from detaug.bench.dataset import BenchDataset
from detaug.bench.harness import BenchSettings, VariantUnavailable

__all__ = ["iter_detaug", "iter_detaug_list", "iter_sequence", "iter_sequence_on_device"]


def iter_detaug(dataset: BenchDataset, settings: BenchSettings, *, sample_list: bool = False) -> Iterator[tuple]:
    """The ``detaug`` variant: ``DetectionLoader`` batches, epoch after epoch, on a ``CocoSource``
    (DALI's COCO reader) or, with ``sample_list``, on the same JSON as an in-memory sample list."""
    try:
        from detaug import transforms as T
        from detaug.sources import CocoSource
        from detaug.torch import DetectionLoader
    except ImportError as exc:
        raise VariantUnavailable(f"detaug's PyTorch iterator is not importable: {exc}") from exc
    recipe = T.default_detection_recipe(size=settings.size)
    source = CocoSource(
        str(dataset.annotations_file), str(dataset.images_dir), shuffle=True, seed=settings.seed
    )
    if sample_list:
        source = source.to_sample_list()
    loader = DetectionLoader(
        source,
        recipe,
        batch_size=settings.batch_size,
        device=settings.device,
        num_threads=settings.threads,
        seed=settings.seed,
        shuffle=True,
    )
    try:
        while True:
            yielded = False
            for images, targets in loader:
                yielded = True
                yield images, targets
            if not yielded:
                raise RuntimeError("DetectionLoader produced an empty epoch")
    finally:
        close = getattr(loader, "close", None)
        if close is not None:
            close()
        del loader


def iter_detaug_list(dataset: BenchDataset, settings: BenchSettings) -> Iterator[tuple]:
    """The ``detaug-list`` variant: :func:`iter_detaug` on a sample list (planned in workers)."""
    return iter_detaug(dataset, settings, sample_list=True)


def iter_sequence(dataset: BenchDataset, settings: BenchSettings, *, images_on_device: bool = False) -> Iterator:
    """The ``sequence`` variant: ``DetectionSequence`` items in a random order, epoch after epoch
    (NumPy images on the host, or with ``images_on_device`` torch tensors on the GPU).

    Keras needs a backend; without ``KERAS_BACKEND`` set, PyTorch's is chosen here (detaug's GPU
    hosts have no TensorFlow).
    """
    os.environ.setdefault("KERAS_BACKEND", "torch")
    try:
        import keras  # noqa: F401
    except ImportError as exc:
        raise VariantUnavailable(f"not installed (pip install keras): {exc}") from exc
    try:
        from detaug import transforms as T
        from detaug.keras import DetectionSequence
        from detaug.sources import CocoSource
    except ImportError as exc:
        raise VariantUnavailable(f"detaug's Keras Sequence is not importable: {exc}") from exc
    recipe = T.default_detection_recipe(size=settings.size)
    source = CocoSource(
        str(dataset.annotations_file), str(dataset.images_dir), shuffle=True, seed=settings.seed
    )
    kwargs = {
        "batch_size": settings.batch_size,
        "max_boxes": max(dataset.max_boxes, 1),
        "device": settings.device,
        "shuffle": True,
        "seed": settings.seed,
    }
    if "num_threads" in inspect.signature(DetectionSequence).parameters:
        kwargs["num_threads"] = settings.threads
    if images_on_device:
        if settings.device != "gpu":
            raise VariantUnavailable("images on the device need --device gpu")
        kwargs["images_on_device"] = True
    sequence = DetectionSequence(source, recipe, **kwargs)
    rng = np.random.default_rng(settings.seed)
    try:
        while True:
            if len(sequence) < 1:
                raise RuntimeError("DetectionSequence has no batches")
            for index in rng.permutation(len(sequence)):
                yield sequence[int(index)]
            on_epoch_end = getattr(sequence, "on_epoch_end", None)
            if on_epoch_end is not None:
                on_epoch_end()
    finally:
        close = getattr(sequence, "close", None)
        if close is not None:
            close()
        del sequence


def iter_sequence_on_device(dataset: BenchDataset, settings: BenchSettings) -> Iterator:
    """The ``sequence-gpu`` variant: :func:`iter_sequence` returning the images on the GPU."""
    return iter_sequence(dataset, settings, images_on_device=True)
