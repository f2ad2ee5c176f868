"""detaug.keras with the Keras setups people run: Keras 3 on TensorFlow, torch and JAX, legacy
Keras 2 (``tf_keras``: ``fit`` and ``fit_generator``), ``seq.to_tf_dataset()`` and the Grain
source, each training a tiny model for an epoch on a few synthetic images, on the CPU.

Keras picks its backend once per process and ``detaug.keras`` its base class at import, and
TensorFlow and torch are best not imported into one pytest process: every configuration runs in
a subprocess, this module run as a script (``python -m tests.detaug.test_keras_tf MODE OUT``),
which writes what it saw to a JSON file that the tests check. Configurations that need
TensorFlow (``pip install -e ".[tf]"``) skip without it.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 300
NUM_IMAGES, BATCH, MAX_BOXES, OUT_HW = 6, 4, 5, (48, 64)  # 2 batches per epoch (4 + 2)

HAS_TF = importlib.util.find_spec("tensorflow") is not None
HAS_TF_KERAS = importlib.util.find_spec("tf_keras") is not None
HAS_GRAIN = importlib.util.find_spec("grain") is not None
HAS_KERAS = importlib.util.find_spec("keras") is not None
needs_tf = pytest.mark.skipif(not HAS_TF, reason='TensorFlow is not installed (pip install -e ".[tf]")')
needs_tf_keras = pytest.mark.skipif(
    not (HAS_TF and HAS_TF_KERAS), reason='TensorFlow and tf-keras are not installed (pip install -e ".[tf]")'
)


def run_mode(tmp_path: Path, mode: str, **env: str) -> dict:
    """Run this module as a script in ``mode`` with ``env`` added; returns its JSON report."""
    out = tmp_path / f"{mode}.json"
    environ = {k: v for k, v in os.environ.items() if k not in ("KERAS_BACKEND", "TF_USE_LEGACY_KERAS", "DETAUG_KERAS")}
    environ.update(
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2", OMP_NUM_THREADS="1", **env,
    )
    run = subprocess.run(
        [sys.executable, "-m", "tests.detaug.test_keras_tf", mode, str(out)],
        check=False, cwd=REPO, env=environ, capture_output=True, text=True, timeout=TIMEOUT_S,
    )
    assert run.returncode == 0, f"{mode}: exit {run.returncode}\n{run.stdout[-3000:]}\n{run.stderr[-6000:]}"
    return json.loads(out.read_text())


def check_training(report: dict) -> None:
    assert report["steps"] == 2 and len(report["losses"]) >= 1
    assert all(math.isfinite(loss) and abs(loss) < 1e6 for loss in report["losses"])


@pytest.mark.skipif(not HAS_KERAS, reason="Keras 3 is not installed")
def test_keras3_on_torch_fits(tmp_path):
    report = run_mode(tmp_path, "keras3", KERAS_BACKEND="torch")
    assert report["flavor"] == "keras" and report["base"] == "keras.src.trainers.data_adapters.py_dataset_adapter.PyDataset"
    assert report["backend"] == "torch"
    check_training(report)
    check_targets(report)
    check_contract(report)


@pytest.mark.skipif(not (HAS_KERAS and importlib.util.find_spec("jax") is not None), reason="Keras 3 or JAX is not installed (pip install jax)")
def test_keras3_on_jax_fits(tmp_path):
    report = run_mode(tmp_path, "keras3", KERAS_BACKEND="jax")
    assert report["flavor"] == "keras" and report["backend"] == "jax" and report["images_type"] == "numpy.ndarray"
    assert report["dlpack"]["equal"] and report["dlpack"]["type"].startswith("jax")
    check_training(report)
    check_targets(report)


@needs_tf
@pytest.mark.skipif(not HAS_KERAS, reason="Keras 3 is not installed")
def test_keras3_on_tensorflow_fits_sequence_and_tf_dataset(tmp_path):
    report = run_mode(tmp_path, "keras3", KERAS_BACKEND="tensorflow")
    assert report["flavor"] == "keras" and report["backend"] == "tensorflow"
    assert report["images_type"] == "numpy.ndarray"  # TensorFlow gets NumPy arrays, not torch tensors
    # images_on_device (a GPU default with TensorFlow): handed over through DLPack, no copy
    assert report["dlpack"] == {"type": report["dlpack"]["type"], "equal": True, "shared": True}
    assert "tensorflow" in report["dlpack"]["type"]
    check_training(report)
    check_targets(report)
    check_contract(report)
    # to_tf_dataset: the same batches as seq.batch(i, e), one epoch per iteration, and fit takes it.
    ds = report["tf_dataset"]
    assert ds["spec"] == {
        "images": [None, *OUT_HW, 3, "float32"],
        "boxes": [None, MAX_BOXES, 4, "float32"],
        "labels": [None, MAX_BOXES, "int32"],
    }
    assert ds["cardinality"] == 2 and ds["epochs_seen"] == [[0, 0], [1, 1]]
    assert ds["identical"] is True and ds["epochs_differ"] is True
    assert ds["fit_steps"] == 2 and ds["fit_loss_finite"] is True
    # pad_last=True: every batch holds BATCH samples (static), the last one padded after its real ones,
    # and a model that needs a static batch size predicts on it (unpadded, the smaller last batch fails)
    pad = ds["pad_last"]
    assert pad["batch_dim"] == BATCH and pad["sizes"] == [BATCH, BATCH] and pad["padding_ok"] is True
    assert pad["unpadded_predict"] != "ran" and pad["padded_predict_rows"] == 2 * BATCH
    if HAS_GRAIN:
        grain = report["grain"]
        assert grain["len"] == 2 * 2 and grain["identical"] is True and grain["shuffled_all"] is True
        assert grain["seq_epoch_unmoved"] is True


@needs_tf_keras
def test_legacy_keras_fit_and_fit_generator(tmp_path):
    report = run_mode(tmp_path, "legacy", TF_USE_LEGACY_KERAS="1")
    assert report["flavor"] == "tf_keras" and report["is_tf_keras_sequence"] is True
    assert report["base"].endswith(".Sequence") and report["images_type"] == "numpy.ndarray"
    check_training(report)  # model.fit(seq)
    gen = report["fit_generator"]
    assert gen["steps"] == 2 and all(math.isfinite(loss) for loss in gen["losses"])
    check_targets(report)
    check_contract(report, fit_generator=True)


@needs_tf_keras
def test_detaug_keras_env_picks_tf_keras(tmp_path):
    """DETAUG_KERAS=tf_keras asks for the legacy base without TF_USE_LEGACY_KERAS; =keras keeps Keras 3."""
    code = "import detaug.keras as k; print(k.KERAS_FLAVOR, k._Base.__module__ + '.' + k._Base.__name__)"
    env = {k: v for k, v in os.environ.items() if k not in ("TF_USE_LEGACY_KERAS", "DETAUG_KERAS")}
    env.update(PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")
    legacy = subprocess.run([sys.executable, "-c", code], env={**env, "DETAUG_KERAS": "tf_keras"},
                            check=False, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=REPO)
    assert legacy.returncode == 0, legacy.stderr[-3000:]
    assert legacy.stdout.split()[0] == "tf_keras" and legacy.stdout.split()[1].endswith(".Sequence")
    keras3 = subprocess.run([sys.executable, "-c", code],
                            env={**env, "DETAUG_KERAS": "keras", "TF_USE_LEGACY_KERAS": "1", "KERAS_BACKEND": "torch"},
                            check=False, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=REPO)
    assert keras3.returncode == 0, keras3.stderr[-3000:]
    assert keras3.stdout.split() == ["keras", "keras.src.trainers.data_adapters.py_dataset_adapter.PyDataset"]


def check_contract(report: dict, fit_generator: bool = False) -> None:
    """The README's contract, on a VOC folder (whose samples have ``iscrowd`` and ``difficult``):
    a default sequence's targets are ``{"boxes", "labels"}`` only, and a model whose outputs are
    ``{"boxes", "labels"}``, compiled with a loss per output, trains on it (``fit``, and
    ``fit_generator`` on legacy Keras 2) over an epoch that ends with a partial batch."""
    contract = report["contract"]
    assert contract["keys"] == ["boxes", "labels"] and contract["batch_sizes"] == [BATCH, NUM_IMAGES - BATCH]
    runs = ["fit", "fit_generator"] if fit_generator else ["fit"]
    assert sorted(contract["losses"]) == sorted(runs)
    assert all(len(losses) == 1 and math.isfinite(losses[0]) for losses in contract["losses"].values())


def check_targets(report: dict) -> None:
    """Class indices 0..n-1 (label_map="contiguous") and yxyx boxes, checked in the subprocess
    against the source's own boxes (the recipe is a plain resize)."""
    assert report["targets_ok"] is True, report.get("targets_detail")


