"""Train a detector with DistributedDataParallel on detaug batches, one process per GPU (or CPU rank).

One node, N GPUs (NCCL; each process uses GPU ``LOCAL_RANK``)::

    torchrun --standalone --nproc_per_node=N examples/torch_ddp_train.py --voc /data/VOC2007 --epochs 2

Several nodes (run on every node, ``--node_rank`` 0..M-1; ``HOST0`` is node 0's address)::

    torchrun --nnodes=M --node_rank=R --nproc_per_node=N \\
        --rdzv_backend=c10d --rdzv_endpoint=HOST0:29400 --rdzv_id=detaug-ddp \\
        examples/torch_ddp_train.py --coco /data/train.json --images /data/train2017

On the CPU (gloo, e.g. to try it out; ``--model tiny`` needs nothing beyond detaug and torch)::

    torchrun --standalone --nproc_per_node=2 examples/torch_ddp_train.py --device cpu --model tiny

Every node must see the dataset at the same path. With neither ``--voc`` nor ``--coco`` a small
VOC dataset of ``--num-images`` images is generated with :mod:`detaug.synthetic` (by local rank 0
of each node, into ``--synthetic-dir`` or a temporary folder rank 0 chose; the others wait at a
barrier).

Models: ``fasterrcnn`` (default) is torchvision's ``fasterrcnn_mobilenet_v3_large_fpn`` with
random weights (nothing is downloaded); it needs torchvision, the build of your torch (``python3 -m pip install torchvision "torch==2.13.0"``
with your torch's version; a CPU-only ``+cpu`` torch needs the ``+cpu`` torchvision of PyTorch's
CPU wheel index: docs/benchmarks.md, "The CPU peers"). ``tiny`` is a small pure-PyTorch stand-in (conv backbone, class-presence
and box losses from the targets) for machines without torchvision.

The loader follows ``DistributedSampler``'s rules (docs/distributed.md): every rank runs
``len(loader)`` steps per epoch, the same on every rank, and the ranks' samples cover the whole
dataset each epoch. Per epoch, each rank prints its number of steps and the image ids it saw
(``--log-dir``: also to ``LOG_DIR/rank<R>.json``). ``--checkpoint`` saves, after every epoch, on
rank 0, ``{"model", "optimizer", "loader", "epoch"}`` where ``"loader"`` is the list of every
rank's ``loader.state_dict()`` (a state names its shard, so each rank loads its own) and
``"epoch"`` the epoch to resume in; ``--resume`` continues from it with exactly the batches an
unbroken run would have seen (same world size, data and settings). ``--max-steps K`` stops each
epoch after at most ``K`` steps (a smoke test; the checkpoint then resumes mid-epoch).

A model that trains at thousands of images a second per GPU feeds faster with NVIDIA's
Multi-Process Service running (``nvidia-cuda-mps-control -d`` before ``torchrun``): each rank's
loader then makes its batches in a process of its own, with the same batches (docs/loader.md,
"Feeding a fast model").
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import detaug.transforms as T
from detaug.sources import CocoSource, VocSource
from detaug.synthetic import write_voc_dataset
from detaug.torch import DetectionLoader

Target = dict[str, Any]


class TinyDetector(nn.Module):
    """A differentiable stand-in for a detector, in plain PyTorch.

    ``forward(images, targets)`` takes float32 ``[B, 3, H, W]`` images in ``[0, 1]`` (or a list
    of ``[3, H, W]`` of one size) and torchvision-style targets (``"boxes"`` float32 ``[N, 4]``
    xyxy pixels, ``"labels"`` int64 ``[N]`` in ``[1, num_classes)``), and returns a dict of
    scalar losses: ``loss_classifier`` (which classes are present, BCE) and ``loss_box_reg``
    (the mean box of the image's objects, normalised by the image size, smooth L1; images without
    boxes contribute nothing).
    """

    def __init__(self, num_classes: int, width: int = 32) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.backbone = nn.Sequential(
            nn.Conv2d(3, width // 2, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(width // 2, width, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(width, width, 3, stride=2, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )
        self.classifier = nn.Linear(width, num_classes)
        self.box_head = nn.Linear(width, 4)

    def forward(self, images: torch.Tensor | list[torch.Tensor], targets: list[Target]) -> dict[str, torch.Tensor]:
        if isinstance(images, (list, tuple)):
            images = torch.stack(list(images))
        features = self.backbone(images)  # [B, width]
        height, width = images.shape[-2:]
        scale = images.new_tensor([width, height, width, height])
        present = images.new_zeros(len(targets), self.num_classes)
        mean_box = images.new_zeros(len(targets), 4)
        has_boxes = images.new_zeros(len(targets))
        for i, t in enumerate(targets):
            present[i, t["labels"]] = 1.0
            if len(t["boxes"]):
                mean_box[i] = t["boxes"].mean(0) / scale
                has_boxes[i] = 1.0
        loss_classifier = F.binary_cross_entropy_with_logits(self.classifier(features), present)
        per_image = F.smooth_l1_loss(self.box_head(features).sigmoid(), mean_box, reduction="none").mean(1)
        loss_box_reg = (per_image * has_boxes).sum() / has_boxes.sum().clamp(min=1.0)
        return {"loss_classifier": loss_classifier, "loss_box_reg": loss_box_reg}


def build_model(name: str, num_classes: int, size: int) -> nn.Module:
    """``"fasterrcnn"`` (torchvision, imported here only) or ``"tiny"``, with random weights."""
    if name == "tiny":
        return TinyDetector(num_classes)
    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_fpn

    return fasterrcnn_mobilenet_v3_large_fpn(weights=None, weights_backbone=None, num_classes=num_classes,
                                             min_size=size, max_size=size)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    data = parser.add_mutually_exclusive_group()
    data.add_argument("--voc", help="a Pascal VOC folder (default: generate one)")
    data.add_argument("--coco", help="a COCO annotations JSON (with --images)")
    parser.add_argument("--images", help="the folder of the COCO file's images")
    parser.add_argument("--split", default=None, help="VOC split (default: every annotation)")
    parser.add_argument("--num-images", type=int, default=64, help="images of the generated dataset")
    parser.add_argument("--synthetic-dir", help="where to generate it (default: a new temporary folder)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16, help="per rank")
    parser.add_argument("--size", type=int, default=320, help="square training size")
    parser.add_argument("--device", choices=["auto", "gpu", "cpu"], default="auto")
    parser.add_argument("--backend", choices=["auto", "nccl", "gloo"], default="auto",
                        help="process group backend (auto: NCCL on GPUs, gloo on the CPU)")
    parser.add_argument("--model", choices=["fasterrcnn", "tiny"], default="fasterrcnn")
    parser.add_argument("--max-steps", type=int, default=None, help="at most this many steps per epoch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--workers", type=int, default=None, help="planning processes per rank")
    parser.add_argument("--checkpoint", help="save model, optimizer and loader states here after every epoch")
    parser.add_argument("--resume", help="a checkpoint written by --checkpoint")
    parser.add_argument("--log-dir", help="write LOG_DIR/rank<R>.json: steps and image ids per epoch")
    args = parser.parse_args()
    if args.coco and not args.images:
        parser.error("--coco needs --images")
    if args.max_steps is not None and args.max_steps < 1:
        parser.error("--max-steps must be >= 1")
    return args


def setup(device: str, backend: str) -> tuple[int, int, int, torch.device]:
    """Join the process group (torchrun's ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_*``):
    NCCL with GPU ``LOCAL_RANK`` on GPUs, gloo on the CPU (``backend`` overrides: gloo on GPUs
    lets several ranks share one GPU, as a smoke test). Returns ``(rank, world, local_rank, device)``."""
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if device == "gpu":
        torch_device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(torch_device)
        if backend == "gloo":
            dist.init_process_group("gloo")
        else:
            dist.init_process_group("nccl", device_id=torch_device)
    else:
        torch_device = torch.device("cpu")
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size(), local_rank, torch_device


def barrier(device: torch.device) -> None:
    if dist.get_backend() == "nccl":
        dist.barrier(device_ids=[device.index])
    else:
        dist.barrier()


def generated_dataset(args: argparse.Namespace, local_rank: int, device: torch.device) -> str:
    """Rank 0 picks the folder; local rank 0 of every node writes the (deterministic) dataset there."""
    root = [(args.synthetic_dir or tempfile.mkdtemp(prefix="detaug-ddp-voc-")) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(root, src=0)
    if local_rank == 0:
        write_voc_dataset(root[0], num_images=args.num_images, size=((160, 320), (160, 320)), max_objects=4, seed=0)
    barrier(device)
    return root[0]


def main() -> None:
    args = parse_args()
    device_name = args.device
    if device_name == "auto":
        device_name = "gpu" if torch.cuda.is_available() else "cpu"
    rank, world, local_rank, device = setup(device_name, args.backend)
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    cpus_per_rank = max(1, (os.cpu_count() or 1) // local_world)

    if args.coco:
        source = CocoSource(args.coco, args.images)
    else:
        source = VocSource(args.voc or generated_dataset(args, local_rank, device), args.split)
    recipe = T.Compose(
        [
            T.RandomZoomOut(fill=114, side_range=(1.0, 2.0)),
            T.RandomIoUCrop(),
            T.RandomHorizontalFlip(),
            T.RandomAffine(degrees=5, scale=(0.9, 1.1), fill=114),
            T.Resize((args.size, args.size)),
            T.ColorJitter(0.2, 0.2, 0.2, 0.02),
        ],
        min_size=2.0,
    )
    workers = args.workers
    if workers is None:
        workers = 0 if device_name == "cpu" else max(1, min(8, cpus_per_rank - 1))
    # shard_id / num_shards come from torch.distributed; the GPU is LOCAL_RANK's.
    loader = DetectionLoader(source, recipe, args.batch_size, device=device_name, device_id=device.index, shuffle=True, seed=args.seed,
                             num_workers=workers, num_threads=max(1, min(4, cpus_per_rank)))

    num_classes = max(source.categories) + 1  # category ids start at 1; 0 is the background
    model = build_model(args.model, num_classes, args.size).to(device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)

    start_epoch = 0
    if args.resume:
        ckpt = torch.load(args.resume, map_location=device)
        if len(ckpt["loader"]) != world:
            raise SystemExit(f"{args.resume} was saved by {len(ckpt['loader'])} ranks; resume with as many, not {world}")
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        loader.load_state_dict(ckpt["loader"][rank])  # its epoch and the batches already done
        start_epoch = int(ckpt["epoch"])

    log: dict[str, Any] = {"rank": rank, "world_size": world, "batches_per_epoch": len(loader),
                           "dataset_image_ids": sorted(int(s.image_id) for s in getattr(source, "samples", [])),
                           "epochs": []}
    ddp.train()
    for epoch in range(start_epoch, args.epochs):
        loader.set_epoch(epoch)  # resumed: keeps the position load_state_dict restored
        first_step = loader.state_dict()["step"]
        steps, seen, loss, start = 0, [], torch.zeros(()), time.perf_counter()
        for images, targets in loader:
            # images: [B, 3, S, S] uint8 on `device`; the models take [0, 1] floats.
            images = images.float().div_(255.0)
            targets = [{k: (v.to(device) if torch.is_tensor(v) else v) for k, v in t.items()} for t in targets]
            losses = ddp(list(images) if args.model == "fasterrcnn" else images, targets)
            loss = sum(losses.values())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
            seen += [int(t["image_id"]) for t in targets]
            if steps == args.max_steps:
                break
        print(f"rank {rank}/{world} epoch {epoch}: {steps} steps from step {first_step}, loss {loss.item():.3f}, "
              f"{time.perf_counter() - start:.1f} s, image ids {seen}", flush=True)
        log["epochs"].append({"epoch": epoch, "first_step": first_step, "steps": steps, "image_ids": seen})
        if args.checkpoint:
            states = [None] * world
            dist.all_gather_object(states, loader.state_dict())  # where each rank's next batch comes from
            if rank == 0:
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "loader": states, "epoch": states[0]["epoch"]}, args.checkpoint)
            barrier(device)

    log["skipped"] = loader.skipped
    if args.log_dir:
        Path(args.log_dir).mkdir(parents=True, exist_ok=True)
        with open(Path(args.log_dir) / f"rank{rank}.json", "w", encoding="utf-8") as f:
            json.dump(log, f, indent=1)
    loader.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
