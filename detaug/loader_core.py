"""The loader core: what both faces resolve alike, plans fed to DALI ahead, outputs collected,
batches carried between epochs.

Two faces stand on it: :class:`~detaug.torch.DetectionLoader` (PyTorch: arguments, target forms,
state, the iteration protocol) and :class:`~detaug.keras.DetectionSequence` (Keras: random access
``seq[i]``). Both take from here, free of any framework:

* the checks and defaults of their common arguments (:func:`check_count`,
  :func:`resolve_device_once`, :func:`resolve_shard`, :func:`resolve_shuffle`,
  :func:`planning_workers`, :func:`pipeline_threads`, :func:`hardware_decoder_share`,
  :func:`epoch_spec`), so that one argument
  means and defaults to the same on both (the recipe's type is checked by each face: this
  engine module reads a recipe only through its methods);
* their class indices and what they answer from them (:class:`LabelledFace`, a base class of
  both);
* the bookkeeping of skipped and repaired images (:func:`start_bookkeeping`, :func:`record`,
  :func:`skip_undecodable`, :func:`plan_here`): a batch DALI fails on is planned again without
  its culprits, named once.

The rest is the machinery of the iterator face (the Sequence runs its batches through
:mod:`detaug.keras.pipeline_queue` instead: docs/keras.md says why), free of any framework but
for one call: ``loader._to_torch(images, planned)``, the hand-over of a batch's DALI outputs.
Each takes the loader (its :class:`LoaderState`) as its first argument.

In the background feed's thread (:mod:`detaug.feeder`) the loader is a weak proxy
(``weakref.proxy``), so that a loader nobody holds is collected, and its feed stopped, even
while the feed waits to hand over the next epoch's batches: nothing here keeps a strong
reference to it beyond a call.

The batches of one iteration go through three stages: ``pending``, ``(epoch, step, future or
None)`` submitted to the planning workers (:class:`~detaug.plan_ahead.PlanPool`); ``inflight``,
runs of ``loader.batches_per_run`` consecutive planned batches (:class:`~detaug.pipeline_runs.Run`:
one pipeline run each, its outputs split back batch by batch) fed to the pipeline whose outputs
are not taken yet (``None``: a filler of a fresh pipeline's first run); and ``next_key``, the next
batch to submit. At the end of an epoch they run on into the next one (the pipeline does not run
dry between epochs), kept as a :class:`Carry` for the next iteration if it starts there.
"""

from __future__ import annotations

import contextlib
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterator, Protocol

import numpy as np

from detaug.decoding import decoder_options, default_planning_workers, threads_beside
from detaug.epochs import check_shard
from detaug.errors import ImageError
from detaug.labels import LabelMap
from detaug.pipeline import build_pipeline, feed, feed_first_run, pick_device, resolve_device, take_outputs
from detaug.pipeline_runs import Run, join_run
from detaug.plan_ahead import PlanPool, batches_ahead, group_size
from detaug.decode_failures import DecodeFailure, undecodable
from detaug.epochs import EpochSpec, source_groups
from detaug.planned_batch import BatchFindings, PlannedBatch
from detaug.planning import BatchPlanner

if TYPE_CHECKING:
    from detaug.feeder import BackgroundFeed

__all__ = ["Carry", "LabelledFace", "LoaderState", "build", "check_count", "discard", "discard_carry", "drain",
           "epoch_spec", "feed_batches", "hardware_decoder_share", "outputs", "pipeline_threads", "plan_here",
           "planning_workers", "produce", "produce_on", "rebuild", "record", "resolve_device_once", "resolve_shard",
           "resolve_shuffle", "result", "skip_undecodable", "start_bookkeeping", "stop_feed", "stop_feeds",
           "take_carry", "take_feed"]


# -- what both faces resolve alike -------------------------------------------------------------------


def check_count(name: str, value: Any, minimum: int, *, none_ok: bool = False) -> int | None:
    """``value`` as an ``int`` (``None`` kept where ``none_ok``), else a ``ValueError`` naming
    the argument: an integer (NumPy's too, not a ``bool``) ``>= minimum``."""
    if value is None and none_ok:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}{' or None' if none_ok else ''}, got {value!r}")
    return int(value)