# -- the subprocess ------------------------------------------------------------------------------


def _source():
    from detaug.sources import SampleListSource
    from tests.detaug.consistency import scene_samples

    samples, _ = scene_samples(NUM_IMAGES, size=(80, 60), max_objects=MAX_BOXES, min_size=12)
    # Category ids 3, 5, 9, ... (not contiguous, not from 0): label k -> 3 + 2 (k - 1).
    for s in samples:
        s.labels = (3 + 2 * (s.labels.astype("int64") - 1)).astype("int64")
    categories = {3 + 2 * k: f"class{k}" for k in range(MAX_BOXES)}
    return SampleListSource(samples, categories=categories), categories


def _sequence(source, transforms, **kwargs):
    from detaug.keras import DetectionSequence

    return DetectionSequence(
        source, transforms, BATCH, max_boxes=MAX_BOXES, shuffle=True, seed=3, device="cpu", num_threads=1,
        plan_workers=0, bounding_box_format="yxyx", label_map="contiguous", num_classes=MAX_BOXES, **kwargs,
    )


def _check_targets(seq, source, report: dict) -> None:
    """A plain-resize sequence's targets against the source: labels are the category ids' ranks,
    boxes the scaled source boxes in yxyx."""
    import numpy as np

    ids = sorted(seq.categories)
    problems = []
    for i in range(len(seq)):
        _, targets = seq[i]
        positions = seq.batch_indices(i)
        for k, p in enumerate(positions):
            sample = source.samples[int(p)]
            h, w = 60, 80
            n = len(sample.boxes)
            want_labels = np.array([ids.index(int(c)) for c in sample.labels])
            sy, sx = OUT_HW[0] / h, OUT_HW[1] / w
            b = sample.boxes
            want_boxes = np.stack([b[:, 1] * sy, b[:, 0] * sx, b[:, 3] * sy, b[:, 2] * sx], axis=1)
            if not (np.array_equal(targets["labels"][k, :n], want_labels) and (targets["labels"][k, n:] == -1).all()):
                problems.append(f"batch {i} sample {k}: labels {targets['labels'][k].tolist()} != {want_labels.tolist()}")
            if not np.allclose(targets["boxes"][k, :n], want_boxes, atol=0.05):
                problems.append(f"batch {i} sample {k}: boxes {targets['boxes'][k, :n].tolist()} != {want_boxes.tolist()}")
    report["targets_ok"] = not problems and seq.class_names == [f"class{k}" for k in range(MAX_BOXES)]
    report["targets_detail"] = problems[:5]


