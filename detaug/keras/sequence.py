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

Access pattern, concurrency and prefetching (the pipeline: :mod:`detaug.keras.pipeline_queue`):

1. ``seq[i]`` right after ``seq[i - 1]`` (or ``seq[0]`` first in an epoch), with no other call in
   progress, is *sequential*: once batch ``i`` is out of the pipeline, the next
   ``detaug.keras.pipeline_queue.PIPELINE_DEPTH`` batches (two) are in it, and DALI prepares them while the
   caller trains on batch ``i``, as the PyTorch loader does. This is how ``fit(seq,
   shuffle=False)`` asks with the default ``workers=1`` (the sequence shuffles its samples every
   epoch itself; docs/keras.md says why Keras' own threads are not the default);
2. ``seq[i]`` may be called from several threads at once (Keras' ``workers > 1``, or your own):
   the sequence runs their batches through one DALI pipeline in the order they come, two at
   once, in one pipeline's memory (batch ``i``'s result does not depend on what ran beside it);
3. a prefetched batch that is not asked for next is dropped (``prefetch_wasted`` counts them):
   in a random order (``fit(seq)``, which shuffles the batch order), with one caller, each batch
   runs alone;
4. the last batches of an epoch prefetch the first of the next one, so that the pipeline does
   not run dry between epochs; ``on_epoch_end()`` moves to the next epoch (and keeps them),
   ``set_epoch(e)`` to another epoch drops them.

Planning ahead (:mod:`detaug.keras.plan_ahead`): the samples and seeds of every batch of an epoch
(and of the next one) are known in advance, so with ``plan_workers > 0`` the host-side work
(reading the image files and their headers, ``Compose.plan_batch``) runs in worker processes,
ahead of the ``seq[i]`` calls, from :meth:`DetectionSequence.start_workers` or the first
``seq[i]`` of an epoch on, for the rest of that epoch and then the next; ``seq[i]`` then only
feeds and runs a pipeline and copies out the images (little Python in the calling threads, which
share one interpreter lock with Keras'). A batch whose plan is not ready is planned in the
calling thread, as with ``plan_workers=0``: the results are the same either way.

Targets (:mod:`detaug.keras.targets`) are ``{"boxes", "labels"}`` padded to ``max_boxes`` with
``-1``, as Keras 3 and KerasHub detectors take them; per-box fields only when asked for
(``fields=``). A sample with more boxes than ``max_boxes`` is handled by ``overflow``:
``"raise"`` (default), ``"warn"`` or ``"truncate"`` (both keep the first ``max_boxes`` boxes,
in annotation order, and count what they cut).

Importing this module imports the Keras that :data:`~detaug.keras.flavor.KERAS_FLAVOR` names
(its base class is chosen here); :mod:`detaug.keras` imports it when ``DetectionSequence`` is
first asked for.
"""

from __future__ import annotations

import operator
import threading
import warnings
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, BrokenExecutor, wait
from typing import Any

import numpy as np

from detaug.decoding import default_planning_workers, threads_beside
from detaug.epochs import check_shard
from detaug.errors import DataWarning
from detaug.keras.flavor import keras_backend, keras_base, keras_module
from detaug.keras.pipeline_queue import DLPACK_BACKENDS, PIPELINE_DEPTH, PipelineQueue
from detaug.keras.plan_ahead import PlanAhead
from detaug.keras.targets import (
    OVERFLOW_POLICIES,
    BoxOverflowWarning,
    check_box_format,
    keras_field_spec,
    overflowing,
    pad_targets,
)
from detaug.labels import LabelMap
from detaug.pipeline import build_pipeline, pick_device, resolve_device
from detaug.decode_failures import DecodeFailure, undecodable
from detaug.epochs import EpochSpec, source_groups
from detaug.field_selection import field_outputs
from detaug.planned_batch import PlannedBatch, batch_columns
from detaug.planning import BatchPlanner
from detaug.transforms import Compose

__all__ = ["DetectionSequence"]

#: The class ``DetectionSequence`` subclasses: Keras 3's ``PyDataset``, ``tf_keras.utils.Sequence``
#: or ``object`` (see :mod:`detaug.keras.flavor`).
_Base = keras_base()


class DetectionSequence(_Base):  # type: ignore[misc, valid-type]
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
        num_threads: DALI CPU threads of the pipeline; ``None``: the CPUs of this rank (those
            this process may use divided by the ranks on the host, ``LOCAL_WORLD_SIZE``) that
            ``plan_workers`` leaves, 1 to 16 (:func:`detaug.decoding.threads_beside`: 8 beside
            8 planning workers on 16 cores).
        shard_id, num_shards: serve one shard of every epoch (the rules of
            :mod:`detaug.epochs`, as the PyTorch loader's: equal shards, padded).
        prefetch: prepare batches ``i + 1`` and ``i + 2`` (``PIPELINE_DEPTH``) while batch ``i``
            is used, when access is sequential.
        plan_workers: processes that plan the batches of the current and the next epoch ahead of
            the ``seq[i]`` calls (read the image headers, run ``Compose.plan_batch``); ``None``: 0 with
            ``device="cpu"`` (DALI needs the cores), else half the CPUs of this rank, 1 to 16
            (:func:`detaug.decoding.default_planning_workers`); 0 plans
            each batch in the calling thread when it is asked for. Started (``spawn``) by
            :meth:`start_workers` or the first ``seq[i]`` (batches are planned in the calling
            thread until they are up, a few seconds when the main script imports Keras);
            stopped by :meth:`close` or when the sequence is collected.
        images_on_device: return the images as a float32 ``[B, H, W, 3]`` tensor on the GPU of
            Keras' backend instead of a NumPy array: a ``torch`` CUDA tensor (torch backend), a
            TensorFlow or JAX GPU tensor handed over through DLPack (the same GPU memory, no host
            copy); the targets too, copied in the calling thread (Keras' ``fit`` would copy them
            in its main thread, behind the model's work). ``None``: on with ``device="gpu"`` when
            Keras runs on torch, TensorFlow or JAX (each would otherwise copy each NumPy batch back
            to the GPU itself, ~100 ms for 64 float images of 512x512), else off.
        workers: Keras' ``PyDataset`` argument: the threads that call ``seq[i]``. ``None``: 1,
            Keras' own loop calls ``seq[i]`` and the sequence prepares the next batches itself
            (sequential access, above). With ``workers > 1`` Keras' ordered enqueuer calls from
            that many threads, whose batches share the sequence's pipeline in turn; it also
            costs 0.1 s at the end of every epoch (Keras 3.15's enqueuer waits out a queue
            timeout when it stops), which a small dataset's epochs feel (docs/keras.md).
        max_queue_size: Keras' ``PyDataset`` argument: batches Keras requests ahead with
            ``workers > 1``, each held until ``fit`` takes it (on the GPU with
            ``images_on_device``: 200 MB for 64 float images of 512x512). ``None``: ``workers``
            (Keras' own default is 10), enough to keep the pipeline full.
        use_multiprocessing: must stay ``False``: a DALI pipeline cannot be forked or pickled.
        on_error: an image that cannot be read or decoded: ``"skip"`` replaces it by the next
            readable sample of the shard's epoch order (named in a :class:`~detaug.DataWarning`
            and listed in :attr:`skipped`), ``"raise"`` raises :class:`~detaug.ImageError`.
        fields: the per-box fields the targets carry besides boxes and labels
            (:func:`detaug.planning.select_fields`): ``"none"`` (default) none, the targets are
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
        # 1. Arguments.
        device = pick_device(device)
        if workers is None:
            workers = 1
        if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 1:
            raise ValueError(f"workers must be an integer >= 1 or None, got {workers!r}")
        if max_queue_size is None:
            max_queue_size = int(workers)
        if isinstance(max_queue_size, bool) or not isinstance(max_queue_size, (int, np.integer)) or max_queue_size < 1:
            raise ValueError(f"max_queue_size must be an integer >= 1 or None, got {max_queue_size!r}")
        if getattr(_Base, "__name__", "") == "PyDataset":
            super().__init__(workers=int(workers), use_multiprocessing=use_multiprocessing, max_queue_size=max_queue_size)
        else:
            super().__init__()
            self.workers, self.use_multiprocessing, self.max_queue_size = int(workers), use_multiprocessing, max_queue_size
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
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
        if plan_workers is not None and (
            isinstance(plan_workers, bool) or not isinstance(plan_workers, (int, np.integer)) or plan_workers < 0
        ):
            raise ValueError(f"plan_workers must be an integer >= 0 or None, got {plan_workers!r}")
        if not isinstance(transforms, Compose):
            raise TypeError(f"transforms must be a detaug.transforms.Compose, got {type(transforms).__name__}")
        self.bounding_box_format = check_box_format(bounding_box_format)

        # 2. Source, shard and shuffle flag (the epoch rules of detaug.epochs, as the PyTorch loader's).
        if not hasattr(source, "samples") or not hasattr(source, "load"):
            raise TypeError(f"source must be a CocoSource, VocSource or SampleListSource, got {type(source).__name__}")
        shuffle = bool(getattr(source, "shuffle", False)) if shuffle is None else bool(shuffle)
        shard_id = getattr(source, "shard_id", None) if shard_id is None else shard_id
        num_shards = getattr(source, "num_shards", None) if num_shards is None else num_shards
        shard_id, num_shards = check_shard(0 if shard_id is None else shard_id, 1 if num_shards is None else num_shards)

        most = int(source.max_boxes())  # columnar sources answer without a pass over the samples
        if max_boxes is None:
            max_boxes = max(most, 1)
        if isinstance(max_boxes, bool) or not isinstance(max_boxes, (int, np.integer)) or max_boxes < 1:
            raise ValueError(f"max_boxes must be an integer >= 1 or None, got {max_boxes!r}")

        # 3. Class indices (before any pipeline is built).
        self.label_map = label_map
        self.label_mapping = LabelMap.from_source(source, label_map, first=0)
        if num_classes is not None:
            self.label_mapping.check_num_classes(num_classes, adapter="DetectionSequence")
        self.num_classes = num_classes

        self.source = source
        self.categories = source.categories
        self.transforms = transforms
        self.batch_size = int(batch_size)
        self.max_boxes = int(max_boxes)
        self.most_source_boxes = most
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.device = device
        self.device_id = resolve_device(device, device_id)
        self.overflow = overflow
        self.drop_last = bool(drop_last)
        self.prefetch = bool(prefetch)
        if plan_workers is None:
            plan_workers = default_planning_workers(on_gpu=self.device_id is not None)
        self.plan_workers = int(plan_workers)
        # None: the rank's CPUs the planning workers leave
        self.num_threads = threads_beside(self.plan_workers) if num_threads is None else int(num_threads)
        self.shard_id, self.num_shards = shard_id, num_shards
        self.spec = EpochSpec(n=len(source), batch_size=self.batch_size, shard_id=shard_id, num_shards=num_shards,
                              shuffle=self.shuffle, drop_last=self.drop_last, seed=self.seed,
                              groups=source_groups(source))
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
        self.skipped: list[dict[str, Any]] = []
        self.repaired: list[dict[str, Any]] = []
        self._warned: set[tuple[str, str]] = set()
        self._bad: dict[int, str] = {}  # positions whose image failed in DALI -> reason

        self.boxes_truncated = 0
        self.samples_truncated = 0
        self.prefetch_hits = 0
        self.planned_ahead = 0
        self.planned_inline = 0
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
    def class_names(self) -> list[str | None]:
        """The name of each class index (see the class docstring); a new list."""
        return self.label_mapping.class_names

    @property
    def category_ids(self) -> list[int]:
        """The category id of each class index, ``-1`` for none (see the class docstring); a new list."""
        return self.label_mapping.category_ids

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
            if ticket is None:
                ticket = queue.submit(self._plan(i, epoch))
            while True:
                try:
                    images = queue.result(ticket)
                    break
                except DecodeFailure as failure:  # DALI failed on an image whose header was fine
                    ticket = queue.submit(self._without_undecodable(ticket.planned, failure))
            if self.prefetch and sequential:  # the next batches, into the next epoch at the end of this one
                for ahead in range(1, 1 + PIPELINE_DEPTH):
                    next_epoch, j = self.spec.after(epoch, i, ahead)
                    self._prefetch_next(j, next_epoch)
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
        if not futures:
            return False
        done, _ = wait(futures, timeout=timeout, return_when=FIRST_COMPLETED)
        return any(not f.cancelled() and not isinstance(f.exception(), BrokenExecutor) for f in done)

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

    # -- plans and the pipeline ----------------------------------------------------------------------

    def _build(self) -> Any:
        pipe = build_pipeline(
            self.source, self.transforms, batch_size=self.batch_size, device=self.device,
            device_id=self.device_id, num_threads=self.num_threads, seed=self.seed, layout="HWC",
            prefetch_queue_depth=PIPELINE_DEPTH,  # the batches of the calls waiting, in turn (detaug.keras.pipeline_queue)
        )
        pipe.build()
        return pipe

    def _check_index(self, index: Any) -> int:
        try:
            i = operator.index(index)
        except TypeError:
            raise TypeError(f"batch indexes must be integers, got {type(index).__name__}") from None
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"batch index {index} out of range for a sequence of {n} batches")
        return i + n if i < 0 else i

    def _plan(self, i: int, epoch: int) -> PlannedBatch:
        """Batch ``i`` of ``epoch``, planned, with its image data: a worker's plan (the image
        bytes it read, or, when it left them out, read here; decoded arrays are taken here), or,
        where its job has not started (or there is none), planned here."""
        with self._lock:
            # a call that began before set_epoch plans its own batch; the next epoch's are planned ahead too
            plannable = self._planner is not None and self._plans_ahead_for(epoch)
            planned = self._planner.take(i, epoch) if plannable else None  # raises the job's error
        ahead = planned is not None
        if planned is None:
            with self._lock:
                bad = dict(self._bad)
            planned = self.planner.plan(epoch, i, bad=bad)  # reads and plans before feeding
        with self._lock:
            if ahead:
                self.planned_ahead += 1
            else:
                self.planned_inline += 1
        if planned.data is None or planned.partners is None:  # decoded arrays, or a plan made without the bytes
            self.planner.fill_data(planned)
        return planned

    def _plans_ahead_for(self, epoch: int) -> bool:
        """Whether ``epoch``'s batches are planned ahead (and prefetched): the current epoch's and
        the next one's (called under the lock)."""
        return epoch in (self.epoch, self.epoch + 1)

    def _without_undecodable(self, planned: PlannedBatch, failure: DecodeFailure) -> PlannedBatch:
        """Batch ``planned`` planned again without the images DALI failed on (``on_error="skip"``),
        or the error naming the culprit (``"raise"``, or no culprit found)."""
        culprits = undecodable(planned)
        if not culprits or self.on_error == "raise":
            raise failure.error(self.source, culprits) from failure.__cause__
        with self._lock:
            self._bad.update(culprits)  # (position, reason) pairs
            bad = dict(self._bad)
        replanned = self.planner.plan(planned.epoch, planned.step, bad=bad)
        if replanned.data is None or replanned.partners is None:
            self.planner.fill_data(replanned)
        return replanned

    def _record(self, planned: PlannedBatch) -> None:
        """Keep the batch's skipped images and repaired boxes (:attr:`skipped`,
        :attr:`repaired`); warn once per file and reason."""
        if not planned.skipped and not planned.repaired:
            return
        with self._lock:
            self.skipped.extend(planned.skipped)
            self.repaired.extend(planned.repaired)
            messages = planned.new_findings(self._warned)
        for message in messages:
            warnings.warn(message, DataWarning, stacklevel=3)

    def _prefetch_next(self, i: int, epoch: int) -> None:
        """Submit batch ``i`` for a later call, unless one is held for it already, and feed it now
        if the pipeline is free. Errors are not this call's: batch ``i`` raises them when it is
        asked for."""
        with self._lock:
            if (epoch, i) in self._queue.prefetched:
                return
        try:
            planned = self._plan(i, epoch)
        except Exception:  # noqa: BLE001 - batch i's error, raised again when batch i is asked for
            return
        with self._lock:
            if not self._plans_ahead_for(epoch):  # the sequence moved on meanwhile
                return
            self._queue.hold((epoch, i), self._queue.submit(planned))
        self._queue.feed_waiting()

    # -- Keras targets ----------------------------------------------------------------------------

    def _targets(self, i: int, epoch: int, planned: PlannedBatch, images: Any) -> dict[str, np.ndarray]:
        """The batch's boxes (xyxy ``[N_k, 4]`` per sample, the plan's: the pipeline only moves
        pixels), labels and fields padded to ``max_boxes`` rows
        (:func:`~detaug.keras.targets.pad_targets`), after the ``overflow`` policy."""
        over = overflowing(planned.boxes, self.max_boxes)
        if over:
            self._overflow(i, epoch, planned.image_ids, over, planned.boxes)
        height, width = images.shape[1:3]
        return pad_targets(batch_columns(planned), self.max_boxes, self.bounding_box_format, (height, width),
                           self.label_mapping, self._field_outputs)

    def _overflow(self, i: int, epoch: int, image_ids: np.ndarray, over: list[int], boxes: list[np.ndarray]) -> None:
        detail = ", ".join(
            f"image_id {image_ids[k]}: {len(boxes[k])}" for k in over[:5]
        ) + (", ..." if len(over) > 5 else "")
        if self.overflow == "raise":
            raise ValueError(
                f"batch {i} (epoch {epoch}): {len(over)} sample(s) have more than max_boxes={self.max_boxes} "
                f"boxes ({detail}); raise max_boxes (the largest source sample has {self.most_source_boxes}, "
                "max_boxes=None uses that) or pass overflow='warn' or 'truncate' to keep the first max_boxes"
            )
        cut = sum(len(boxes[k]) - self.max_boxes for k in over)
        with self._lock:
            self.boxes_truncated += cut
            self.samples_truncated += len(over)
            so_far = self.boxes_truncated
        if self.overflow == "warn":
            warnings.warn(
                f"batch {i} (epoch {epoch}): cut {cut} box(es) beyond max_boxes={self.max_boxes} "
                f"from {len(over)} sample(s) ({detail}); {so_far} cut so far",
                BoxOverflowWarning,
                stacklevel=5,  # the caller of seq[i]: _overflow < _targets < batch < __getitem__
            )
