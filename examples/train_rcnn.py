"""Train torchvision's Keypoint R-CNN and Mask R-CNN for a few steps each from detaug's batches.

    python3 examples/train_rcnn.py                    # GPU if there is one, 5 steps a model
    python3 examples/train_rcnn.py --device cpu --steps 2 --size 192
    python3 examples/train_rcnn.py --dry-run          # the batches and their targets only: no torchvision

Writes a small COCO dataset of generated scenes (:func:`detaug.synthetic.write_coco_dataset`:
solid rectangles, each annotation with the rectangle's polygon as ``segmentation``) and gives
every annotation ``K = 5`` keypoints inside its rectangle (``centre``, ``left_top``,
``right_top``, ``left_bottom``, ``right_bottom``, COCO's pixel indices, all visible), named in the
category's ``keypoints``. Two sources read it: ``CocoSource(annotations, images)`` with the
keypoints (read wherever the file has them) and ``CocoSource(annotations, images, masks=True)``
with the polygons as masks. Each
goes through one geometric recipe (a flip whose ``keypoint_flip_pairs`` come from the names,
``RandomAffine``, ``Resize``) into a ``DetectionLoader`` whose targets are what torchvision's
detectors take: ``boxes`` float32 ``[N, 4]`` xyxy, ``labels`` int64 ``[N]`` (1 .. C, 0 is the
background), and ``keypoints`` float32 ``[N, K, 3]`` (docs/keypoints.md) or ``masks`` uint8
``[N, H, W]`` (docs/masks.md), on the images' device. Every batch's targets are checked (shapes,
dtypes, device, visible points inside their box, masks inside their box); ``--dry-run`` stops
there. Otherwise ``keypointrcnn_resnet50_fpn`` and ``maskrcnn_resnet50_fpn`` with random weights
(no download) train ``--steps`` steps each; the loop prints their losses and stops on one that
is not finite.

Needs torchvision, the build of your installed torch (examples/torch_train.py says how to install
it); ``--dry-run`` needs only detaug's core. The models normalise their inputs themselves, so the
recipes end with uint8 images, which the loop scales to [0, 1].
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import torch

import detaug.transforms as T
from detaug.keypoints import flip_pairs_from_names
from detaug.sources import CocoSource
from detaug.synthetic import write_coco_dataset
from detaug.torch import DetectionLoader

#: the keypoints given to each rectangle, in their order (``K = 5``)
KEYPOINT_NAMES = ["centre", "left_top", "right_top", "left_bottom", "right_bottom"]
#: the loss of the head each field trains, among the model's losses
HEAD_LOSS = {"keypoints": "loss_keypoint", "masks": "loss_mask"}


def write_dataset(root: Path, num_images: int, size: int) -> tuple[Path, Path]:
    """A COCO dataset of ``num_images`` generated scenes of about ``size`` pixels under ``root``.

    Returns:
        ``(annotations, images)``: the annotations file, where every annotation has ``keypoints``
        (a flat ``[x1, y1, v1, ...]`` of ``K`` points: COCO's pixel indices inside the rectangle,
        ``v = 2``) and its rectangle's polygon as ``segmentation``, and the images' folder.
    """
    path = write_coco_dataset(root, num_images=num_images, size=((size * 3 // 4, size), (size * 3 // 4, size)),
                              max_objects=4, seed=0, progress=False)
    doc = json.loads(path.read_text())
    for category in doc["categories"]:
        category["keypoints"] = KEYPOINT_NAMES
    for ann in doc["annotations"]:
        x, y, w, h = ann["bbox"]  # whole pixels: the rectangle fills columns x .. x + w - 1
        left, top, right, bottom = x + 1, y + 1, x + w - 2, y + h - 2  # pixel indices one inside its edges
        points = [(x + w // 2, y + h // 2), (left, top), (right, top), (left, bottom), (right, bottom)]
        ann["keypoints"] = [c for px, py in points for c in (float(px), float(py), 2)]
        ann["num_keypoints"] = len(points)
    path.write_text(json.dumps(doc))
    return path, root / "images"


def make_loader(source: CocoSource, field: str, args: argparse.Namespace) -> DetectionLoader:
    """A loader of ``source`` whose targets carry ``field`` (``"keypoints"`` or ``"masks"``)
    besides boxes and labels, through a geometric recipe ending at ``args.size`` square, uint8."""
    pairs = flip_pairs_from_names(KEYPOINT_NAMES) if field == "keypoints" else ()  # ((1, 2), (3, 4))
    recipe = T.Compose(
        [
            T.RandomHorizontalFlip(),
            T.RandomAffine(degrees=10, translate=(0.1, 0.1), scale=(0.8, 1.2), fill=114),
            T.Resize((args.size, args.size)),
        ],
        min_size=2.0,
        keypoint_flip_pairs=pairs,
    )
    return DetectionLoader(source, recipe, args.batch_size, device=args.device, shuffle=True, seed=0,
                           label_map="contiguous", fields=[field])


def check_batch(images: torch.Tensor, targets: list[dict], field: str, num_classes: int, size: int) -> None:
    """Assert that a batch is what torchvision's detectors take: ``images`` uint8 ``[B, 3, size,
    size]``, each target's ``boxes`` float32 ``[N, 4]`` with ``x1 > x0, y1 > y0``, ``labels``
    int64 ``[N]`` in ``1 .. num_classes - 1``, and ``keypoints`` float32 ``[N, K, 3]`` (each visible
    point inside its box, to the pixel) or ``masks`` uint8 ``[N, size, size]`` of 0/1 (each inside
    its box, to the pixel), all on the images' device."""
    assert images.dtype == torch.uint8 and images.shape[1:] == (3, size, size), (images.dtype, images.shape)
    assert len(targets) == len(images)
    for t in targets:
        boxes, labels, values = t["boxes"], t["labels"], t[field]
        n = len(boxes)
        assert boxes.dtype == torch.float32 and boxes.shape == (n, 4), (boxes.dtype, boxes.shape)
        assert bool((boxes[:, 2:] > boxes[:, :2]).all()), f"image {t['image_id']}: a box without area"
        assert labels.dtype == torch.int64 and labels.shape == (n,), (labels.dtype, labels.shape)
        assert bool(((labels >= 1) & (labels < num_classes)).all()), labels
        assert all(v.device == images.device for v in (boxes, labels, values))
        if field == "keypoints":
            assert values.dtype == torch.float32 and values.shape == (n, len(KEYPOINT_NAMES), 3), values.shape
            x, y, visible = values[..., 0], values[..., 1], values[..., 2] > 0
            inside = ((x >= boxes[:, None, 0] - 1) & (x <= boxes[:, None, 2] + 1)
                      & (y >= boxes[:, None, 1] - 1) & (y <= boxes[:, None, 3] + 1))
            assert bool((inside | ~visible).all()), f"image {t['image_id']}: a visible keypoint outside its box"
        else:
            assert values.dtype == torch.uint8 and values.shape == (n, size, size), (values.dtype, values.shape)
            assert n == 0 or int(values.max()) <= 1, "mask values other than 0 and 1"
            ys, xs = torch.arange(size, device=values.device) + 0.5, torch.arange(size, device=values.device) + 0.5
            for mask, box in zip(values.bool(), boxes):
                rows, cols = ys[mask.any(1)], xs[mask.any(0)]
                if len(rows):
                    assert box[0] - 1 <= cols.min() and cols.max() <= box[2] + 1, f"image {t['image_id']}: mask outside its box"
                    assert box[1] - 1 <= rows.min() and rows.max() <= box[3] + 1, f"image {t['image_id']}: mask outside its box"