def _model(keras_module, max_boxes: int, ops):
    class Regressor(keras_module.Model):
        """Predicts ``max_boxes`` boxes; padded rows (label -1) are left out of the loss."""

        def __init__(self) -> None:
            super().__init__()
            self.conv = keras_module.layers.Conv2D(4, 3, strides=4, activation="relu")
            self.pool = keras_module.layers.GlobalAveragePooling2D()
            self.head = keras_module.layers.Dense(max_boxes * 4)
            self.shape_out = keras_module.layers.Reshape((max_boxes, 4))

        def call(self, images):
            return self.shape_out(self.head(self.pool(self.conv(images / 255.0))))

        def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, **kwargs):
            real = ops.cast(y["labels"] >= 0, "float32")
            error = ops.mean(ops.abs(y_pred - y["boxes"] / 64.0), axis=-1)
            return ops.sum(error * real) / ops.maximum(ops.sum(real), 1.0)

    if keras_module.__name__ == "tf_keras":  # Keras 2's train_step would map the dict targets to outputs
        import tensorflow as tf

        class LegacyRegressor(Regressor):
            def train_step(self, data):
                images, targets = data
                with tf.GradientTape() as tape:
                    loss = self.compute_loss(images, targets, self(images, training=True))
                self.optimizer.minimize(loss, self.trainable_variables, tape=tape)
                return {"loss": loss}

        Regressor = LegacyRegressor
    model = Regressor()
    model.compile(optimizer=keras_module.optimizers.SGD(0.01))
    return model


