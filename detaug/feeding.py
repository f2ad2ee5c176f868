"""Feeding sample-list sources to DALI's ``fn.external_source``: epochs, shards, seeds, planning.

The per-batch planning of :meth:`detaug.transforms.Compose.plan_batch` runs here, on the host,
*before* a batch enters the augmentation pipeline, never inside it (a Python operator in the graph
would sit in the pipeline's critical path):

* sample-list sources (VOC folders, lists of samples): :class:`BatchFeeder`, in DALI's worker
  processes when the loader uses ``num_workers > 0`` (parallel external source), else in the
  calling process; image shapes come from the encoded files' headers (EXIF orientation applied,
  as DALI's decoders do);
* a ``CocoSource``: :class:`ReaderFeeder`, DALI's COCO reader in a small CPU pipeline in a
  process of its own, which plans its batches ahead.

Batch ``i`` of epoch ``e`` always holds the same samples, drawn from a permutation seeded by
``(seed, e)``; each sample carries the seed words ``(seed, e, index)`` that drive its augmentation.
Everything is a pure function of ``(epoch, step)``, so worker processes need no shared state.
"""

from __future__ import annotations

import io
import pickle
from typing import Any, Sequence

import numpy as np

from detaug.sources import SampleListSource
from detaug.transforms import Compose

__all__ = [
    "shard_range",
    "epoch_order",
    "image_shape",
    "plan_samples",
    "BatchFeeder",
    "ReaderFeeder",
    "FEED_COLUMNS",
    "init_plan_worker",
    "plan_job",
    "DecodedShapes",
]

#: The columns a feeder produces, in order (also the names of the Keras pipeline's inputs).
FEED_COLUMNS = ("data", "params", "boxes", "labels", "image_ids")

_EXIF_ORIENTATION = 0x0112


def shard_range(n: int, shard_id: int, num_shards: int) -> tuple[int, int]:
    """``[begin, end)`` of shard ``shard_id`` of ``n`` samples, split as DALI's readers do."""
    return n * shard_id // num_shards, n * (shard_id + 1) // num_shards


def epoch_order(n: int, epoch: int, *, shuffle: bool, seed: int, begin: int = 0, end: int | None = None) -> np.ndarray:
    """Source positions of shard ``[begin, end)`` in ``epoch``'s order: a permutation of all ``n``
    drawn from ``(seed, epoch)`` when ``shuffle`` (the same on every rank), then sliced."""
    order = np.arange(n)
    if shuffle:
        order = np.random.default_rng([seed, epoch]).permutation(order)
    return order[begin:end]


def image_shape(data: np.ndarray) -> tuple[int, int, int]:
    """``(height, width, 3)`` of an image: a decoded ``[H, W, 3]`` array, or encoded bytes (read
    from the header, with the EXIF orientation applied as DALI's decoders do)."""
    if data.ndim == 3:
        return int(data.shape[0]), int(data.shape[1]), 3
    from PIL import Image

    with Image.open(io.BytesIO(data.tobytes())) as im:
        w, h = im.size
        if im.format in ("JPEG", "TIFF", "WEBP") and im.getexif().get(_EXIF_ORIENTATION, 1) in (5, 6, 7, 8):
            w, h = h, w
    return h, w, 3


def plan_samples(
    source: SampleListSource, transforms: Compose, indices: Sequence[int], seeds: Sequence[np.ndarray]
) -> tuple[list[np.ndarray], ...]:
    """Load and plan the samples at ``indices``: the :data:`FEED_COLUMNS` lists (image data,
    parameter vectors, output boxes, output labels, image ids) for one batch."""
    data, boxes, labels, ids, shapes = [], [], [], [], []
    for i in indices:
        try:
            d, b, lab, image_id = source.load(int(i))
            shapes.append(np.array(image_shape(d)))
        except (OSError, ValueError, SyntaxError) as err:  # PIL raises SyntaxError on some headers
            raise type(err)(f"{source.describe(int(i))}: {err}") from err
        data.append(d)
        boxes.append(b)
        labels.append(lab)
        ids.append(image_id)
    params, out_boxes, out_labels = transforms.plan_batch(shapes, boxes, labels, list(seeds))
    return data, params, out_boxes, out_labels, ids


