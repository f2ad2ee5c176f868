"""A :class:`~detaug.keras.DetectionSequence`'s batches for the loaders Keras users have besides
``PyDataset``: a ``tf.data.Dataset`` (:func:`to_tf_dataset`) and a Grain random-access source
(:class:`GrainBatchSource`).

Both serve the sequence's own batches, so the seed contract holds: batch ``i`` of epoch ``e``
is identical, bit for bit, to ``seq[i]`` after ``seq.set_epoch(e)`` (the same samples, the same
augmentations). Elements are ``(images, targets)``:

* ``images``: float32 ``[B, H, W, 3]`` (``B <= batch_size``: the last batch of an epoch may be
  smaller unless ``drop_last=True``, or :func:`to_tf_dataset`'s ``pad_last=True`` pads it),
  channels last, as ``seq[i]``'s (a NumPy array here, also when the sequence hands torch tensors
  to Keras' torch backend);
* ``targets``: ``{"boxes": float32 [B, max_boxes, 4], "labels": int32 [B, max_boxes]}`` (and the
  per-box fields the sequence was asked for, ``[B, max_boxes, ...]``, ``seq.field_specs``),
  boxes in the sequence's ``bounding_box_format``, labels its class indices, ``-1`` padding.

TensorFlow and Grain are imported only when these are used.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from detaug.keras.targets import PAD_VALUE

__all__ = ["GrainBatchSource", "element_spec", "last_batch_size", "pad_batch", "to_tf_dataset"]


def _host(array: Any) -> np.ndarray:
    """``array`` (images or a target) as a NumPy array: a torch tensor (CUDA too) or a TensorFlow
    or JAX tensor (``images_on_device``) is copied to the host."""
    if isinstance(array, np.ndarray):
        return array
    if hasattr(array, "detach"):  # torch
        return array.detach().cpu().numpy()
    return np.asarray(array)


def last_batch_size(seq: Any) -> int:
    """Samples in the last batch of an epoch of ``seq`` (the same in every epoch): ``batch_size``
    unless the epoch's samples do not fill it (and ``drop_last=False``)."""
    return len(seq.batch_indices(len(seq) - 1)) if len(seq) else int(seq.batch_size)


def element_spec(seq: Any, pad_last: bool = False) -> tuple[Any, dict[str, Any]]:
    """The ``tf.TensorSpec`` s of ``seq``'s batches: images ``[B, H, W, 3]`` float32 (``H, W``
    from the recipe's fixed output size, ``None`` when it has none), boxes ``[B, max_boxes, 4]``
    float32, labels ``[B, max_boxes]`` int32 and each per-box field ``[B, max_boxes, ...]`` of its
    dtype (``seq.field_specs``). ``B`` is ``batch_size`` when every batch has that many samples
    (``drop_last=True``, an epoch that fills its last batch, or ``pad_last=True``: see
    :func:`to_tf_dataset`), else ``None``."""
    import tensorflow as tf

    height, width = seq.transforms.output_size() or (None, None)
    batch = int(seq.batch_size) if pad_last or last_batch_size(seq) == seq.batch_size else None
    fields = {
        name: tf.TensorSpec((batch, seq.max_boxes, *shape), tf.as_dtype(dtype), name=name)
        for name, (dtype, shape) in getattr(seq, "field_specs", {}).items()
    }
    return (
        tf.TensorSpec((batch, height, width, 3), tf.float32, name="images"),
        {
            "boxes": tf.TensorSpec((batch, seq.max_boxes, 4), tf.float32, name="boxes"),
            "labels": tf.TensorSpec((batch, seq.max_boxes), tf.int32, name="labels"),
            **fields,
        },
    )