def _contract(keras_module, out: Path, legacy: bool = False) -> dict:
    """A default sequence over a generated VOC folder, and ``fit`` (and ``fit_generator`` with
    ``legacy``) of a functional model whose outputs are ``{"boxes", "labels"}``, a loss each."""
    import detaug.transforms as T
    from detaug.keras import DetectionSequence
    from detaug.sources import VocSource
    from detaug.synthetic import write_voc_dataset

    root = out.parent / f"{out.stem}-voc"
    write_voc_dataset(root, num_images=NUM_IMAGES, size=((80, 96), (60, 72)), max_objects=MAX_BOXES,
                      splits={"train": 1.0})
    seq = DetectionSequence(VocSource(root, "train"), T.Compose([T.RandomHorizontalFlip(), T.Resize(OUT_HW)]),
                            BATCH, device="cpu", num_threads=1, plan_workers=0)
    batches = [seq[i] for i in range(len(seq))]
    images = keras_module.Input((*OUT_HW, 3))
    x = keras_module.layers.Conv2D(4, 3, strides=4, activation="relu")(keras_module.layers.Rescaling(1 / 255.0)(images))
    x = keras_module.layers.GlobalAveragePooling2D()(x)
    boxes = keras_module.layers.Reshape((seq.max_boxes, 4), name="boxes")(keras_module.layers.Dense(seq.max_boxes * 4)(x))
    labels = keras_module.layers.Dense(seq.max_boxes, name="labels")(x)
    model = keras_module.Model(images, {"boxes": boxes, "labels": labels})
    model.compile(optimizer=keras_module.optimizers.SGD(1e-3), loss={"boxes": "mae", "labels": "mse"})
    losses = {"fit": [float(v) for v in model.fit(seq, epochs=1, verbose=0).history["loss"]]}
    if legacy:
        history = model.fit_generator(seq, steps_per_epoch=len(seq), epochs=1, verbose=0)
        losses["fit_generator"] = [float(v) for v in history.history["loss"]]
    seq.close()
    return {"keys": list(batches[0][1]), "batch_sizes": [len(b[0]) for b in batches], "losses": losses}


def _check_dlpack(backend: str) -> dict:
    """The GPU hand-over (``images_on_device``) run on host memory: values equal, memory shared."""
    import numpy as np
    import torch

    from detaug.keras.pipeline_queue import hand_over

    images = torch.arange(24, dtype=torch.float32).reshape(1, 2, 4, 3)
    out = hand_over(images, backend)
    equal = bool(np.array_equal(np.asarray(out), images.numpy()))
    images[0, 0, 0, 0] = -7.0  # shared memory: the backend's tensor sees it
    return {"type": f"{type(out).__module__}.{type(out).__name__}", "equal": equal,
            "shared": float(np.asarray(out)[0, 0, 0, 0]) == -7.0}


def _main(mode: str, out: str) -> None:
    import numpy as np

    import detaug.keras as dk
    import detaug.transforms as T

    report: dict = {"flavor": dk.KERAS_FLAVOR, "base": f"{dk._Base.__module__}.{dk._Base.__name__}"}
    source, _ = _source()
    seq = _sequence(source, T.Compose([T.Resize(OUT_HW)]))
    _check_targets(seq, source, report)
    report["images_type"] = f"{type(seq[0][0]).__module__}.{type(seq[0][0]).__name__}"
    aug = T.Compose([T.RandomHorizontalFlip(), T.RandomAffine(degrees=5, fill=114), T.Resize(OUT_HW)])

    if mode == "legacy":
        import tensorflow as tf
        import tf_keras

        report["is_tf_keras_sequence"] = isinstance(seq, tf_keras.utils.Sequence)
        report["backend"] = "tensorflow"
        train = _sequence(source, aug)
        from types import SimpleNamespace

        ops = SimpleNamespace(cast=tf.cast, mean=tf.reduce_mean, abs=tf.abs, sum=tf.reduce_sum, maximum=tf.maximum)
        model = _model(tf_keras, MAX_BOXES, ops)
        history = model.fit(train, epochs=1, verbose=0)
        report["steps"] = len(train)
        report["losses"] = [float(v) for v in history.history["loss"]]
        history = model.fit_generator(train, steps_per_epoch=len(train), epochs=1, verbose=0)
        report["fit_generator"] = {"steps": len(train), "losses": [float(v) for v in history.history["loss"]]}
        report["contract"] = _contract(tf_keras, Path(out), legacy=True)
    else:
        import keras

        report["backend"] = keras.backend.backend()
        if report["backend"] in ("tensorflow", "jax"):
            report["dlpack"] = _check_dlpack(report["backend"])
        train = _sequence(source, aug)
        model = _model(keras, MAX_BOXES, keras.ops)
        history = model.fit(train, epochs=1, verbose=0)
        report["steps"] = len(train)
        report["losses"] = [float(v) for v in history.history["loss"]]
        report["contract"] = _contract(keras, Path(out))
        if report["backend"] == "tensorflow":
            report["tf_dataset"] = _check_tf_dataset(_sequence(source, aug), model)
            if importlib.util.find_spec("grain") is not None:
                report["grain"] = _check_grain(_sequence(source, aug))
    Path(out).write_text(json.dumps(report))
    del np


