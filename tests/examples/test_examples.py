"""Every script of ``examples/`` runs as shipped, on the CPU, each in a subprocess with its
documented flags, on a small generated dataset, with an epoch whose last batch is partial.

:data:`RUNS` says where each example runs: here (:data:`HERE`), or in the test module that
already runs it with more checks (:data:`ELSEWHERE`); a new example that is in neither fails
:func:`test_every_example_is_run`. An example whose packages do not import here (torchvision for
the torch examples' Faster R-CNN, ``train_rcnn.py``'s Keypoint and Mask R-CNN and
``compare_presets.py``'s policies, TensorFlow and KerasHub for the KerasHub example) skips, naming
the package; ``train_rcnn.py --dry-run`` (its batches and targets, no model) runs everywhere.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
TIMEOUT_S = 300

#: examples run by another test module (their checks go further than "it runs"), with its path
ELSEWHERE = {
    "keras_hub_retinanet.py": "tests/examples/test_keras_hub.py",  # tf.data and Grain, partial last batches
    "torch_ddp_train.py": "tests/examples/test_ddp.py",  # 2 CPU ranks, --model tiny, partial last batches
    "draw_previews.py": "tests/examples/test_draw_previews.py",  # --out, twice: the same pictures
}
#: examples run here: the packages they need besides detaug's core
HERE = {
    "quickstart_torch.py": (),
    "quickstart_keras.py": ("keras",),
    "keras_fit.py": ("keras",),
    "torch_train.py": ("torchvision",),
    "compare_presets.py": ("torchvision",),
    "train_rcnn.py": ("torchvision",),
}


def missing(packages: tuple[str, ...]) -> list[str]:
    """The packages of ``packages`` that do not import in a fresh interpreter (torchvision may be
    installed for another torch build and fail on import; Keras is imported on torch, as the
    examples do)."""
    absent = [name for name in packages if importlib.util.find_spec(name) is None]
    for name in (name for name in packages if name not in absent):
        env = dict(os.environ, KERAS_BACKEND="torch")
        run = subprocess.run([sys.executable, "-c", f"import {name}"], env=env, capture_output=True, text=True,
                             timeout=TIMEOUT_S)
        if run.returncode != 0:
            absent.append(name)
    return absent


def run_example(name: str, *args: str, tmp_path: Path, needs: tuple[str, ...] | None = None,
                exit_code: int = 0) -> str:
    """Run ``examples/NAME ARGS`` as a user would (a fresh process, the repository on the path,
    no GPU); its standard output (and error, where it must fail), after checking that it exited
    ``exit_code``. It skips where a package of ``needs`` (default: ``HERE[name]``) does not import."""
    skip = missing(HERE[name] if needs is None else needs)
    if skip:
        pytest.skip(f"examples/{name} needs {', '.join(skip)}, which does not import here")
    env = {k: v for k, v in os.environ.items() if k not in ("KERAS_BACKEND", "TF_USE_LEGACY_KERAS", "DETAUG_KERAS")}
    env.update(CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    run = subprocess.run([sys.executable, str(EXAMPLES / name), *args], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=TIMEOUT_S)
    assert run.returncode == exit_code, f"examples/{name}: exit {run.returncode}\n{run.stdout[-3000:]}\n{run.stderr[-6000:]}"
    return run.stdout if exit_code == 0 else run.stdout + run.stderr


def test_every_example_is_run():
    scripts = sorted(p.name for p in EXAMPLES.glob("*.py"))
    assert scripts and sorted({*ELSEWHERE, *HERE}) == scripts, "add the new example to HERE or ELSEWHERE"
    for name, module in ELSEWHERE.items():
        assert f'"examples" / "{name}"' in (REPO / module).read_text(), f"{module} does not run examples/{name}"


def test_quickstart_torch(tmp_path):
    """The README's PyTorch quick start, no argument: 40 generated images at batch 32, batches of 32 and 8."""
    out = run_example("quickstart_torch.py", tmp_path=tmp_path)
    assert re.search(r"^batch 0: images \(32, 3, 512, 512\) torch.float32 on cpu", out, re.M), out[-2000:]
    assert re.search(r"^batch 1: images \(8, 3, 512, 512\)", out, re.M) and "batch 2:" not in out, out[-2000:]