def dry_run(loader: DetectionLoader, field: str, size: int) -> None:
    """One epoch of ``loader``, each batch checked (:func:`check_batch`) and described."""
    num_classes = len(loader.class_names)
    for i, (images, targets) in enumerate(loader):
        check_batch(images, targets, field, num_classes, size)
        shapes = ", ".join(f"{tuple(t[field].shape)}" for t in targets)
        print(f"{field} batch {i}: {len(images)} images {tuple(images.shape[1:])} {images.dtype} on {images.device}; "
              f"{field} {shapes} {targets[0][field].dtype}")


def train(model: torch.nn.Module, loader: DetectionLoader, field: str, steps: int, size: int) -> None:
    """``steps`` SGD steps of ``model`` on ``loader``'s batches (epochs follow one another),
    each batch checked first; prints each step's losses and stops on one that is not finite."""
    device, num_classes = loader.device, len(loader.class_names)
    model.to(device).train()
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.005, momentum=0.9,
                                weight_decay=1e-4)
    step, start = 0, time.perf_counter()
    while step < steps:
        for images, targets in loader:
            check_batch(images, targets, field, num_classes, size)
            inputs = list(images.float() / 255.0)  # [3, H, W] float in [0, 1]: the model normalises
            losses = model(inputs, targets)
            assert HEAD_LOSS[field] in losses, sorted(losses)
            loss = sum(losses.values())
            if not all(math.isfinite(v.item()) for v in losses.values()):
                raise SystemExit(f"step {step + 1}: a loss is not finite: {dict((k, v.item()) for k, v in losses.items())}")
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
            optimizer.step()
            step += 1
            print(f"{field} step {step:3d}  loss {loss.item():.3f}  "
                  + "  ".join(f"{k}={v.item():.3f}" for k, v in losses.items()))
            if step == steps:
                break
    print(f"{field}: {step} steps in {time.perf_counter() - start:.1f} s on {device}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5, help="training steps of each model")
    parser.add_argument("--device", choices=["gpu", "cpu"], default="gpu" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--images", type=int, default=16, help="images of the generated dataset")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--size", type=int, default=256, help="the square output size of the recipes")
    parser.add_argument("--dry-run", action="store_true", help="check an epoch of batches of each loader; no training")
    args = parser.parse_args()

    if not args.dry_run:
        try:
            from torchvision.models.detection import keypointrcnn_resnet50_fpn, maskrcnn_resnet50_fpn
        except Exception as error:  # absent, or built for another torch
            sys.exit(f"examples/train_rcnn.py needs torchvision, which does not import here ({error!r}); "
                     "install the build of your torch (examples/torch_train.py), or check the batches "
                     "alone with --dry-run")

    annotations, images = write_dataset(Path(tempfile.mkdtemp(prefix="detaug-rcnn-")), args.images, args.size)
    keypoints = make_loader(CocoSource(annotations, images), "keypoints", args)
    masks = make_loader(CocoSource(annotations, images, masks=True), "masks", args)
    print(f"{args.images} images, {len(keypoints.class_names) - 1} classes, {len(KEYPOINT_NAMES)} keypoints, "
          f"flip pairs {keypoints.transforms.keypoint_flip_pairs}, on {keypoints.device}")

    if args.dry_run:
        dry_run(keypoints, "keypoints", args.size)
        dry_run(masks, "masks", args.size)
    else:
        common = dict(weights=None, weights_backbone=None, min_size=args.size, max_size=args.size)
        train(keypointrcnn_resnet50_fpn(num_classes=len(keypoints.class_names), num_keypoints=len(KEYPOINT_NAMES),
                                        **common), keypoints, "keypoints", args.steps, args.size)
        train(maskrcnn_resnet50_fpn(num_classes=len(masks.class_names), **common), masks, "masks", args.steps,
              args.size)
    keypoints.close()
    masks.close()


if __name__ == "__main__":
    main()
