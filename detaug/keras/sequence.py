"""The Keras face: :class:`DetectionSequence`, an indexable ``PyDataset`` (``Sequence``) of
augmented detection batches.

A Keras ``Sequence`` is random access: ``seq[i]`` may be asked for any batch, in any order, and
``on_epoch_end()`` reshuffles. DALI pipelines are iterators. :class:`DetectionSequence` bridges
the two: batch ``i`` of an epoch is a pure function of the source, the recipe and
``(seed, epoch)`` (the epoch and shard rules of :mod:`detaug.epochs`, each sample augmented from
its key ``(seed, epoch, image_id)``, :mod:`detaug.planning`), and ``seq[i]`` feeds it to a
pipeline's external sources and runs it once. The same ``i`` in the same epoch therefore always
gives the same samples and the same augmentation; a new epoch gives a new order
(``shuffle=True``) and new augmentations.

How batch ``i`` is made (:mod:`detaug.keras.batches`): the plan, by the rules and bookkeeping
it shares with the PyTorch loader (:mod:`detaug.loader_core`), or ahead by the planning workers
(``plan_workers``, :mod:`detaug.keras.plan_ahead`); one DALI pipeline that concurrent calls
share (:mod:`detaug.keras.pipeline_queue`); for sequential calls, the next batches fed to DALI
while the caller trains on this one; a prefetch not asked for
next is dropped (an out-of-order ``seq[i]`` is made on demand).

Importing this module imports the Keras that :data:`~detaug.keras.flavor.KERAS_FLAVOR` names
(its base class is chosen here); :mod:`detaug.keras` imports it when ``DetectionSequence`` is
first asked for.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np

from detaug import loader_core as core
from detaug.keras.batches import SequenceBatches
from detaug.keras.flavor import keras_backend, keras_base, keras_module
from detaug.keras.pipeline_queue import DLPACK_BACKENDS, PIPELINE_DEPTH, PipelineQueue
from detaug.keras.plan_ahead import PlanAhead, any_planned
from detaug.keras.targets import OVERFLOW_POLICIES, check_box_format, keras_field_spec
from detaug.field_selection import field_outputs
from detaug.planning import BatchPlanner
from detaug.transforms import Compose

__all__ = ["DetectionSequence"]

#: The class ``DetectionSequence`` subclasses: Keras 3's ``PyDataset``, ``tf_keras.utils.Sequence``
#: or ``object`` (see :mod:`detaug.keras.flavor`).
_Base = keras_base()
#: Its bases: the Keras class first (``DetectionSequence.__mro__[1]``), then the batches' half and
#: the class indices (shared with the PyTorch loader).
_BASES = ((SequenceBatches, core.LabelledFace) if _Base is object
          else (_Base, SequenceBatches, core.LabelledFace))


class DetectionSequence(*_BASES):  # type: ignore[misc]
    """Augmented detection batches by index, for ``model.fit(seq)`` (and ``fit_generator``).

    Args:
        source: a :class:`~detaug.sources.CocoSource`, :class:`~detaug.sources.VocSource` or
            :class:`~detaug.sources.SampleListSource` (``shuffle=None`` takes the source's flag,
            and its ``shard_id`` / ``num_shards`` are used when given).
        transforms: the :class:`~detaug.transforms.Compose` recipe. Its output size must be
            fixed (end it with ``Resize((h, w))``, ``LetterBox`` or ``RandomResizedCrop``) unless
            every source image has the same size: a batch is one ``[B, H, W, 3]`` array.
        batch_size: samples per batch; the last batch of an epoch may hold fewer.
        max_boxes: rows of the padded targets; ``None``: the most boxes of any source sample
            (at least 1), which no recipe exceeds (transforms only remove boxes).
        shuffle: draw a new sample order every epoch from ``(seed, epoch)``; ``None``: the
            ``CocoSource``'s flag, else ``False``.
        seed: seeds the orders and the augmentations.
        device: ``"auto"`` (default: the GPU where DALI can use one, else the CPU), ``"gpu"``
            (decode with nvJPEG, augment on the GPU; :class:`~detaug.DeviceError` without one)
            or ``"cpu"``.
        bounding_box_format: a Keras format name (:data:`KERAS_BOX_FORMATS`, case-insensitive);
            ``rel_*`` formats divide by the output image's width and height.
        label_map: the targets' ``labels``: ``None`` (default) the source's category ids as they
            are; ``"contiguous"``: the category ids in ascending order become ``0 .. n - 1``, the
            class indices KerasHub detectors one-hot (see :mod:`detaug.labels`).
        num_classes: the model's ``num_classes``; when given, the sequence checks when it is
            built that every class index fits, ``0 <= label < num_classes``, for every category
            of the source (also one without boxes), else a ``ValueError`` names the label, its
            category id and the fix (``label_map="contiguous"`` or a larger ``num_classes``).
            ``None``: not checked.
        overflow: what a sample with more than ``max_boxes`` boxes does: ``"raise"`` a
            ``ValueError``; ``"warn"`` (a :class:`BoxOverflowWarning` with the count) and keep the
            first ``max_boxes`` boxes; ``"truncate"``: keep them without a warning. Cut boxes are
            counted in ``boxes_truncated`` / ``samples_truncated`` either way.
        drop_last: leave out the last, smaller batch of an epoch.
        device_id: the GPU (``None``: 0).
        num_threads: DALI CPU threads of the pipeline; ``None``: the CPUs of this rank that
            ``plan_workers`` leaves, as the PyTorch loader's (:func:`detaug.loader_core.pipeline_threads`).
        hw_decoder_load: the share of JPEGs for the GPU's hardware decoder, as the PyTorch
            loader's (``None``: ``DETAUG_HW_DECODER_LOAD`` when set, else 0.8;
            :func:`detaug.loader_core.hardware_decoder_share`); resolved when the sequence is
            built (``None`` on the CPU).
        shard_id, num_shards: serve one shard of every epoch (the rules of
            :mod:`detaug.epochs`, as the PyTorch loader's: equal shards, padded).
        prefetch: prepare batches ``i + 1`` and ``i + 2`` (``PIPELINE_DEPTH``) while batch ``i``
            is used, when access is sequential: planned and fed to DALI (:mod:`detaug.keras.batches`).
        plan_workers: processes that plan the batches of the current and the next epoch ahead of
            the ``seq[i]`` calls (read the image headers, run ``Compose.plan_batch``); ``None``:
            as the PyTorch loader's ``num_workers`` (:func:`detaug.loader_core.planning_workers`:
            0 on the CPU); 0 plans each batch in the calling thread when it is asked for.
            Started by :meth:`start_workers` or the first ``seq[i]``; stopped by :meth:`close`
            or when the sequence is collected.
        images_on_device: return the images as a float32 ``[B, H, W, 3]`` tensor on the GPU of
            Keras' backend instead of a NumPy array: a ``torch`` CUDA tensor (torch backend), a
            TensorFlow or JAX GPU tensor handed over through DLPack (the same GPU memory, no host
            copy); the targets too. ``None``: on with ``device="gpu"`` when Keras runs on torch,
            TensorFlow or JAX (each would otherwise copy each NumPy batch back to the GPU), else
            off (docs/keras.md).
        workers: Keras' ``PyDataset`` argument: the threads that call ``seq[i]``. ``None``: 1,
            Keras' own loop calls ``seq[i]`` and the sequence prepares the next batches itself
            (sequential access, above). With ``workers > 1`` Keras' ordered enqueuer calls from
            that many threads, whose batches share the sequence's pipeline in turn (its cost:
            docs/keras.md).
        max_queue_size: Keras' ``PyDataset`` argument: batches Keras requests ahead with
            ``workers > 1``, each held until ``fit`` takes it. ``None``: ``workers`` (Keras' own
            default is 10), enough to keep the pipeline full.
        use_multiprocessing: must stay ``False``: a DALI pipeline cannot be forked or pickled.
        on_error: an image that cannot be read or decoded: ``"skip"`` replaces it by the next
            readable sample of the shard's epoch order (named in a :class:`~detaug.DataWarning`
            and listed in :attr:`skipped`), ``"raise"`` raises :class:`~detaug.ImageError`.
        fields: the per-box fields the targets carry besides boxes and labels
            (:func:`detaug.field_selection.select_fields`): ``"none"`` (default) none, the targets are
            ``{"boxes", "labels"}`` only, the structure of a detector's outputs that Keras'
            ``fit`` compares them with; ``"all"`` every field of the source (a ``CocoSource``:
            ``iscrowd`` and ``area``; a ``VocSource``: ``iscrowd`` and ``difficult``; a sample
            list: its ``fields``), or a list of names (``"area"`` is available for any source).
            They follow their boxes through every transform and filter (and ``overflow`` cuts);
            ``area`` is recomputed on the output boxes. (The PyTorch ``DetectionLoader``'s
            default is ``"all"``: its targets are per-image dicts that models read by key.)

    ``seq[i]`` returns ``(images, targets)``:

    * ``images``: float32 ``[B, H, W, 3]``, channels last: normalised when the recipe ends with
      ``Normalize``, else ``0..255``. A NumPy array, or with ``images_on_device`` a GPU tensor of
      Keras' backend (``keras.ops.convert_to_numpy(images)`` gives the array).
    * ``targets``: ``{"boxes": float32 [B, max_boxes, 4], "labels": int32 [B, max_boxes]}``
      (and, when asked for with ``fields=``, ``**fields``), boxes in ``bounding_box_format`` on
      the output image, labels the class indices of ``label_map`` (the source's category ids by
      default), each field ``[B, max_boxes, ...]``
      (float32 for float fields such as ``area``, int32 for the others, such as ``iscrowd``:
      :func:`~detaug.keras.targets.keras_field_dtype`); rows past a sample's boxes are ``-1``.
      NumPy arrays, or with ``images_on_device`` GPU tensors of Keras' backend, as the images.

    Attributes:
        epoch: the current epoch (``on_epoch_end`` adds one; :meth:`set_epoch` sets it).
        boxes_truncated, samples_truncated: boxes cut by ``overflow="warn"``/``"truncate"`` and the
            samples they came from, over every ``seq[i]`` call so far (a batch fetched twice
            counts twice).
        prefetch_hits, prefetch_wasted: prefetched batches that were / were not asked for next.
        planned_ahead, planned_inline: batches fed with a worker's plan / planned in the calling
            thread (``plan_workers=0``, a plan not ready yet, a batch fed a second time).
        fields: the names of the per-box fields of the targets, in order (``()`` by default).
        field_specs: ``{name: (dtype, shape)}``: each field's Keras dtype and trailing shape (``{}`` by default).
        class_names: ``list``, the name of each class index: ``class_names[label]``; with
            ``label_map=None`` an index that is no category id is ``None``. ``len(class_names)``
            is the smallest ``num_classes`` that fits the labels.
        category_ids: ``list[int]``, the category id of each class index, ``category_ids[label]``
            (COCOeval's ``category_id`` of a prediction), ``-1`` where the index is no category (a
            gap); with ``label_map=None`` the identity: ``category_ids[k] == k``.
        label_mapping: the :class:`~detaug.labels.LabelMap` (``to_category_ids(labels)`` maps a
            model's predicted labels back, vectorised, keeping the ``-1`` padding).
    """

    def __init__(
        self,
        source: Any,
        transforms: Compose,
        batch_size: int,
        max_boxes: int | None = None,
        shuffle: bool | None = None,
        seed: int = 0,
        device: str = "auto",
        *,
        bounding_box_format: str = "xyxy",
        overflow: str = "raise",
        drop_last: bool = False,
        device_id: int | None = None,
        num_threads: int | None = None,
        hw_decoder_load: float | None = None,
        shard_id: int | None = None,
        num_shards: int | None = None,
        prefetch: bool = True,
        plan_workers: int | None = None,
        images_on_device: bool | None = None,
        workers: int | None = None,
        max_queue_size: int | None = None,
        use_multiprocessing: bool = False,
        on_error: str = "skip",
        label_map: str | None = None,
        num_classes: int | None = None,
        fields: Any = "none",
    ) -> None:
        # 1. Arguments (the checks and defaults the PyTorch loader shares: detaug.loader_core).
        device, device_id = core.resolve_device_once(device, device_id)
        workers = core.check_count("workers", 1 if workers is None else workers, 1, none_ok=True)
        max_queue_size = core.check_count("max_queue_size", workers if max_queue_size is None else max_queue_size, 1,
                                          none_ok=True)
        if getattr(_Base, "__name__", "") == "PyDataset":
            super().__init__(workers=int(workers), use_multiprocessing=use_multiprocessing, max_queue_size=max_queue_size)
        else:
            super().__init__()
            self.workers, self.use_multiprocessing, self.max_queue_size = int(workers), use_multiprocessing, max_queue_size
        core.check_count("batch_size", batch_size, 1)
        if overflow not in OVERFLOW_POLICIES:
            raise ValueError(f"overflow must be one of {', '.join(map(repr, OVERFLOW_POLICIES))}, got {overflow!r}")
        if use_multiprocessing:
            raise ValueError(
                "use_multiprocessing=True is not supported: the DALI pipeline cannot be pickled or "
                "forked into Keras' worker processes; DALI already runs num_threads worker threads"
            )
        if images_on_device and device == "cpu":
            raise ValueError("images_on_device=True needs device='gpu' (CPU images are host arrays already)")
        if images_on_device is None:
            images_on_device = device != "cpu" and keras_backend() in DLPACK_BACKENDS
        self.images_on_device = bool(images_on_device)
        core.check_count("plan_workers", plan_workers, 0, none_ok=True)
        if not isinstance(transforms, Compose):
            raise TypeError(f"transforms must be a detaug.transforms.Compose, got {type(transforms).__name__}")
        self.bounding_box_format = check_box_format(bounding_box_format)

        # 2. Source, shard and shuffle flag (the epoch rules of detaug.epochs, as the PyTorch loader's).
        if not hasattr(source, "samples") or not hasattr(source, "load"):
            raise TypeError(f"source must be a CocoSource, VocSource or SampleListSource, got {type(source).__name__}")
        shuffle = core.resolve_shuffle(source, shuffle)
        shard_id, num_shards = core.resolve_shard(source, shard_id, num_shards)

        most = int(source.max_boxes())  # columnar sources answer without a pass over the samples
        max_boxes = core.check_count("max_boxes", max(most, 1) if max_boxes is None else max_boxes, 1, none_ok=True)

        # 3. Class indices (before any pipeline is built).
        self._set_labels(source, label_map, num_classes, first=0, adapter="DetectionSequence")

        self.source, self.categories, self.transforms = source, source.categories, transforms
        self.batch_size, self.max_boxes, self.most_source_boxes = int(batch_size), max_boxes, most
        self.shuffle, self.seed, self.device, self.device_id = bool(shuffle), int(seed), device, device_id
        self.overflow, self.drop_last, self.prefetch = overflow, bool(drop_last), bool(prefetch)
        self.plan_workers = core.planning_workers("plan_workers", plan_workers, self.device_id)
        self.num_threads = core.pipeline_threads(num_threads, self.plan_workers)  # None: the CPUs the workers leave
        self.hw_decoder_load = core.hardware_decoder_share(hw_decoder_load, self.device_id)
        self.shard_id, self.num_shards = shard_id, num_shards
        self.spec = core.epoch_spec(source, self.batch_size, (shard_id, num_shards), shuffle=self.shuffle,
                                    drop_last=self.drop_last, seed=self.seed)
        self.planner = BatchPlanner(source, transforms, self.spec, on_error, fields=fields)
        self.fields = self.planner.fields
        self._field_outputs = field_outputs(source, self.fields)
        self.field_specs = {name: keras_field_spec(name, spec, transforms.output_size())
                            for name, spec in self._field_outputs.items()}
        self.on_error = on_error
        if len(self) == 0:  # as the PyTorch loader: every shard has the same (empty) length
            warnings.warn(
                f"the sequence has no batches: each of the {num_shards} shard(s) holds {self.spec.n // num_shards} "
                f"samples, fewer than batch_size={self.batch_size} with drop_last=True", stacklevel=2,
            )
        core.start_bookkeeping(self)  # skipped, repaired, ...

        self.boxes_truncated = self.samples_truncated = self.prefetch_hits = self.planned_ahead = self.planned_inline = 0
        self._lock = threading.Condition()  # guards the counters, the epoch and the pipeline queue
        self._planner = (
            PlanAhead(self.planner, self.plan_workers, num_batches=len(self)) if self.plan_workers and len(self) > 1 else None
        )
        self._last = -1  # last index asked for in this epoch
        self._calls = 0  # seq[i] calls in progress
        self.epoch = 0
        self._queue = PipelineQueue(self._build, PIPELINE_DEPTH, self._lock, device_id=self.device_id,
                                    images_on_device=self.images_on_device, backend=keras_backend())

    # -- the classic Sequence protocol ------------------------------------------------------------

    @property
    def prefetch_wasted(self) -> int:
        """Prefetched batches dropped because nobody asked for them next."""
        return self._queue.wasted

    def __len__(self) -> int:
        """Batches per epoch (the same on every shard)."""
        return len(self.spec)

    def __getitem__(self, index: int) -> tuple[Any, dict[str, np.ndarray]]:
        """Batch ``index`` of the current epoch (negative indexes count from the end); safe to
        call from several threads at once (their batches share the pipeline, two at a time)."""
        return self.batch(index)

    def batch(self, index: int, epoch: int | None = None) -> tuple[Any, dict[str, np.ndarray]]:
        """Batch ``index`` of ``epoch`` (``None``: the current epoch, as ``seq[index]``), without
        moving the sequence's epoch: the same batch ``seq[index]`` gives after
        ``set_epoch(epoch)``. Only calls in the current epoch count as sequential (prefetching)."""
        i = self._check_index(index)
        queue = self._queue
        with self._lock:
            epoch = self.epoch if epoch is None else int(epoch)
            current = epoch == self.epoch
            sequential = current and i == self._last + 1 and self._calls == 0
            if current:
                self._last = i
            self._calls += 1
            ticket = queue.take((epoch, i))
            if ticket is not None:
                self.prefetch_hits += 1
            elif queue.prefetched:  # asked for another batch next: the prefetch is not wanted
                queue.drop_prefetched()
        try:
            ticket, images = self._run(ticket, i, epoch)
            if self.prefetch and sequential:  # the next batches, into the next epoch at the end of this one
                self._prefetch_after(i, epoch)
            self._record(ticket.planned)
            targets = self._targets(i, epoch, ticket.planned, images)
            return images, queue.to_device(targets) if self.images_on_device else targets
        finally:
            with self._lock:
                self._calls -= 1

    def __iter__(self) -> Iterator[tuple[Any, dict[str, np.ndarray]]]:
        """The batches of the current epoch, in order (one epoch; call ``on_epoch_end`` after)."""
        for i in range(len(self)):
            yield self[i]

    def on_epoch_end(self) -> None:
        """Move to the next epoch: new augmentations and, with ``shuffle=True``, a new order."""
        self.set_epoch(self.epoch + 1)

    def set_epoch(self, epoch: int) -> None:
        """Jump to ``epoch`` (e.g. when resuming with ``fit(initial_epoch=...)``)."""
        with self._lock:
            self._queue.drop_prefetched(keep=int(epoch))  # those of the new epoch are wanted
            if self._planner is not None:
                self._planner.set_epoch(int(epoch))  # keeps the plans of the next epoch, cancels others
            self.epoch = int(epoch)
            self._last = -1

    def epoch_callback(self) -> Any:
        """A Keras callback that sets this sequence's epoch to Keras' epoch number when each
        epoch begins. ``fit`` also calls ``on_epoch_end`` once before training (and the epoch
        count then drifts from Keras'); with this callback, epoch ``e`` of ``fit`` always sees
        the same orders and augmentations, also when resumed with ``initial_epoch=e``."""
        keras = keras_module()

        return keras.callbacks.LambdaCallback(on_epoch_begin=lambda epoch, logs=None: self.set_epoch(epoch))

    def start_workers(self, timeout: float | None = 120.0) -> bool:
        """Start the planning workers now (else the first ``seq[i]`` starts them) and wait, up to
        ``timeout`` seconds, until they have planned a first batch of the current epoch; like
        DALI's ``Pipeline.start_py_workers``, before training, so that its first steps run at
        full speed too. ``True`` when the workers are running; ``False`` with
        ``plan_workers=0`` (or fewer than 2 batches), or when they could not start in time."""
        with self._lock:
            if self._planner is None:
                return False
            futures = self._planner.start(self.epoch)
        return any_planned(futures, timeout)

    def batch_indices(self, index: int) -> np.ndarray:
        """int64 ``[B]`` source positions of batch ``index`` in the current epoch (before any
        replacement of an unreadable image)."""
        return self.planner.positions(self.epoch, self._check_index(index)).copy()

    def close(self) -> None:
        """Release the DALI pipeline (and its GPU memory) and stop the planning workers; a
        later ``seq[i]`` builds and starts new ones. Call it when no ``seq[i]`` is in progress."""
        with self._lock:
            self._queue.close()
            if self._planner is not None:
                self._planner.close()

    def to_tf_dataset(self, prefetch: int | None = -1, pad_last: bool = False) -> Any:
        """A ``tf.data.Dataset`` of this sequence's batches, for ``model.fit(ds)`` where a Keras
        ``PyDataset`` is not taken (KerasHub detectors, plain TensorFlow loops); see
        :func:`detaug.keras.data.to_tf_dataset` (each iteration of the dataset is one epoch;
        ``pad_last=True`` pads a smaller last batch to ``batch_size``, for ``model.predict`` of
        models that need a static batch size, such as KerasHub's detectors)."""
        from detaug.keras.data import to_tf_dataset

        return to_tf_dataset(self, prefetch=prefetch, pad_last=pad_last)

    def grain_source(self, epochs: int = 1, first_epoch: int | None = None) -> Any:
        """A Grain random-access source of this sequence's batches over ``epochs`` epochs, for
        ``grain.MapDataset.source(...)``; see :class:`detaug.keras.data.GrainBatchSource`."""
        from detaug.keras.data import GrainBatchSource

        return GrainBatchSource(self, epochs=epochs, first_epoch=first_epoch)

    def __repr__(self) -> str:
        return (
            f"DetectionSequence({len(self.source)} samples, batch_size={self.batch_size}, "
            f"{len(self)} batches, max_boxes={self.max_boxes}, shuffle={self.shuffle}, seed={self.seed}, "
            f"device={self.device!r}, epoch={self.epoch})"
        )