def resolve_device_once(device: str, device_id: int | None,
                        default_gpu: Callable[[], int] | None = None) -> tuple[str, int | None]:
    """``(device, device_id)``, resolved once when the face is built: ``device`` ``"gpu"`` or
    ``"cpu"`` (``"auto"`` picked and said once, :func:`detaug.pipeline.pick_device`; ``"gpu"``
    without one is a :class:`~detaug.DeviceError`), ``device_id`` DALI's GPU (``None`` on the
    CPU; unset: ``default_gpu()``, else 0)."""
    device = pick_device(device)
    if device == "gpu" and device_id is None and default_gpu is not None:
        device_id = default_gpu()
    return device, resolve_device(device, device_id)


def resolve_shard(source: Any, shard_id: int | None, num_shards: int | None,
                  default: tuple[int, int] = (0, 1)) -> tuple[int, int]:
    """``(shard_id, num_shards)``: those given, else the source's, else ``default`` (the PyTorch
    face's: ``torch.distributed``'s rank); checked (:func:`detaug.epochs.check_shard`)."""
    shard_id = getattr(source, "shard_id", None) if shard_id is None else shard_id
    num_shards = getattr(source, "num_shards", None) if num_shards is None else num_shards
    return check_shard(default[0] if shard_id is None else shard_id, default[1] if num_shards is None else num_shards)


def resolve_shuffle(source: Any, shuffle: bool | None) -> bool:
    """``shuffle``, or where ``None`` the source's flag (a ``CocoSource`` has one), else ``False``."""
    return bool(getattr(source, "shuffle", False)) if shuffle is None else bool(shuffle)


def planning_workers(name: str, workers: Any, device_id: int | None) -> int:
    """The planning processes (``num_workers`` / ``plan_workers``, named ``name``): as given, or
    for ``None`` 0 on the CPU, else half the CPUs of this rank, 1 to 16
    (:func:`detaug.decoding.default_planning_workers`)."""
    workers = check_count(name, workers, 0, none_ok=True)
    return default_planning_workers(on_gpu=device_id is not None) if workers is None else workers


def pipeline_threads(num_threads: int | None, workers: int) -> int:
    """DALI's CPU threads: as given, or for ``None`` the CPUs of this rank that ``workers``
    planning processes leave (:func:`detaug.decoding.threads_beside`)."""
    return threads_beside(workers) if num_threads is None else int(num_threads)


def hardware_decoder_share(hw_decoder_load: Any, device_id: int | None) -> float | None:
    """The share of JPEGs DALI sends to the GPU's hardware decoder, resolved once when the face
    is built: ``hw_decoder_load`` as given (a number in ``[0, 1]``, checked on any device), or for
    ``None`` ``DETAUG_HW_DECODER_LOAD`` when set, else 0.8 (:func:`detaug.decoding.decoder_options`);
    ``None`` on the CPU (``device_id`` ``None``), whose decoder has no hardware share."""
    if hw_decoder_load is None:
        return decoder_options(device_id is not None).get("hw_decoder_load")
    share = decoder_options(True, hw_decoder_load=hw_decoder_load)["hw_decoder_load"]  # checked on the CPU too
    return None if device_id is None else share


def epoch_spec(source: Any, batch_size: int, shard: tuple[int, int], *, shuffle: bool, drop_last: bool,
               seed: int) -> EpochSpec:
    """The epoch rules (:mod:`detaug.epochs`) of ``source`` for this shard ``(shard_id, num_shards)``."""
    return EpochSpec(n=len(source), batch_size=batch_size, shard_id=shard[0], num_shards=shard[1], shuffle=shuffle,
                     drop_last=drop_last, seed=seed, groups=source_groups(source))


