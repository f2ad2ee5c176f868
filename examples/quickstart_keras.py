"""Quick start, Keras: a VOC folder augmented by DALI, as an indexable ``PyDataset`` for ``model.fit``.

Usage::

    python3 examples/quickstart_keras.py                              # a small generated VOC folder
    python3 examples/quickstart_keras.py VOCdevkit/VOC2007 trainval   # your VOC folder and split

Needs Keras 3 (``python3 -m pip install -e ".[keras]"``); Keras runs on its PyTorch backend unless
``KERAS_BACKEND`` says otherwise. Runs on the GPU when DALI sees one (``device="auto"``), else on
the CPU. The model is a stand-in for your detector; ``examples/keras_fit.py`` has every option.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "torch")  # before Keras is imported

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import keras

import detaug.transforms as T
from detaug.keras import DetectionSequence
from detaug.sources import VocSource
from detaug.synthetic import write_voc_dataset


class TinyDetector(keras.Model):
    """A stand-in for your detector: ``max_boxes`` boxes per image; padded rows (label -1) are
    left out of its L1 loss."""

    def __init__(self, max_boxes: int) -> None:
        super().__init__()
        self.max_boxes = max_boxes
        self.body = keras.Sequential([keras.layers.Conv2D(8, 3, strides=4, activation="relu"),
                                      keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(max_boxes * 4)])

    def call(self, images):
        return keras.ops.reshape(self.body(images), (-1, self.max_boxes, 4))

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        real = keras.ops.cast(y["labels"] >= 0, "float32")  # [B, max_boxes]
        error = keras.ops.mean(keras.ops.abs(y_pred - y["boxes"]), axis=-1)
        return keras.ops.sum(error * real) / keras.ops.maximum(keras.ops.sum(real), 1.0)


def main(argv: list[str]) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        if argv:
            root, split = Path(argv[0]), (argv[1] if len(argv) > 1 else "trainval")
        else:  # 64 generated photos of coloured rectangles with their boxes: 4 batches of 16
            root, split = Path(tmp) / "VOC", "trainval"
            write_voc_dataset(root, num_images=64, splits={"trainval": 1.0}, seed=0)

        recipe = T.Compose([T.RandomIoUCrop(), T.RandomHorizontalFlip(), T.Resize((512, 512)),
                            T.ColorJitter(0.2, 0.2, 0.2, 0.05), T.Normalize()])
        seq = DetectionSequence(VocSource(root, split), recipe, batch_size=16,
                                max_boxes=50, shuffle=True, seed=0, device="auto")
        images, targets = seq[3]   # float32 [16, 512, 512, 3]; {"boxes": [16, 50, 4], "labels": [16, 50]}, -1 padded
        print(f"seq[3]: images {tuple(images.shape)}, boxes {tuple(targets['boxes'].shape)}, "
              f"labels {tuple(targets['labels'].shape)}; {len(seq)} batches an epoch")
        seq.start_workers()        # optional: the planning processes up before the first step
        model = TinyDetector(seq.max_boxes)
        model.compile(optimizer="adam")
        history = model.fit(seq, epochs=2, shuffle=False, callbacks=[seq.epoch_callback()], verbose=2)  # the sequence shuffles
        print(f"fit: loss {[round(v, 2) for v in history.history['loss']]}")
        seq.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
