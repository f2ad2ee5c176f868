"""PyTorch iterator: batches of images and torchvision-style detection targets."""

from __future__ import annotations

import contextlib
import os
import warnings
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import torch

from detaug.decoding import default_planning_workers, threads_beside
from detaug.errors import DataWarning, ImageError
from detaug.feeder import BackgroundFeed
from detaug.handover import TARGET_FORMS, build_targets, dali_images_to_torch
from detaug.labels import LabelMap
from detaug.masks import MASKS
from detaug.plan_ahead import PlanPool, batches_ahead, group_size
from detaug.pipeline import build_pipeline, feed, feed_first_run, outputs_outlive_runs, pick_device, resolve_device
from detaug.planning import BatchPlanner, DecodeFailure, EpochSpec, PlannedBatch, batch_columns, source_groups, undecodable
from detaug.epochs import check_shard
from detaug.transforms import Compose

__all__ = ["DetectionLoader", "distributed_shard", "dali_images_to_torch"]

Target = dict[str, Any]

#: Keys of :meth:`DetectionLoader.state_dict` that must match when a state is loaded.
_STATE_CHECKED = ("dataset_size", "batch_size", "shard_id", "num_shards", "shuffle", "drop_last", "seed")


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
        device: ``"auto"`` (default: the GPU where DALI can use one, else the CPU, said once in
            the ``detaug`` log), ``"gpu"`` (decode with nvJPEG, augment on the GPU; a
            :class:`~detaug.DeviceError` where there is none) or ``"cpu"``.
        shuffle: a new order every epoch, drawn from ``(seed, epoch)``; ``None``: the source's
            ``shuffle`` flag (a ``CocoSource`` has one), else ``False``.
        drop_last: every rank drops evenly: ``floor(n / W)`` samples per rank and epoch, and the
            last, smaller batch is dropped (see :mod:`detaug.epochs`).
        num_threads: DALI CPU threads; ``None``: the CPUs of this rank (those this process may
            use divided by the ranks on the host, ``LOCAL_WORLD_SIZE``) that ``num_workers``
            leaves, 1 to 16 (:func:`detaug.decoding.threads_beside`: 8 beside 8 workers on 16
            cores; all 16 with ``num_workers=0``). JPEGs go to the GPU's hardware
            decoder where it has one (``DETAUG_HW_DECODER_LOAD`` sets the share; see
            :mod:`detaug.decoding`).
        seed: seeds the orders and the augmentations: a sample's augmentation is a pure function
            of ``(seed, epoch, image_id)`` (docs/reproducibility.md); one seed gives the same
            boxes on both devices.
        shard_id, num_shards: this rank and the number of ranks; default to the source's, then
            to ``torch.distributed`` / torchrun's ``RANK``, ``WORLD_SIZE``.
        num_workers: processes that read and plan batches ahead of DALI (``None``: 0 on the CPU,
            where DALI needs the cores, else half the CPUs of this rank: the CPUs this process
            may use divided by the ranks on the host, halved, 1 to 16,
            :func:`detaug.decoding.default_planning_workers`); 0 plans in the calling process.
            Each worker plans runs of consecutive batches of about 256 samples at once
            (:func:`detaug.plan_ahead.group_size`: the same plans, less CPU).
        on_error: an image that cannot be read or decoded (missing, empty, truncated, a format
            DALI cannot decode, absurdly large): ``"skip"`` replaces it by the next readable
            sample of the rank's epoch order, warns once per image (:class:`~detaug.DataWarning`)
            and records it in :attr:`skipped`; ``"raise"`` raises :class:`~detaug.ImageError`
            naming the file and the image id.
        label_map: the targets' ``labels``: ``None`` (default) the source's category ids as they
            are; ``"contiguous"``: the category ids in ascending order become ``1 .. n``
            (torchvision's detectors: 0 is the background), see :mod:`detaug.labels`.
        targets: the form of a batch's targets, all on the images' device, made from one
            host-to-device copy of the batch's columns (:mod:`detaug.handover`): ``"dict"``
            (default) torchvision's list of per-image dicts (below); ``"tv_tensors"`` the same
            with images as ``torchvision.tv_tensors.Image`` and boxes as
            ``tv_tensors.BoundingBoxes`` (``XYXY``, ``canvas_size`` of the output image), for
            torchvision.transforms.v2 (needs torchvision); ``"padded"`` one dict ``{"boxes":
            float32 [B, M, 4], "labels": int64 [B, M], "num_boxes": int64 [B], "image_id": int64
            [B], **fields [B, M, ...]}``, rows past an image's boxes -1 (``M``: ``max_boxes``, or
            the batch's largest count); ``"concat"`` one dict ``{"boxes": float32 [N, 4],
            "labels": int64 [N], "batch_index": int64 [N], "num_boxes": int64 [B], "image_id":
            int64 [B], **fields [N, ...]}`` (YOLO-style losses).
        max_boxes: rows per image of ``targets="padded"`` (``None``: the batch's largest count;
            an image with more boxes is a ``ValueError`` naming it).
        ready_batches: finished batches a background thread keeps ready (default 2): the next
            batches are fed to DALI, collected, copied and given their targets while the caller
            trains on this one (:mod:`detaug.feeder`: on the GPU on a stream of the loader's,
            handed over to the caller's current stream without a wait). ``0``: no thread, each
            batch is made inside ``next()``. After an epoch the thread runs on into the next
            one (taken over by the next iteration if it starts there; :meth:`close`, or
            collecting the loader, stops it).
        num_classes: the model's ``num_classes`` (torchvision's, counting the background); when
            given, the loader checks when it is built that every class index fits, ``1 <=
            label < num_classes``, for every category of the source (also one without boxes),
            else a ``ValueError`` names the label, its category id and the fix
            (``label_map="contiguous"`` or a larger ``num_classes``). ``None``: not checked.
        fields: the per-box fields each target carries besides boxes and labels, under their
            names (:func:`detaug.planning.select_fields`): ``"all"`` (default) every field of
            the source (a ``CocoSource``: ``iscrowd`` and ``area``, as torchvision's detection
            references name them; a ``VocSource``: ``iscrowd`` and ``difficult``; a sample
            list: its ``fields``), then ``area`` for a source that has none (every source gives
            it), ``"none"`` none (``{"boxes", "labels", "image_id"}`` only), or a list of names.
            They follow their boxes through every transform and filter; ``area`` is recomputed
            on the output boxes.

    Yields:
        ``images``: one tensor ``[B, 3, H, W]`` on the pipeline's device (float32 when the recipe
        normalises, else uint8) when the recipe fixes the output size (ends with ``Resize((h,
        w))``, ``LetterBox`` or ``RandomResizedCrop``), else always a list of ``[3, H, W]``
        tensors (also when a batch's images happen to share a size); ``targets`` (``"dict"``): a
        list of ``{"boxes": float32 [N, 4] xyxy output-image pixels, "labels": int64 [N] class
        indices (``label_map``), "image_id": int, **fields}``: each field a tensor ``[N, ...]``
        of the boxes kept, in their order (``iscrowd`` int64, ``area`` float32 ``w * h`` output
        pixels, the others in their source dtype); every tensor on the images' device (views of
        one buffer copied once per batch: ``.to(device)`` on them is free).

    Epochs (the rules of ``DistributedSampler``, :mod:`detaug.epochs`): every rank yields
    ``len(loader)`` batches per epoch, the same number on every rank; with ``drop_last=False``
    the union of the ranks' samples is the whole dataset in every epoch (padded with at most
    ``W - 1`` repeats). Iterating again starts the next epoch; :meth:`set_epoch` chooses it;
    :meth:`state_dict` / :meth:`load_state_dict` resume after any batch with exactly the
    batches an unbroken run would have yielded.

    Attributes:
        skipped: ``{"image_id", "file", "reason"}`` of each image skipped, once per image and
            epoch (an image skipped in each of 3 epochs is listed 3 times), however many batches
            met it as a replacement candidate or a Mosaic/MixUp partner.
        repaired: ``{"image_id", "file", "reason", "count"}`` of boxes clipped to an image whose
            size the annotation did not declare, found when it was read (once per image and
            epoch); the source's own repairs are in ``source.report``.
        class_names: ``list``, the name of each class index: ``class_names[label]``. Index 0 is
            ``"__background__"`` (unless, with ``label_map=None``, 0 is a category id), and with
            ``label_map=None`` an index that is no category id is ``None``. ``len(class_names)``
            is the smallest ``num_classes`` (background included) that fits the labels.
        category_ids: ``list[int]``, the category id of each class index, ``category_ids[label]``
            (COCOeval's ``category_id`` of a prediction), ``-1`` where the index is no category
            (the background, a gap); with ``label_map=None`` the identity: ``category_ids[k] == k``.
        label_mapping: the :class:`~detaug.labels.LabelMap` (``to_category_ids(labels)`` maps a
            model's predicted labels back, vectorised).
    """

    def __init__(
        self,
        source: Any,
        transforms: Compose,
        batch_size: int,
        *,
        device: str = "auto",
        device_id: int | None = None,
        num_threads: int | None = None,
        shuffle: bool | None = None,
        drop_last: bool = False,
        seed: int = 0,
        shard_id: int | None = None,
        num_shards: int | None = None,
        prefetch_queue_depth: int = 2,
        num_workers: int | None = None,
        on_error: str = "skip",
        label_map: str | None = None,
        num_classes: int | None = None,
        targets: str = "dict",
        fields: Any = "all",
        max_boxes: int | None = None,
        ready_batches: int = 2,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        if not isinstance(transforms, Compose):
            raise TypeError(f"transforms must be a detaug.transforms.Compose, got {type(transforms).__name__}")
        if targets not in TARGET_KINDS:
            raise ValueError(f"targets must be one of {', '.join(map(repr, TARGET_KINDS))}, got {targets!r}")
        if targets == "tv_tensors":
            _tv_tensors()  # said now, not at the first batch
        if max_boxes is not None and (isinstance(max_boxes, bool) or not isinstance(max_boxes, (int, np.integer))
                                      or max_boxes < 0):
            raise ValueError(f"max_boxes must be an integer >= 0 or None, got {max_boxes!r}")
        if isinstance(ready_batches, bool) or not isinstance(ready_batches, (int, np.integer)) or ready_batches < 0:
            raise ValueError(f"ready_batches must be an integer >= 0, got {ready_batches!r}")
        self.targets, self.max_boxes, self.ready_batches = targets, max_boxes, int(ready_batches)
        self.label_map = label_map
        self.label_mapping = LabelMap.from_source(source, label_map, first=1)  # before any pipeline
        if num_classes is not None:
            self.label_mapping.check_num_classes(num_classes, adapter="DetectionLoader")
        self.num_classes = num_classes
        rank, world = distributed_shard()
        shard_id = getattr(source, "shard_id", None) if shard_id is None else shard_id
        num_shards = getattr(source, "num_shards", None) if num_shards is None else num_shards
        shard_id, num_shards = check_shard(rank if shard_id is None else shard_id, world if num_shards is None else num_shards)
        if shuffle is None:
            shuffle = bool(getattr(source, "shuffle", False))
        device = pick_device(device)
        if device == "gpu" and device_id is None:
            device_id = int(os.environ.get("LOCAL_RANK", torch.cuda.current_device() if torch.cuda.is_available() else 0))
        self.device_id = resolve_device(device, device_id)
        self.device = torch.device("cpu") if self.device_id is None else torch.device("cuda", self.device_id)
        self.source, self.transforms, self.batch_size = source, transforms, int(batch_size)
        self.shuffle, self.drop_last, self.seed = bool(shuffle), bool(drop_last), int(seed)
        self.shard_id, self.num_shards = shard_id, num_shards
        self.categories = source.categories
        self._stacked = transforms.output_size() is not None  # else a list, also for one image
        self.spec = EpochSpec(n=len(source), batch_size=self.batch_size, shard_id=shard_id, num_shards=num_shards,
                              shuffle=self.shuffle, drop_last=self.drop_last, seed=self.seed,
                              groups=source_groups(source))
        self.planner = BatchPlanner(source, transforms, self.spec, on_error, fields=fields)
        self.fields = self.planner.fields  # the names each target carries, in order
        self.on_error = on_error
        if num_workers is None:
            num_workers = default_planning_workers(on_gpu=self.device_id is not None)
        if isinstance(num_workers, bool) or not isinstance(num_workers, (int, np.integer)) or num_workers < 0:
            raise ValueError(f"num_workers must be an integer >= 0 or None, got {num_workers!r}")
        self.num_workers = int(num_workers)
        self._pool = PlanPool(self.planner, self.num_workers) if self.num_workers else None
        if self._pool is not None:
            self._pool.deferred = []  # said by _record, in the caller's thread
        if num_threads is None:  # the rank's CPUs the planning workers leave
            num_threads = threads_beside(self.num_workers)
        self._pipeline_args = dict(batch_size=self.batch_size, device=device, device_id=self.device_id,
                                   num_threads=num_threads, seed=self.seed, prefetch_queue_depth=prefetch_queue_depth)
        self._depth = max(1, int(prefetch_queue_depth))
        self._batch_bytes: int | None = None  # the most image bytes a worker's plan carried (None: none seen)
        self.pipeline = self._build()
        self._broken = False  # the pipeline failed while batches nobody wanted were dropped
        if len(self) == 0:
            warnings.warn(
                f"the loader yields no batches: {len(source)} samples on {num_shards} rank(s) give "
                f"{self.spec.n // num_shards if drop_last else -(-self.spec.n // num_shards)} per rank, "
                f"fewer than batch_size={batch_size} with drop_last=True", stacklevel=2,
            )
        self.skipped: list[dict[str, Any]] = []
        self.repaired: list[dict[str, Any]] = []
        self._warned: set[tuple[str, str]] = set()
        self._bad: dict[int, str] = {}  # positions whose image failed in DALI -> reason
        self._epoch, self._step = 0, 0  # where the next batch comes from
        self._abandoned = False  # an iteration stopped early: the next one starts the next epoch
        self._current: Iterator[Any] | None = None
        self._carry: _Carry | None = None  # batches of the next epoch in flight when an epoch ended
        self._kept_feed: BackgroundFeed | None = None  # the background feed, kept running into the next epoch
        self._feed_at: tuple[int, int] | None = None  # where the kept feed's next batch is
        self._live_feeds: list[BackgroundFeed] = []  # stopped when the loader is collected
        weakref.finalize(self, _stop_feeds, self._live_feeds)

    @property
    def class_names(self) -> list[str | None]:
        """The name of each class index (see the class docstring); a new list."""
        return self.label_mapping.class_names

    @property
    def category_ids(self) -> list[int]:
        """The category id of each class index, ``-1`` for none (see the class docstring); a new list."""
        return self.label_mapping.category_ids

    # -- epochs and resume ---------------------------------------------------------------------

    def __len__(self) -> int:
        """Batches per epoch (the same on every rank)."""
        return len(self.spec)

    @property
    def epoch(self) -> int:
        """The epoch in progress, or the next one to run."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Run ``epoch`` at the next iteration (``DistributedSampler.set_epoch``'s convention).
        Setting the epoch already in progress (after :meth:`load_state_dict`, or an early
        ``break``) keeps its position, so a resumed run may call it as usual."""
        epoch = int(epoch)
        self._close_current()
        if epoch != self._epoch:
            self._epoch, self._step = epoch, 0
        self._abandoned = False

    def state_dict(self) -> dict[str, Any]:
        """Where the next batch comes from: ``{"epoch", "step", ...}`` (torchdata's
        ``StatefulDataLoader`` convention; plain ints and bools, JSON-friendly)."""
        return {
            "epoch": self._epoch, "step": self._step, "dataset_size": self.spec.n, "batch_size": self.batch_size,
            "shard_id": self.shard_id, "num_shards": self.num_shards, "shuffle": self.shuffle,
            "drop_last": self.drop_last, "seed": self.seed,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the next iteration yields exactly the batches that
        remained of that epoch (same samples, same augmentations), then the next epochs."""
        mine = self.state_dict()
        differ = [f"{k}: {state.get(k)!r} != {mine[k]!r}" for k in _STATE_CHECKED if k in state and state[k] != mine[k]]
        if differ:
            raise ValueError("the state was saved by a loader over other data or settings (" + "; ".join(differ) + ")")
        step = int(state["step"])
        if not 0 <= step <= len(self):
            raise ValueError(f"state step {step} out of range for an epoch of {len(self)} batches")
        self._close_current()
        self._epoch, self._step = int(state["epoch"]), step
        self._abandoned = False

    # -- iteration -----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[tuple[torch.Tensor | list[torch.Tensor], Any]]:
        self._close_current()
        if self._abandoned or self._step >= len(self):
            self._epoch, self._step = self._epoch + 1, 0
        self._abandoned = True  # until the epoch completes
        self._current = self._consume(self._epoch, self._step)
        return self._current

    def _consume(self, epoch: int, start: int) -> Iterator[tuple[Any, Any]]:
        """The caller's side: batches made by :meth:`_produce` (in a background thread unless
        ``ready_batches=0``), recorded and counted here, in the caller's thread, as they are
        taken. The thread runs on into the next epoch; when this epoch completes it is kept for
        the next iteration (:meth:`_take_feed`), so no epoch starts with an empty queue."""
        steps = len(self)
        if not self.ready_batches:
            yield from self._consume_inline(epoch, start)
            return
        feed = self._take_feed((epoch, start))
        if feed is None and self._pool is not None:
            self._pool.start()  # here, in the caller's thread (SIGTERM's clean-up is installed from the main one)
        if feed is None and start < steps:
            proxy = weakref.proxy(self)
            feed = BackgroundFeed(lambda: _produce_on(proxy, epoch, start), self.ready_batches, self.device)
            self._live_feeds.append(feed)
        completed = False
        try:
            for _ in range(start, steps):
                try:
                    item_epoch, step, planned, images, targets = feed.take()
                except StopIteration:  # the producer runs on forever; only a bug ends it
                    raise RuntimeError("the loader's background feed ended before the epoch did") from None
                assert item_epoch == epoch, (item_epoch, epoch)
                feed.hand_over(_tensors_of(images, targets))
                self._record(planned)
                self._step = step + 1
                yield images, targets
            self._epoch, self._step, self._abandoned = epoch + 1, 0, False
            completed = True
        except KeyboardInterrupt:  # a Ctrl-C inside a future's wait can leave the pool unusable
            if self._pool is not None:
                self._pool.close(wait=False)  # the next iteration starts new workers
            raise
        finally:
            if feed is not None:
                if completed:
                    self._kept_feed, self._feed_at = feed, (epoch + 1, 0)  # already making the next epoch
                else:
                    _stop_feed(feed, self._live_feeds)  # closes _produce in its thread, which drops the batches in flight

    def _consume_inline(self, epoch: int, start: int) -> Iterator[tuple[Any, Any]]:
        """:meth:`_consume` without a thread: each batch made inside ``next()``."""
        made = _produce(self, epoch, start)
        try:
            for step, planned, images, targets in made:
                self._record(planned)
                self._step = step + 1
                yield images, targets
            self._epoch, self._step, self._abandoned = epoch + 1, 0, False
        except KeyboardInterrupt:  # a Ctrl-C inside a future's wait can leave the pool unusable
            if self._pool is not None:
                self._pool.close(wait=False)  # the next iteration starts new workers
            raise
        finally:
            made.close()

    def _take_feed(self, at: tuple[int, int]) -> BackgroundFeed | None:
        """The background feed kept from the last epoch if this iteration starts where it
        runs (``at``: ``(epoch, step)``), else none (a kept one is stopped)."""
        feed, self._kept_feed = self._kept_feed, None
        if feed is not None and self._feed_at == at:
            return feed
        if feed is not None:
            _stop_feed(feed, self._live_feeds)
        return None

    def _take_carry(self, at: tuple[int, int]) -> _Carry | None:
        """The batches carried over from the last epoch if the iteration starts where they do
        (``at``: ``(epoch, step)``), else none (those are dropped)."""
        if self._carry is not None and self._carry.at == at:
            carry, self._carry = self._carry, None
            return carry
        self._discard_carry()
        return None

    def _discard_carry(self) -> None:
        carry, self._carry = self._carry, None
        if carry is not None:
            self._discard(carry.pending, carry.inflight)

    def _discard(self, pending: deque[tuple[int, int, Any]], inflight: deque[PlannedBatch | None]) -> None:
        """Cancel plans nobody will take and drop the outputs of batches in flight."""
        for *_, future in pending:
            if future is not None:
                future.cancel()
        self._drain(len(inflight))

    def _result(self, epoch: int, step: int, future: Any) -> PlannedBatch:
        """A planned batch: the worker's, or planned here (no pool, or the pool broke)."""
        planned = None
        if future is not None:
            try:
                planned = future.result()
            except RuntimeError as err:  # BrokenProcessPool: a worker died
                if isinstance(err, ImageError) or self._pool is None:
                    raise
                if not self._pool.disabled:  # the other plans of the pool fail alike
                    self._pool.give_up(f"the planning workers stopped ({err})")
        if planned is not None:  # a worker's: its image bytes size the look-ahead (batches_ahead)
            self._batch_bytes = max(self._batch_bytes or 0, sum(int(a.nbytes) for a in planned.image_arrays()))
        if planned is None:
            planned = self.planner.plan(epoch, step, bad=self._bad)
        if planned.data is None or planned.partners is None:
            self.planner.fill_data(planned)
        return planned

    def _feed(self, batches: list[PlannedBatch], inflight: deque[PlannedBatch | None]) -> None:
        """Feed planned batches to the pipeline and schedule their runs. A fresh pipeline's
        first run runs ``prefetch_queue_depth`` batches (DALI's prefetch): when fewer are left in
        the epoch, the last is fed again as a filler (``None`` in ``inflight``) whose output is
        dropped."""
        if not batches:
            return
        if self._fresh:
            fillers = feed_first_run(self.pipeline, batches, self._depth)
            self._fresh = False
            inflight.extend(batches)
            inflight.extend([None] * fillers)
            return
        for planned in batches:
            feed(self.pipeline, planned.data, planned.params, planned.partners)
            inflight.append(planned)

    def _outputs(self, inflight: deque[PlannedBatch | None]) -> tuple[Any, PlannedBatch]:
        """The images of the oldest batch in flight. When DALI fails on an image whose header
        was fine, the culprits are found (decoded one by one on the CPU) and skipped: the
        batch is planned again without them, and the batches in flight are fed again to a
        fresh pipeline (DALI's is unusable after an error)."""
        while True:
            try:
                images = self.pipeline.outputs()[0]
                return images, inflight.popleft()
            except (RuntimeError, IndexError) as err:  # IndexError: DALI's "critical error"
                failure = DecodeFailure(inflight[0], err)
                culprits = undecodable(failure.planned)
                if not culprits or self.on_error == "raise":
                    inflight.clear()
                    self._rebuild(inflight)
                    raise failure.error(self.source, culprits) from err
                self._bad.update(culprits)  # (position, reason) pairs
                inflight[0] = self._result(failure.planned.epoch, failure.planned.step, None)
                self._rebuild(inflight)

    def _rebuild(self, inflight: deque[PlannedBatch | None]) -> None:
        """A fresh pipeline, fed again with the batches in flight."""
        self.pipeline = self._build()
        batches = [b for b in inflight if b is not None]
        inflight.clear()
        self._feed(batches, inflight)

    def _drain(self, count: int) -> None:
        """Take and drop the outputs of ``count`` batches in flight (an iteration that stopped
        early); a pipeline that fails meanwhile is replaced."""
        for _ in range(count):
            try:
                self.pipeline.outputs()
            except Exception:  # noqa: BLE001 - outputs nobody wants; the next epoch builds anew
                self._broken = True
                return

    def _close_current(self) -> None:
        if self._current is not None:
            current, self._current = self._current, None
            current.close()  # drains its batches in flight; keeps the position it reached

    def _record(self, planned: PlannedBatch) -> None:
        while self._pool is not None and self._pool.deferred:
            warnings.warn(self._pool.deferred.pop(0), RuntimeWarning, stacklevel=4)
        self.skipped.extend(planned.skipped)
        self.repaired.extend(planned.repaired)
        for message in planned.new_findings(self._warned):
            warnings.warn(message, DataWarning, stacklevel=4)

    def _build(self) -> Any:
        pipe = build_pipeline(self.source, self.transforms, **self._pipeline_args)
        pipe.build()
        self._fresh = True  # its first schedule_run runs prefetch_queue_depth batches
        return pipe

    def _to_torch(self, images: Any, planned: PlannedBatch) -> tuple[torch.Tensor | list[torch.Tensor], Any]:
        # host images of a pipeline whose outputs outlive their run: no copy (GPU images are
        # copied: see dali_images_to_torch)
        batch = dali_images_to_torch(images, self.device, copy=not outputs_outlive_runs(self.pipeline))
        if self._stacked != isinstance(batch, torch.Tensor):  # one batch type, whatever its size
            batch = torch.stack(batch) if self._stacked else list(batch)
        # The whole batch at once (category ids -> class indices too), one copy to the device;
        # per-image tensors are views (detaug.handover).
        counts, boxes, labels, fields = batch_columns(planned)
        form = "dict" if self.targets == "tv_tensors" else self.targets
        targets = build_targets(counts, boxes, self.label_mapping.map(labels), fields if self.fields else {},
                                planned.image_ids, self.device, form, self.max_boxes)
        if form == "dict" and self.fields and MASKS in fields:  # padded to the batch's largest size where
            for target, image in zip(targets, batch):  # sizes differ (detaug.masks.join_masks): the image's
                target[MASKS] = target[MASKS][:, :image.shape[-2], :image.shape[-1]]
        if self.targets == "tv_tensors":
            batch, targets = _as_tv_tensors(batch, targets)
        return batch, targets

    def close(self) -> None:
        """Stop the planning workers and release the pipeline (and its GPU memory); a later
        iteration starts them again. Also done when the loader is collected."""
        self._close_current()
        self._take_feed((-1, -1))  # stops a feed kept for the next epoch
        if self.pipeline is not None and not self._broken:
            self._discard_carry()
        self._carry = None
        if self._pool is not None:
            self._pool.close()
        self.pipeline, self._broken = None, True

    def __repr__(self) -> str:
        return (f"DetectionLoader({self.spec.n} samples, shard {self.shard_id}/{self.num_shards}, "
                f"batch_size={self.batch_size}, {len(self)} batches, epoch={self._epoch}, step={self._step})")


def _produce(self: DetectionLoader, epoch: int, start: int) -> Iterator[tuple[int, PlannedBatch, Any, Any]]:
    """``(step, planned, images, targets)`` of the batches from ``(epoch, start)`` to the
    end of the epoch: plans submitted ahead, fed to DALI ahead, outputs converted. At the
    end of the epoch the next epoch's first batches stay in flight (:class:`_Carry`).

    A function, not a method: in the background feed's thread ``self`` is a weak proxy of the
    loader, so that a loader nobody holds is collected (and its feed stopped) even while the
    feed waits to hand over the next epoch's batches."""
    steps = len(self)
    # Workers plan groups of consecutive batches (one plan_batch call each: less CPU a
    # sample); each worker gets one group to plan and one queued, within a byte budget.
    group = group_size(self.batch_size) if self._pool is not None else 1
    carry = self._take_carry((epoch, start))
    if self._broken:  # the pipeline failed while batches nobody wanted were dropped
        if carry is not None:
            self._discard(carry.pending, deque())  # its batches in flight went with the pipeline
        carry, self.pipeline, self._broken = None, self._build(), False
    # pending: (epoch, step, future or None) submitted to the workers; inflight: fed to the
    # pipeline, outputs not taken (None: a filler); next_key: the next batch to submit. At the
    # end of an epoch they run on into the next one (the pipeline does not run dry between
    # epochs), kept for the next iteration if it starts there (_Carry).
    pending: deque[tuple[int, int, Any]] = carry.pending if carry else deque()
    inflight: deque[PlannedBatch | None] = carry.inflight if carry else deque()
    next_key: tuple[int, int] | None = carry.next_key if carry else ((epoch, start) if steps else None)

    def top_up() -> None:
        """Submit plans up to ``ahead`` and feed the pipeline up to its depth."""
        nonlocal next_key
        ahead = batches_ahead(self._depth, self.num_workers, group, self._batch_bytes)
        while next_key is not None and len(pending) + len(inflight) < ahead:
            e, s = next_key
            group_steps = list(range(s, min(s + group, steps)))  # within the epoch
            futures = self._pool.submit_many(e, group_steps, dict(self._bad)) if self._pool is not None else None
            pending.extend((e, k, futures[i] if futures else None) for i, k in enumerate(group_steps))
            next_key = self.spec.after(e, group_steps[-1])
        batches = []
        try:
            while pending and len(inflight) + len(batches) < self._depth:
                batches.append(self._result(*pending[0]))  # left pending if it raises
                pending.popleft()
        finally:
            self._feed(batches, inflight)

    completed = False
    try:
        for step in range(start, steps):
            top_up()
            images, planned = self._outputs(inflight)
            # The next batch goes in before this one is converted, so that the pipeline
            # always holds ``prefetch_queue_depth`` batches (DALI keeps these outputs until
            # the next ``outputs()``).
            try:
                top_up()
            except ImageError:  # raised again by the next top_up, once this batch is yielded
                pass
            yield (step, planned, *self._to_torch(images, planned))
        self._carry = _Carry((epoch + 1, 0), pending, inflight, next_key)
        completed = True
    finally:
        if not completed:
            with contextlib.suppress(ReferenceError):  # the loader was collected: nothing to drop
                self._discard(pending, inflight)


def _produce_on(self: DetectionLoader, epoch: int, start: int) -> Iterator[tuple[int, int, PlannedBatch, Any, Any]]:
    """``(epoch, step, planned, images, targets)`` from ``(epoch, start)`` on, epoch after
    epoch: the background feed's generator (``self`` a weak proxy); it ends only when stopped."""
    if not len(self):
        return
    while True:
        for item in _produce(self, epoch, start):
            yield (epoch, *item)
        epoch, start = epoch + 1, 0


@dataclass
class _Carry:
    """What runs on past the end of an epoch: the next batches, submitted to the planning
    workers (``pending``) and fed to the pipeline (``inflight``), and the next to submit
    (``next_key``); the next iteration takes them over if it starts at ``at`` ``(epoch, step)``."""

    at: tuple[int, int]
    pending: deque[tuple[int, int, Any]]
    inflight: deque[PlannedBatch | None]
    next_key: tuple[int, int] | None


#: ``targets=`` of :class:`DetectionLoader`.
TARGET_KINDS = (TARGET_FORMS[0], "tv_tensors", *TARGET_FORMS[1:])


def _stop_feed(feed: BackgroundFeed, live: list[BackgroundFeed]) -> None:
    feed.stop()
    with contextlib.suppress(ValueError):
        live.remove(feed)


def _stop_feeds(live: list[BackgroundFeed]) -> None:
    """The finalizer of a collected loader: stop its background feeds."""
    for feed in list(live):
        _stop_feed(feed, live)


def _tensors_of(images: Any, targets: Any) -> list[torch.Tensor]:
    """One tensor per allocation of a batch: the images (one, or one per image) and the one
    buffer every target tensor is a view of (:mod:`detaug.handover`)."""
    tensors = [images] if isinstance(images, torch.Tensor) else list(images)
    first = targets[0] if isinstance(targets, list) and targets else targets
    if isinstance(first, dict) and isinstance(first.get("boxes"), torch.Tensor):
        tensors.append(first["boxes"])
    return tensors


def _tv_tensors() -> Any:
    try:
        from torchvision import tv_tensors
    except Exception as err:  # noqa: BLE001 - ImportError, or torchvision built for another torch
        raise ImportError(
            f"targets='tv_tensors' needs torchvision built for this torch ({torch.__version__}): "
            f"python3 -m pip install torchvision \"torch=={torch.__version__.split('+')[0]}\" ({err})"
        ) from err
    return tv_tensors


def _as_tv_tensors(batch: Any, targets: list[Target]) -> tuple[Any, list[Target]]:
    """Images as ``tv_tensors.Image`` and boxes as ``tv_tensors.BoundingBoxes`` (``XYXY``, the
    output image's ``canvas_size``), so that torchvision.transforms.v2 takes the batch as is."""
    tv = _tv_tensors()
    images = list(batch) if isinstance(batch, torch.Tensor) else batch
    for image, target in zip(images, targets):
        target["boxes"] = tv.BoundingBoxes(target["boxes"], format="XYXY", canvas_size=tuple(image.shape[-2:]))
    if isinstance(batch, torch.Tensor):
        return tv.Image(batch), targets
    return [tv.Image(image) for image in batch], targets