def test_quickstart_keras(tmp_path):
    """The README's Keras quick start, no argument: seq[3] of 64 generated images, then fit for 2 epochs."""
    out = run_example("quickstart_keras.py", tmp_path=tmp_path)
    assert "seq[3]: images (16, 512, 512, 3), boxes (16, 50, 4), labels (16, 50); 4 batches an epoch" in out, out[-2000:]
    assert re.search(r"^fit: loss \[[0-9.]+, [0-9.]+\]$", out, re.M), out[-2000:]


def test_keras_fit(tmp_path):
    """10 images at batch 4: batches of 4, 4 and 2, fitted for an epoch; the report counts all 10."""
    out = run_example("keras_fit.py", "--device", "cpu", "--images", "10", "--batch-size", "4", "--epochs", "1",
                      "--size", "64", tmp_path=tmp_path)
    assert "seq[0]: images float32 (4, 64, 64, 3)" in out
    assert re.search(r"^fit: 1 epochs, 10 images in .* loss \[[0-9.]+\]$", out, re.M), out[-2000:]


def test_torch_train(tmp_path):
    """32 generated images at batch 5: the 7th step is the epoch's last batch, of 2 images."""
    out = run_example("torch_train.py", "--device", "cpu", "--size", "128", "--batch-size", "5",
                      "--iterations", "7", tmp_path=tmp_path)
    assert re.search(r"^step   7  loss [0-9.]+", out, re.M) and "7 iterations in" in out, out[-2000:]


def test_compare_presets(tmp_path):
    """One preset, one pass over 20 generated photos: detaug's batches of 16 and 4."""
    from detaug.synthetic import write_voc_dataset

    write_voc_dataset(tmp_path / "voc", num_images=20, size=((96, 160), (96, 160)), max_objects=3)
    out = run_example("compare_presets.py", "--voc", str(tmp_path / "voc"), "--preset", "hflip", "--repeats", "1",
                      "--workers", "0", "--device", "cpu", "--json", str(tmp_path / "presets.json"), tmp_path=tmp_path)
    assert "20 photos with boxes" in out and (tmp_path / "presets.json").is_file()


def test_train_rcnn_dry_run(tmp_path):
    """No torchvision needed: 5 generated images at batch 2 through both loaders, each batch's
    targets checked by the example (keypoints float32 [N, 5, 3] inside their boxes, masks uint8
    [N, 128, 128] inside theirs); the third batch of each is the partial one, of 1 image."""
    out = run_example("train_rcnn.py", "--dry-run", "--device", "cpu", "--images", "5", "--batch-size", "2",
                      "--size", "128", tmp_path=tmp_path, needs=())
    assert "5 images, 4 classes, 5 keypoints, flip pairs ((1, 2), (3, 4)), on cpu" in out, out[-2000:]
    for field, shape in (("keypoints", r"\(\d+, 5, 3\)"), ("masks", r"\(\d+, 128, 128\)")):
        assert re.search(rf"^{field} batch 0: 2 images \(3, 128, 128\) torch.uint8 on cpu; {field} {shape}, {shape} ",
                         out, re.M), out[-2000:]
        assert re.search(rf"^{field} batch 2: 1 images .*; {field} {shape} ", out, re.M), out[-2000:]
        assert f"{field} batch 3" not in out


def test_train_rcnn(tmp_path):
    """Both models, 3 steps each at batch 2 over 5 images: the third step is the partial batch;
    each step has its head's loss (the targets' keypoints and masks were used)."""
    out = run_example("train_rcnn.py", "--device", "cpu", "--steps", "3", "--images", "5", "--batch-size", "2",
                      "--size", "128", tmp_path=tmp_path)
    assert re.search(r"^keypoints step   3  loss [0-9.]+ .*loss_keypoint=[0-9.]+", out, re.M), out[-2000:]
    assert re.search(r"^masks step   3  loss [0-9.]+ .*loss_mask=[0-9.]+", out, re.M), out[-2000:]


def test_train_rcnn_names_torchvision_where_it_does_not_import(tmp_path):
    if not missing(("torchvision",)):
        pytest.skip("torchvision imports here")
    out = run_example("train_rcnn.py", "--device", "cpu", tmp_path=tmp_path, needs=(), exit_code=1)
    assert "examples/train_rcnn.py needs torchvision, which does not import here" in out and "--dry-run" in out
