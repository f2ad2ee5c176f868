"""Train a KerasHub RetinaNet on DALI-augmented batches from a converted VOC folder, then evaluate
it with pycocotools.

Usage::

    python examples/keras_hub_retinanet.py                       # a generated VOC dataset, temp folder
    python examples/keras_hub_retinanet.py --voc VOCdevkit/VOC2007 --train-split trainval --val-split test
    python examples/keras_hub_retinanet.py --loader grain        # Grain instead of tf.data

Needs ``pip install -e ".[tf]"`` (TensorFlow, KerasHub; Grain for ``--loader grain``). Steps:

1. ``voc2coco`` converts the VOC folder's splits to COCO files;
2. a :class:`~detaug.keras.DetectionSequence` per split, with ``label_map="contiguous"`` (class
   indices ``0 .. num_classes - 1`` in category-id order, which KerasHub one-hots),
   ``num_classes=`` checked against the model, and ``bounding_box_format`` the model's;
3. a RetinaNet from a small ResNet built from scratch (no pretrained weights, nothing
   downloaded), fitted for a few steps through ``seq.to_tf_dataset()`` (KerasHub detectors do
   not take a ``PyDataset``) or a Grain ``MapDataset`` over ``seq.grain_source()``;
4. ``model.predict`` on the validation split (no augmentation: a plain resize; its last batch
   padded to the batch size, ``to_tf_dataset(pad_last=True)``, as KerasHub's non-max
   suppression needs a static batch size, and the padding's predictions dropped), predictions
   scaled back to the original image size, their labels mapped back to COCO category ids with
   ``seq.label_mapping.to_category_ids``, and COCOeval against the converted COCO file.

A few steps of a model trained from scratch detect little: the example shows the data path and
that every id and box format lines up, not accuracy. ``--report FILE`` writes a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "tensorflow")  # before Keras is imported: tf.data needs TensorFlow

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import numpy as np

BOX_FORMAT = "yxyx"  # KerasHub's default bounding_box_format; the sequence hands boxes over in it


def build_detector(num_classes: int, size: int):
    """A RetinaNet on a small ResNet (one basic block per stage, 64..128 filters; KerasHub wants 64 first), randomly initialised."""
    import keras_hub

    encoder = keras_hub.models.ResNetBackbone(
        input_conv_filters=[64], input_conv_kernel_sizes=[3],
        stackwise_num_filters=[64, 64, 128, 128], stackwise_num_blocks=[1, 1, 1, 1],
        stackwise_num_strides=[1, 2, 2, 2], block_type="basic_block", image_shape=(size, size, 3),
    )
    backbone = keras_hub.models.RetinaNetBackbone(
        image_encoder=encoder, min_level=3, max_level=5, use_p5=False, image_shape=(size, size, 3),
    )
    # Anchors of 16, 32 and 64 pixels on P3..P5 (KerasHub's default, anchor_size=4, gives 32..128:
    # too large for small inputs, then no anchor matches an object and the loss is 0).
    anchors = keras_hub.layers.AnchorGenerator(
        BOX_FORMAT, min_level=3, max_level=5, num_scales=3, aspect_ratios=[0.5, 1.0, 2.0], anchor_size=2,
    )
    return keras_hub.models.RetinaNetObjectDetector(
        backbone=backbone, num_classes=num_classes, bounding_box_format=BOX_FORMAT, anchor_generator=anchors,
        pre_logits_num_conv_layers=1,
    )


def convert(voc: Path, split: str, out: Path) -> Path:
    """``voc2coco VOC --split SPLIT -o OUT`` (the converter's exit status checked)."""
    from converters.cli import main as voc2coco

    code = voc2coco([str(voc), "--split", split, "-o", str(out), "--no-progress", "-q"])
    if code != 0:
        raise SystemExit(f"voc2coco failed on {voc} split {split} (exit {code})")
    return out


def predictions_to_coco(seq, outputs: dict, image_sizes: dict[int, tuple[int, int]], size: int) -> list[dict]:
    """``model.predict``'s outputs for ``seq``'s batches, in order (``boxes`` in :data:`BOX_FORMAT`
    on the ``size`` x ``size`` input, ``labels`` class indices, ``confidence``, ``num_detections``)
    as COCO results: boxes ``[x, y, w, h]`` on the original image, ``category_id`` mapped back."""
    image_ids = [seq.source.samples[int(p)].image_id for i in range(len(seq)) for p in seq.batch_indices(i)]
    categories = seq.label_mapping.to_category_ids(np.asarray(outputs["labels"]))
    results = []
    for k, image_id in enumerate(image_ids):
        height, width = image_sizes[image_id]
        n = int(outputs["num_detections"][k])
        boxes = np.clip(np.asarray(outputs["boxes"][k][:n], dtype=np.float64), 0, size)  # an untrained model's may be huge
        for (y1, x1, y2, x2), cat, score in zip(boxes, categories[k][:n], outputs["confidence"][k][:n]):
            if cat < 0 or x2 <= x1 or y2 <= y1:
                continue
            x1, x2 = x1 * width / size, x2 * width / size
            y1, y2 = y1 * height / size, y2 * height / size
            results.append({"image_id": image_id, "category_id": int(cat), "score": float(score),
                            "bbox": [float(x1), float(y1), float(x2 - x1), float(y2 - y1)]})
    return results


def targets_match_annotations(seq, gt, size: int) -> bool:
    """Check the first batch of a plain-resize sequence against the COCO file: its labels, mapped
    back with ``to_category_ids``, are the annotations' category ids, and its boxes, read as
    :data:`BOX_FORMAT` and scaled back, their boxes (to 0.01 pixel)."""
    import keras

    _, targets = seq[0]
    targets = {name: keras.ops.convert_to_numpy(value) for name, value in targets.items()}  # GPU tensors by default on a GPU
    for k, position in enumerate(seq.batch_indices(0)):
        sample = seq.source.samples[int(position)]
        info = gt.imgs[sample.image_id]
        anns = gt.imgToAnns[sample.image_id]
        n = len(anns)
        if (targets["labels"][k, n:] != -1).any():
            return False
        cats = seq.label_mapping.to_category_ids(targets["labels"][k, :n])
        y1, x1, y2, x2 = np.asarray(targets["boxes"][k, :n], dtype=np.float64).T
        sx, sy = info["width"] / size, info["height"] / size
        got = np.stack([x1 * sx, y1 * sy, (x2 - x1) * sx, (y2 - y1) * sy], axis=1)
        want = np.array([a["bbox"] for a in anns], dtype=np.float64).reshape(-1, 4)
        if cats.tolist() != [a["category_id"] for a in anns] or not np.allclose(got, want, atol=0.01):
            return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--voc", type=Path, help="a VOC folder; default: generate one in a temp folder")
    parser.add_argument("--train-split", default="train")
    parser.add_argument("--val-split", default="val")
    parser.add_argument("--images", type=int, default=24, help="images to generate without --voc")
    parser.add_argument("--size", type=int, default=128, help="square input side (default: 128)")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=6, help="training steps, rounded up to whole epochs (default: 6)")
    parser.add_argument("--loader", choices=("tf", "grain"), default="tf")
    parser.add_argument("--device", choices=("auto", "gpu", "cpu"), default="auto")
    parser.add_argument("--work-dir", type=Path, help="where converted COCO files go (default: a temp folder)")
    parser.add_argument("--report", type=Path, help="write a JSON summary here")
    args = parser.parse_args(argv)

    import keras
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    import detaug.transforms as T
    from detaug.keras import DetectionSequence
    from detaug.sources import CocoSource
    from detaug.synthetic import write_voc_dataset

    work = args.work_dir or Path(tempfile.mkdtemp(prefix="detaug-kerashub-"))
    work.mkdir(parents=True, exist_ok=True)
    voc = args.voc
    if voc is None:
        voc = work / "voc"
        write_voc_dataset(voc, num_images=args.images, size=((160, 240), (160, 240)), max_objects=4,
                          splits={args.train_split: 0.75, args.val_split: 0.25})
    train_json = convert(voc, args.train_split, work / f"{args.train_split}.json")
    val_json = convert(voc, args.val_split, work / f"{args.val_split}.json")
    images_dir = voc / "JPEGImages"

    size = args.size
    train_recipe = T.Compose([T.RandomHorizontalFlip(), T.RandomAffine(degrees=5, scale=(0.9, 1.1), fill=114),
                              T.Resize((size, size))])
    train_source = CocoSource(train_json, images_dir)
    num_classes = len(train_source.categories)
    common = {"device": args.device, "bounding_box_format": BOX_FORMAT, "label_map": "contiguous", "num_classes": num_classes}
    train = DetectionSequence(train_source, train_recipe, args.batch_size, shuffle=True, seed=0, **common)
    val = DetectionSequence(CocoSource(val_json, images_dir), T.Compose([T.Resize((size, size))]), args.batch_size,
                            shuffle=False, **common)
    if val.category_ids != train.category_ids:
        raise SystemExit(f"the splits' categories differ: {train.class_names} vs {val.class_names}")
    print(f"classes (index -> category id): {dict(enumerate(train.category_ids))}, names {train.class_names}")

    epochs = max(1, -(-args.steps // len(train)))
    if args.loader == "tf":
        data = train.to_tf_dataset()
    else:
        import grain

        data_source = train.grain_source(epochs=epochs)  # record g: batch g % len(train) of epoch g // len(train)
        data = grain.MapDataset.source(data_source).shuffle(seed=0).to_iter_dataset()
        epochs = 1  # the Grain source spans all the epochs
    model = build_detector(num_classes, size)
    model.compile(optimizer=keras.optimizers.Adam(1e-3))
    steps = None if args.loader == "tf" else len(data_source)  # tf: the dataset knows its length
    history = model.fit(data, epochs=epochs, steps_per_epoch=steps, verbose=2, shuffle=False)  # the sequence (or Grain) shuffles  # whole epochs: ceil(steps / len(train)) of them
    losses = [float(v) for v in history.history["loss"]]

    # pad_last: KerasHub's non-max suppression needs a static batch size, which a smaller last
    # batch would take away; the padded images come last, and only the real ones are kept.
    outputs = model.predict(val.to_tf_dataset(pad_last=True), verbose=0)
    num_val = sum(len(val.batch_indices(i)) for i in range(len(val)))
    outputs = {k: np.asarray(v)[:num_val] for k, v in outputs.items()}
    gt = COCO(str(val_json))
    sizes = {i["id"]: (i["height"], i["width"]) for i in gt.dataset["images"]}
    results = predictions_to_coco(val, outputs, sizes, size)
    targets_ok = targets_match_annotations(val, gt, size)
    stats = [0.0] * 12
    if results:
        evaluation = COCOeval(gt, gt.loadRes(results), "bbox")
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
        stats = [float(s) for s in evaluation.stats]
    else:
        print("no detections (a model trained for a few steps from scratch)")
    summary = {
        "losses": losses, "steps": epochs * len(train) if args.loader == "tf" else len(data_source), "num_classes": num_classes, "class_names": train.class_names,
        "category_ids": train.category_ids, "detections": len(results), "coco_stats": stats,
        "result_category_ids": sorted({r["category_id"] for r in results}), "val_images": len(val.source),
        "prediction_images": len(outputs["boxes"]), "keras_backend": keras.backend.backend(),
        "targets_match_annotations": targets_ok, "loader": args.loader,
    }
    print(json.dumps({k: summary[k] for k in ("losses", "detections", "coco_stats", "targets_match_annotations")}))
    if args.report:
        args.report.write_text(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
