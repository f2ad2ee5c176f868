"""Train a small Keras model on DALI-augmented detection batches: ``model.fit(seq, epochs=2, shuffle=False)``.

Usage::

    python3 examples/keras_fit.py                      # a generated VOC dataset in a temp folder
    python3 examples/keras_fit.py --voc VOCdevkit/VOC2012 --split train --size 320
    python3 examples/keras_fit.py --device cpu

Needs, beyond detaug's core (README set-up): Keras 3, from the detaug clone (the installed torch
stays as it is)::

    python3 -m pip install -e ".[keras]"

Keras needs a backend; this example uses PyTorch's unless ``KERAS_BACKEND`` says otherwise.
The model is deliberately tiny (a convolution, global pooling and a dense head regressing every
box slot, its loss masked to the real boxes): it shows the data path, not a detector. A KerasHub
detector (e.g. ``keras_hub.models.RetinaNetObjectDetector``) takes the same ``(images,
{"boxes", "labels"})`` batches; give it the sequence's ``bounding_box_format`` and map the
labels to ``0 .. num_classes - 1`` (VOC and COCO category ids start at 1).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "torch")  # before Keras is imported (detaug's GPU hosts have no TensorFlow)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import keras

from detaug.keras import DetectionSequence
from detaug.sources import VocSource
from detaug.synthetic import write_voc_dataset
from detaug.transforms import default_detection_recipe


class BoxRegressor(keras.Model):
    """Predicts ``max_boxes`` boxes per image; padded rows (label -1) are left out of the loss."""

    def __init__(self, max_boxes: int, width: int = 16) -> None:
        super().__init__()
        self.max_boxes = max_boxes
        self.features = keras.Sequential(
            [
                keras.layers.Conv2D(width, 3, strides=2, activation="relu"),
                keras.layers.Conv2D(2 * width, 3, strides=2, activation="relu"),
                keras.layers.GlobalAveragePooling2D(),
            ]
        )
        self.head = keras.layers.Dense(max_boxes * 4, activation="sigmoid")  # rel_xyxy: 0..1

    def call(self, images):
        return keras.ops.reshape(self.head(self.features(images)), (-1, self.max_boxes, 4))

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        real = keras.ops.cast(y["labels"] >= 0, "float32")  # [B, max_boxes]
        error = keras.ops.mean(keras.ops.abs(y_pred - y["boxes"]), axis=-1)
        return keras.ops.sum(error * real) / keras.ops.maximum(keras.ops.sum(real), 1.0)


def default_device() -> str:
    """``"gpu"`` when DALI sees a CUDA device, else ``"cpu"``."""
    try:
        from nvidia.dali.backend import GetCUDADeviceCount

        return "gpu" if GetCUDADeviceCount() > 0 else "cpu"
    except (ImportError, RuntimeError):
        return "cpu"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--voc", type=Path, help="a VOC folder (Annotations/, JPEGImages/, ImageSets/Main/); default: generate one")
    parser.add_argument("--split", default="train", help="image set of --voc (default: train)")
    parser.add_argument("--images", type=int, default=48, help="images to generate without --voc (default: 48)")
    parser.add_argument("--device", choices=("gpu", "cpu"), default=None, help="default: gpu if available, else cpu")
    parser.add_argument("--size", type=int, default=128, help="output side in pixels (default: 128)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--max-boxes", type=int, default=None, help="default: the most boxes of any image")
    parser.add_argument("--threads", type=int, default=2, help="DALI CPU threads (default: 2)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    device = args.device or default_device()

    with tempfile.TemporaryDirectory() as tmp:
        root = args.voc
        if root is None:
            root = Path(tmp) / "voc"
            write_voc_dataset(root, num_images=args.images, size=((160, 320), (160, 320)), seed=args.seed, splits={"train": 1.0})
            print(f"generated {args.images} images in {root}")
        source = VocSource(root, args.split)

        seq = DetectionSequence(
            source,
            default_detection_recipe(size=args.size),  # IoU crop, flip, affine, resize, colour jitter, normalize
            batch_size=args.batch_size,
            max_boxes=args.max_boxes,
            shuffle=True,  # a new sample order every epoch, drawn from (seed, epoch)
            seed=args.seed,
            device=device,
            bounding_box_format="rel_xyxy",
            overflow="warn",  # only matters with --max-boxes: cut boxes are reported and counted
            num_threads=args.threads,
        )
        print(seq)
        images, targets = seq[0]
        print(f"seq[0]: images {images.dtype} {images.shape}, boxes {targets['boxes'].dtype} "
              f"{targets['boxes'].shape}, labels {targets['labels'].dtype} {targets['labels'].shape}")

        seq.start_workers()  # the planning processes, up before the first step (no-op on the CPU)
        keras.utils.set_random_seed(args.seed)
        model = BoxRegressor(seq.max_boxes)
        model.compile(optimizer=keras.optimizers.Adam(1e-3))
        start = time.perf_counter()
        # shuffle=False: the sequence shuffles its samples itself, and asked for in order it
        # prepares the next batches during each step; epoch_callback numbers the sequence's
        # epochs as Keras does (fit(initial_epoch=...) then resumes the same augmentations).
        history = model.fit(seq, epochs=args.epochs, shuffle=False, callbacks=[seq.epoch_callback()], verbose=2)
        elapsed = time.perf_counter() - start
        seen = args.epochs * sum(len(seq.batch_indices(i)) for i in range(len(seq)))  # images per epoch, the last batch's too
        print(f"fit: {args.epochs} epochs, {seen} images in {elapsed:.1f} s on {device} "
              f"({seen / elapsed:.0f} images/s); loss {[round(v, 4) for v in history.history['loss']]}")
        print(f"batches planned ahead {seq.planned_ahead}, in the calling thread {seq.planned_inline}; "
              f"prefetched batches used {seq.prefetch_hits}, wasted {seq.prefetch_wasted}; "
              f"boxes cut by max_boxes {seq.boxes_truncated}")
        seq.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
