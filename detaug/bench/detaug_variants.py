"""The measured detaug variants: the PyTorch iterator and the Keras Sequence.

Both run the recipe of ``settings.recipe`` (:func:`detaug.bench.recipe.detaug_recipe`: the default
detection recipe, or ``detaug.transforms.yolo_recipe`` for ``"yolo"``) at ``settings.size`` on a
shuffled ``CocoSource`` (the ``detaug-list`` variant: a ``SampleListSource`` of the same files,
boxes and labels; the YOLO recipe's Mosaic and MixUp partners come from the same source). Every other
setting is the adapters' default for the device (planning workers, DALI threads, Sequence
threads, where the images go; ``--threads`` sets the DALI threads), so the rows measure what a
user gets.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from detaug.bench.dataset import BenchDataset
from detaug.bench.harness import BenchSettings, VariantUnavailable
from detaug.bench.recipe import detaug_recipe

__all__ = [
    "iter_detaug",
    "iter_detaug_cpu",
    "iter_detaug_list",
    "iter_sequence",
    "iter_sequence_numpy",
    "iter_sequence_serial",
]


def iter_detaug(dataset: BenchDataset, settings: BenchSettings, *, sample_list: bool = False) -> Iterator[tuple]:
    """The ``detaug`` variant: ``DetectionLoader`` batches, epoch after epoch, on a ``CocoSource``
    or, with ``sample_list``, on a ``SampleListSource`` of the same samples (file paths)."""
    try:
        from detaug.sources import CocoSource
        from detaug.torch import DetectionLoader
    except ImportError as exc:
        raise VariantUnavailable(f"detaug's PyTorch iterator is not importable: {exc}") from exc
    recipe = detaug_recipe(settings.recipe, settings.size)
    source = CocoSource(
        str(dataset.annotations_file), str(dataset.images_dir), shuffle=True, seed=settings.seed
    )
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


def iter_detaug_cpu(dataset: BenchDataset, settings: BenchSettings) -> Iterator[tuple]:
    """The ``detaug-cpu`` variant: :func:`iter_detaug` with ``device="cpu"`` (DALI's CPU
    operators, ``settings.threads`` threads, images on the host) on every run, GPU or not: what
    a user without a GPU gets."""
    from dataclasses import replace

    return iter_detaug(dataset, replace(settings, device="cpu"))


def iter_sequence(dataset: BenchDataset, settings: BenchSettings, *, mode: str = "fit") -> Iterator:
    """The ``sequence`` variants: ``DetectionSequence`` batches in a random order, epoch after
    epoch. The sequence's planning workers are started (``start_workers``) before the first batch.

    ``mode``:

    * ``"fit"``: as ``model.fit(seq)`` receives them, through Keras' own data path for
      ``fit(shuffle=True)``: its ``PyDatasetAdapter`` asks for the batches of an epoch in a
      random order from ``workers`` threads (the sequence's default, 4 on a GPU), a
      ``max_queue_size`` ahead, and converts them to tensors on Keras' device. The images are
      the sequence's default: on a GPU with Keras' torch backend, torch tensors on the GPU.
    * ``"numpy"``: ``images_on_device=False`` (NumPy images on the host), asked for as Keras'
      ordered enqueuer does (random order, ``workers`` threads, ``max_queue_size`` ahead) but
      without Keras' own conversion (on the torch backend, a ``np.array`` copy and a pageable
      host-to-GPU copy of every batch, ~100 ms for 64 float images of 512x512).
    * ``"serial"``: ``seq[i]`` called directly, one at a time, in a random order (``workers=1``).

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
    if mode == "fit":
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
    if mode == "serial":
        kwargs["workers"] = 1
    if mode == "numpy":
        kwargs["images_on_device"] = False
    sequence = DetectionSequence(source, recipe, **kwargs)
    sequence.start_workers()
    rng = np.random.default_rng(settings.seed)
    try:
        while True:
            if mode == "fit":
                adapter = adapter_class(sequence, shuffle=True)
                adapter.on_epoch_begin()
                try:
                    yield from adapter.get_torch_dataloader()
                finally:
                    adapter.on_epoch_end()  # stops the enqueuer's threads, then sequence.on_epoch_end()
                continue
            order = [int(i) for i in rng.permutation(len(sequence))]
            if mode == "serial":
                for index in order:
                    yield sequence[index]
            else:
                yield from _enqueued(sequence, order)
            sequence.on_epoch_end()
    finally:
        sequence.close()
        del sequence


def _enqueued(sequence, order: list[int]) -> Iterator:
    """``sequence[i]`` for ``i`` in ``order``, as Keras' ordered enqueuer asks for them: from
    ``sequence.workers`` threads, at most ``sequence.max_queue_size`` requests ahead, in order."""
    with ThreadPoolExecutor(sequence.workers) as pool:
        pending: deque = deque()
        for index in order:
            pending.append(pool.submit(sequence.__getitem__, index))
            if len(pending) >= sequence.max_queue_size:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def iter_sequence_numpy(dataset: BenchDataset, settings: BenchSettings) -> Iterator:
    """The ``sequence-numpy`` variant: :func:`iter_sequence` with NumPy images."""
    return iter_sequence(dataset, settings, mode="numpy")


def iter_sequence_serial(dataset: BenchDataset, settings: BenchSettings) -> Iterator:
    """The ``sequence-serial`` variant: :func:`iter_sequence` called one batch at a time."""
    return iter_sequence(dataset, settings, mode="serial")
