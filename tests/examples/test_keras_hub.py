"""examples/keras_hub_retinanet.py on a tiny generated VOC set, on the CPU: a KerasHub RetinaNet
(small ResNet, no pretrained weights) fitted through ``seq.to_tf_dataset()`` and through a Grain
source, predictions mapped back to COCO category ids and evaluated with pycocotools. Both splits
end with a partial batch: KerasHub's non-max suppression in ``predict`` needs a static batch
size, which ``to_tf_dataset(pad_last=True)`` keeps.

The example runs in a subprocess (Keras on TensorFlow; TensorFlow stays out of the pytest
process, which runs Keras on torch). Skips without TensorFlow and KerasHub
(``pip install -e ".[tf]"``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "keras_hub_retinanet.py"
TIMEOUT_S = 400
NUM_IMAGES, BATCH = 15, 3  # 11 train (batches of 3, 3, 3, 2), 4 val (3, 1)
TRAIN_BATCHES, VAL_IMAGES = 4, 4

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("tensorflow") is None or importlib.util.find_spec("keras_hub") is None,
    reason='TensorFlow and KerasHub are not installed (pip install -e ".[tf]")',
)


def run_example(tmp_path: Path, loader: str) -> dict:
    report = tmp_path / f"{loader}.json"
    env = {k: v for k, v in os.environ.items() if k not in ("KERAS_BACKEND", "TF_USE_LEGACY_KERAS", "DETAUG_KERAS")}
    env.update(CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    command = [
        sys.executable, str(EXAMPLE), "--images", str(NUM_IMAGES), "--size", "96", "--batch-size", str(BATCH),
        "--steps", "3", "--device", "cpu", "--loader", loader, "--work-dir", str(tmp_path / loader),
        "--report", str(report),
    ]
    run = subprocess.run(command, check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert run.returncode == 0, f"exit {run.returncode}\n{run.stdout[-3000:]}\n{run.stderr[-6000:]}"
    return json.loads(report.read_text())


def check(summary: dict) -> None:
    assert summary["keras_backend"] == "tensorflow"
    # The converter's categories, discovered from the generated VOC files: 4 classes, ids 1..4 by name.
    assert summary["num_classes"] == 4 and summary["category_ids"] == [1, 2, 3, 4]
    assert summary["class_names"] == sorted(summary["class_names"])
    # Class indices 0..3 and yxyx boxes in the targets are the COCO file's annotations.
    assert summary["targets_match_annotations"] is True
    losses = summary["losses"]
    assert losses and all(0 < loss < 1e6 for loss in losses)  # anchors matched objects (else the loss is 0)
    assert summary["prediction_images"] == summary["val_images"] == VAL_IMAGES  # the padding's predictions dropped
    assert set(summary["result_category_ids"]) <= {1, 2, 3, 4}  # predictions mapped back to category ids
    assert len(summary["coco_stats"]) == 12  # COCOeval ran (or no detections: zeros)


def test_retinanet_through_tf_dataset(tmp_path):
    summary = run_example(tmp_path, "tf")
    check(summary)
    assert summary["steps"] == TRAIN_BATCHES  # --steps 3: one whole epoch of 4 batches


@pytest.mark.skipif(importlib.util.find_spec("grain") is None, reason='Grain is not installed (pip install -e ".[tf]")')
def test_retinanet_through_grain_source(tmp_path):
    summary = run_example(tmp_path, "grain")
    check(summary)
    assert summary["loader"] == "grain" and summary["steps"] == TRAIN_BATCHES
