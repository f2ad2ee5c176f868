"""PyTorch iterator: batches of images and torchvision-style detection targets."""

from __future__ import annotations

import contextlib
import itertools
import os
import warnings
import weakref
from collections import deque
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, Iterator

import torch

from detaug import loader_core as core
from detaug.errors import DataWarning
from detaug.feeder import BackgroundFeed, FeedStats
from detaug.handover import TARGET_FORMS, dali_images_to_torch, host_targets, image_dicts, targets_to_device
from detaug.masks import MASKS
from detaug.mps import mps_control_pipe
from detaug.plan_ahead import PlanPool
from detaug.pipeline import outputs_outlive_runs
from detaug.pipeline_runs import default_batches_per_run
from detaug.planned_batch import BatchFindings, PlannedBatch, batch_columns
from detaug.planning import BatchPlanner
from detaug.process_feed import JOB_BATCHES, ProcessFeed
from detaug.streams import LoopStream, training_stream
from detaug.transforms import Compose

__all__ = ["DetectionLoader", "distributed_shard", "dali_images_to_torch", "training_stream"]

Target = dict[str, Any]

#: Keys of :meth:`DetectionLoader.state_dict` that must match when a state is loaded.
_STATE_CHECKED = ("dataset_size", "batch_size", "shard_id", "num_shards", "shuffle", "drop_last", "seed")


def _local_gpu() -> int:
    """The GPU of this rank where none is named: torchrun's ``LOCAL_RANK``, else torch's current one."""
    return int(os.environ.get("LOCAL_RANK", torch.cuda.current_device() if torch.cuda.is_available() else 0))


