"""The measured detaug variants: the PyTorch iterator and the Keras Sequence.

Both run the recipe of ``settings.recipe`` (:func:`detaug.bench.recipe.detaug_recipe`: the default
detection recipe, or ``detaug.transforms.yolo_recipe`` for ``"yolo"``; for ``"masks"`` the
default recipe on ``CocoSource(..., masks=True)`` of the dataset with an ellipse mask per box,
:mod:`detaug.bench.mask_data`, the masks in the targets) at ``settings.size`` on a
shuffled ``CocoSource`` (the ``detaug-list`` variant: a ``SampleListSource`` of the same files,
boxes and labels; the YOLO recipe's Mosaic and MixUp partners come from the same source). Every other
setting is the adapters' default for the device (planning workers, DALI threads, Sequence
threads, where the images go; ``--threads`` sets the DALI threads), so the rows measure what a
user gets.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from typing import Any

from detaug.bench.dataset import BenchDataset
from detaug.bench.harness import BenchSettings, VariantUnavailable
from detaug.bench.recipe import detaug_recipe

__all__ = [
    "iter_detaug",
    "iter_detaug_cpu",
    "iter_detaug_list",
    "iter_sequence",
    "iter_sequence_numpy",
    "iter_sequence_shuffled",
]


def iter_detaug(dataset: BenchDataset, settings: BenchSettings, *, sample_list: bool = False,
                feed_stats: Any = None, **loader_args) -> Iterator[tuple]:
    """The ``detaug`` variant: ``DetectionLoader`` batches, epoch after epoch, on a ``CocoSource``
    or, with ``sample_list``, on a ``SampleListSource`` of the same samples (file paths);
    ``loader_args`` go to the loader as they are (the training rows' ``targets``);
    ``feed_stats`` (a :class:`~detaug.feeder.FeedStats`), where given, counts the loader's takes."""
    try:
        import detaug.sources  # noqa: F401
        import detaug.torch  # noqa: F401
    except ImportError as exc:
        raise VariantUnavailable(f"detaug's PyTorch iterator is not importable: {exc}") from exc
    recipe = detaug_recipe(settings.recipe, settings.size)
    if settings.recipe != "masks":
        yield from _loader_batches(dataset, settings, recipe, str(dataset.annotations_file), sample_list, loader_args,
                                   feed_stats=feed_stats)
        return
    from detaug.bench.mask_data import write_ellipse_masks

    with tempfile.TemporaryDirectory(prefix="detaug-bench-masks-") as scratch:  # removed when the row ends
        annotations = write_ellipse_masks(dataset.annotations_file, os.path.join(scratch, "annotations.json"))
        yield from _loader_batches(dataset, settings, recipe, str(annotations), sample_list,
                                   {"fields": ["masks"], **loader_args}, masks=True, feed_stats=feed_stats)


def _loader_batches(dataset: BenchDataset, settings: BenchSettings, recipe, annotations: str, sample_list: bool,
                    loader_args: dict, *, masks: bool = False, feed_stats: Any = None) -> Iterator[tuple]:
    """:func:`iter_detaug`'s batches: the loader on ``CocoSource(annotations, masks=masks)``."""
    from detaug.sources import CocoSource
    from detaug.torch import DetectionLoader

    source = CocoSource(annotations, str(dataset.images_dir), shuffle=True, seed=settings.seed, masks=masks)
    if sample_list:
        from detaug.sources import Sample, SampleListSource

        source = SampleListSource(
            [Sample(s.image, s.boxes, s.labels, s.image_id, s.size) for s in source.samples],
            categories=source.categories,
        )
    loader = DetectionLoader(
        source,
        recipe,
        batch_size=settings.batch_size,
        device=settings.device,
        num_threads=settings.adapter_threads,  # None: the loader's default
        seed=settings.seed,
        shuffle=True,
        **loader_args,
    )
    if feed_stats is not None:
        loader.feed_stats = feed_stats  # before its first feed starts
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


def iter_detaug_list(dataset: BenchDataset, settings: BenchSettings, *, feed_stats: Any = None) -> Iterator[tuple]:
    """The ``detaug-list`` variant: :func:`iter_detaug` on a sample list (planned in workers)."""
    return iter_detaug(dataset, settings, sample_list=True, feed_stats=feed_stats)


def iter_detaug_cpu(dataset: BenchDataset, settings: BenchSettings) -> Iterator[tuple]:
    """The ``detaug-cpu`` variant: :func:`iter_detaug` with ``device="cpu"`` (DALI's CPU
    operators, ``settings.threads`` threads, images on the host) on every run, GPU or not: what
    a user without a GPU gets."""
    from dataclasses import replace

    return iter_detaug(dataset, replace(settings, device="cpu"))


def iter_sequence(dataset: BenchDataset, settings: BenchSettings, *, mode: str = "fit") -> Iterator:
    """The ``sequence`` variants: ``DetectionSequence`` batches, epoch after epoch, with the
    sequence's defaults (``workers=1``: Keras' loop calls ``seq[i]``, the sequence prepares the
    next batches itself when they are asked for in order). The sequence's planning workers are
    started (``start_workers``) before the first batch.

    ``mode``:

    * ``"fit"``: as ``model.fit(seq, shuffle=False)`` receives them (docs/keras.md: the sequence
      shuffles its samples every epoch, so Keras' batch shuffle adds nothing): Keras' own
      ``PyDatasetAdapter`` asks for the batches of an epoch in order and converts them to
      tensors on Keras' device. The images are the sequence's default: on a GPU with Keras'
      torch backend, torch tensors on the GPU.
    * ``"shuffled"``: the same through ``fit(seq)``'s default ``shuffle=True``: the batches of an
      epoch in a random order, which nothing can prepare ahead (each batch runs alone).
    * ``"numpy"``: ``images_on_device=False`` (NumPy images on the host), asked for in order,
      without Keras' own conversion (on the torch backend, a ``np.array`` copy and a pageable
      host-to-GPU copy of every batch, ~100 ms for 64 float images of 512x512).

    Keras needs a backend; without ``KERAS_BACKEND`` set, PyTorch's is chosen here (detaug's GPU
    hosts have no TensorFlow).
    """
    os.environ.setdefault("KERAS_BACKEND", "torch")
    try:
        import keras  # noqa: F401
    except ImportError as exc:
        raise VariantUnavailable(f'not installed (python3 -m pip install -e ".[keras]", from the detaug clone): {exc}') from exc
    try:
        from detaug.keras import DetectionSequence
        from detaug.sources import CocoSource
    except ImportError as exc:
        raise VariantUnavailable(f"detaug's Keras Sequence is not importable: {exc}") from exc
    adapter_class = None
    if mode in ("fit", "shuffled"):
        try:
            from keras.src.trainers.data_adapters.py_dataset_adapter import (
                PyDatasetAdapter as adapter_class,
            )
        except ImportError as exc:
            raise VariantUnavailable(f"Keras' PyDatasetAdapter is not importable (Keras 3 needed): {exc}") from exc
    recipe = detaug_recipe(settings.recipe, settings.size)
    source = CocoSource(
        str(dataset.annotations_file), str(dataset.images_dir), shuffle=True, seed=settings.seed
    )
    kwargs = {
        "batch_size": settings.batch_size,
        "max_boxes": max(dataset.max_boxes, 1),
        "device": settings.device,
        "shuffle": True,
        "seed": settings.seed,
        "num_threads": settings.adapter_threads,  # None: the sequence's default
    }
    if mode == "numpy":
        kwargs["images_on_device"] = False
    sequence = DetectionSequence(source, recipe, **kwargs)
    sequence.start_workers()
    try:
        while True:
            if adapter_class is not None:
                adapter = adapter_class(sequence, shuffle=mode == "shuffled")
                adapter.on_epoch_begin()
                try:
                    yield from adapter.get_torch_dataloader()
                finally:
                    adapter.on_epoch_end()  # then sequence.on_epoch_end()
                continue
            yield from sequence
            sequence.on_epoch_end()
    finally:
        sequence.close()
        del sequence


def iter_sequence_numpy(dataset: BenchDataset, settings: BenchSettings) -> Iterator:
    """The ``sequence-numpy`` variant: :func:`iter_sequence` with NumPy images."""
    return iter_sequence(dataset, settings, mode="numpy")


def iter_sequence_shuffled(dataset: BenchDataset, settings: BenchSettings) -> Iterator:
    """The ``sequence-shuffled`` variant: :func:`iter_sequence` as ``fit(seq)`` reads it with
    Keras' default ``shuffle=True``."""
    return iter_sequence(dataset, settings, mode="shuffled")
