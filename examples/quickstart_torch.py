"""Quick start, PyTorch: a VOC folder augmented by DALI, as batches for a training loop.

Usage::

    python3 examples/quickstart_torch.py                              # a small generated VOC folder
    python3 examples/quickstart_torch.py VOCdevkit/VOC2007 trainval   # your VOC folder and split

Runs on the GPU when DALI sees one (``device="auto"``), else on the CPU. The README's PyTorch
quick start is this file's middle part; ``examples/torch_train.py`` trains a detector from it.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import detaug.transforms as T
from detaug.sources import VocSource  # or CocoSource(annotations_file, images_dir)
from detaug.synthetic import write_voc_dataset
from detaug.torch import DetectionLoader


def main(argv: list[str]) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        if argv:
            root, split = Path(argv[0]), (argv[1] if len(argv) > 1 else "trainval")
        else:  # 40 generated photos of coloured rectangles with their boxes: batches of 32 and 8
            root, split = Path(tmp) / "VOC", "trainval"
            write_voc_dataset(root, num_images=40, splits={"trainval": 1.0}, seed=0)

        recipe = T.Compose([
            T.RandomIoUCrop(), T.RandomHorizontalFlip(),
            T.RandomAffine(degrees=10, translate=(0.1, 0.1), scale=(0.9, 1.1), shear=5, fill=114),
            T.Resize((512, 512)), T.ColorJitter(0.2, 0.2, 0.2, 0.05), T.Normalize(),
        ])
        loader = DetectionLoader(VocSource(root, split), recipe,
                                 batch_size=32, device="auto", shuffle=True, seed=0)  # "auto": the GPU if any
        for step, (images, targets) in enumerate(loader):  # images: float32 [B, 3, 512, 512]
            boxes = targets[0]["boxes"]  # float32 [N, 4] xyxy pixels; "labels": int64 [N]; "image_id": int
            print(f"batch {step}: images {tuple(images.shape)} {images.dtype} on {images.device}; "
                  f"sample 0: image_id {targets[0]['image_id']}, {len(boxes)} boxes, labels {targets[0]['labels'].tolist()}")
        loader.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
