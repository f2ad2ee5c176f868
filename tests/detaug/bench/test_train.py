"""``detaug bench --train`` on the CPU: the model, the padding, the loss and the rows' plumbing
(no figure is asserted: CPU timings say nothing about the GPU targets)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from detaug.bench import train
from detaug.bench.train_context import TRAIN_STREAMS, distributed_context
from tests.detaug.bench.json_doc import check_documented
from detaug.bench.train_model import (
    MAX_BOXES,
    RESNET18_TRUNK_PARAMS,
    DenseDetector,
    ResNet18Trunk,
    detection_loss,
    pad_targets,
)


def _params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# ------------------------------------------------------------------------------------------
# the model
# ------------------------------------------------------------------------------------------


def test_the_trunk_is_resnet18_without_its_classifier():
    """11,689,512 parameters (torchvision's ``ResNet18_Weights`` ``num_params``) less the
    classifier (512 x 1000 weights + 1000 biases)."""
    assert RESNET18_TRUNK_PARAMS == 11_689_512 - (512 * 1000 + 1000) == 11_176_512
    ours = ResNet18Trunk()
    assert _params(ours) == RESNET18_TRUNK_PARAMS
    assert ours(torch.zeros(1, 3, 320, 320)).shape == (1, 512, 10, 10)
    model = DenseDetector(prefer_torchvision=False)
    assert model.trunk_source == "detaug.bench"
    assert _params(model) == RESNET18_TRUNK_PARAMS + 512 * 25 + 25  # the 1x1 head: 4 + 1 + 20 channels
    assert model(torch.zeros(2, 3, 320, 320)).shape == (2, 25, 10, 10)


def test_the_trunk_matches_torchvisions_where_it_imports():
    torchvision = pytest.importorskip("torchvision", reason="torchvision does not import here")
    reference = torchvision.models.resnet18(weights=None)
    assert _params(reference) == 11_689_512
    theirs = torch.nn.Sequential(*list(reference.children())[:-2])
    shapes = lambda m: [tuple(p.shape) for p in m.parameters()]  # noqa: E731
    assert shapes(theirs) == shapes(ResNet18Trunk())
    assert DenseDetector().trunk_source == "torchvision"


def test_the_keras_model_is_the_same_network():
    if "keras" not in __import__("sys").modules:
        os.environ.setdefault("KERAS_BACKEND", "torch")
    keras = pytest.importorskip("keras")
    if keras.backend.backend() != "torch":
        pytest.skip(f"Keras runs on {keras.backend.backend()} in this process, the rows need torch")
    from detaug.bench.train_model import keras_dense_detector

    model = keras_dense_detector(64)
    trainable = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    assert trainable == RESNET18_TRUNK_PARAMS + 512 * 25 + 25
    assert tuple(model.output.shape) == (None, 2, 2, 25)


# ------------------------------------------------------------------------------------------
# padding and loss
# ------------------------------------------------------------------------------------------


def _pad_reference(boxes: list[np.ndarray], labels: list[np.ndarray], rows: int) -> tuple[np.ndarray, np.ndarray]:
    out_boxes = np.zeros((len(boxes), rows, 4), np.float32)
    out_labels = np.full((len(boxes), rows), -1, np.int64)
    for k, (b, lab) in enumerate(zip(boxes, labels)):
        n = min(len(b), rows)
        out_boxes[k, :n], out_labels[k, :n] = b[:n], lab[:n]
    return out_boxes, out_labels


@pytest.mark.parametrize("counts", [(3, 0, 70, 64), (0, 0), (1,), (65, 2)])
def test_pad_targets_against_numpy(counts):
    rng = np.random.default_rng(sum(counts))
    boxes = [rng.uniform(0, 300, (n, 4)).astype(np.float32) for n in counts]
    labels = [rng.integers(0, 90, n) for n in counts]
    expected = _pad_reference(boxes, labels, MAX_BOXES)
    targets = [{"boxes": torch.from_numpy(b), "labels": torch.from_numpy(lab), "image_id": k}
               for k, (b, lab) in enumerate(zip(boxes, labels))]
    got_boxes, got_labels = pad_targets(targets, "cpu")
    assert got_boxes.dtype == torch.float32 and got_labels.dtype == torch.int64
    np.testing.assert_array_equal(got_boxes.numpy(), expected[0])
    np.testing.assert_array_equal(got_labels.numpy(), expected[1])
    # the batched form ([B, M, 4], labels padded by -1, as targets="padded" and Keras give it),
    # with fewer rows than MAX_BOXES and with more
    for rows in (max(counts), 80, 5):
        padded_boxes, padded_labels = _pad_reference(boxes, labels, rows)
        batched = {"boxes": torch.from_numpy(padded_boxes), "labels": torch.from_numpy(padded_labels).int(),
                   "num_boxes": torch.tensor([min(n, rows) for n in counts])}
        got_boxes, got_labels = pad_targets(batched, "cpu")
        want = _pad_reference([b[:rows] for b in boxes], [lab[:rows] for lab in labels], MAX_BOXES)
        np.testing.assert_array_equal(got_boxes.numpy(), want[0])
        np.testing.assert_array_equal(got_labels.numpy(), want[1])
        assert got_labels.dtype == torch.int64


def _loss_reference(outputs: np.ndarray, boxes: np.ndarray, labels: np.ndarray, stride: int) -> float:
    """The loss of :mod:`detaug.bench.train_model`, box by box in float64."""
    b, ch, gh, gw = outputs.shape
    c = ch - 5
    sig = lambda x: 1 / (1 + np.exp(-x))  # noqa: E731
    box_sum = cls_sum = 0.0
    count = 0
    objectness = np.zeros((b, gh, gw))
    for k in range(b):
        for box, label in zip(boxes[k], labels[k]):
            if label < 0:
                continue
            count += 1
            col = int(min(max(np.floor((box[0] + box[2]) / 2 / stride), 0), gw - 1))
            row = int(min(max(np.floor((box[1] + box[3]) / 2 / stride), 0), gh - 1))
            objectness[k, row, col] = 1.0
            cell = outputs[k, :, row, col].astype(np.float64)
            scaled = np.array([box[0] / (gw * stride), box[1] / (gh * stride), box[2] / (gw * stride),
                               box[3] / (gh * stride)])
            box_sum += np.abs(sig(cell[:4]) - scaled).sum()
            logits = cell[5:]
            cls_sum += np.log(np.exp(logits - logits.max()).sum()) + logits.max() - logits[label % c]
    x = outputs[:, 4].astype(np.float64)
    bce = np.mean(np.maximum(x, 0) - x * objectness + np.log1p(np.exp(-np.abs(x))))
    count = max(count, 1)
    return box_sum / count + bce + cls_sum / count


def test_detection_loss_against_numpy():
    rng = np.random.default_rng(0)
    outputs = rng.normal(size=(3, 25, 4, 5)).astype(np.float32)  # a 128 x 160 input
    counts = (5, 0, 9)
    boxes = [np.sort(rng.uniform(-10, 170, (n, 2, 2)), axis=1).reshape(n, 4)[:, [0, 2, 1, 3]].astype(np.float32)
             for n in counts]  # some centres off the image: clamped to the border cells
    labels = [rng.integers(0, 45, n) for n in counts]
    padded = _pad_reference(boxes, labels, MAX_BOXES)
    got = detection_loss(torch.from_numpy(outputs), torch.from_numpy(padded[0]), torch.from_numpy(padded[1]))
    assert got.dtype == torch.float32 and got.ndim == 0
    assert float(got) == pytest.approx(_loss_reference(outputs, *padded, 32), rel=1e-5)
    # channels last gives the same; no box at all: objectness alone
    last = torch.from_numpy(outputs).permute(0, 2, 3, 1).contiguous()
    assert float(detection_loss(last, torch.from_numpy(padded[0]), torch.from_numpy(padded[1]),
                                channels_last=True)) == pytest.approx(float(got), rel=1e-6)
    none = torch.full((3, MAX_BOXES), -1)
    x = outputs[:, 4].astype(np.float64)
    assert float(detection_loss(torch.from_numpy(outputs), torch.zeros(3, MAX_BOXES, 4), none)) == pytest.approx(
        np.mean(np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))), rel=1e-5)


def test_a_train_step_moves_the_weights():
    torch.manual_seed(0)
    model = DenseDetector(prefer_torchvision=False).to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = model.head.weight.detach().clone()
    targets = [{"boxes": torch.tensor([[4.0, 8.0, 40.0, 50.0]]), "labels": torch.tensor([7])},
               {"boxes": torch.zeros(0, 4), "labels": torch.zeros(0, dtype=torch.int64)}]
    loss = train.train_step(model, optimizer, torch.randn(2, 3, 64, 64), targets, device=torch.device("cpu"),
                            autocast=False)
    assert math.isfinite(float(loss.detach())) and not torch.equal(before, model.head.weight)


def test_process_tree_cpu_seconds_counts_this_process():
    t = os.times()
    own = t.user + t.system
    assert train.process_tree_cpu_seconds() >= own - 0.05


# ------------------------------------------------------------------------------------------
# the rows and checks
# ------------------------------------------------------------------------------------------


ROW_FIELDS = {"variant", "label", "status", "batch_size", "img_per_s", "total_img_per_s", "vs_ceiling", "data_wait",
              "not_ready_wait", "cpu_cores", "gpu_peak_mib", "torch_peak_mib", "steps", "images", "world_size"}


def test_train_rows_on_the_cpu(coco_folder, tmp_path, capsys):
    """``detaug bench --train`` with tiny sizes: every row with its fields, the ceiling at 1x, the
    others' ratios over it, the GPU targets "n/a" (never FAIL), ``--check`` passing."""
    from detaug import cli

    out = tmp_path / "train.json"
    status = cli.main(["bench", "--train", "--device", "cpu", "--quiet", "--check", "--json", str(out),
                       "--data", str(coco_folder), "--batch-sizes", "2", "--warmup", "1", "--steps", "2",
                       "--size", "64", "--threads", "1", "--workers", "0"])
    printed = capsys.readouterr().out
    assert status == 0
    results = json.loads(out.read_text(encoding="utf-8"))
    check_documented(results, "train")  # every field named in docs/bench-json.md
    assert results["mode"] == "train" and results["settings"]["steps"] == 2 and results["settings"]["size"] == 64
    assert results["settings"]["train_stream"] == "default"
    assert results["settings"]["decoder_defaults"]["decoder_options"] == {}  # the CPU decoder: no hardware share
    rows = {r["variant"]: r for r in results["train"]["rows"]}
    assert set(rows) == set(train.TRAIN_ROW_NAMES)
    for name in ("ceiling", "detaug", "detaug-list"):
        row = rows[name]
        assert ROW_FIELDS <= set(row) and row["status"] == "ok", row
        timings = 4 if name == "ceiling" else 1  # before detaug, after it, after detaug-list, after detaug-process
        assert row["batch_size"] == 2 and row["steps"] == 2 * timings and row["images"] == 4 * timings
        assert row["img_per_s"] == row["total_img_per_s"] > 0
        assert 0.0 <= row["data_wait"] < 1.0 and row["cpu_cores"] > 0
        assert row["gpu_peak_mib"] is None and row["torch_peak_mib"] is None
        assert 0 < row["vs_ceiling"] < math.inf
    # each iterator's ratio: over the ceiling timed just before and just after it
    ceiling_runs = rows["ceiling"]["runs"]
    assert len(ceiling_runs) == 4 and rows["ceiling"]["img_per_s"] == pytest.approx(sum(ceiling_runs) / 4)
    for name, around in (("detaug", ceiling_runs[0:2]), ("detaug-list", ceiling_runs[1:3]),
                         ("detaug-process", ceiling_runs[2:4]),
                         ("detaug-padded", rows["ceiling-padded"]["runs"])):
        assert rows[name]["ceiling_runs"] == around
        assert rows[name]["vs_ceiling"] == pytest.approx(rows[name]["img_per_s"] / (sum(around) / 2))
    if rows["torchvision"]["status"] == "ok":  # timed before any ceiling: over the ceiling row
        assert rows["torchvision"]["ceiling_runs"] == []
        assert rows["torchvision"]["vs_ceiling"] == pytest.approx(
            rows["torchvision"]["img_per_s"] / rows["ceiling"]["img_per_s"])
    for name in ("detaug", "detaug-list", "detaug-process", "detaug-padded"):  # part of the wait: not made yet
        assert 0.0 <= rows[name]["not_ready_wait"] <= rows[name]["data_wait"], rows[name]
    assert rows["ceiling"]["not_ready_wait"] is None and rows["torchvision"].get("not_ready_wait") is None
    assert rows["ceiling"]["vs_ceiling"] == pytest.approx(1.0)
    first, second = rows["ceiling-padded"]["runs"]  # before and after detaug-padded: the mean
    assert rows["ceiling-padded"]["img_per_s"] == pytest.approx((first + second) / 2)
    assert rows["ceiling-padded"]["steps"] == 4 and rows["ceiling-padded"]["images"] == 8
    assert rows["ceiling"]["ceiling_runs"] == [] and rows["detaug"]["runs"] == []
    assert rows["detaug-padded"]["status"] == "ok"
    # the CUDA decoder's row: nothing to set on the CPU, said so, and no ceiling timing for it
    assert rows["detaug-cuda-decoder"]["status"] == "unavailable"
    assert "no hardware decoder share" in rows["detaug-cuda-decoder"]["message"]
    assert rows["torchvision"]["status"] in ("ok", "unavailable")
    keras_ok = rows["keras-ceiling"]["status"] == "ok"
    if keras_ok:  # Keras with its torch backend in this process
        assert len(rows["keras-ceiling"]["runs"]) == 2
        assert rows["sequence"]["status"] == "ok", rows["sequence"]["message"]
        assert 0 < rows["sequence"]["vs_ceiling"] < math.inf and rows["sequence"]["images"] == 4
    checks = results["train"]["checks"]
    assert checks == results["checks"] and {c["variant"] for c in checks} >= {"detaug", "detaug-list"}
    for check in checks:
        assert check["applies"] is False and check["passed"] is None
    assert "FAIL" not in printed and printed.count("n/a on the CPU") == sum(c["value"] is not None for c in checks)
    assert "ceiling (one cached batch)" in printed and "data wait" in printed and "not ready" in printed


def test_train_checks_hold_on_a_gpu_run_only():
    """The targets: iterators >= 0.9x the ceiling with data wait <= 5%, the Sequence >= 0.85x its
    own ceiling; PASS / FAIL on a GPU run, "n/a" on a CPU run."""
    rows = {row.name: row for row in train.TRAIN_ROWS}

    def result(name, ratio, wait):
        return train.TrainResult(rows[name], "ok", batch_size=64, img_per_s=1000.0 * ratio,
                                 total_img_per_s=1000.0 * ratio, vs_ceiling=ratio, data_wait=wait)

    results = [result("ceiling", 1.0, 0.0), result("detaug", 0.95, 0.02), result("detaug-list", 0.85, 0.2),
               result("sequence", 0.8, 0.0)]
    by_name = {}
    for device in ("gpu", "cpu"):
        by_name[device] = {c.name: train._evaluate(c, results, 64, device) for c in train.TRAIN_CHECKS}
    gpu = by_name["gpu"]
    assert gpu["training: detaug (COCO reader) / ceiling"].passed is True
    assert gpu["training: detaug (COCO reader), data wait"].passed is True
    assert gpu["training: detaug (sample list) / ceiling"].passed is False
    assert gpu["training: detaug (sample list), data wait"].line().endswith("= 20.0% (target <= 5%): FAIL")
    assert gpu["training: Keras Sequence in fit / Keras ceiling"].passed is False
    assert gpu["training: detaug (padded targets) / ceiling"].value is None  # not run
    for check in by_name["cpu"].values():
        assert check.passed is None
        assert check.value is None or check.line().endswith("n/a on the CPU")


def test_the_data_wait_targets_hold_up_to_batch_64(coco_folder, tmp_path):
    """The issue's targets: the ratio at every batch size, the data wait at batch 64 and below
    only; the checks a run evaluates say so by batch size."""
    from detaug import cli

    waits = {c.name for c in train.TRAIN_CHECKS if c.wait}
    assert waits and all(c.applies_at(64) and c.applies_at(16) and not c.applies_at(256)
                         for c in train.TRAIN_CHECKS if c.wait)
    assert all(c.applies_at(256) for c in train.TRAIN_CHECKS if not c.wait)
    out = tmp_path / "train.json"
    assert cli.main(["bench", "--train", "--device", "cpu", "--quiet", "--json", str(out), "--only", "ceiling,detaug",
                     "--data", str(coco_folder), "--batch-sizes", "2,65", "--warmup", "1", "--steps", "1",
                     "--size", "64", "--threads", "1", "--workers", "0"]) == 0
    checks = json.loads(out.read_text(encoding="utf-8"))["checks"]
    by_batch = {b: {c["name"] for c in checks if c["batch_size"] == b} for b in (2, 65)}
    assert "training: detaug (COCO reader), data wait" in by_batch[2]
    assert "training: detaug (COCO reader), data wait" not in by_batch[65]
    assert "training: detaug (COCO reader) / ceiling" in by_batch[65]


def test_steps_need_train(capsys):
    from detaug import cli

    with pytest.raises(SystemExit) as stop:
        cli.main(["bench", "--device", "cpu", "--steps", "3", "--only", "decode"])
    assert stop.value.code == 2 and "--steps" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        cli.main(["bench", "--device", "cpu", "--train-stream", "high", "--only", "decode"])
    assert stop.value.code == 2 and "--train-stream" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        cli.main(["bench", "--train", "--device", "cpu", "--train-stream", "low"])
    assert stop.value.code == 2 and "invalid choice: 'low'" in capsys.readouterr().err


def test_train_stream_high_is_recorded(coco_folder, tmp_path):
    """``--train-stream high``: the ceiling still trains (on the CPU the stream is moot) and the
    report says where the steps ran."""
    from detaug import cli

    out = tmp_path / "train.json"
    assert cli.main(["bench", "--train", "--device", "cpu", "--quiet", "--json", str(out), "--only", "ceiling",
                     "--data", str(coco_folder), "--batch-sizes", "2", "--warmup", "1", "--steps", "1",
                     "--size", "64", "--threads", "1", "--workers", "0", "--train-stream", "high"]) == 0
    results = json.loads(out.read_text(encoding="utf-8"))
    assert results["settings"]["train_stream"] == "high"
    assert [r["status"] for r in results["train"]["rows"]] == ["ok"]
    with pytest.raises(ValueError, match="--train-stream should be one of default, high"):
        distributed_context("cpu", "low")


def test_the_loaders_decoder_share_is_recorded(monkeypatch):
    """A GPU run's report says the share of JPEGs the loaders send to the hardware decoder (what
    ``DETAUG_HW_DECODER_LOAD`` set), in its JSON and header; a bad value is recorded, not raised."""
    from detaug.bench.report import decoder_defaults

    from detaug.bench.dataset import BenchDataset
    from detaug.bench.harness import BenchSettings
    from detaug.bench.train_report import TrainReport

    monkeypatch.setenv("DETAUG_HW_DECODER_LOAD", "0")
    assert decoder_defaults("gpu")["decoder_options"] == {"hw_decoder_load": 0.0}
    assert decoder_defaults("cpu")["decoder_options"] == {}
    data = BenchDataset(Path("d"), Path("d/i"), Path("d/a.json"), 2, 3, 2, (8, 8), (8, 8), 100, True)
    env = {"gpu": "a GPU", "cpus": 16, "versions": {}}
    for device, said in (("gpu", True), ("cpu", False)):
        report = TrainReport(BenchSettings(device=device, workers=1, threads=1), data, env, [], [], 1, 1, (2,))
        assert ("loaders' hw_decoder_load 0" in report.format().splitlines()[2]) == said
        assert report.to_dict()["settings"]["decoder_defaults"] == decoder_defaults(device)
    monkeypatch.setenv("DETAUG_HW_DECODER_LOAD", "2")
    assert "should be a number in [0, 1]" in decoder_defaults("gpu")["decoder_options"]["error"]


def test_the_report_says_whether_an_mps_daemon_ran(coco_folder, tmp_path, monkeypatch):
    """A GPU report's settings line says whether the loaders ran under NVIDIA MPS (their default
    feed depends on it); the JSON's environment names the daemon's pipe, null on the CPU."""
    from detaug import cli
    from detaug.bench.dataset import BenchDataset
    from detaug.bench.harness import BenchSettings
    from detaug.bench.train_report import TrainReport

    data = BenchDataset(Path("d"), Path("d/i"), Path("d/a.json"), 2, 3, 2, (8, 8), (8, 8), 100, True)
    for pipe, said in (("/tmp/mps/control", "under NVIDIA MPS"), (None, "no NVIDIA MPS daemon")):
        env = {"gpu": "a GPU", "cpus": 16, "versions": {}, "mps_control_pipe": pipe}
        line = TrainReport(BenchSettings(device="gpu", workers=1, threads=1), data, env, [], [], 1, 1,
                           (2,)).format().splitlines()[2]
        assert line.endswith(said), line
        cpu = TrainReport(BenchSettings(device="cpu", workers=1, threads=1), data, env, [], [], 1, 1, (2,))
        assert "MPS" not in cpu.format().splitlines()[2]
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    os.mkfifo(tmp_path / "control")
    daemon = os.open(tmp_path / "control", os.O_RDONLY | os.O_NONBLOCK)  # a daemon reading its pipe
    try:
        out = tmp_path / "train.json"
        assert cli.main(["bench", "--train", "--device", "cpu", "--quiet", "--json", str(out), "--only", "ceiling",
                         "--data", str(coco_folder), "--batch-sizes", "2", "--warmup", "1", "--steps", "1",
                         "--size", "64", "--threads", "1", "--workers", "0"]) == 0
    finally:
        os.close(daemon)
    assert json.loads(out.read_text(encoding="utf-8"))["environment"]["mps_control_pipe"] is None  # the CPU


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the hardware decoder's share is a GPU setting")
def test_the_cuda_decoder_row_trains_on_loaders_without_the_hardware_decoder(coco_folder, tmp_path, monkeypatch):
    """``detaug-cuda-decoder`` on a GPU: the COCO reader's loader with ``hw_decoder_load=0.0``
    (every other row: the loaders' default share), timed against the ceilings around it."""
    from detaug import cli
    from detaug.bench import detaug_variants

    asked = []
    real = detaug_variants.iter_detaug

    def spy(dataset, settings, **kwargs):
        asked.append(kwargs.get("hw_decoder_load"))
        return real(dataset, settings, **kwargs)

    monkeypatch.setattr(detaug_variants, "iter_detaug", spy)
    out = tmp_path / "train.json"
    assert cli.main(["bench", "--train", "--quiet", "--json", str(out), "--only", "ceiling,detaug,detaug-cuda-decoder",
                     "--data", str(coco_folder), "--batch-sizes", "2", "--warmup", "1", "--steps", "2",
                     "--size", "64"]) == 0
    rows = {r["variant"]: r for r in json.loads(out.read_text(encoding="utf-8"))["train"]["rows"]}
    assert rows["detaug-cuda-decoder"]["status"] == "ok", rows["detaug-cuda-decoder"]["message"]
    assert rows["detaug-cuda-decoder"]["ceiling_runs"] == rows["ceiling"]["runs"][1:3]
    assert 0 < rows["detaug-cuda-decoder"]["vs_ceiling"] < math.inf
    # the ceiling's first batch at each of its three timings (before, after detaug, after this row)
    assert asked == [None, None, None, 0.0, None]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA stream's priority needs a GPU")
def test_train_stream_high_runs_the_steps_on_the_training_stream():
    ctx, before = distributed_context("gpu", "high"), torch.cuda.current_stream()
    with ctx.training_stream():
        assert torch.cuda.current_stream() != before
        assert torch.cuda.current_stream().priority == TRAIN_STREAMS["high"]
    with distributed_context("gpu").training_stream():
        assert torch.cuda.current_stream() == before


@pytest.mark.parametrize("nodes", [1, 2], ids=["one node, 2 ranks", "two simulated nodes"])
def test_train_rows_under_torchrun_with_ddp(coco_folder, tmp_path, nodes):
    """Two ranks on the CPU (gloo), on one node or as two nodes of one rank each (two torchrun
    launchers meeting at a c10d rendezvous on localhost, as docs/distributed.md's "Several
    nodes"): each rank trains its own shard with DDP; rank 0 alone prints and writes, img/s per
    rank (the mean) and in all (the sum), every rank's figures kept."""
    import socket
    import subprocess
    import sys
    import uuid

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "ddp.json"
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(name, None)
    bench = ["-m", "detaug.cli", "bench", "--train", "--device", "cpu", "--quiet", "--data", str(coco_folder),
             "--only", "ceiling,detaug,sequence", "--batch-sizes", "2", "--warmup", "1", "--steps", "1",
             "--size", "64", "--threads", "1", "--json", str(out)]
    if nodes == 1:
        launchers = [["--nproc_per_node=2", "--master_addr=127.0.0.1", f"--master_port={port}"]]
    else:
        run_id = f"detaug-bench-{uuid.uuid4().hex[:8]}"
        launchers = [["--nnodes=2", f"--node-rank={r}", "--nproc-per-node=1", "--rdzv-backend=c10d",
                      f"--rdzv-endpoint=localhost:{port}", f"--rdzv-id={run_id}", "--max-restarts=0"]
                     for r in range(2)]
    procs = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *launcher, *bench], env=env,
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for launcher in launchers]
    try:
        outputs = [proc.communicate(timeout=600) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    for proc, (_, err) in zip(procs, outputs):
        assert proc.returncode == 0, err[-3000:]
    printed = "".join(stdout for stdout, _ in outputs)
    assert printed.count("detaug bench --train:") == 1 and "DDP, 2 ranks" in printed
    results = json.loads(out.read_text(encoding="utf-8"))
    assert results["settings"]["world_size"] == 2
    rows = {r["variant"]: r for r in results["train"]["rows"]}
    for name in ("ceiling", "detaug"):
        row = rows[name]
        assert row["status"] == "ok" and row["world_size"] == 2 and len(row["ranks"]) == 2, row
        assert row["total_img_per_s"] == pytest.approx(sum(r["img_per_s"] for r in row["ranks"]))
        assert row["img_per_s"] == pytest.approx(row["total_img_per_s"] / 2)
        timings = 2 if name == "ceiling" else 1  # a ceiling is timed before and after the other rows
        assert row["images"] == 4 * timings  # one step of 2 images on each rank
    assert rows["sequence"]["status"] == "unavailable" and "torchrun" in rows["sequence"]["message"]


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("passed", [True, False])
def test_every_rank_exits_with_the_checks_status(rank, passed, monkeypatch, capsys):
    """Under torchrun every rank holds every rank's figures, so the same checks: with --check
    each rank exits 1 when one fails (else a node whose ranks all passed waits 300 s at its
    launcher's exit barrier for the node that failed); rank 0 alone prints."""
    from types import SimpleNamespace

    from detaug import cli
    from detaug.bench import runner

    check = SimpleNamespace(passed=passed)
    report = SimpleNamespace(rank=rank, runs=[SimpleNamespace(checks=[check])], format=lambda: "the report")
    monkeypatch.setattr(runner, "run_bench", lambda **kwargs: report)
    for flags, want in ((["--check"], 0 if passed else 1), ([], 0)):
        assert cli.main(["bench", "--train", "--device", "cpu", "--quiet", *flags]) == want
    printed = capsys.readouterr().out
    assert printed.count("the report") == (2 if rank == 0 else 0)


def test_options_of_the_rows_timed_alone_are_refused_with_train(capsys):
    from detaug import cli

    with pytest.raises(SystemExit) as stop:
        cli.main(["bench", "--train", "--device", "cpu", "--recipes", "yolo", "--images", "8"])
    assert stop.value.code == 2
    assert "--recipes, --images: not for --train" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["bench", "--train", "--device", "cpu", "--only", "decode"])
    assert "unknown training row(s) ['decode']" in capsys.readouterr().err


