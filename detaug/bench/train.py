"""``detaug bench --train``: the loaders feeding a fast detector's training loop.

Each row trains :class:`~detaug.bench.train_model.DenseDetector` (a ResNet-18 trunk with random
weights and a 1x1 head per 32-pixel cell; plain PyTorch) on the bench's dataset with the training
recipe, :data:`TRAIN_SIZE` x :data:`TRAIN_SIZE` (``default_detection_recipe(320)``: RandomIoUCrop,
RandomHorizontalFlip, RandomAffine(10, (0.1, 0.1), (0.9, 1.1), shear=5, fill=114), Resize((320,
320)), ColorJitter(0.2, 0.2, 0.2, 0.05), Normalize()); bf16 autocast on CUDA (float32 on the CPU),
channels last, SGD. Rows (:data:`TRAIN_ROWS`, ``--only`` names):

* ``ceiling``: the same steps on one batch kept on the device (the first batch of the ``detaug``
  iterator, its targets moved there once): what the model alone runs at;
* ``detaug``, ``detaug-list``: the bench's iterators (``CocoSource``, sample list;
  :mod:`detaug.bench.detaug_variants`) with their defaults; ``detaug-cuda-decoder``: ``detaug``
  with ``hw_decoder_load=0.0`` (a GPU run only; an option, not checked); ``detaug-process``:
  ``detaug`` with ``feed_process=True`` (the loader in a child process; on a GPU under NVIDIA MPS,
  which the row looks for and names, :func:`~detaug.mps.mps_control_pipe`; an option,
  not checked); ``detaug-padded``:
  ``detaug`` with ``targets="padded"``;
* ``keras-ceiling``, ``sequence``: the same network in Keras (torch backend,
  :func:`~detaug.bench.train_model.keras_dense_detector`) in ``model.fit`` on one cached batch, and
  on ``DetectionSequence`` (Keras' own data path, ``shuffle=False``);
* ``torchvision``: torchvision.transforms.v2 in a DataLoader (:mod:`detaug.bench.peers`), run
  first (its workers fork before DALI starts threads), at most :data:`PEER_STEPS` timed steps.

The step is what a torchvision user writes (:func:`train_step`): ``images, targets = next(it)``,
each target's tensors ``.to(device, non_blocking=True)`` (nothing when they are there already),
the targets padded to 64 boxes on the device (:func:`~detaug.bench.train_model.pad_targets`, which
takes the batched form too), forward, loss, backward, SGD step; no host synchronisation inside.
With ``--train-step graph`` every PyTorch row's step (the ceilings' too) is captured once in a CUDA
graph and replayed (:class:`~detaug.bench.train_graph.GraphedStep`).

Timing: ``warmup`` steps, a CUDA synchronize, then ``steps`` timed steps and a synchronize. A
ceiling is timed before the rows measured against it and again after each of them (twice at
least); a row's ratio is over the mean of the two timings around it (on H200s the same ceiling
differed by up to 28% within a few minutes: every timing is printed), the ceiling row's figures
the mean of all its timings. Per row:
img/s, the ratio to its ceiling (``ceiling`` for the PyTorch rows, ``keras-ceiling`` for the
Sequence), the share of the timed wall time spent blocked in ``next()`` (in ``seq[i]`` for the
Sequence), the CPU cores used (CPU time of this process and its child processes over the timed
window, from ``/proc``, divided by its wall time), the peak GPU memory (device-wide, above the
row's start, and PyTorch's own) and host memory.

Under ``torchrun`` (``WORLD_SIZE > 1``) each rank runs the PyTorch rows with DDP (NCCL on CUDA,
gloo on the CPU), its own shard by the loaders' defaults; rank 0 prints the rows with img/s per
GPU and for all of them. The Keras rows run without torchrun only.

Targets (:data:`TRAIN_CHECKS`, for a GPU run; a CPU run prints "n/a"): every detaug iterator >= 0.9x
the ceiling at every batch size, with data wait <= 5% of the step time at batch 64 and below (with
the step run op by op); the Sequence in fit >= 0.85x the Keras ceiling.

Modules: this one runs the rows and times the PyTorch ones; :mod:`detaug.bench.train_rows` holds
the rows and their defaults, :mod:`detaug.bench.train_keras` the Keras rows,
:mod:`detaug.bench.train_graph` the step in a CUDA graph, :mod:`detaug.bench.train_context` the
device, the DDP rank and the probes, and
:mod:`detaug.bench.train_report` the results, the checks and the report. Their public names are
importable from here too.
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any, Literal

import torch

from detaug.bench.dataset import BenchDataset
from detaug.bench.harness import BenchSettings, VariantUnavailable, count_images
from detaug.bench.train_context import (
    _Context, _Probe, _Timed, distributed_context, process_tree_cpu_seconds, rank_zero_first,
)
from detaug.bench.train_graph import GraphedStep
from detaug.bench.train_keras import _Repeat, _keras, _sequence, _time_keras, _timed_dataset
from detaug.bench.train_model import DenseDetector, batch_on, model_loss
from detaug.bench.train_report import TRAIN_CHECKS, TrainCheck, TrainCheckResult, TrainReport, TrainResult, _evaluate
from detaug.feeder import FeedStats
from detaug.bench.train_rows import (
    PEER_STEPS, RowKind, TRAIN_DEFAULTS, TRAIN_ROWS, TRAIN_ROW_NAMES, TRAIN_RUN_ORDER, TRAIN_SIZE, TrainDefaults,
    TrainRow, selected_rows,
)
from detaug.mps import mps_control_pipe

__all__ = [
    "TRAIN_CHECKS",
    "TRAIN_DEFAULTS",
    "TRAIN_ROWS",
    "TRAIN_SIZE",
    "TrainCheck",
    "TrainReport",
    "TrainResult",
    "TrainRow",
    "process_tree_cpu_seconds",
    "run_train",
    "run_train_bench",
    "train_step",
]


# ------------------------------------------------------------------------------------------
# the step and its measurements
# ------------------------------------------------------------------------------------------


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, images: Any, targets: Any, *,
               device: torch.device, autocast: bool) -> torch.Tensor:
    """One SGD step as a torchvision user writes it: the images and each target's tensors moved
    with ``.to(device, non_blocking=True)`` (nothing where they are already there), the targets
    padded on the device, bf16 autocast where ``autocast``; returns the loss (not read: no host
    synchronisation)."""
    images, boxes, labels = batch_on(images, targets, device)
    loss = model_loss(model, images, boxes, labels, autocast=autocast)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss


def _model(ctx: _Context, seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, str]:
    torch.manual_seed(seed)
    model = DenseDetector().to(ctx.device, memory_format=torch.channels_last)
    source = model.trunk_source
    if ctx.world > 1:
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model, device_ids=[ctx.local_rank] if ctx.cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    return model, optimizer, f"ResNet-18 trunk from {source}, random weights"


def _time_torch(batches: Iterator, ctx: _Context, warmup: int, steps: int, seed: int,
                feed_stats: FeedStats | None = None) -> tuple[_Timed, str]:
    """Warm up, then time ``steps`` training steps on ``batches`` (closed at the end);
    ``feed_stats``: the loader's (:class:`~detaug.feeder.FeedStats`), for the time its batches
    were not ready."""
    probe = _Probe(ctx)
    try:
        with ctx.training_stream():
            model, optimizer, described = _model(ctx, seed)
            if ctx.step == "graph":
                step = GraphedStep(model, optimizer, device=ctx.device, autocast=ctx.autocast)
                described += ", the step replayed from a CUDA graph"
            else:
                step = lambda images, targets: train_step(  # noqa: E731
                    model, optimizer, images, targets, device=ctx.device, autocast=ctx.autocast)
            it = iter(batches)
            for _ in range(warmup):
                step(*next(it))
            ctx.sync()
            ctx.barrier()
            start, cpu_start = time.perf_counter(), process_tree_cpu_seconds()
            not_ready_start = feed_stats.waited_s if feed_stats is not None else None
            wait, images = 0.0, 0
            for _ in range(steps):
                before = time.perf_counter()
                batch_images, targets = next(it)
                wait += time.perf_counter() - before
                images += count_images(batch_images)
                step(batch_images, targets)
            ctx.sync()
        seconds, cpu = time.perf_counter() - start, process_tree_cpu_seconds() - cpu_start
        not_ready = None if not_ready_start is None else feed_stats.waited_s - not_ready_start
        if getattr(step, "eager_steps", 0):
            described += f" ({step.eager_steps} batch(es) of another shape stepped eagerly)"
        return probe.finish(_Timed(images, steps, seconds, wait, cpu, not_ready_wait=not_ready)), described
    finally:
        probe.sampler.stop()
        close = getattr(batches, "close", None)
        if close is not None:
            close()


def _every_rank(ctx: _Context, value: Any) -> list[Any]:
    """``value`` of every rank (this one's alone without torchrun): for decisions all ranks
    must take alike."""
    if ctx.world == 1:
        return [value]
    values: list[Any] = [None] * ctx.world
    torch.distributed.all_gather_object(values, value)
    return values


def _cached_batches(batch: tuple) -> Iterator[tuple]:
    while True:
        yield batch


def _first_batch_on(ctx: _Context, batches: Iterator) -> tuple:
    """The first batch of ``batches``, its images and targets on the device; ``batches`` closed."""
    def own(value: Any) -> Any:  # a copy of ours: a host batch may be the loader's own buffers
        return value.to(ctx.device, copy=True) if isinstance(value, torch.Tensor) else value

    try:
        images, targets = next(iter(batches))
        images = own(images)
        if isinstance(targets, dict):
            targets = {k: own(v) for k, v in targets.items()}
        else:
            targets = [{k: own(v) for k, v in t.items()} for t in targets]
    finally:
        batches.close()
    ctx.sync()
    return images, targets


# ------------------------------------------------------------------------------------------
# the rows
# ------------------------------------------------------------------------------------------


def run_train_bench(
    *,
    data: Any = None,
    images_dir: Any = None,
    allow_paths_outside: bool = False,
    repeat_to: int | None = None,
    num_images: int | None = None,
    cache_dir: Any = None,
    device: Literal["gpu", "cpu"] = "cpu",
    batch_sizes: Sequence[int] | None = None,
    workers: int | None = None,
    threads: int | None = None,
    size: int | None = None,
    seed: int = 0,
    only: Sequence[str] | None = None,
    warmup: int | None = None,
    steps: int | None = None,
    stream: str = "default",
    step: str = "eager",
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> TrainReport:
    """``detaug bench --train``: the dataset of :func:`detaug.bench.session.run_bench` (its
    arguments alike; under ``torchrun`` rank 0 prepares it first), then :func:`run_train`;
    ``stream``: where every row's steps run on CUDA, a key of
    :data:`~detaug.bench.train_context.TRAIN_STREAMS`; ``step``: how the PyTorch rows step, one of
    :data:`~detaug.bench.train_context.TRAIN_STEPS`. Under ``torchrun`` only rank 0 logs."""
    import shutil
    import tempfile

    from detaug.bench.dataset import prepare_dataset
    from detaug.bench.harness import default_threads, default_workers
    from detaug.bench.machine import DEFAULTS, _environment

    selected_rows(only)  # said before any work
    started = torch.distributed.is_available() and torch.distributed.is_initialized()
    ctx = distributed_context(device, stream, step)
    if ctx.rank != 0:
        log, progress = (lambda msg: None), False
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        raise ValueError(f"--size should be a positive int, got {size!r}")
    base = BenchSettings(
        device=device, batch_size=(batch_sizes or TRAIN_DEFAULTS[device].batch_sizes)[0],
        workers=default_workers() if workers is None else workers,
        threads=default_threads() if threads is None else threads, adapter_threads=threads,
        size=TRAIN_SIZE if size is None else size, seed=seed,
    )
    work = tempfile.mkdtemp(prefix="detaug-bench-")
    try:
        with rank_zero_first(ctx):
            dataset = prepare_dataset(
                data, images_dir=images_dir, allow_paths_outside=allow_paths_outside, repeat_to=repeat_to, work_dir=work,
                num_images=DEFAULTS[device].num_images if num_images is None else num_images,
                cache_dir=cache_dir, seed=seed, progress=progress,
            )
        log(f"dataset: {dataset.describe()}")
        return run_train(dataset, base, ctx, _environment(device), batch_sizes=batch_sizes, warmup=warmup,
                         steps=steps, only=only, log=log)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if ctx.world > 1 and not started:  # the group this call started
            torch.distributed.destroy_process_group()


def run_train(
    dataset: BenchDataset,
    base: BenchSettings,
    ctx: _Context,
    environment: dict,
    *,
    batch_sizes: Sequence[int] | None = None,
    warmup: int | None = None,
    steps: int | None = None,
    only: Sequence[str] | None = None,
    log: Callable[[str], None] = print,
) -> TrainReport:
    """Every selected row (:data:`TRAIN_ROWS`; ``only``: their names) at each batch size on
    ``dataset``; ``None``: :data:`TRAIN_DEFAULTS` of ``base.device``. ``base.size`` is the input
    side (:data:`TRAIN_SIZE` unless ``--size``)."""
    defaults = TRAIN_DEFAULTS[base.device]
    sizes = tuple(dict.fromkeys(batch_sizes or defaults.batch_sizes))
    warmup = defaults.warmup if warmup is None else warmup
    steps = defaults.steps if steps is None else steps
    for name, value, low in (("--warmup", warmup, 1), ("--steps", steps, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} should be an int >= {low}, got {value!r}")
    if any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in sizes):
        raise ValueError(f"batch sizes should be positive ints, got {list(sizes)}")
    selected = selected_rows(only)
    rows = {row.name: row for row in TRAIN_ROWS}
    results: list[TrainResult] = []
    for b in sizes:
        settings = replace(base, batch_size=b)
        done: dict[str, TrainResult] = {}
        timings: dict[str, list[TrainResult]] = {}  # each ceiling's timings, in order
        brackets: dict[str, tuple[TrainResult, TrainResult]] = {}  # a row: its ceiling just before and after

        def run(name: str, again: bool = False) -> TrainResult:
            log(f"training: {rows[name].label}{' again' if again else ''}, batch {b} ...")
            r = _run_row(rows[name], dataset, settings, ctx, warmup, steps, log)
            log(f"  {r.img_per_s:,.1f} img/s" + ("" if again else f", data wait {r.data_wait:.1%}")
                if r.status == "ok" else f"  {r.status}: {r.message}")
            return r

        for name in (n for n in TRAIN_RUN_ORDER if n in selected):
            if rows[name].kind in CEILING_KINDS:
                timings[name] = [run(name)]
                continue
            done[name] = run(name)
            ceiling = rows[name].ceiling
            # again after it (unless either cannot run here: a decision every DDP rank takes alike)
            if ceiling in timings and "unavailable" not in (done[name].status, timings[ceiling][-1].status):
                timings[ceiling].append(run(ceiling, again=True))
                brackets[name] = (timings[ceiling][-2], timings[ceiling][-1])
        for name, timed in timings.items():
            if len(timed) == 1:  # no row after it: a second timing all the same
                timed.append(run(name, again=True))
            done[name] = _all_timings(timed)
        ordered = [done[row.name] for row in TRAIN_ROWS if row.name in done]
        for r in ordered:
            before, after = brackets.get(r.row.name, (None, None))
            if before is not None and before.status == after.status == "ok" and r.total_img_per_s is not None:
                r.ceiling_runs = [before.total_img_per_s, after.total_img_per_s]
                r.vs_ceiling = r.total_img_per_s / (sum(r.ceiling_runs) / 2)
                continue
            ceiling = done.get(r.row.ceiling)
            if r.total_img_per_s is not None and ceiling is not None and ceiling.total_img_per_s:
                r.vs_ceiling = r.total_img_per_s / ceiling.total_img_per_s
        results += ordered
    checks = [_evaluate(check, results, b, base.device) for b in sizes for check in TRAIN_CHECKS
              if check.row in selected and check.applies_at(b, ctx.step)]
    return TrainReport(base, dataset, environment, results, checks, warmup, steps, sizes, ctx.world, ctx.rank,
                       ctx.stream, ctx.step)


#: Rows timed before the rows whose ceiling they are and again after each of them.
CEILING_KINDS = ("ceiling", "keras-ceiling")


#: How :func:`_all_timings` joins a figure's timings: summed, the largest, else the mean.
_SUMMED = ("steps", "images", "seconds")
_LARGEST = ("gpu_peak_mib", "torch_peak_mib", "host_peak_rss_mib")
#: The figures of a :class:`TrainResult` it joins (a rank's dict: all its keys).
_JOINED = (*_SUMMED, *_LARGEST, "img_per_s", "total_img_per_s", "data_wait", "not_ready_wait", "cpu_cores")


def _all_timings(timings: list[TrainResult]) -> TrainResult:
    """A ceiling timed several times, as one row: its rates the mean of the timings, its steps,
    images and seconds their sums, its memory the largest (each rank's figures alike); ``runs``
    each timing's ``total_img_per_s``. Failed timings are left out; where all failed, the first."""
    ok = [t for t in timings if t.status == "ok"]
    if not ok:
        return timings[0]
    if len(ok) == 1:
        return replace(ok[0], runs=[ok[0].total_img_per_s])
    joined = _join([{k: getattr(t, k) for k in _JOINED} for t in ok])
    return replace(ok[0], **joined, runs=[t.total_img_per_s for t in ok],
                   ranks=[_join(list(per)) for per in zip(*(t.ranks for t in ok))])


def _join(per_timing: list[dict]) -> dict:
    """The figures of several timings as one (the keys of the first): :data:`_SUMMED` summed,
    :data:`_LARGEST` the largest known (``None`` where none is), the rest the mean (``None``
    where any is ``None``)."""

    def join(key: str, values: list) -> Any:
        if key in _SUMMED:
            return sum(values)
        known = [v for v in values if v is not None]
        if key in _LARGEST:
            return max(known) if known else None
        return None if len(known) < len(values) else sum(values) / len(values)

    return {k: join(k, [d[k] for d in per_timing]) for k in per_timing[0]}


def _run_row(row: TrainRow, dataset: BenchDataset, settings: BenchSettings, ctx: _Context, warmup: int,
             steps: int, log: Callable[[str], None]) -> TrainResult:
    """One row at ``settings.batch_size``: a result, or why there is none (on every rank)."""
    base = TrainResult(row, "ok", batch_size=settings.batch_size, world_size=ctx.world)
    try:
        timed, model = _measure(row, dataset, settings, ctx, warmup, steps)
    except VariantUnavailable as exc:
        return replace(base, status="unavailable", message=str(exc))
    except Exception as exc:  # noqa: BLE001 - one broken row must not end the run
        if ctx.world > 1:  # but a rank that went on alone would wait forever in the others' collectives
            raise RuntimeError(f"rank {ctx.rank}: the training row {row.name!r} at batch {settings.batch_size} failed "
                               f"(under torchrun a row's error ends the run: the other ranks wait in its steps)") from exc
        log("".join(traceback.format_exception(exc)).rstrip())
        return replace(base, status="error", message=f"{type(exc).__name__}: {exc}".splitlines()[0])
    finally:
        from detaug.bench.harness import _release_gpu_memory

        _release_gpu_memory("gpu" if ctx.cuda else "cpu")
    mine = {"img_per_s": timed.images / timed.seconds, "data_wait": timed.wait / timed.seconds,
            "not_ready_wait": None if timed.not_ready_wait is None else timed.not_ready_wait / timed.seconds,
            "cpu_cores": timed.cpu_seconds / timed.seconds, "gpu_peak_mib": timed.gpu_peak_mib,
            "torch_peak_mib": timed.torch_peak_mib, "host_peak_rss_mib": timed.host_peak_rss_mib,
            "images": timed.images, "seconds": timed.seconds}
    ranks = _every_rank(ctx, mine)
    peak = [r[k] for r in ranks for k in ("gpu_peak_mib",) if r[k] is not None]
    torch_peak = [r["torch_peak_mib"] for r in ranks if r["torch_peak_mib"] is not None]
    total = sum(r["img_per_s"] for r in ranks)
    return replace(
        base, steps=timed.steps, images=sum(r["images"] for r in ranks), seconds=max(r["seconds"] for r in ranks),
        img_per_s=total / len(ranks), total_img_per_s=total,
        data_wait=sum(r["data_wait"] for r in ranks) / len(ranks), cpu_cores=sum(r["cpu_cores"] for r in ranks),
        not_ready_wait=None if mine["not_ready_wait"] is None else sum(r["not_ready_wait"] for r in ranks) / len(ranks),
        gpu_peak_mib=max(peak) if peak else None, torch_peak_mib=max(torch_peak) if torch_peak else None,
        host_peak_rss_mib=sum(r["host_peak_rss_mib"] or 0.0 for r in ranks) or None,
        ranks=ranks if ctx.world > 1 else [], model=model,
    )


#: The loader arguments of the rows on the COCO reader (:func:`detaug.bench.detaug_variants.iter_detaug`):
#: an iterator row's loader, or the loader whose first batch a ceiling caches.
_COCO_LOADER_ARGS: dict[str, dict[str, Any]] = {
    "ceiling": {},
    "detaug": {},
    "detaug-cuda-decoder": {"hw_decoder_load": 0.0},
    "detaug-process": {"feed_process": True},
    "ceiling-padded": {"targets": "padded"},
    "detaug-padded": {"targets": "padded"},
}


def _feed_words(row: TrainRow, ctx: _Context) -> str:
    """What a detaug row's model description adds about where its loader ran: the process row
    names the MPS daemon (or its absence); a row with the default feed says so where the default
    chose the loader's own process (:func:`detaug.torch.process_by_default`)."""
    from detaug.torch import process_by_default

    if not ctx.cuda:
        return ""
    pipe = mps_control_pipe()
    if row.name == "detaug-process":
        return (f"; the loader's process under NVIDIA MPS (control pipe {pipe})" if pipe else
                "; no NVIDIA MPS daemon found: the two processes' kernels take turns on the GPU")
    if process_by_default(ctx.device):
        return f"; the loader in its own process, the default under NVIDIA MPS (control pipe {pipe})"
    return ""


def _measure(row: TrainRow, dataset: BenchDataset, settings: BenchSettings, ctx: _Context, warmup: int,
             steps: int) -> tuple[_Timed, str]:
    from detaug.bench import detaug_variants, torchvision_peers

    if row.kind in ("keras-ceiling", "keras"):
        if ctx.world > 1:
            raise VariantUnavailable("the Keras rows run in one process (without torchrun)")
        keras = _keras()
        sequence = _sequence(dataset, settings)
        try:
            if row.kind == "keras-ceiling":
                images, targets = sequence[0]
                to = lambda v: torch.as_tensor(v).to(ctx.device, copy=True)  # noqa: E731
                batch = (to(images), {k: to(v) for k, v in targets.items()})
                data = _timed_dataset(keras, _Repeat(batch), length=warmup + steps)
            else:
                data = _timed_dataset(keras, sequence)
            timed = _time_keras(keras, data, ctx, settings.size, warmup, steps, settings.seed)
        finally:
            sequence.close()
        return timed, "ResNet-18 trunk in Keras layers, random weights"
    if row.name == "detaug-cuda-decoder" and not ctx.cuda:
        raise VariantUnavailable("the CPU decodes every JPEG itself: no hardware decoder share to set")
    if row.kind == "ceiling":  # one batch: made in this process under MPS too
        batch = _first_batch_on(ctx, detaug_variants.iter_detaug(dataset, settings, feed_process=False,
                                                                 **_COCO_LOADER_ARGS[row.name]))
        return _time_torch(_cached_batches(batch), ctx, warmup, steps, settings.seed)
    stats = FeedStats()
    if row.name in _COCO_LOADER_ARGS or row.name == "detaug-list":
        batches = (detaug_variants.iter_detaug_list(dataset, settings, feed_stats=stats) if row.name == "detaug-list"
                   else detaug_variants.iter_detaug(dataset, settings, **_COCO_LOADER_ARGS[row.name], feed_stats=stats))
        timed, described = _time_torch(batches, ctx, warmup, steps, settings.seed, stats)
        return timed, described + _feed_words(row, ctx)
    if row.name == "torchvision":
        workers = max(1, settings.workers // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
        batches = torchvision_peers.iter_torchvision(dataset, replace(settings, workers=workers, seed=settings.seed + ctx.rank))
        return _time_torch(batches, ctx, warmup, min(steps, PEER_STEPS), settings.seed)
    raise ValueError(f"unknown training row {row.name!r}")