class LabelledFace:
    """A face's class indices: ``label_map`` and ``num_classes`` as given, ``label_mapping``
    (:class:`~detaug.labels.LabelMap`), set by :meth:`_set_labels`, and what the face answers
    from them (:attr:`class_names`, :attr:`category_ids`)."""

    label_map: str | None
    label_mapping: LabelMap
    num_classes: int | None

    def _set_labels(self, source: Any, label_map: str | None, num_classes: int | None, *, first: int,
                    adapter: str) -> None:
        """The class indices of ``source`` (:meth:`LabelMap.from_source
        <detaug.labels.LabelMap.from_source>`: ``first`` the index of the first category), checked
        against ``num_classes`` where given (its errors name ``adapter``, the face's class)."""
        self.label_map = label_map
        self.label_mapping = LabelMap.from_source(source, label_map, first=first)
        if num_classes is not None:
            self.label_mapping.check_num_classes(num_classes, adapter=adapter)
        self.num_classes = num_classes

    @property
    def class_names(self) -> list[str | None]:
        """The name of each class index (see the class docstring); a new list."""
        return self.label_mapping.class_names

    @property
    def category_ids(self) -> list[int]:
        """The category id of each class index, ``-1`` for none (see the class docstring); a new list."""
        return self.label_mapping.category_ids


class Bookkeeper(Protocol):
    """What :func:`record`, :func:`skip_undecodable` and :func:`plan_here` read and write on a face."""

    source: Any
    planner: BatchPlanner
    on_error: str
    skipped: list[dict[str, Any]]
    repaired: list[dict[str, Any]]
    _warned: set[tuple[str, str]]
    _bad: dict[int, str]  # positions whose image failed in DALI -> reason


def start_bookkeeping(face: Bookkeeper) -> None:
    """Nothing skipped, repaired, said or failed in DALI yet: the face's lists and sets that
    :func:`record` and :func:`skip_undecodable` fill."""
    face.skipped = []
    face.repaired = []
    face._warned = set()
    face._bad = {}


def record(face: Bookkeeper, planned: PlannedBatch | BatchFindings) -> list[str]:
    """Keep the batch's skipped images and repaired boxes (``face.skipped``, ``face.repaired``);
    the messages of the findings not said before (once per file and reason), for the face to
    warn in its caller's thread."""
    face.skipped.extend(planned.skipped)
    face.repaired.extend(planned.repaired)
    return planned.new_findings(face._warned)


def skip_undecodable(face: Bookkeeper, failure: DecodeFailure, cause: BaseException | None,
                     lock: ContextManager[Any] | None = None) -> dict[int, str]:
    """The images DALI failed on in ``failure``'s batch (found by decoding them one by one on
    the CPU), added to ``face._bad`` (under ``lock``) so that every later plan skips them; the
    error naming them (from ``cause``) with ``on_error="raise"``, or when none is found."""
    culprits = undecodable(failure.planned)
    if not culprits or face.on_error == "raise":
        raise failure.error(face.source, culprits) from cause
    with lock if lock is not None else contextlib.nullcontext():
        face._bad.update(culprits)  # (position, reason) pairs
    return culprits


def plan_here(face: Bookkeeper, epoch: int, step: int, bad: dict[int, str]) -> PlannedBatch:
    """Batch ``step`` of ``epoch`` planned in this thread, skipping the positions ``bad``, with
    its image data (read here)."""
    planned = face.planner.plan(epoch, step, bad=bad)
    if planned.data is None or planned.partners is None:
        face.planner.fill_data(planned)
    return planned