def _same(a, b) -> bool:
    import numpy as np

    return bool(np.array_equal(a[0], b[0]) and all(np.array_equal(a[1][k], b[1][k]) for k in ("boxes", "labels")))


def _check_tf_dataset(seq, model) -> dict:
    import numpy as np

    ds = seq.to_tf_dataset()
    images, targets = ds.element_spec
    spec = {
        "images": [*images.shape.as_list(), images.dtype.name],
        "boxes": [*targets["boxes"].shape.as_list(), targets["boxes"].dtype.name],
        "labels": [*targets["labels"].shape.as_list(), targets["labels"].dtype.name],
    }
    epochs_seen, got = [], []
    for _ in range(2):
        seen = []
        for images, targets in ds:
            seen.append(seq.epoch)
            got.append((images.numpy(), {k: v.numpy() for k, v in targets.items()}))
        epochs_seen.append(seen)
    want = [seq.batch(i, e) for e in range(2) for i in range(len(seq))]
    identical = all(_same(g, w) for g, w in zip(got, want)) and len(got) == len(want)
    differ = not np.array_equal(got[0][0], got[len(seq)][0])
    history = model.fit(seq.to_tf_dataset(), epochs=1, verbose=0)
    return {
        "spec": spec, "cardinality": int(ds.cardinality()), "epochs_seen": epochs_seen, "identical": identical,
        "epochs_differ": differ, "fit_steps": len(seq),
        "fit_loss_finite": all(np.isfinite(v) for v in history.history["loss"]),
        "pad_last": _check_pad_last(seq),
    }


def _check_pad_last(seq) -> dict:
    """``to_tf_dataset(pad_last=True)``: a static batch size, the last batch padded (zero images,
    ``-1`` targets) after the real samples, and ``predict`` of a model that needs a static batch
    size (as KerasHub's non-max suppression) works, where the unpadded dataset fails."""
    import keras
    import numpy as np

    class NeedsStaticBatch(keras.Model):
        def call(self, images):
            return keras.ops.mean(images, axis=(1, 2, 3))

        def predict_step(self, data):
            images, _, _ = keras.utils.unpack_x_y_sample_weight(data)
            return self(images) + keras.ops.zeros([images.shape[0]])  # KerasHub's NMS does ops.zeros([batch_size])

    padded = seq.to_tf_dataset(pad_last=True)
    got = [(images.numpy(), {k: v.numpy() for k, v in targets.items()}) for images, targets in padded]
    epoch = seq.epoch
    want = [seq.batch(i, epoch) for i in range(len(seq))]
    real = len(want[-1][0])
    last_images, last_targets = got[-1]
    padding_ok = (
        not last_images[real:].any()
        and all((value[real:] == -1).all() for value in last_targets.values())
        and _same((last_images[:real], {k: v[:real] for k, v in last_targets.items()}), want[-1])
        and all(_same(g, w) for g, w in zip(got[:-1], want[:-1]))
    )
    model = NeedsStaticBatch()
    try:
        model.predict(seq.to_tf_dataset(), verbose=0)
        unpadded = "ran"
    except Exception as error:  # noqa: BLE001 - the failure KerasHub users saw
        unpadded = type(error).__name__
    predictions = model.predict(seq.to_tf_dataset(pad_last=True), verbose=0)
    return {
        "batch_dim": padded.element_spec[0].shape.as_list()[0], "sizes": [len(g[0]) for g in got],
        "padding_ok": bool(padding_ok), "unpadded_predict": unpadded,
        "padded_predict_rows": int(np.asarray(predictions).shape[0]),
    }


def _check_grain(seq) -> dict:
    import grain

    source = seq.grain_source(epochs=2)
    ds = grain.MapDataset.source(source)
    identical = all(_same(ds[g], seq.batch(g % len(seq), g // len(seq))) for g in range(len(source)))
    shuffled = ds.shuffle(seed=1)
    records = [shuffled[g] for g in range(len(source))]
    keys = sorted(tuple(r[1]["boxes"].ravel()[:8].tolist()) for r in records)
    every = sorted(tuple(source[g][1]["boxes"].ravel()[:8].tolist()) for g in range(len(source)))
    return {"len": len(source), "identical": identical, "shuffled_all": keys == every, "seq_epoch_unmoved": seq.epoch == 0}


if __name__ == "__main__":
    _main(sys.argv[1], sys.argv[2])