def pad_batch(images: np.ndarray, targets: dict[str, np.ndarray], size: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """``(images, targets)`` of ``B <= size`` samples padded to ``size``: images with zeros,
    every target (boxes, labels, fields) with ``-1`` rows, so that a padded sample has no box."""
    missing = size - len(images)
    if missing <= 0:
        return images, targets

    def pad(array: np.ndarray, value: float) -> np.ndarray:
        return np.concatenate([array, np.full((missing, *array.shape[1:]), value, dtype=array.dtype)])

    return pad(images, 0), {name: pad(np.asarray(value), PAD_VALUE) for name, value in targets.items()}


def to_tf_dataset(seq: Any, prefetch: int | None = -1, pad_last: bool = False) -> Any:
    """A ``tf.data.Dataset`` of ``seq``'s batches, one epoch per iteration.

    Each iteration of the dataset (a ``for`` loop, or each epoch of ``model.fit(ds, epochs=E)``)
    serves the ``len(seq)`` batches of one epoch in order: the first iteration epoch
    ``seq.epoch`` as it is when the dataset is made, each later one the next epoch; the
    iteration calls ``seq.set_epoch`` first, so ``seq.epoch`` follows. An iteration stopped
    early (``ds.take(n)``) still counts as its epoch. The batches come from ``seq[i]`` in batch
    order, so the sequence's own prefetching (DALI prepares batch ``i + 1`` while batch ``i`` is
    used) and planning workers apply. Do not use the sequence for anything else while the
    dataset is iterated (the epochs would interleave).

    Args:
        seq: a :class:`~detaug.keras.DetectionSequence`.
        prefetch: batches ``tf.data`` keeps ready ahead of the consumer (``Dataset.prefetch``);
            ``-1`` (default) ``tf.data.AUTOTUNE``; ``None`` or ``0``: none beyond the sequence's own.
        pad_last: pad the last batch of an epoch, when it holds fewer than ``batch_size``
            samples, to ``batch_size`` (:func:`pad_batch`: zero images, no boxes), so that every
            batch, and the ``element_spec``, has the static batch size ``batch_size``. For
            ``model.predict`` of models that need a static batch size (KerasHub's detectors:
            their non-max suppression sizes its arrays from it, and Keras traces a smaller last
            batch with an unknown one); the padded samples come last, so keep the first
            ``len(seq.source)`` predictions (one shard, ``drop_last=False``; in general the
            epoch's samples, ``sum(len(seq.batch_indices(i)) for i in range(len(seq)))``). Not
            for training: a padded sample would count as an image without objects.

    Returns:
        a ``tf.data.Dataset`` with :func:`element_spec`'s ``element_spec``.
    """
    import tensorflow as tf

    state = {"next_epoch": int(seq.epoch)}
    size = int(seq.batch_size)

    def batches() -> Iterator[tuple[np.ndarray, dict[str, np.ndarray]]]:
        epoch = state["next_epoch"]
        state["next_epoch"] = epoch + 1
        seq.set_epoch(epoch)
        for i in range(len(seq)):
            images, targets = seq[i]
            images, targets = _host(images), {name: _host(value) for name, value in targets.items()}
            yield pad_batch(images, targets, size) if pad_last else (images, targets)

    dataset = tf.data.Dataset.from_generator(batches, output_signature=element_spec(seq, pad_last=pad_last))
    dataset = dataset.apply(tf.data.experimental.assert_cardinality(len(seq)))
    if prefetch:
        dataset = dataset.prefetch(tf.data.AUTOTUNE if prefetch == -1 else int(prefetch))
    return dataset


class GrainBatchSource:
    """A Grain random-access source (``grain.MapDataset.source(src)``, ``grain.DataLoader(
    data_source=src, ...)``) of a sequence's batches over ``epochs`` epochs.

    Record ``g`` (``0 <= g < epochs * len(seq)``) is batch ``g % len(seq)`` of epoch
    ``first_epoch + g // len(seq)``: exactly ``seq[g % len(seq)]`` after
    ``seq.set_epoch(first_epoch + g // len(seq))`` (:meth:`DetectionSequence.batch`; the
    sequence's epoch is not moved). Grain's own shuffling (of whole batches), sharding and
    checkpointing then act on that index space; the records are batches already, so do not
    batch them again. The source holds a DALI pipeline, which cannot be pickled: read it in the
    main process (Grain's ``worker_count=0``; its ``ReadOptions(num_threads=...)`` threads may
    call it at once, their batches sharing the pipeline).

    Args:
        seq: a :class:`~detaug.keras.DetectionSequence`.
        epochs: epochs the index space covers (>= 1).
        first_epoch: the epoch of record 0 (``None``: ``seq.epoch``).
    """

    def __init__(self, seq: Any, epochs: int = 1, first_epoch: int | None = None) -> None:
        if isinstance(epochs, bool) or not isinstance(epochs, (int, np.integer)) or epochs < 1:
            raise ValueError(f"epochs must be an integer >= 1, got {epochs!r}")
        self.seq = seq
        self.epochs = int(epochs)
        self.first_epoch = int(seq.epoch if first_epoch is None else first_epoch)

    def __len__(self) -> int:
        """``epochs * len(seq)`` records (batches)."""
        return self.epochs * len(self.seq)

    def locate(self, record: int) -> tuple[int, int]:
        """``(epoch, batch index)`` of record ``record``."""
        n = len(self.seq)
        g = int(record)
        if not 0 <= g < self.epochs * n:
            raise IndexError(f"record {record} out of range for {self.epochs} epoch(s) of {n} batches")
        return self.first_epoch + g // n, g % n

    def __getitem__(self, record: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """``(images, targets)`` of record ``record`` (NumPy arrays, see the module docstring)."""
        epoch, i = self.locate(record)
        images, targets = self.seq.batch(i, epoch)
        return _host(images), {name: _host(value) for name, value in targets.items()}

    def __repr__(self) -> str:
        return f"GrainBatchSource({self.epochs} epoch(s) from {self.first_epoch}, {len(self.seq)} batches each)"