class LoaderState(Protocol):
    """What the core reads and writes on a loader (:class:`~detaug.torch.DetectionLoader`)."""

    source: Any
    transforms: Any
    planner: BatchPlanner
    spec: EpochSpec
    batch_size: int
    num_workers: int
    on_error: str
    pipeline: Any  # the DALI pipeline (None once closed)
    _pipeline_args: dict[str, Any]  # build_pipeline's keyword arguments
    _fresh: bool  # the pipeline's first schedule_run is still to come (it runs prefetch_queue_depth batches)
    _depth: int  # prefetch_queue_depth, at least 1
    batches_per_run: int  # planned batches joined in one pipeline run (detaug.pipeline_runs), at least 1
    _pool: PlanPool | None
    _bad: dict[int, str]  # positions whose image failed in DALI -> reason
    _batch_bytes: int | None  # the most image bytes a worker's plan carried (None: none seen)
    _broken: bool  # the pipeline failed while batches nobody wanted were dropped
    _carry: Carry | None  # batches of the next epoch in flight when an epoch ended
    _kept_feed: BackgroundFeed | None  # the background feed, kept running into the next epoch
    _feed_at: tuple[int, int] | None  # where the kept feed's next batch is
    _live_feeds: list[BackgroundFeed]  # stopped when the loader is collected

    def __len__(self) -> int: ...

    def _images_to_torch(self, images: Any) -> Any: ...

    def _run_to_torch(self, whole: Any, members: list[PlannedBatch],
                      sizes: list[int]) -> tuple[list[tuple[Any, Any]], Exception | None]: ...


@dataclass
class Carry:
    """What runs on past the end of an epoch: the next batches, submitted to the planning
    workers (``pending``) and fed to the pipeline (``inflight``), and the next to submit
    (``next_key``); the next iteration takes them over if it starts at ``at`` ``(epoch, step)``."""

    at: tuple[int, int]
    pending: deque[tuple[int, int, Any]]
    inflight: deque[Run | None]
    next_key: tuple[int, int] | None


def build(loader: LoaderState) -> Any:
    """A built pipeline for the loader's source and recipe (its first run still to come)."""
    pipe = build_pipeline(loader.source, loader.transforms, **loader._pipeline_args)
    pipe.build()
    loader._fresh = True  # its first schedule_run runs prefetch_queue_depth batches
    return pipe


