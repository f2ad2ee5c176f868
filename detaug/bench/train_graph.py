"""``detaug bench --train --train-step graph``: the training step captured once in a CUDA graph.

A model as fast as the bench's spends most of a step's host time launching kernels (about 430 a
step at batch 64); with a loader in the same process those launches slow down and the GPU waits
for the host. Captured in a CUDA graph, the whole step (forward, loss, backward, SGD) is one
launch: what is left of the loader's cost is its GPU work beside the model's. This is PyTorch's
whole-network capture (``torch.cuda.graphs``, "CUDA Graphs" in PyTorch's CUDA semantics notes),
as a user with a launch-bound model would write it:

1. the batch is moved as the eager step moves it (:func:`~detaug.bench.train_model.batch_on`: the
   images ``[B, 3, H, W]`` float in channels last, the targets padded to
   :data:`~detaug.bench.train_model.MAX_BOXES` rows, ``boxes`` float32 ``[B, MAX_BOXES, 4]``,
   ``labels`` int64 ``[B, MAX_BOXES]``, -1 for padding) and copied into static input tensors, so
   every batch has the shapes captured;
2. the first batch warms the step up three times on a side stream, then the step is captured
   (autocast without its weight cache, as capture needs) and replayed for every batch after; the
   capture forbids unsafe CUDA calls in this thread only (``capture_error_mode="thread_local"``):
   the loader's threads keep calling CUDA meanwhile (in the default global mode their calls
   void the capture);
3. a batch of another shape (an epoch's short last batch) runs the eager step instead
   (:func:`~detaug.bench.train.train_step`'s arithmetic on the same model and optimizer), counted
   in :attr:`GraphedStep.eager_steps`.

CUDA only, one process (DDP's all-reduce is not captured here): the bench refuses it elsewhere.
"""

from __future__ import annotations

from typing import Any

import torch

from detaug.bench.train_model import batch_on, model_loss

__all__ = ["GraphedStep"]

#: Steps run on a side stream before the capture (PyTorch's recipe: allocations and autotuning
#: settle before the graph records them).
WARMUP_STEPS = 3


class GraphedStep:
    """``step(images, targets)``: one SGD step of ``model`` by ``optimizer``, replayed from a CUDA
    graph captured on the first call.

    Args:
        model: on ``device``, channels last, in training mode.
        optimizer: over ``model``'s parameters (its state lives in the graph's memory after the
            capture: keep using it through this step).
        device: a CUDA device.
        autocast: bf16 autocast in the step, as :func:`~detaug.bench.train.train_step`.

    ``images``: ``[B, 3, H, W]`` float (or a list of ``[3, H, W]``), anywhere; ``targets``:
    torchvision's list of dicts or the padded dict (what :func:`pad_targets` takes). Nothing is
    read back to the host.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, device: torch.device,
                 autocast: bool) -> None:
        if device.type != "cuda":
            raise ValueError(f"a CUDA graph needs a CUDA device, got {device}")
        self.model, self.optimizer, self.device, self.autocast = model, optimizer, device, autocast
        self.graph: torch.cuda.CUDAGraph | None = None
        self.images: torch.Tensor | None = None
        self.boxes: torch.Tensor | None = None
        self.labels: torch.Tensor | None = None
        #: Batches run eagerly: their shapes differed from the captured batch's.
        self.eager_steps = 0

    def _loss(self, images: torch.Tensor, boxes: torch.Tensor, labels: torch.Tensor, *, cache: bool) -> torch.Tensor:
        return model_loss(self.model, images, boxes, labels, autocast=self.autocast, cache=cache)

    def _eager(self, images: torch.Tensor, boxes: torch.Tensor, labels: torch.Tensor) -> None:
        loss = self._loss(images, boxes, labels, cache=True)
        self.optimizer.zero_grad(set_to_none=False)  # after the capture the graph owns .grad
        loss.backward()
        self.optimizer.step()

    def _capture(self, images: torch.Tensor, boxes: torch.Tensor, labels: torch.Tensor) -> None:
        self.images = images.clone(memory_format=torch.channels_last)
        self.boxes, self.labels = boxes.clone(), labels.clone()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_STEPS):
                self.optimizer.zero_grad(set_to_none=True)
                self._loss(self.images, self.boxes, self.labels, cache=False).backward()
                self.optimizer.step()
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        self.optimizer.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):  # the loader's threads call CUDA meanwhile
            self._loss(self.images, self.boxes, self.labels, cache=False).backward()
            self.optimizer.step()
        self.graph = graph

    def __call__(self, images: Any, targets: Any) -> None:
        images, boxes, labels = batch_on(images, targets, self.device)
        if self.graph is None:
            self._capture(images, boxes, labels)  # its warm-up steps train on this batch
        elif images.shape != self.images.shape or boxes.shape != self.boxes.shape:
            self.eager_steps += 1
            self._eager(images, boxes, labels)
            return
        self.images.copy_(images)
        self.boxes.copy_(boxes)
        self.labels.copy_(labels)
        self.graph.replay()
