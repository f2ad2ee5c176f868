"""Where the rows of ``detaug bench --train`` run and what they measure with: the device, autocast
and DDP rank (:func:`distributed_context`), the CPU time of this process tree and the memory
probes of a timed row."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from detaug.bench.resources import ResourceSampler, process_tree
from detaug.streams import TRAINING_STREAM_PRIORITY, training_stream


def process_tree_cpu_seconds(pid: int | None = None) -> float:
    """CPU seconds (user + system) of process ``pid`` (default: this one) and its descendants
    (:func:`~detaug.bench.resources.process_tree`): each live process's own time and that of its
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


#: ``--train-stream``: where the PyTorch rows' training steps run on CUDA. ``"default"``: CUDA's
#: default stream, as most training loops run (the detaug iterators then switch their loop to their
#: training stream by themselves: ``DetectionLoader(training_stream=True)``); ``"high"``: a stream
#: of their own at high priority (:func:`detaug.torch.training_stream`, docs/loader.md, "Feeding a
#: fast model"). Values: the CUDA priority (``None``: the default stream). The Keras rows run on
#: the default stream either way: the Sequence hands its device batches over to it.
TRAIN_STREAMS: dict[str, int | None] = {"default": None, "high": TRAINING_STREAM_PRIORITY}

#: ``--train-step``: how the PyTorch rows' step runs. ``"eager"``: op by op, as most loops run
#: (:func:`detaug.bench.train.train_step`); ``"graph"``: captured once in a CUDA graph and
#: replayed (:class:`detaug.bench.train_graph.GraphedStep`; CUDA, one process). The Keras rows run
#: Keras' own ``fit`` either way.
TRAIN_STEPS = ("eager", "graph")


@dataclass
class _Context:
    """Where the rows run: the device, autocast, the DDP rank and world."""

    device: torch.device
    autocast: bool
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    stream: str = "default"  # TRAIN_STREAMS: where the steps run on CUDA
    step: str = "eager"  # TRAIN_STEPS: op by op, or replayed from a CUDA graph

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def training_stream(self) -> contextlib.AbstractContextManager:
        """Where the block's steps run: the current stream (``"default"``, or on the CPU), or
        :func:`detaug.streams.training_stream` at the :data:`TRAIN_STREAMS` priority."""
        priority = TRAIN_STREAMS[self.stream]
        if not self.cuda or priority is None:
            return contextlib.nullcontext()
        return training_stream(self.device, priority)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def barrier(self) -> None:
        if self.world > 1:
            torch.distributed.barrier()


def distributed_context(device: str, stream: str = "default", step: str = "eager") -> _Context:
    """The context of this process: under ``torchrun`` (``WORLD_SIZE > 1``) the process group
    initialised (NCCL on CUDA, gloo on the CPU) and this rank's GPU (``LOCAL_RANK``) made current;
    ``stream``: a key of :data:`TRAIN_STREAMS`; ``step``: one of :data:`TRAIN_STEPS` (``"graph"``
    needs ``device="gpu"`` and one process)."""
    if stream not in TRAIN_STREAMS:
        raise ValueError(f"--train-stream should be one of {', '.join(TRAIN_STREAMS)}, got {stream!r}")
    if step not in TRAIN_STEPS:
        raise ValueError(f"--train-step should be one of {', '.join(TRAIN_STEPS)}, got {step!r}")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if step == "graph" and (device != "gpu" or world > 1):
        raise ValueError("--train-step graph captures the step in a CUDA graph: it needs --device gpu and one "
                         f"process (got --device {device}" + (f", WORLD_SIZE={world})" if world > 1 else ")"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    cuda = device == "gpu"
    if cuda:
        torch.cuda.set_device(local_rank)
    if world > 1 and not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if cuda else "gloo")
    return _Context(torch.device("cuda", local_rank) if cuda else torch.device("cpu"), autocast=cuda,
                    rank=rank, world=world, local_rank=local_rank, stream=stream, step=step)


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
    not_ready_wait: float | None = None  # seconds of ``wait`` for batches not made yet (detaug's loader)


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