def distributed_shard() -> tuple[int, int]:
    """``(rank, world_size)`` from ``torch.distributed`` when initialised, else from torchrun's
    ``RANK`` / ``WORLD_SIZE`` environment variables, else ``(0, 1)``."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


class DetectionLoader(core.LabelledFace):
    """Iterate over augmented batches: ``for images, targets in loader``.

    Args:
        source: a :class:`~detaug.sources.CocoSource`, :class:`~detaug.sources.VocSource` or
            :class:`~detaug.sources.SampleListSource`.
        transforms: the :class:`~detaug.transforms.Compose` recipe.
        batch_size: samples per batch.
        device: ``"auto"`` (default: the GPU where DALI can use one, else the CPU, said once in
            the ``detaug`` log), ``"gpu"`` (decode with nvJPEG, augment on the GPU; a
            :class:`~detaug.DeviceError` where there is none) or ``"cpu"``.
        device_id: the GPU the loader runs on (its batches' device); ``None``: torchrun's
            ``LOCAL_RANK``, else torch's current GPU. Unused on the CPU.
        shuffle: a new order every epoch, drawn from ``(seed, epoch)``; ``None``: the source's
            ``shuffle`` flag (a ``CocoSource`` has one), else ``False``.
        drop_last: every rank drops evenly: ``floor(n / W)`` samples per rank and epoch, and the
            last, smaller batch is dropped (see :mod:`detaug.epochs`).
        num_threads: DALI CPU threads; ``None``: the CPUs of this rank (those this process may
            use divided by the ranks on the host, ``LOCAL_WORLD_SIZE``) that ``num_workers``
            leaves, 1 to 16 (:func:`detaug.decoding.threads_beside`: 8 beside 8 workers on 16
            cores; all 16 with ``num_workers=0``).
        hw_decoder_load: the share of each batch's JPEGs DALI sends to the GPU's hardware
            decoder where it has one (A100, H100, H200, ...), the rest to the CUDA decoder, whose
            Huffman decoding runs on DALI's CPU threads; a number in ``[0, 1]``. ``None``:
            ``DETAUG_HW_DECODER_LOAD`` when set, else 0.8 (:mod:`detaug.decoding`). Beside a
            GPU-bound model at large batches, 0.0 can train faster where CPU cores are free
            (docs/loader.md, "Feeding a fast model"). Resolved when the loader is built
            (:attr:`hw_decoder_load`; ``None`` on the CPU).
        seed: seeds the orders and the augmentations: a sample's augmentation is a pure function
            of ``(seed, epoch, image_id)`` (docs/reproducibility.md); one seed gives the same
            boxes on both devices.
        shard_id, num_shards: this rank and the number of ranks; default to the source's, then
            to ``torch.distributed`` / torchrun's ``RANK``, ``WORLD_SIZE``.
        prefetch_queue_depth: DALI runs fed and scheduled before their outputs are taken
            (default 2; at least 1): the pipeline's queue, and the runs the loader keeps in flight.
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
        ready_batches: finished batches a background thread keeps ready (default 2; rounded up
            to whole runs, ``batches_per_run``): the next
            batches are fed to DALI, collected, copied and given their targets while the caller
            trains on this one (:mod:`detaug.feeder`: on the GPU on a stream of the loader's,
            handed over to the caller's current stream without a wait). ``0``: no thread, each
            run of batches is made inside ``next()``. After an epoch the thread runs on into the next
            one (taken over by the next iteration if it starts there; :meth:`close`, or
            collecting the loader, stops it). :attr:`feed_stats` (a
            :class:`~detaug.feeder.FeedStats`) counts the batches taken, those not made yet when
            ``next()`` asked for them and the seconds it waited for those: a training loop whose
            ``not_ready`` stays near 0 never waits for data. With ``feed_process`` the thread
            takes the child's batches (a job of up to 4 at a time), copies them out of the
            ring and gives them their per-image targets; ``0``: all that inside ``next()``.
        batches_per_run: consecutive batches DALI makes in one pipeline run, its outputs then
            handed out batch by batch (:mod:`detaug.pipeline_runs`): a run's own costs (feeding,
            the executor's events and copies, the collection and hand-over of its outputs) are
            paid once for all of them, which a fast model in the same process feels as less
            time lost beside the loader. ``None`` (default): on the GPU enough batches for 256
            images (4 of 64, 1 of 256 or more, at most 8) within 512 MiB of output images
            (:data:`detaug.pipeline_runs.RUN_BYTES`), 1 for a recipe that fixes no output size;
            on the CPU 1. The batches, their
            order, samples, augmentation and targets do not depend on it (a run ends with its
            epoch); DALI's buffers and the run's images on the device grow with it. On the
            GPU the JPEGs sent to the hardware decoder are a share of each run, so which image
            a decoder gets can change with it (the two decoders' pixels may differ by rounding).
        training_stream: on the GPU, when the thread that iterates has the loader's GPU as its
            current device and is on its default CUDA stream (PyTorch's, unless the caller chose
            another), run the loop on :func:`training_stream`'s stream from the iteration's first
            batch until it ends (the epoch's last batch trained on, ``close()``, or the next
            iteration after a ``break``), then back on the default stream, which waits for the
            loop's work: code before and after the loop needs no synchronisation
            (:class:`detaug.streams.LoopStream`). A fast model trains faster there beside the
            loader than on the default stream (docs/loader.md, "Feeding a fast model"). A stream
            the caller chose is kept; ``False``: never switched.
            Work the loop body hands to another thread's default stream needs that thread to
            wait for it (``Tensor.record_stream``, ``Stream.wait_stream``), as in any
            ``torch.cuda.stream`` block.
        feed_process: make the batches in a process of its own (``True``) or in this one
            (``False``); ``None`` (default): its own on a GPU where an NVIDIA Multi-Process Service
            (MPS) daemon runs, else this one (:func:`process_by_default`; the choice is
            ``loader.feed_process``). In its own process the whole loader (DALI, planning
            workers, the feed) runs in a spawned child (the source, transforms and arguments go
            to it pickled: a ``TypeError`` names what does not pickle; where the default chose
            the child and it cannot start, a ``RuntimeWarning`` says why and the loader runs in
            this process) and its batches reach this process through a ring of slots the two
            share (CUDA IPC on the GPU, shared memory on the CPU), each copied once into memory of
            this process's by the background thread (``ready_batches``), so that of the feed's
            Python only that copy and the split of per-image targets share the interpreter lock
            with the training thread (:mod:`detaug.process_feed`). The same batches, targets, epochs,
            findings and warnings; a child that dies (killed, out of memory) is replaced, with a
            ``RuntimeWarning``, and the epoch goes on from the batch it had reached. On a GPU
            without MPS the two processes' kernels take turns: in the recorded runs that gained
            at batch 64 and cost a GPU-bound step at 256 (docs/loader.md, "Feeding a fast model").
        num_classes: the model's ``num_classes`` (torchvision's, counting the background); when
            given, the loader checks when it is built that every class index fits, ``1 <=
            label < num_classes``, for every category of the source (also one without boxes),
            else a ``ValueError`` names the label, its category id and the fix
            (``label_map="contiguous"`` or a larger ``num_classes``). ``None``: not checked.
        fields: the per-box fields each target carries besides boxes and labels, under their
            names (:func:`detaug.field_selection.select_fields`): ``"all"`` (default) every field of
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
        one buffer copied once per run of batches, ``batches_per_run``: ``.to(device)`` on them is free).

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
        hw_decoder_load: float | None = None,
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
        batches_per_run: int | None = None,
        training_stream: bool = True,
        feed_process: bool | None = None,
    ) -> None:
        core.check_count("batch_size", batch_size, 1)
        if not isinstance(transforms, Compose):
            raise TypeError(f"transforms must be a detaug.transforms.Compose, got {type(transforms).__name__}")
        if targets not in TARGET_KINDS:
            raise ValueError(f"targets must be one of {', '.join(map(repr, TARGET_KINDS))}, got {targets!r}")
        if targets == "tv_tensors":
            _tv_tensors()  # said now, not at the first batch
        core.check_count("max_boxes", max_boxes, 0, none_ok=True)
        core.check_count("ready_batches", ready_batches, 0)
        if not isinstance(training_stream, bool):
            raise TypeError(f"training_stream must be True or False, got {training_stream!r}")
        if feed_process is not None and not isinstance(feed_process, bool):
            raise TypeError(f"feed_process must be True, False or None, got {feed_process!r}")
        batches_per_run = core.check_count("batches_per_run", batches_per_run, 1, none_ok=True)
        self.targets, self.max_boxes, self.ready_batches = targets, max_boxes, int(ready_batches)
        self.training_stream = training_stream
        self._set_labels(source, label_map, num_classes, first=1, adapter="DetectionLoader")  # before any pipeline
        shard_id, num_shards = core.resolve_shard(source, shard_id, num_shards, default=distributed_shard())
        shuffle = core.resolve_shuffle(source, shuffle)
        device, self.device_id = core.resolve_device_once(device, device_id, default_gpu=_local_gpu)
        self.device = torch.device("cpu") if self.device_id is None else torch.device("cuda", self.device_id)
        chosen = feed_process is None  # the default: decided here, and undone if the child cannot start
        #: Whether the batches are made in a process of the loader's own (``feed_process``, resolved).
        feed_process = self.feed_process = process_by_default(self.device) if chosen else feed_process
        self.source, self.transforms, self.batch_size = source, transforms, int(batch_size)
        self.shuffle, self.drop_last, self.seed = bool(shuffle), bool(drop_last), int(seed)
        self.shard_id, self.num_shards = shard_id, num_shards
        self.categories = source.categories
        self._stacked = transforms.output_size() is not None  # else a list, also for one image
        self.spec = core.epoch_spec(source, self.batch_size, (shard_id, num_shards), shuffle=self.shuffle,
                                    drop_last=self.drop_last, seed=self.seed)
        self.planner = BatchPlanner(source, transforms, self.spec, on_error, fields=fields)
        self.fields = self.planner.fields  # the names each target carries, in order
        self.on_error = on_error
        self.num_workers = core.planning_workers("num_workers", num_workers, self.device_id)
        self._pool = self._plan_pool() if not feed_process else None
        num_threads = core.pipeline_threads(num_threads, self.num_workers)  # None: the CPUs the workers leave
        self.hw_decoder_load = core.hardware_decoder_share(hw_decoder_load, self.device_id)
        size = transforms.output_size()  # (h, w) of every image, else None; float32 after an output stage
        image_bytes = None if size is None else size[0] * size[1] * 3 * (4 if transforms.output is not None else 1)
        self.batches_per_run = (default_batches_per_run(self.batch_size, self.device_id is not None, image_bytes)
                                if batches_per_run is None else batches_per_run)
        self._pipeline_args = dict(batch_size=self.batch_size * self.batches_per_run, device=device,
                                   device_id=self.device_id,
                                   num_threads=num_threads, seed=self.seed, prefetch_queue_depth=prefetch_queue_depth,
                                   hw_decoder_load=self.hw_decoder_load)
        self._depth = max(1, int(prefetch_queue_depth))
        self._batch_bytes: int | None = None  # the most image bytes a worker's plan carried (None: none seen)
        self._process: ProcessFeed | None = None  # feed_process: the child that makes the batches
        self._process_spec: tuple | None = None  # what starts it (again after close())
        if feed_process:
            self.pipeline = None
            self._process_spec = (
                DetectionLoader, (source, transforms, self.batch_size),
                dict(device=device, device_id=self.device_id, num_threads=num_threads,
                     hw_decoder_load=self.hw_decoder_load, shuffle=self.shuffle, drop_last=self.drop_last,
                     seed=self.seed, shard_id=shard_id, num_shards=num_shards,
                     prefetch_queue_depth=prefetch_queue_depth, num_workers=self.num_workers, on_error=on_error,
                     label_map=label_map, num_classes=num_classes,
                     targets="concat" if targets in ("dict", "tv_tensors") else targets, fields=fields,
                     max_boxes=max_boxes, ready_batches=self.ready_batches, batches_per_run=self.batches_per_run,
                     training_stream=False, feed_process=False),
                -(-max(1, self.ready_batches) // JOB_BATCHES), self.device)
            try:
                self._process = ProcessFeed(*self._process_spec)  # now: the child's errors are raised here
            except Exception as err:  # noqa: BLE001 - the default's choice: the loader runs here instead
                if not chosen:
                    raise
                warnings.warn(f"the loader runs in this process: its own process, the default under NVIDIA MPS, "
                              f"did not start ({err})", RuntimeWarning, stacklevel=2)
                self.feed_process, self._process_spec, self._pool = False, None, self._plan_pool()
        if self._process is None:
            self.pipeline = core.build(self)
        self._broken = False  # the pipeline failed while batches nobody wanted were dropped
        if len(self) == 0:
            warnings.warn(
                f"the loader yields no batches: {len(source)} samples on {num_shards} rank(s) give "
                f"{self.spec.n // num_shards if drop_last else -(-self.spec.n // num_shards)} per rank, "
                f"fewer than batch_size={batch_size} with drop_last=True", stacklevel=2,
            )
        core.start_bookkeeping(self)  # skipped, repaired, ...
        self._epoch, self._step = 0, 0  # where the next batch comes from
        self._abandoned = False  # an iteration stopped early: the next one starts the next epoch
        self._current: Iterator[Any] | None = None
        self._carry: core.Carry | None = None  # batches of the next epoch in flight when an epoch ended
        self._kept_feed: BackgroundFeed | None = None  # the background feed, kept running into the next epoch
        self._feed_at: tuple[int, int] | None = None  # where the kept feed's next batch is
        self._live_feeds: list[BackgroundFeed] = []  # stopped when the loader is collected
        self.feed_stats = FeedStats()  # what the caller found at each take, over the loader's life
        weakref.finalize(self, core.stop_feeds, self._live_feeds)

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
        """The caller's side: batches made by :func:`detaug.loader_core.produce` (in a background
        thread unless ``ready_batches=0``), recorded and counted here, in the caller's thread, as
        they are taken. The thread runs on into the next epoch; when this epoch completes it is
        kept for the next iteration (:func:`detaug.loader_core.take_feed`), so no epoch starts
        with an empty queue."""
        steps = len(self)
        if self._process_spec is not None:  # feed_process (a child started again after close())
            yield from self._consume_process(epoch, start)
            return
        if not self.ready_batches:
            yield from self._consume_inline(epoch, start)
            return
        feed = core.take_feed(self, (epoch, start))
        if feed is None and self._pool is not None:
            self._pool.start()  # here, in the caller's thread (SIGTERM's clean-up is installed from the main one)
        if feed is None and start < steps:
            proxy = weakref.proxy(self)
            # The feed hands over whole runs (detaug.pipeline_runs): ready_batches rounded up to runs
            runs_ready = -(-self.ready_batches // self.batches_per_run)
            feed = BackgroundFeed(lambda: core.produce_on(proxy, epoch, start), runs_ready, self.device,
                                  stats=self.feed_stats)
            self._live_feeds.append(feed)
        batches = self._from_feed(feed, epoch, start, lambda batch: _tensors_of(*batch[3:5]))
        loop_stream = LoopStream(self.device, self.training_stream)
        try:
            loop_stream.enter()  # at the first next(), in the caller's thread, before any hand-over
            for item_epoch, step, findings, images, targets in batches:
                assert item_epoch == epoch, (item_epoch, epoch)
                self._record(findings)
                self._step = step + 1
                yield images, targets
            self._epoch, self._step, self._abandoned = epoch + 1, 0, False
        except KeyboardInterrupt:  # a Ctrl-C inside a future's wait can leave the pool unusable
            if self._pool is not None:
                self._pool.close(wait=False)  # the next iteration starts new workers
            raise
        finally:
            loop_stream.exit()
            batches.close()  # stops the feed unless the epoch completed

    def _consume_inline(self, epoch: int, start: int) -> Iterator[tuple[Any, Any]]:
        """:meth:`_consume` without a thread: each run of batches made inside ``next()``."""
        made = core.produce(self, epoch, start)
        loop_stream = LoopStream(self.device, self.training_stream)
        try:
            loop_stream.enter()  # before the first run is made: its copies go to the loop's stream
            for step, findings, images, targets in itertools.chain.from_iterable(made):
                self._record(findings)
                self._step = step + 1
                yield images, targets
            self._epoch, self._step, self._abandoned = epoch + 1, 0, False
        except KeyboardInterrupt:  # a Ctrl-C inside a future's wait can leave the pool unusable
            if self._pool is not None:
                self._pool.close(wait=False)  # the next iteration starts new workers
            raise
        finally:
            loop_stream.exit()
            made.close()

    def _consume_process(self, epoch: int, start: int) -> Iterator[tuple[Any, Any]]:
        """:meth:`_consume` with the batches made in the child process (``feed_process``): taken
        from the child, copied out of its slots and given their targets (:func:`_child_runs`)
        in a background thread, ``ready_batches`` ahead on the feed stream, as the loader in
        this process makes its own; with ``ready_batches=0`` inside ``next()``."""
        if self._process is None:  # closed before
            self._process = ProcessFeed(*self._process_spec)
        steps = len(self)
        feed = core.take_feed(self, (epoch, start)) if self.ready_batches else None
        if feed is None and self.ready_batches and start < steps:
            proxy = weakref.proxy(self)
            # One item a take of the child's (up to JOB_BATCHES batches); the thread runs on into
            # the next epoch, so that epoch's first take is under way when this one ends
            feed = BackgroundFeed(lambda: _child_runs(proxy, epoch, start, None, forever=True),
                                  -(-self.ready_batches // JOB_BATCHES), self.device, stats=self.feed_stats)
            self._live_feeds.append(feed)
        if feed is not None:
            runs, batches = None, self._from_feed(feed, epoch, start, lambda batch: [batch[6]])
        else:
            runs = _child_runs(self, epoch, start, self.feed_stats, forever=False)
            batches = itertools.chain.from_iterable(runs)
        loop_stream = LoopStream(self.device, self.training_stream)
        try:
            loop_stream.enter()  # before the first take: the batches are handed over to the loop's stream
            for item_epoch, step, findings, images, targets, messages, _ in batches:
                assert item_epoch == epoch, (item_epoch, epoch)
                for message in messages:
                    warnings.warn(message, RuntimeWarning, stacklevel=3)
                self._record(findings)
                self._step = step + 1
                yield images, targets
            self._epoch, self._step, self._abandoned = epoch + 1, 0, False
        finally:
            loop_stream.exit()
            if runs is not None:
                runs.close()  # forgets the child's jobs in flight unless the epoch completed
            else:
                batches.close()  # stops the feed unless the epoch completed

    def _from_feed(self, feed: BackgroundFeed | None, epoch: int, start: int,
                   allocations: Callable[[tuple], list[torch.Tensor]]) -> Iterator[tuple]:
        """Batches ``start`` on of ``epoch`` from ``feed``'s items (each a run or take: a list of
        batches, ``(epoch, step, findings, images, targets, ...)``), one at a time in the
        caller's thread: each counted in :attr:`feed_stats`, its allocations
        (``allocations(batch)``) handed over to the caller's current stream,
        the targets of the batch before the last yielded retired to the feed's thread (the
        caller lets go of a batch when it takes the one after it, so that one is ours alone: it
        is freed there, not in the training thread). When the epoch completes the feed is kept
        for the next iteration (:func:`detaug.loader_core.take_feed`: its thread runs on into the
        next epoch, so no epoch starts with an empty queue); closed before, it is stopped (its
        generator closed in its thread, which drops what it had in flight). ``feed`` ``None``:
        no batch is left of the epoch."""
        if feed is None:
            return
        taken: deque[tuple] = deque()  # the item taken last, batches not yet yielded
        handed: deque[Any] = deque()  # the targets of the last two batches yielded
        completed = False
        try:
            for _ in range(start, len(self)):
                if not taken:
                    try:
                        taken.extend(feed.take())
                    except StopIteration:  # the producer runs on forever; only a bug ends it
                        raise RuntimeError("the loader's background feed ended before the epoch did") from None
                    self.feed_stats.taken -= 1  # the feed counts its items; counted below batch by batch
                batch = taken.popleft()
                self.feed_stats.taken += 1
                feed.hand_over(allocations(batch))
                handed.append(batch[4])  # its targets
                if len(handed) > 2:
                    feed.retire(handed.popleft())
                yield batch
            completed = True
        finally:
            if completed:
                self._kept_feed, self._feed_at = feed, (epoch + 1, 0)  # already making the next epoch
            else:
                core.stop_feed(feed, self._live_feeds)

    def _plan_pool(self) -> PlanPool | None:
        """The planning workers of a loader in this process (``None`` without workers); their
        messages are kept in ``deferred``, said by :meth:`_record` in the caller's thread."""
        if not self.num_workers:
            return None
        pool = PlanPool(self.planner, self.num_workers)
        pool.deferred = []
        return pool

    def _close_current(self) -> None:
        if self._current is not None:
            current, self._current = self._current, None
            current.close()  # drains its batches in flight; keeps the position it reached

    def _record(self, findings: BatchFindings) -> None:
        while self._pool is not None and self._pool.deferred:
            warnings.warn(self._pool.deferred.pop(0), RuntimeWarning, stacklevel=4)
        for message in core.record(self, findings):
            warnings.warn(message, DataWarning, stacklevel=4)

    def _images_to_torch(self, images: Any) -> torch.Tensor | list[torch.Tensor]:
        """A run's DALI images as one tensor (or a list), copied once; each of its batches takes
        its slice (:meth:`_run_to_torch`)."""
        # host images of a pipeline whose outputs outlive their run: no copy (GPU images are
        # copied: see dali_images_to_torch)
        return dali_images_to_torch(images, self.device, copy=not outputs_outlive_runs(self.pipeline))

    def _run_to_torch(self, whole: torch.Tensor | list[torch.Tensor], members: list[PlannedBatch],
                      sizes: list[int]) -> tuple[list[tuple[Any, Any]], Exception | None]:
        """Each batch of a run: its images (its slice of the run's, :meth:`_images_to_torch`)
        and its targets on the images' device, the run's targets from one copy (category ids ->
        class indices too; per-image tensors are views: :mod:`detaug.handover`). A batch that
        fails (an image with more boxes than ``max_boxes``) ends the list: its error comes back
        with the batches before it."""
        form = "dict" if self.targets == "tv_tensors" else self.targets
        batches, hosts, failed, first = [], [], None, 0
        try:
            for planned, size in zip(members, sizes):
                batch = whole[first : first + size]
                if self._stacked != isinstance(batch, torch.Tensor):  # one batch type, whatever its size
                    batch = torch.stack(batch) if self._stacked else list(batch)
                counts, boxes, labels, fields = batch_columns(planned)
                hosts.append(host_targets(counts, boxes, self.label_mapping.map(labels), fields if self.fields else {},
                                          planned.image_ids, form, self.max_boxes))
                batches.append(batch)
                first += size
        except Exception as err:  # noqa: BLE001 - raised after the batches before it are handed out
            failed = err
        made = []
        try:
            for batch, host, targets in zip(batches, hosts, targets_to_device(hosts, self.device)):
                if form == "dict" and MASKS in host.columns:
                    _cut_masks(targets, batch)
                if self.targets == "tv_tensors":
                    batch, targets = _as_tv_tensors(batch, targets)
                made.append((batch, targets))
        except Exception as err:  # noqa: BLE001 - as above
            failed = err
        return made, failed

    def close(self) -> None:
        """Stop the planning workers and release the pipeline (and its GPU memory); a later
        iteration starts them again. Also done when the loader is collected."""
        self._close_current()
        core.take_feed(self, (-1, -1))  # stops a feed kept for the next epoch
        if self._process is not None:
            self._process.close()
            self._process = None
        if self.pipeline is not None and not self._broken:
            core.discard_carry(self)
        self._carry = None
        if self._pool is not None:
            self._pool.close()
        self.pipeline, self._broken = None, True

    def __repr__(self) -> str:
        return (f"DetectionLoader({self.spec.n} samples, shard {self.shard_id}/{self.num_shards}, "
                f"batch_size={self.batch_size}, {len(self)} batches, epoch={self._epoch}, step={self._step})")


#: ``targets=`` of :class:`DetectionLoader`.
TARGET_KINDS = (TARGET_FORMS[0], "tv_tensors", *TARGET_FORMS[1:])


def _child_runs(loader: DetectionLoader, epoch: int, start: int, stats: FeedStats | None, *,
                forever: bool) -> Iterator[list[tuple]]:
    """The batches of ``loader``'s child process from ``(epoch, start)`` on, one list a take
    (:meth:`detaug.process_feed.ProcessFeed.take`): ``(epoch, step, findings, images,
    targets, messages, base)`` each, the targets in the loader's form (the per-image forms split
    here from the child's ``"concat"``), ``messages`` the warnings to say with the batch (the
    worker pool's, a child replaced), ``base`` the one allocation the batch views. Made in the
    thread that iterates it, on its current stream; until the epoch ends, or on through the
    next epochs (``forever``). A child that dies is replaced once, and the epoch goes on from
    the batch it had reached; the jobs in flight are forgotten when this is closed early."""
    steps, completed = len(loader), False
    form = "dict" if loader.targets == "tv_tensors" else loader.targets
    try:
        while True:
            step = start
            while step < steps:
                feed, replaced = loader._process, []
                try:
                    made = feed.take(epoch, step, steps, stats)
                except BrokenProcessPool:  # the child died (killed, out of memory): a new one goes on from here
                    why = feed.ended()
                    feed.close()
                    loader._process = feed = ProcessFeed(*loader._process_spec)
                    replaced.append(f"the loader's process {why}; a new one (pid {feed.pid}) goes on from batch "
                                    f"{step} of epoch {epoch}")
                    try:
                        made = feed.take(epoch, step, steps, stats)
                    except BrokenProcessPool as err:  # again at once: not a passing accident
                        raise RuntimeError(f"the loader's process {why}; its replacement {feed.ended()} too, at "
                                           f"batch {step} of epoch {epoch}") from err
                run = []
                for made_step, findings, deferred, images, targets, counts, image_ids, base in made:
                    assert made_step == step, (made_step, step)
                    if form == "dict":
                        targets = _dicts_from_concat(images, targets, counts, image_ids)
                        if loader.targets == "tv_tensors":
                            images, targets = _as_tv_tensors(images, targets)
                    run.append((epoch, step, findings, images, targets, replaced + list(deferred), base))
                    replaced, step = [], step + 1
                yield run
            if not forever:
                completed = True
                return
            epoch, start = epoch + 1, 0
    finally:
        with contextlib.suppress(ReferenceError):  # a loader collected: its process is stopped by its own finalizer
            if not completed and loader._process is not None:
                loader._process.drop_ahead()


def _tensors_of(images: Any, targets: Any) -> list[torch.Tensor]:
    """One tensor per allocation of a batch: the images (one, or one per image) and the one
    buffer every target tensor is a view of (:mod:`detaug.handover`)."""
    tensors = [images] if isinstance(images, torch.Tensor) else list(images)
    first = targets[0] if isinstance(targets, list) and targets else targets
    if isinstance(first, dict) and isinstance(first.get("boxes"), torch.Tensor):
        tensors.append(first["boxes"])
    return tensors


def _dicts_from_concat(images: Any, concat: dict[str, torch.Tensor], counts: list[int],
                       image_ids: list[int]) -> list[Target]:
    """The ``"dict"`` targets of a batch from its ``"concat"`` ones: each per-box column split
    into per-image views, masks cut to their image."""
    targets = image_dicts({name: column.split_with_sizes(counts) for name, column in concat.items()
                           if name not in ("batch_index", "num_boxes", "image_id")}, image_ids)
    if MASKS in concat:
        _cut_masks(targets, images)
    return targets


def _cut_masks(targets: list[Target], images: Any) -> None:
    """Each image's masks cut to its size: a batch's masks are padded to its largest image where
    sizes differ (:func:`detaug.masks.join_masks`)."""
    for target, image in zip(targets, images):
        target[MASKS] = target[MASKS][:, :image.shape[-2], :image.shape[-1]]


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


def process_by_default(device: torch.device) -> bool:
    """``feed_process=None``'s choice: the loader in a process of its own on a GPU where an
    NVIDIA MPS daemon runs (:func:`detaug.mps.mps_control_pipe`): there the two processes'
    kernels run side by side, and the training thread keeps the interpreter lock to itself; on
    the CPU, and on a GPU without MPS (where the child's kernels would take turns with the
    step's), in the caller's process."""
    return device.type == "cuda" and mps_control_pipe() is not None