class BatchFeeder:
    """The ``source`` of a batch-mode ``fn.external_source``: ``feeder(batch_info)`` returns the
    :data:`FEED_COLUMNS` of global step ``batch_info.iteration`` (epochs follow one another
    without a break; the last batch of each epoch holds the remainder).

    Stateless apart from its arguments and picklable, so DALI can run it in worker processes.
    """

    def __init__(
        self,
        source: SampleListSource,
        transforms: Compose,
        batch_size: int,
        *,
        shuffle: bool,
        seed: int,
        shard_id: int,
        num_shards: int,
    ) -> None:
        self.source = source
        self.transforms = transforms
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.begin, self.end = shard_range(len(source), shard_id, num_shards)
        self.steps_per_epoch = -(-(self.end - self.begin) // batch_size)
        self._cached: tuple[int, np.ndarray] | None = None

    def order(self, epoch: int) -> np.ndarray:
        if self._cached is None or self._cached[0] != epoch:
            self._cached = (epoch, epoch_order(len(self.source), epoch, shuffle=self.shuffle, seed=self.seed, begin=self.begin, end=self.end))
        return self._cached[1]

    def batch(self, epoch: int, step: int) -> tuple[list[np.ndarray], ...]:
        """The columns of batch ``step`` of ``epoch``."""
        indices = self.order(epoch)[step * self.batch_size : (step + 1) * self.batch_size]
        seeds = [np.array([self.seed, epoch, i], dtype=np.int64) for i in indices]
        return plan_samples(self.source, self.transforms, indices, seeds)

    def __call__(self, batch_info: Any) -> tuple[list[np.ndarray], ...]:
        epoch, step = divmod(int(batch_info.iteration), self.steps_per_epoch)
        return self.batch(epoch, step)


class ReaderFeeder:
    """Feeds a :class:`~detaug.sources.CocoSource` read by DALI's ``fn.readers.coco``.

    ``num_workers`` processes of its own (started with ``spawn``) each run the reader in a small
    CPU pipeline (file reading, shuffling and sharding in DALI's C++ threads, image shapes from
    ``fn.peek_image_shape``) with the same seed, so they all see the same stream of batches;
    worker ``w`` plans and queues the batches ``s`` with ``s % num_workers == w``, and
    ``feeder(batch_info)`` returns them in order (:data:`FEED_COLUMNS`). Planning thus runs in
    parallel and overlaps the augmentation pipeline instead of stalling it (Python work in the
    process that drives DALI does), and the batches do not depend on the number of workers.
    Batches are full: the reader pads the last batch of an epoch by repeating its last sample,
    and the loader drops the padding. Sample ``k`` of reader step ``s`` carries the seed words
    ``(seed, s, k)``.
    """

    def __init__(
        self,
        source: Any,
        transforms: Compose,
        batch_size: int,
        *,
        seed: int,
        shard_id: int,
        num_shards: int,
        num_workers: int = 1,
        num_threads: int = 2,
        queue_depth: int = 3,
    ) -> None:
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        self._stop = context.Event()
        self._queues = [context.Queue(maxsize=queue_depth) for _ in range(max(1, num_workers))]
        self._processes = [
            context.Process(
                target=_run_reader,
                args=(q, self._stop, w, len(self._queues), source, transforms, batch_size, seed, shard_id, num_shards, num_threads),
                name=f"detaug-coco-reader-{w}",
                daemon=True,
            )
            for w, q in enumerate(self._queues)
        ]
        for process in self._processes:
            process.start()
        self._step = 0
        self.epoch_size = int(self._next(0))
        for w in range(1, len(self._queues)):
            self._next(w)  # every worker announces the epoch size

    def _next(self, worker: int) -> Any:
        """The next item of a worker's queue, raising the reader's error, or an error of our own
        when its process died without one (it was killed, or could not start)."""
        import queue

        while True:
            try:
                item = self._queues[worker].get(timeout=1.0)
                break
            except queue.Empty:
                process = self._processes[worker]
                if not process.is_alive():
                    self.close()
                    raise RuntimeError(
                        f"the COCO reader process stopped (exit code {process.exitcode}); "
                        "if it could not start, run your script from a file, not from standard input"
                    ) from None
        if isinstance(item, str):
            self.close()
            raise RuntimeError(item)
        return item

    def __call__(self, batch_info: Any = None) -> tuple[list[np.ndarray], ...]:
        item = self._next(self._step % len(self._queues))
        self._step += 1
        return item

    def close(self) -> None:
        """Stop the reader processes."""
        self._stop.set()
        for process in self._processes:
            process.join(timeout=2)
            if process.is_alive():
                process.terminate()
                process.join(timeout=2)


def _run_reader(out: Any, stop: Any, worker: int, num_workers: int, source: Any, transforms: Compose,
                batch_size: int, seed: int, shard_id: int, num_shards: int, num_threads: int) -> None:
    """The body of a :class:`ReaderFeeder` process: the epoch size first, then its share of the
    planned batches forever (or an error message, a ``str``)."""
    import queue
    import traceback

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                out.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    try:
        from nvidia.dali import fn, pipeline_def

        from detaug.sources import READER_NAME

        @pipeline_def(batch_size=batch_size, num_threads=num_threads, device_id=None, seed=seed)
        def reader_pipeline():
            encoded, boxes, labels, image_ids = source.dali_read(shard_id, num_shards)
            return encoded, boxes, labels, image_ids, fn.peek_image_shape(encoded)

        pipe = reader_pipeline()
        pipe.build()
        if not put(int(pipe.reader_meta(READER_NAME)["epoch_size"])):
            return
        step = 0
        while True:
            encoded, boxes, labels, image_ids, shapes = pipe.run()
            if step % num_workers != worker:  # another worker's batch
                step += 1
                continue
            n = len(encoded)
            data = [np.array(encoded[k]) for k in range(n)]
            box_list = [np.array(boxes[k], dtype=np.float32).reshape(-1, 4) for k in range(n)]
            label_list = [np.array(labels[k]).reshape(-1).astype(np.int32) for k in range(n)]
            ids = [np.array(image_ids[k], dtype=np.int32).reshape(1) for k in range(n)]
            seeds = [np.array([seed, step, k], dtype=np.int64) for k in range(n)]
            planned = transforms.plan_batch([np.array(shapes[k]) for k in range(n)], box_list, label_list, seeds)
            if not put((data, *planned, ids)):
                return
            step += 1
    except Exception as err:  # noqa: BLE001 - the consumer raises it, with DALI's message naming the file
        put(f"COCO reader ({source.annotations_file}): {type(err).__name__}: {err}\n{traceback.format_exc(limit=3)}")


# -- planning workers of the Keras Sequence (here, so that workers import neither Keras nor torch) --

_PLANNING: tuple[Any, Compose] | None = None  # (source, recipe), in a planning worker
PAYLOAD_MAGIC = b"detaug planning payload\n"


def init_plan_worker(payload: bytes | str) -> None:
    """A planning worker's initializer: ``PAYLOAD_MAGIC`` and the pickled source and recipe (once
    for all the worker's jobs), or the path to read them from (see ``detaug.keras``)."""
    global _PLANNING
    if isinstance(payload, str):
        try:
            with open(payload, "rb") as f:
                payload = f.read()
        except OSError:  # the pool was shut down (and the file closed) before this worker started
            return
    if not payload.startswith(PAYLOAD_MAGIC):  # ... and the file's descriptor number reused
        return
    _PLANNING = pickle.loads(memoryview(payload)[len(PAYLOAD_MAGIC) :])


def plan_job(indices: np.ndarray, seed: int, epoch: int) -> tuple[list[np.ndarray] | None, ...]:
    """In a planning worker: :func:`~detaug.feeding.plan_samples` of one batch. The image data
    column holds the encoded bytes the worker read (the caller need not read the files again),
    or ``None`` for decoded arrays, which the workers only know the shapes of (``DecodedShapes``)."""
    if _PLANNING is None:
        raise RuntimeError("this planning worker started after its pool was shut down")
    source, transforms = _PLANNING
    seeds = [np.array([seed, epoch, j], dtype=np.int64) for j in indices]
    data, *rest = plan_samples(source, transforms, indices, seeds)
    return (None if isinstance(source, DecodedShapes) else data, *rest)


class DecodedShapes:
    """What planning workers get of a source of decoded arrays: each image's shape, not its
    pixels (``load`` returns a read-only zero-stride view of that shape), boxes, labels, ids."""

    def __init__(self, source: SampleListSource) -> None:
        self.samples = [(np.shape(s.image), s.boxes, s.labels, s.image_id) for s in source.samples]

    def __len__(self) -> int:
        return len(self.samples)

    def describe(self, index: int) -> str:
        return f"sample {index} (array {self.samples[index][0]})"

    def load(self, index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        shape, boxes, labels, image_id = self.samples[index]
        data = np.broadcast_to(np.zeros((), np.uint8), (*shape[:2], 3))  # the shape SampleListSource.load gives
        return data, boxes, labels, np.array([image_id], dtype=np.int32)