def test_a_ceiling_timed_several_times_is_their_mean():
    """Rates the mean of the timings that ran, steps and images summed, memory the largest;
    a failed timing is left out, and where all failed the first stands."""
    row = {r.name: r for r in train.TRAIN_ROWS}["ceiling"]

    def timing(rate, memory, status="ok"):
        figures = {"img_per_s": rate, "data_wait": 0.0, "gpu_peak_mib": memory, "images": 8, "seconds": 8 / rate}
        return train.TrainResult(row, status, batch_size=2, steps=4, images=8, seconds=8 / rate, img_per_s=rate,
                                 total_img_per_s=rate, data_wait=0.0, cpu_cores=1.0, gpu_peak_mib=memory,
                                 ranks=[figures])

    merged = train._all_timings([timing(100.0, 10.0), timing(50.0, 30.0, "error"), timing(80.0, 20.0)])
    assert merged.runs == [100.0, 80.0] and merged.img_per_s == merged.total_img_per_s == pytest.approx(90.0)
    assert merged.steps == 8 and merged.images == 16 and merged.gpu_peak_mib == 20.0
    assert merged.ranks == [{"img_per_s": 90.0, "data_wait": 0.0, "gpu_peak_mib": 20.0, "images": 16,
                             "seconds": pytest.approx(0.08 + 0.1)}]
    failed = [timing(1.0, 1.0, "error"), timing(2.0, 1.0, "unavailable")]
    assert train._all_timings(failed) is failed[0]


