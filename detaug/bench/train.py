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
  :mod:`detaug.bench.detaug_variants`) with their defaults; ``detaug-padded``: ``detaug`` with
  ``targets="padded"``;
* ``keras-ceiling``, ``sequence``: the same network in Keras (torch backend,
  :func:`~detaug.bench.train_model.keras_dense_detector`) in ``model.fit`` on one cached batch, and
  on ``DetectionSequence`` (Keras' own data path, ``shuffle=False``);
* ``torchvision``: torchvision.transforms.v2 in a DataLoader (:mod:`detaug.bench.peers`), run
  first (its workers fork before DALI starts threads), at most :data:`PEER_STEPS` timed steps.

The step is what a torchvision user writes (:func:`train_step`): ``images, targets = next(it)``,
each target's tensors ``.to(device, non_blocking=True)`` (nothing when they are there already),
the targets padded to 64 boxes on the device (:func:`~detaug.bench.train_model.pad_targets`, which
takes the batched form too), forward, loss, backward, SGD step; no host synchronisation inside.

Timing: ``warmup`` steps, a CUDA synchronize, then ``steps`` timed steps and a synchronize. Per row:
img/s, the ratio to its ceiling (``ceiling`` for the PyTorch rows, ``keras-ceiling`` for the
Sequence), the share of the timed wall time spent blocked in ``next()`` (in ``seq[i]`` for the
Sequence), the CPU cores used (CPU time of this process and its child processes over the timed
window, from ``/proc``, divided by its wall time), the peak GPU memory (device-wide, above the
row's start, and PyTorch's own) and host memory.

Under ``torchrun`` (``WORLD_SIZE > 1``) each rank runs the PyTorch rows with DDP (NCCL on CUDA,
gloo on the CPU), its own shard by the loaders' defaults; rank 0 prints the rows with img/s per
GPU and for all of them. The Keras rows run without torchrun only.

Targets (:data:`TRAIN_CHECKS`, for a GPU run; a CPU run prints "n/a"): every detaug iterator >= 0.9x
the ceiling with data wait <= 5% of the step time; the Sequence in fit >= 0.85x the Keras ceiling.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import torch

from detaug.bench.dataset import BenchDataset
from detaug.bench.harness import (BenchSettings, ResourceSampler, VariantUnavailable, count_images, format_table,
                                  process_tree)
from detaug.bench.train_model import DenseDetector, detection_loss, keras_dense_detector, pad_targets

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

#: Input side of the training rows.
TRAIN_SIZE = 320
#: Timed steps of the torchvision row at most: it runs at a few percent of the ceiling (221 img/s
#: against 4,753 on an H100, issue 37), where 600 steps of 256 images would take 12 minutes.
PEER_STEPS = 100
RowKind = Literal["ceiling", "iterator", "keras-ceiling", "keras", "peer"]


@dataclass(frozen=True)
class TrainDefaults:
    """``batch_sizes``, ``warmup`` steps and timed ``steps`` of ``--train`` on a device."""

    batch_sizes: tuple[int, ...]
    warmup: int
    steps: int


#: A GPU run: the issue's 20 warm-up and 600 timed steps at batch 64 and 256; the CPU: a few steps
#: of a few images (about a minute on 2 cores with every row).
TRAIN_DEFAULTS: dict[str, TrainDefaults] = {
    "gpu": TrainDefaults(batch_sizes=(64, 256), warmup=20, steps=600),
    "cpu": TrainDefaults(batch_sizes=(2,), warmup=1, steps=2),
}


@dataclass(frozen=True)
class TrainRow:
    """A row of ``--train``: ``name`` (``--only``), ``label``, ``kind``, ``note``; ``ceiling``: the
    row its ratio is taken against."""

    name: str
    label: str
    kind: RowKind
    note: str
    ceiling: str = "ceiling"


TRAIN_ROWS: tuple[TrainRow, ...] = (
    TrainRow("ceiling", "ceiling (one cached batch)", "ceiling",
             "the same steps on one batch kept on the device: the model alone"),
    TrainRow("detaug", "detaug iterator, COCO reader", "iterator",
             "DetectionLoader(CocoSource), its defaults; targets moved per sample"),
    TrainRow("detaug-list", "detaug iterator, sample list", "iterator",
             "DetectionLoader(SampleListSource), its defaults; targets moved per sample"),
    TrainRow("ceiling-padded", "ceiling, padded targets (one cached batch)", "ceiling",
             "the same steps on one batch of padded targets kept on the device", ceiling="ceiling-padded"),
    TrainRow("detaug-padded", "detaug iterator, padded targets", "iterator",
             "DetectionLoader(CocoSource, targets='padded'): [B, M, 4] boxes", ceiling="ceiling-padded"),
    TrainRow("keras-ceiling", "Keras ceiling (one cached batch)", "keras-ceiling",
             "the same network in Keras (torch backend) in fit on one cached batch", ceiling="keras-ceiling"),
    TrainRow("sequence", "detaug Keras Sequence in fit", "keras",
             "model.fit(DetectionSequence, shuffle=False), the sequence's defaults", ceiling="keras-ceiling"),
    TrainRow("torchvision", "torchvision.transforms.v2, DataLoader", "peer",
             f"DataLoader workers = CPUs of the rank; pinned images, targets moved per sample; "
             f"at most {PEER_STEPS} timed steps"),
)
TRAIN_ROW_NAMES = tuple(row.name for row in TRAIN_ROWS)
#: Run order: the DataLoader peer first (its workers fork before DALI starts threads here).
TRAIN_RUN_ORDER = ("torchvision", "ceiling", "detaug", "detaug-list", "ceiling-padded", "detaug-padded",
                   "keras-ceiling", "sequence")


@dataclass(frozen=True)
class TrainCheck:
    """A target of a training row: its ratio to its ceiling ``>= target`` (``wait=False``) or
    its data-wait share ``<= target`` (``wait=True``). Targets of a GPU run."""

    name: str
    row: str
    target: float
    wait: bool = False


TRAIN_CHECKS: tuple[TrainCheck, ...] = (
    TrainCheck("training: detaug (COCO reader) / ceiling", "detaug", 0.9),
    TrainCheck("training: detaug (COCO reader), data wait", "detaug", 0.05, wait=True),
    TrainCheck("training: detaug (sample list) / ceiling", "detaug-list", 0.9),
    TrainCheck("training: detaug (sample list), data wait", "detaug-list", 0.05, wait=True),
    TrainCheck("training: detaug (padded targets) / ceiling", "detaug-padded", 0.9),
    TrainCheck("training: detaug (padded targets), data wait", "detaug-padded", 0.05, wait=True),
    TrainCheck("training: Keras Sequence in fit / Keras ceiling", "sequence", 0.85),
)


def selected_rows(only: Sequence[str] | None) -> set[str]:
    """The row names ``only`` selects (``None``: all); ``ValueError`` for an unknown one."""
    selected = set(TRAIN_ROW_NAMES) if only is None else {n.strip() for n in only if n.strip()}
    unknown = selected - set(TRAIN_ROW_NAMES)
    if unknown or not selected:
        raise ValueError(f"unknown training row(s) {sorted(unknown)}; choose from {', '.join(TRAIN_ROW_NAMES)}")
    return selected


# ------------------------------------------------------------------------------------------
# results
# ------------------------------------------------------------------------------------------


@dataclass
class TrainResult:
    """One row at one batch size (per rank under DDP; ``ranks`` holds every rank's figures).

    Attributes:
        img_per_s: images per second of this process (per GPU under DDP: the ranks' mean).
        total_img_per_s: of all ranks together (``img_per_s`` without DDP).
        vs_ceiling: ``total_img_per_s`` over its ceiling row's.
        data_wait: seconds blocked in ``next()`` over the timed wall time, 0 to 1 (ranks' mean).
        cpu_cores: CPU seconds of this process and its children over the timed wall time
            (ranks' sum).
        gpu_peak_mib: peak device-wide GPU memory above the row's start (ranks' max).
        torch_peak_mib: ``torch.cuda.max_memory_allocated`` (ranks' max).
    """

    row: TrainRow
    status: Literal["ok", "unavailable", "error"]
    message: str = ""
    batch_size: int = 0
    steps: int = 0
    images: int = 0
    seconds: float = 0.0
    img_per_s: float | None = None
    total_img_per_s: float | None = None
    vs_ceiling: float | None = None
    data_wait: float | None = None
    cpu_cores: float | None = None
    gpu_peak_mib: float | None = None
    torch_peak_mib: float | None = None
    host_peak_rss_mib: float | None = None
    world_size: int = 1
    ranks: list[dict] = field(default_factory=list)
    model: str = ""

    def to_dict(self) -> dict:
        return {
            "variant": self.row.name, "label": self.row.label, "kind": self.row.kind, "note": self.row.note,
            "ceiling": self.row.ceiling, "status": self.status, "message": self.message,
            "batch_size": self.batch_size, "steps": self.steps, "images": self.images, "seconds": self.seconds,
            "img_per_s": self.img_per_s, "total_img_per_s": self.total_img_per_s, "vs_ceiling": self.vs_ceiling,
            "data_wait": self.data_wait, "cpu_cores": self.cpu_cores, "gpu_peak_mib": self.gpu_peak_mib,
            "torch_peak_mib": self.torch_peak_mib, "host_peak_rss_mib": self.host_peak_rss_mib,
            "world_size": self.world_size, "ranks": self.ranks, "model": self.model,
        }


@dataclass
class TrainCheckResult:
    check: TrainCheck
    value: float | None
    batch_size: int
    reason: str = ""
    applies: bool = True  # False: a GPU target in a CPU run

    @property
    def passed(self) -> bool | None:
        if self.value is None or not self.applies:
            return None
        return self.value <= self.check.target if self.check.wait else self.value >= self.check.target

    def line(self) -> str:
        c = self.check
        bound = f"target {'<=' if c.wait else '>='} {c.target:.0%}" if c.wait else f"target >= {c.target:g}"
        if self.value is None:
            return f"{c.name}: n/a ({self.reason}) ({bound})"
        verdict = "PASS" if self.passed else "FAIL" if self.applies else "n/a on the CPU"
        value = f"{self.value:.1%}" if c.wait else f"{self.value:.2f}"
        return f"{c.name} = {value} ({bound}): {verdict}"

    def to_dict(self) -> dict:
        return {"name": self.check.name, "batch_size": self.batch_size, "variant": self.check.row,
                "kind": "data_wait" if self.check.wait else "vs_ceiling", "value": self.value,
                "target": self.check.target, "passed": self.passed, "applies": self.applies, "reason": self.reason}


@dataclass
class TrainReport:
    """What ``detaug bench --train`` prints (:meth:`format`) and writes with ``--json``.

    ``rank``: this process's rank (only rank 0 prints); :attr:`runs` and ``checks`` give
    ``--check`` the same view as a :class:`~detaug.bench.runner.BenchReport`."""

    settings: BenchSettings
    dataset: BenchDataset
    environment: dict
    results: list[TrainResult]
    checks: list[TrainCheckResult]
    warmup: int
    steps: int
    batch_sizes: tuple[int, ...]
    world_size: int = 1
    rank: int = 0

    @property
    def runs(self) -> list[TrainReport]:
        return [self]

    def format(self) -> str:
        env, s = self.environment, self.settings
        gpu = s.device == "gpu"
        ddp = f" | DDP, {self.world_size} ranks" if self.world_size > 1 else ""
        lines = [
            f"detaug bench --train: a dense detector (ResNet-18 trunk, 1x1 head per 32-pixel cell) trained on "
            f"the default recipe at {s.size}x{s.size}",
            f"GPU: {env['gpu']} | CPUs: {env['cpus']} | "
            + " | ".join(f"{k} {v}" for k, v in env["versions"].items() if v),
            f"device {s.device}{ddp} | batch {', '.join(map(str, self.batch_sizes))} | "
            f"{'bf16 autocast' if gpu else 'float32'}, channels last, SGD | {self.warmup} warm-up steps, "
            f"{self.steps} timed | seed {s.seed}",
            f"dataset: {self.dataset.describe()}",
        ]
        model = next((r.model for r in self.results if r.model), "")
        if model:
            lines.append(f"model: {model}")
        for b in self.batch_sizes:
            per = " per GPU" if gpu else " per rank"
            lines += ["", f"batch {b}" + (per if self.world_size > 1 else "") + ":"]
            lines += self._table([r for r in self.results if r.batch_size == b])
        lines += [
            "",
            "img/s" + (f" per {'GPU' if gpu else 'rank'} (the ranks' mean) and total" if self.world_size > 1 else "")
            + "; vs ceiling: over its ceiling row (the Sequence: the Keras one); data wait: time blocked in "
            "next() (seq[i]) over the timed time; CPU cores: CPU time of the process and its children over the "
            "timed time" + ("; GPU MiB: peak device-wide memory above the row's start" if gpu else "") + ".",
            "",
            "checks" + ("" if gpu else " (the targets are for a GPU run)") + ":",
        ]
        lines += [f"  [batch {c.batch_size}] {c.line()}" for c in self.checks]
        return "\n".join(lines)

    def _table(self, results: list[TrainResult]) -> list[str]:
        gpu = self.settings.device == "gpu"
        ddp = self.world_size > 1
        header = ("row", "img/s", *(["total img/s"] if ddp else []), "vs ceiling", "data wait", "CPU cores",
                  *(["GPU MiB"] if gpu else []), "note")
        rows = [header]
        for r in results:
            if r.status != "ok":
                rows.append((r.row.label, *("-",) * (len(header) - 2), f"{r.status}: {r.message}"))
                continue
            rows.append((
                r.row.label,
                f"{r.img_per_s:,.1f}",
                *([f"{r.total_img_per_s:,.1f}"] if ddp else []),
                "-" if r.vs_ceiling is None else f"{r.vs_ceiling:.2f}x",
                f"{r.data_wait:.1%}",
                "-" if r.cpu_cores is None else f"{r.cpu_cores:.1f}",
                *(["-" if r.gpu_peak_mib is None else f"{r.gpu_peak_mib:,.0f}"] if gpu else []),
                r.row.note,
            ))
        return format_table(rows)

    def to_dict(self) -> dict:
        from detaug.bench.report import SCHEMA

        s = self.settings
        return {
            "schema": SCHEMA,
            "mode": "train",
            "settings": {"device": s.device, "batch_sizes": list(self.batch_sizes), "size": s.size,
                         "seed": s.seed, "warmup": self.warmup, "steps": self.steps,
                         "world_size": self.world_size, "workers": s.workers},
            "environment": self.environment,
            "dataset": self.dataset.to_dict(),
            "results": [],
            "checks": [c.to_dict() for c in self.checks],
            "train": {"rows": [r.to_dict() for r in self.results], "checks": [c.to_dict() for c in self.checks]},
        }


# ------------------------------------------------------------------------------------------
# the step and its measurements
# ------------------------------------------------------------------------------------------


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, images: Any, targets: Any, *,
               device: torch.device, autocast: bool) -> torch.Tensor:
    """One SGD step as a torchvision user writes it: the images and each target's tensors moved
    with ``.to(device, non_blocking=True)`` (nothing where they are already there), the targets
    padded on the device, bf16 autocast where ``autocast``; returns the loss (not read: no host
    synchronisation)."""
    if isinstance(images, (list, tuple)):
        images = torch.stack([image.to(device, non_blocking=True) for image in images])
    images = images.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)
    boxes, labels = pad_targets(targets, device)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
        outputs = model(images)
    loss = detection_loss(outputs, boxes, labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss


def process_tree_cpu_seconds(pid: int | None = None) -> float:
    """CPU seconds (user + system) of process ``pid`` (default: this one) and its descendants
    (:func:`~detaug.bench.harness.process_tree`): each live process's own time and that of its
    children it has reaped, from ``/proc/<pid>/stat``; this process's from :func:`os.times`
    where ``/proc`` cannot be read."""
    pid = os.getpid() if pid is None else pid
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for p in process_tree(pid):
        try:
            with open(f"/proc/{p}/stat", encoding="ascii") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            if p == pid and pid == os.getpid():
                t = os.times()
                return t.user + t.system + t.children_user + t.children_system
            continue
        total += sum(int(v) for v in fields[11:15]) / tick  # utime, stime, cutime, cstime
    return total


@dataclass
class _Context:
    """Where the rows run: the device, autocast, the DDP rank and world."""

    device: torch.device
    autocast: bool
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def barrier(self) -> None:
        if self.world > 1:
            torch.distributed.barrier()


def distributed_context(device: str) -> _Context:
    """The context of this process: under ``torchrun`` (``WORLD_SIZE > 1``) the process group
    initialised (NCCL on CUDA, gloo on the CPU) and this rank's GPU (``LOCAL_RANK``) made current."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    cuda = device == "gpu"
    if cuda:
        torch.cuda.set_device(local_rank)
    if world > 1 and not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if cuda else "gloo")
    return _Context(torch.device("cuda", local_rank) if cuda else torch.device("cpu"), autocast=cuda,
                    rank=rank, world=world, local_rank=local_rank)


@contextlib.contextmanager
def rank_zero_first(ctx: _Context) -> Iterator[None]:
    """Rank 0 runs the block first, the others after it (a generated dataset is cached once)."""
    if ctx.rank != 0:
        ctx.barrier()
    yield
    if ctx.rank == 0:
        ctx.barrier()


@dataclass
class _Timed:
    images: int
    steps: int
    seconds: float
    wait: float
    cpu_seconds: float
    gpu_peak_mib: float | None = None
    torch_peak_mib: float | None = None
    host_peak_rss_mib: float | None = None


class _Probe:
    """The row's memory: device-wide GPU and host peaks (:class:`ResourceSampler`) and torch's."""

    def __init__(self, ctx: _Context) -> None:
        self.ctx = ctx
        if ctx.cuda:
            torch.cuda.reset_peak_memory_stats(ctx.device)
        self.sampler = ResourceSampler(gpu=ctx.cuda)
        self.sampler.start()

    def finish(self, timed: _Timed) -> _Timed:
        timed.host_peak_rss_mib, timed.gpu_peak_mib = self.sampler.stop()
        if self.ctx.cuda:
            timed.torch_peak_mib = torch.cuda.max_memory_allocated(self.ctx.device) / 2**20
        return timed


def _model(ctx: _Context, seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, str]:
    torch.manual_seed(seed)
    model = DenseDetector().to(ctx.device, memory_format=torch.channels_last)
    source = model.trunk_source
    if ctx.world > 1:
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model, device_ids=[ctx.local_rank] if ctx.cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    return model, optimizer, f"ResNet-18 trunk from {source}, random weights"


def _time_torch(batches: Iterator, ctx: _Context, warmup: int, steps: int, seed: int) -> tuple[_Timed, str]:
    """Warm up, then time ``steps`` training steps on ``batches`` (closed at the end)."""
    probe = _Probe(ctx)
    try:
        model, optimizer, described = _model(ctx, seed)
        step = lambda images, targets: train_step(  # noqa: E731
            model, optimizer, images, targets, device=ctx.device, autocast=ctx.autocast)
        it = iter(batches)
        for _ in range(warmup):
            step(*next(it))
        ctx.sync()
        ctx.barrier()
        start, cpu_start = time.perf_counter(), process_tree_cpu_seconds()
        wait, images = 0.0, 0
        for _ in range(steps):
            before = time.perf_counter()
            batch_images, targets = next(it)
            wait += time.perf_counter() - before
            images += count_images(batch_images)
            step(batch_images, targets)
        ctx.sync()
        seconds, cpu = time.perf_counter() - start, process_tree_cpu_seconds() - cpu_start
        return probe.finish(_Timed(images, steps, seconds, wait, cpu)), described
    finally:
        probe.sampler.stop()
        close = getattr(batches, "close", None)
        if close is not None:
            close()


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
# Keras
# ------------------------------------------------------------------------------------------


def _keras() -> Any:
    os.environ.setdefault("KERAS_BACKEND", "torch")
    try:
        import keras
    except ImportError as exc:
        raise VariantUnavailable(f'Keras not installed (python3 -m pip install -e ".[keras]"): {exc}') from exc
    if keras.backend.backend() != "torch":
        raise VariantUnavailable(f"needs Keras' torch backend (KERAS_BACKEND=torch), this one is "
                                 f"{keras.backend.backend()}")
    return keras


def _sequence(dataset: BenchDataset, settings: BenchSettings) -> Any:
    """The bench's ``DetectionSequence`` (:func:`detaug.bench.detaug_variants.iter_sequence`'s
    settings), its planning workers started."""
    from detaug.bench.recipe import detaug_recipe
    from detaug.keras import DetectionSequence
    from detaug.sources import CocoSource

    source = CocoSource(str(dataset.annotations_file), str(dataset.images_dir), shuffle=True, seed=settings.seed)
    sequence = DetectionSequence(source, detaug_recipe("default", settings.size), batch_size=settings.batch_size,
                                 max_boxes=max(dataset.max_boxes, 1), device=settings.device, shuffle=True,
                                 seed=settings.seed, num_threads=settings.adapter_threads)
    sequence.start_workers()
    return sequence


def _timed_dataset(keras: Any, inner: Any, length: int | None = None) -> Any:
    """A Keras ``PyDataset`` that hands over ``inner[i]`` (``workers=1``: Keras asks for the
    batches in order, in its training thread), adding the time each took to ``.wait`` and its
    images to ``.images``."""

    class Timed(keras.utils.PyDataset):
        def __init__(self) -> None:
            super().__init__(workers=1, use_multiprocessing=False)
            self.wait = 0.0
            self.images = 0

        def __len__(self) -> int:
            return len(inner) if length is None else length

        def __getitem__(self, index: int):
            before = time.perf_counter()
            batch = inner[index]
            self.wait += time.perf_counter() - before
            self.images += count_images(batch[0])
            return batch

        def on_epoch_end(self) -> None:
            end = getattr(inner, "on_epoch_end", None)
            if end is not None:
                end()

    return Timed()


class _Repeat:
    """One batch at every index."""

    def __init__(self, batch: tuple) -> None:
        self.batch = batch

    def __getitem__(self, index: int) -> tuple:
        return self.batch


def _time_keras(keras: Any, data: Any, ctx: _Context, size: int, warmup: int, steps: int, seed: int) -> _Timed:
    """``model.fit(data)`` of :func:`keras_dense_detector` for ``warmup + steps`` steps; the last
    ``steps`` timed by a callback (CUDA synchronised at both ends)."""
    probe = _Probe(ctx)
    try:
        keras.utils.set_random_seed(seed)
        model = keras_dense_detector(size, dtype="mixed_bfloat16" if ctx.cuda else None)
        model.compile(optimizer=keras.optimizers.SGD(learning_rate=1e-3, momentum=0.9))
        clock: dict[str, float] = {}

        class Timer(keras.callbacks.Callback):
            done = 0

            def on_train_batch_end(self, batch, logs=None):
                self.done += 1
                if self.done == warmup:
                    ctx.sync()
                    clock.update(start=time.perf_counter(), wait=data.wait, images=data.images,
                                 cpu=process_tree_cpu_seconds())
                elif self.done == warmup + steps:
                    ctx.sync()
                    clock.update(stop=time.perf_counter(), wait=data.wait - clock["wait"],
                                 images=data.images - clock["images"], cpu=process_tree_cpu_seconds() - clock["cpu"])
                    self.model.stop_training = True

        timer = Timer()
        epochs = math.ceil((warmup + steps) / len(data))
        model.fit(data, epochs=epochs, shuffle=False, verbose=0, callbacks=[timer])
        if "stop" not in clock:
            raise RuntimeError(f"fit stopped after {timer.done} of {warmup + steps} steps")
        seconds = clock["stop"] - clock["start"]
        return probe.finish(_Timed(int(clock["images"]), steps, seconds, clock["wait"], clock["cpu"]))
    finally:
        probe.sampler.stop()


# ------------------------------------------------------------------------------------------
# the rows
# ------------------------------------------------------------------------------------------


def run_train_bench(
    *,
    data: Any = None,
    images_dir: Any = None,
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
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> TrainReport:
    """``detaug bench --train``: the dataset of :func:`detaug.bench.runner.run_bench` (its
    arguments alike; under ``torchrun`` rank 0 prepares it first), then :func:`run_train`. Under
    ``torchrun`` only rank 0 logs."""
    import shutil
    import tempfile

    from detaug.bench.dataset import prepare_dataset
    from detaug.bench.harness import default_threads, default_workers
    from detaug.bench.machine import DEFAULTS, _environment

    selected_rows(only)  # said before any work
    started = torch.distributed.is_available() and torch.distributed.is_initialized()
    ctx = distributed_context(device)
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
                data, images_dir=images_dir, repeat_to=repeat_to, work_dir=work,
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
        for name in TRAIN_RUN_ORDER:
            if name in selected:
                log(f"training: {rows[name].label}, batch {b} ...")
                done[name] = _run_row(rows[name], dataset, settings, ctx, warmup, steps, log)
                r = done[name]
                log(f"  {r.img_per_s:,.1f} img/s, data wait {r.data_wait:.1%}" if r.status == "ok"
                    else f"  {r.status}: {r.message}")
        ordered = [done[row.name] for row in TRAIN_ROWS if row.name in done]
        for r in ordered:
            ceiling = done.get(r.row.ceiling)
            if r.total_img_per_s is not None and ceiling is not None and ceiling.total_img_per_s:
                r.vs_ceiling = r.total_img_per_s / ceiling.total_img_per_s
        results += ordered
    checks = [_evaluate(check, results, b, base.device) for b in sizes for check in TRAIN_CHECKS
              if check.row in selected]
    return TrainReport(base, dataset, environment, results, checks, warmup, steps, sizes, ctx.world, ctx.rank)


def _evaluate(check: TrainCheck, results: list[TrainResult], batch_size: int, device: str) -> TrainCheckResult:
    row = next((r for r in results if r.row.name == check.row and r.batch_size == batch_size), None)
    applies = device == "gpu"
    if row is None or row.status != "ok":
        return TrainCheckResult(check, None, batch_size, f"{check.row} {'not run' if row is None else row.status}",
                                applies)
    value = row.data_wait if check.wait else row.vs_ceiling
    if value is None:
        return TrainCheckResult(check, None, batch_size, f"no {row.row.ceiling} row", applies)
    return TrainCheckResult(check, value, batch_size, applies=applies)


def _run_row(row: TrainRow, dataset: BenchDataset, settings: BenchSettings, ctx: _Context, warmup: int,
             steps: int, log: Callable[[str], None]) -> TrainResult:
    """One row at ``settings.batch_size``: a result, or why there is none (on every rank)."""
    base = TrainResult(row, "ok", batch_size=settings.batch_size, world_size=ctx.world)
    try:
        timed, model = _measure(row, dataset, settings, ctx, warmup, steps)
    except VariantUnavailable as exc:
        return replace(base, status="unavailable", message=str(exc))
    except Exception as exc:  # noqa: BLE001 - one broken row must not end the run
        log("".join(traceback.format_exception(exc)).rstrip())
        return replace(base, status="error", message=f"{type(exc).__name__}: {exc}".splitlines()[0])
    finally:
        from detaug.bench.harness import _release_gpu_memory

        _release_gpu_memory("gpu" if ctx.cuda else "cpu")
    mine = {"img_per_s": timed.images / timed.seconds, "data_wait": timed.wait / timed.seconds,
            "cpu_cores": timed.cpu_seconds / timed.seconds, "gpu_peak_mib": timed.gpu_peak_mib,
            "torch_peak_mib": timed.torch_peak_mib, "host_peak_rss_mib": timed.host_peak_rss_mib,
            "images": timed.images, "seconds": timed.seconds}
    ranks = [mine]
    if ctx.world > 1:
        ranks = [None] * ctx.world
        torch.distributed.all_gather_object(ranks, mine)
    peak = [r[k] for r in ranks for k in ("gpu_peak_mib",) if r[k] is not None]
    torch_peak = [r["torch_peak_mib"] for r in ranks if r["torch_peak_mib"] is not None]
    total = sum(r["img_per_s"] for r in ranks)
    return replace(
        base, steps=timed.steps, images=sum(r["images"] for r in ranks), seconds=max(r["seconds"] for r in ranks),
        img_per_s=total / len(ranks), total_img_per_s=total,
        data_wait=sum(r["data_wait"] for r in ranks) / len(ranks), cpu_cores=sum(r["cpu_cores"] for r in ranks),
        gpu_peak_mib=max(peak) if peak else None, torch_peak_mib=max(torch_peak) if torch_peak else None,
        host_peak_rss_mib=sum(r["host_peak_rss_mib"] or 0.0 for r in ranks) or None,
        ranks=ranks if ctx.world > 1 else [], model=model,
    )


def _measure(row: TrainRow, dataset: BenchDataset, settings: BenchSettings, ctx: _Context, warmup: int,
             steps: int) -> tuple[_Timed, str]:
    from detaug.bench import detaug_variants, peers

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
    if row.name in ("ceiling", "ceiling-padded"):
        form = {"targets": "padded"} if row.name == "ceiling-padded" else {}
        batch = _first_batch_on(ctx, detaug_variants.iter_detaug(dataset, settings, **form))
        return _time_torch(_cached_batches(batch), ctx, warmup, steps, settings.seed)
    if row.name == "detaug":
        return _time_torch(detaug_variants.iter_detaug(dataset, settings), ctx, warmup, steps, settings.seed)
    if row.name == "detaug-list":
        return _time_torch(detaug_variants.iter_detaug_list(dataset, settings), ctx, warmup, steps, settings.seed)
    if row.name == "detaug-padded":
        batches = detaug_variants.iter_detaug(dataset, settings, targets="padded")
        return _time_torch(batches, ctx, warmup, steps, settings.seed)
    if row.name == "torchvision":
        workers = max(1, settings.workers // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
        batches = peers.iter_torchvision(dataset, replace(settings, workers=workers, seed=settings.seed + ctx.rank))
        return _time_torch(batches, ctx, warmup, min(steps, PEER_STEPS), settings.seed)
    raise ValueError(f"unknown training row {row.name!r}")
