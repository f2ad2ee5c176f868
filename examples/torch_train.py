"""Train a torchvision detector for a few iterations from detaug's PyTorch iterator.

    python3 examples/torch_train.py                      # a generated VOC dataset, GPU if available
    python3 examples/torch_train.py --voc /data/VOC2007 --split trainval --iterations 200

Needs, beyond detaug's core (README set-up): torchvision, the build of your installed torch. Pin
torch to the version installed (2.13.0 after the README's set-up) and pip picks the matching
torchvision without touching torch::

    python3 -m pip install torchvision "torch==2.13.0"

(PyPI's torchvision is built for PyPI's torch; a CPU-only ``+cpu`` torch needs the ``+cpu``
torchvision from PyTorch's CPU wheel index: docs/benchmarks.md, "The CPU peers".) The model is
``fasterrcnn_mobilenet_v3_large_fpn`` with random weights (no download); it normalises its inputs
itself, so the recipe ends with uint8 images, which the loop scales to [0, 1].
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

import detaug.transforms as T
from detaug.sources import VocSource
from detaug.synthetic import write_voc_dataset
from detaug.torch import DetectionLoader


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--voc", help="a Pascal VOC folder; default: generate one")
    parser.add_argument("--split", default=None)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--size", type=int, default=320)
    parser.add_argument("--device", choices=["gpu", "cpu"], default="gpu" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_fpn

    root = args.voc
    if root is None:
        root = tempfile.mkdtemp(prefix="detaug-voc-")
        write_voc_dataset(root, num_images=32, seed=0)
    source = VocSource(root, args.split)
    print(source.report.summary())

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
    loader = DetectionLoader(source, recipe, args.batch_size, device=args.device, shuffle=True, seed=0)
    device = loader.device

    num_classes = max(source.categories) + 1  # category ids start at 1; 0 is the background
    model = fasterrcnn_mobilenet_v3_large_fpn(weights=None, weights_backbone=None, num_classes=num_classes,
                                              min_size=args.size, max_size=args.size).to(device)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)

    step, start = 0, time.perf_counter()
    # On a GPU the loader runs this loop on a CUDA stream of its own (training_stream=True, docs/loader.md)
    while step < args.iterations:
        for images, targets in loader:
            images = images.float() / 255.0  # [B, 3, H, W] uint8 on `device` -> [0, 1]
            targets = [{k: (v.to(device) if torch.is_tensor(v) else v) for k, v in t.items()} for t in targets]
            losses = model(list(images), targets)
            loss = sum(losses.values())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            print(f"step {step:3d}  loss {loss.item():.3f}  " + "  ".join(f"{k}={v.item():.3f}" for k, v in losses.items()))
            if step == args.iterations:
                break
    print(f"{step} iterations in {time.perf_counter() - start:.1f} s on {device}")


if __name__ == "__main__":
    main()