def test_a_rows_error_is_recorded_alone_and_ends_the_run_under_torchrun():
    """One process: the row's status is "error" with its message, the run goes on. Under
    torchrun (world 2) the rank raises, naming the row, instead of going on to steps the other
    ranks are not in (which hung a run on the GPU machine)."""
    from detaug.bench.harness import BenchSettings
    from detaug.bench.train_context import _Context
    from detaug.bench.train_rows import TrainRow

    row = TrainRow("no-such-row", "a row _measure does not know", "iterator", "")
    settings = BenchSettings(device="cpu", batch_size=2)
    alone = train._run_row(row, None, settings, _Context(torch.device("cpu"), False), 1, 1, lambda _: None)
    assert alone.status == "error" and "unknown training row 'no-such-row'" in alone.message
    with pytest.raises(RuntimeError, match="rank 1: the training row 'no-such-row' at batch 2 failed") as raised:
        train._run_row(row, None, settings, _Context(torch.device("cpu"), False, rank=1, world=2), 1, 1,
                       lambda _: None)
    assert "unknown training row" in str(raised.value.__cause__)


def test_a_detaug_rows_description_says_where_its_loader_ran(tmp_path, monkeypatch):
    """On a GPU under MPS the default rows say that the default chose the loader's own process;
    the process row names the daemon or its absence; without MPS, or on the CPU, the default
    rows add nothing."""
    from detaug.bench.train_context import _Context

    rows = {r.name: r for r in train.TRAIN_ROWS}
    gpu, cpu = _Context(torch.device("cuda", 0), False), _Context(torch.device("cpu"), False)
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    assert train._feed_words(rows["detaug"], gpu) == "" and train._feed_words(rows["detaug-process"], cpu) == ""
    assert "no NVIDIA MPS daemon found" in train._feed_words(rows["detaug-process"], gpu)
    os.mkfifo(tmp_path / "control")
    assert "no NVIDIA MPS daemon found" in train._feed_words(rows["detaug-process"], gpu)  # nobody reads it
    daemon = os.open(tmp_path / "control", os.O_RDONLY | os.O_NONBLOCK)  # a daemon reading its pipe
    try:
        assert train._feed_words(rows["detaug-list"], gpu) == (
            f"; the loader in its own process, the default under NVIDIA MPS (control pipe {tmp_path / 'control'})")
        assert "the loader's process under NVIDIA MPS" in train._feed_words(rows["detaug-process"], gpu)
        assert train._feed_words(rows["detaug"], cpu) == ""
    finally:
        os.close(daemon)