def produce(loader: LoaderState, epoch: int, start: int) -> Iterator[list[tuple[int, BatchFindings, Any, Any]]]:
    """The batches from ``(epoch, start)`` to the end of the epoch, one list a run:
    ``(step, findings, images, targets)`` of each batch of the run, in order. Plans are submitted
    ahead and fed to DALI ahead in runs of ``loader.batches_per_run`` batches; each run's images
    are copied once, each batch's a slice of them, and the run is handed over whole (one
    hand-over between threads a run, not a batch). At the end of the epoch the next epoch's
    first batches stay in flight (:class:`Carry`; a run holds batches of one epoch).

    A function, not a method: in the background feed's thread ``loader`` is a weak proxy of the
    loader, so that a loader nobody holds is collected (and its feed stopped) even while the
    feed waits to hand over the next epoch's batches."""
    steps = len(loader)
    per_run = loader.batches_per_run  # a run ends with its epoch: no batch of it is left at the end
    # Workers plan groups of consecutive batches (one plan_batch call each: less CPU a
    # sample); each worker gets one group to plan and one queued, within a byte budget.
    group = group_size(loader.batch_size) if loader._pool is not None else 1
    carry = take_carry(loader, (epoch, start))
    if loader._broken:  # the pipeline failed while batches nobody wanted were dropped
        if carry is not None:
            discard(loader, carry.pending, deque())  # its batches in flight went with the pipeline
        carry, loader.pipeline, loader._broken = None, build(loader), False
    # pending: (epoch, step, future or None) submitted to the workers; inflight: runs fed to
    # the pipeline, outputs not taken (None: a filler); next_key: the next batch to submit. At
    # the end of an epoch they run on into the next one (the pipeline does not run dry between
    # epochs), kept for the next iteration if it starts there (Carry).
    pending: deque[tuple[int, int, Any]] = carry.pending if carry else deque()
    inflight: deque[Run | None] = carry.inflight if carry else deque()
    next_key: tuple[int, int] | None = carry.next_key if carry else ((epoch, start) if steps else None)

    def top_up() -> None:
        """Submit plans up to ``ahead`` and feed the pipeline up to its depth in runs."""
        nonlocal next_key
        ahead = batches_ahead(loader._depth * per_run, loader.num_workers, group, loader._batch_bytes)
        fed = sum(len(r.members) for r in inflight if r is not None)
        while next_key is not None and len(pending) + fed < ahead:
            e, s = next_key
            group_steps = list(range(s, min(s + group, steps)))  # within the epoch
            futures = loader._pool.submit_many(e, group_steps, dict(loader._bad)) if loader._pool is not None else None
            pending.extend((e, k, futures[i] if futures else None) for i, k in enumerate(group_steps))
            next_key = loader.spec.after(e, group_steps[-1])
        runs = []
        try:
            while pending and len(inflight) + len(runs) < loader._depth:
                take = 1  # consecutive batches of one epoch: a run ends with its epoch
                while take < min(per_run, len(pending)) and pending[take][0] == pending[0][0]:
                    take += 1
                members = [result(loader, *pending[i]) for i in range(take)]  # left pending if one raises
                for _ in range(take):
                    pending.popleft()
                runs.append(join_run(members))
        finally:
            feed_batches(loader, runs, inflight)

    completed = False
    try:
        step = start
        while step < steps:
            top_up()
            images, run = outputs(loader, inflight)
            # The next run goes in before this one is converted, so that the pipeline always
            # holds ``prefetch_queue_depth`` runs (DALI keeps these outputs until the next
            # ``outputs()``).
            try:
                top_up()
            except ImageError:  # raised again by the next top_up, once this run is yielded
                pass
            whole = loader._images_to_torch(images)  # the run's images copied once
            del images
            for k, planned in enumerate(run.members):
                assert (planned.epoch, planned.step) == (epoch, step + k), ((planned.epoch, planned.step), (epoch, step + k))
            # the run's targets in one copy; a batch that fails is raised after the batches before it
            pairs, failed = loader._run_to_torch(whole, run.members, run.sizes)
            made = []
            for planned, (batch_images, targets) in zip(run.members, pairs):
                made.append((step, planned.findings, batch_images, targets))
                step += 1
            del whole, run, planned, pairs
            if made:
                yield made  # the batches' arrays freed with them
            del made
            if failed is not None:
                raise failed
        loader._carry = Carry((epoch + 1, 0), pending, inflight, next_key)
        completed = True
    finally:
        if not completed:
            with contextlib.suppress(ReferenceError):  # the loader was collected: nothing to drop
                discard(loader, pending, inflight)


def produce_on(loader: LoaderState, epoch: int,
               start: int) -> Iterator[list[tuple[int, int, BatchFindings, Any, Any]]]:
    """The runs of :func:`produce` from ``(epoch, start)`` on, epoch after epoch, each batch as
    ``(epoch, step, findings, images, targets)``: the background feed's generator (``loader`` a
    weak proxy); it ends only when stopped."""
    if not len(loader):
        return
    while True:
        for run in produce(loader, epoch, start):
            yield [(epoch, *item) for item in run]
        epoch, start = epoch + 1, 0


def take_feed(loader: LoaderState, at: tuple[int, int]) -> BackgroundFeed | None:
    """The background feed kept from the last epoch if this iteration starts where it
    runs (``at``: ``(epoch, step)``), else none (a kept one is stopped)."""
    kept, loader._kept_feed = loader._kept_feed, None
    if kept is not None and loader._feed_at == at:
        return kept
    if kept is not None:
        stop_feed(kept, loader._live_feeds)
    return None


def stop_feed(kept: BackgroundFeed, live: list[BackgroundFeed]) -> None:
    """Stop a background feed and strike it from ``live``."""
    kept.stop()
    with contextlib.suppress(ValueError):
        live.remove(kept)


def stop_feeds(live: list[BackgroundFeed]) -> None:
    """The finalizer of a collected loader: stop its background feeds."""
    for kept in list(live):
        stop_feed(kept, live)


def take_carry(loader: LoaderState, at: tuple[int, int]) -> Carry | None:
    """The batches carried over from the last epoch if the iteration starts where they do
    (``at``: ``(epoch, step)``), else none (those are dropped)."""
    if loader._carry is not None and loader._carry.at == at:
        carry, loader._carry = loader._carry, None
        return carry
    discard_carry(loader)
    return None


def discard_carry(loader: LoaderState) -> None:
    """Drop the batches carried over from the last epoch, if any."""
    carry, loader._carry = loader._carry, None
    if carry is not None:
        discard(loader, carry.pending, carry.inflight)


def discard(loader: LoaderState, pending: deque[tuple[int, int, Any]], inflight: deque[Run | None]) -> None:
    """Cancel plans nobody will take and drop the outputs of the runs in flight."""
    for *_, future in pending:
        if future is not None:
            future.cancel()
    drain(loader, len(inflight))


def result(loader: LoaderState, epoch: int, step: int, future: Any) -> PlannedBatch:
    """A planned batch: the worker's, or planned here (no pool, or the pool broke)."""
    planned = None
    if future is not None:
        try:
            planned = future.result()
        except RuntimeError as err:  # BrokenProcessPool: a worker died
            if isinstance(err, ImageError) or loader._pool is None:
                raise
            if not loader._pool.disabled:  # the other plans of the pool fail alike
                loader._pool.give_up(f"the planning workers stopped ({err})")
    if planned is not None:  # a worker's: its image bytes size the look-ahead (batches_ahead)
        loader._batch_bytes = max(loader._batch_bytes or 0, sum(int(a.nbytes) for a in planned.image_arrays()))
    if planned is None:
        return plan_here(loader, epoch, step, loader._bad)
    if planned.data is None or planned.partners is None:
        loader.planner.fill_data(planned)
    return planned


def feed_batches(loader: LoaderState, runs: list[Run], inflight: deque[Run | None]) -> None:
    """Feed runs of planned batches to the pipeline and schedule them. A fresh pipeline's
    first run runs ``prefetch_queue_depth`` runs (DALI's prefetch): when fewer are left in
    the epoch, the last is fed again as a filler (``None`` in ``inflight``) whose output is
    dropped."""
    if not runs:
        return
    if loader._fresh:
        fillers = feed_first_run(loader.pipeline, [run.joined for run in runs], loader._depth)
        loader._fresh = False
        inflight.extend(runs)
        inflight.extend([None] * fillers)
        return
    for run in runs:
        joined = run.joined
        feed(loader.pipeline, joined.data, joined.params, joined.partners)
        inflight.append(run)


def outputs(loader: LoaderState, inflight: deque[Run | None]) -> tuple[Any, Run]:
    """The images of the oldest run in flight. When DALI fails on an image whose header
    was fine, the culprits are found (decoded one by one on the CPU) and skipped: the
    run's batches are planned again without them, and the runs in flight are fed again to a
    fresh pipeline (DALI's is unusable after an error)."""
    while True:
        try:
            images = take_outputs(loader.pipeline)[0]
            return images, inflight.popleft()
        except (RuntimeError, IndexError) as err:  # IndexError: DALI's "critical error"
            run = inflight[0]
            failure = DecodeFailure(run.joined, err, where=run.describe())
            try:
                skip_undecodable(loader, failure, err)
            except Exception:
                inflight.clear()
                rebuild(loader, inflight)
                raise
            inflight[0] = join_run([result(loader, m.epoch, m.step, None) for m in run.members])
            rebuild(loader, inflight)


def rebuild(loader: LoaderState, inflight: deque[Run | None]) -> None:
    """A fresh pipeline, fed again with the runs in flight."""
    loader.pipeline = build(loader)
    runs = [r for r in inflight if r is not None]
    inflight.clear()
    feed_batches(loader, runs, inflight)


def drain(loader: LoaderState, count: int) -> None:
    """Take and drop the outputs of ``count`` runs in flight (an iteration that stopped
    early); a pipeline that fails meanwhile is replaced."""
    for _ in range(count):
        try:
            take_outputs(loader.pipeline)
        except Exception:  # noqa: BLE001 - outputs nobody wants; the next epoch builds anew
            loader._broken = True
            return