def test_a_rows_own_model_words_show_in_its_printed_note():
    """What a row's model description adds to the report's "model:" line (the process row's MPS
    daemon, found or not) is printed in that row's note; a row that adds nothing prints the note."""
    from detaug.bench.dataset import BenchDataset
    from detaug.bench.harness import BenchSettings
    from detaug.bench.train_report import TrainReport

    rows = {row.name: row for row in train.TRAIN_ROWS}
    trunk = "ResNet-18 trunk, random weights"
    results = [train.TrainResult(rows[name], "ok", batch_size=2, img_per_s=10.0, total_img_per_s=10.0, vs_ceiling=1.0,
                                 data_wait=0.0, model=model)
               for name, model in (("ceiling", trunk), ("detaug", trunk),
                                   ("detaug-process", trunk + "; no NVIDIA MPS daemon found: kernels take turns"))]
    data = BenchDataset(Path("d"), Path("d/i"), Path("d/a.json"), 2, 3, 2, (8, 8), (8, 8), 100, True)
    env = {"gpu": "a GPU", "cpus": 16, "versions": {}}
    text = TrainReport(BenchSettings(device="gpu", workers=1, threads=1), data, env, results, [], 1, 1, (2,)).format()
    lines = {label: next(line for line in text.splitlines() if line.startswith(label))
             for label in (rows["detaug-process"].label, rows["detaug"].label)}
    assert f"model: {trunk}" in text
    assert lines[rows["detaug-process"].label].endswith("not checked; no NVIDIA MPS daemon found: kernels take turns")
    assert lines[rows["detaug"].label].endswith(rows["detaug"].note)


def test_a_graphed_runs_legend_says_what_its_data_wait_is():
    """With ``--train-step graph`` the host waits in ``next()`` while the GPU runs the replayed
    step, so the printed legend says its data wait is not the GPU's idle time; op by op it does
    not."""
    from detaug.bench.dataset import BenchDataset
    from detaug.bench.harness import BenchSettings
    from detaug.bench.train_report import TrainReport

    data = BenchDataset(Path("d"), Path("d/i"), Path("d/a.json"), 2, 3, 2, (8, 8), (8, 8), 100, True)
    env = {"gpu": "a GPU", "cpus": 16, "versions": {}}
    said = {}
    for step in ("eager", "graph"):
        report = TrainReport(BenchSettings(device="gpu", workers=1, threads=1), data, env, [], [], 1, 1, (2,), step=step)
        said[step] = "not time the GPU waits" in report.format()
    assert said == {"eager": False, "graph": True}
