"""``--train-step graph``: the bench's step captured in a CUDA graph (detaug/bench/train_graph.py)."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from detaug.bench import train
from detaug.bench.train_context import TRAIN_STEPS, distributed_context
from detaug.bench.train_graph import WARMUP_STEPS, GraphedStep
from detaug.bench.train_model import DenseDetector

CUDA = torch.cuda.is_available()


def test_a_graph_needs_cuda_and_one_process(monkeypatch):
    model = DenseDetector(prefer_torchvision=False)
    with pytest.raises(ValueError, match="needs a CUDA device, got cpu"):
        GraphedStep(model, torch.optim.SGD(model.parameters(), lr=0.1), device=torch.device("cpu"), autocast=False)
    assert TRAIN_STEPS == ("eager", "graph")
    with pytest.raises(ValueError, match="it needs --device gpu and one process \\(got --device cpu\\)"):
        distributed_context("cpu", step="graph")
    with pytest.raises(ValueError, match="--train-step should be one of eager, graph, got 'lazy'"):
        distributed_context("cpu", step="lazy")
    monkeypatch.setenv("WORLD_SIZE", "2")  # refused before anything starts a process group or touches CUDA
    with pytest.raises(ValueError, match="got --device gpu, WORLD_SIZE=2"):
        distributed_context("gpu", step="graph")


def test_train_step_is_a_train_option(coco_folder, tmp_path, capsys):
    from detaug import cli

    with pytest.raises(SystemExit) as stop:
        cli.main(["bench", "--device", "cpu", "--train-step", "graph", "--only", "decode"])
    assert stop.value.code == 2 and "--train-step is how training steps run: give it with --train" in (
        capsys.readouterr().err)
    with pytest.raises(SystemExit) as stop:
        cli.main(["bench", "--train", "--device", "cpu", "--train-step", "graph", "--data", str(coco_folder)])
    assert stop.value.code == 2 and "needs --device gpu" in capsys.readouterr().err
    out = tmp_path / "train.json"
    assert cli.main(["bench", "--train", "--device", "cpu", "--quiet", "--json", str(out), "--only", "ceiling",
                     "--data", str(coco_folder), "--batch-sizes", "2", "--warmup", "1", "--steps", "1",
                     "--size", "64", "--threads", "1", "--workers", "0", "--train-step", "eager"]) == 0
    assert json.loads(out.read_text(encoding="utf-8"))["settings"]["train_step"] == "eager"


def test_a_graphed_run_holds_the_ratio_targets_only():
    """Replayed from a graph the host waits in ``next()`` for the GPU's pace: no data-wait target."""
    from detaug.bench.train_report import TRAIN_CHECKS

    waits = [c for c in TRAIN_CHECKS if c.wait]
    assert waits and all(c.applies_at(64) and not c.applies_at(64, "graph") for c in waits)
    assert all(c.applies_at(b, "graph") for c in TRAIN_CHECKS if not c.wait for b in (64, 256))


def _batch(seed: int, n: int, device: torch.device) -> tuple[torch.Tensor, list[dict]]:
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(n, 3, 64, 64, generator=g)
    targets = []
    for _ in range(n):
        k = int(torch.randint(0, 5, (1,), generator=g))
        xy = torch.rand(k, 2, generator=g) * 40
        targets.append({"boxes": torch.cat([xy, xy + 4 + torch.rand(k, 2, generator=g) * 20], 1),
                        "labels": torch.randint(0, 20, (k,), generator=g)})
    return images.to(device), [{k: v.to(device) for k, v in t.items()} for t in targets]


def _model(device: torch.device) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = DenseDetector(prefer_torchvision=False).to(device, memory_format=torch.channels_last)
    return model, torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)


@pytest.mark.skipif(not CUDA, reason="capturing a CUDA graph needs a GPU (the GPU machine runs this)")
def test_the_graphed_step_trains_as_the_eager_step():
    """The replayed step moves the weights as the eager step does on the same batches: the first
    batch stepped ``WARMUP_STEPS + 1`` times (the warm-up before the capture, then the replay), the
    next ones once; a batch of another size steps eagerly and is counted; a thread calling CUDA
    meanwhile (as a loader's do) does not void the capture."""
    device = torch.device("cuda")
    batches = [_batch(seed, 4, device) for seed in range(4)]
    short = _batch(9, 3, device)
    model, optimizer = _model(device)
    start = [p.detach().clone() for p in model.parameters()]
    graphed = GraphedStep(model, optimizer, device=device, autocast=True)
    stop = threading.Event()

    def loader_like() -> None:  # a thread calling CUDA as a loader's do, during the capture too
        stream = torch.cuda.Stream(device)
        with torch.cuda.stream(stream):
            while not stop.is_set():
                torch.ones(1024, device=device).sum()
                stream.synchronize()

    thread = threading.Thread(target=loader_like, daemon=True)
    thread.start()
    try:
        for images, targets in batches[:2] + [short] + batches[2:]:
            graphed(images, targets)
    finally:
        stop.set()
        thread.join()
    torch.cuda.synchronize()
    assert graphed.eager_steps == 1
    reference, ref_optimizer = _model(device)
    for images, targets in [batches[0]] * WARMUP_STEPS + batches[:2] + [short] + batches[2:]:
        train.train_step(reference, ref_optimizer, images, targets, device=device, autocast=True)
    torch.cuda.synchronize()
    moved = torch.cat([(p.detach() - s).flatten() for p, s in zip(model.parameters(), start)])
    expected = torch.cat([(p.detach() - s).flatten() for p, s in zip(reference.parameters(), start)])
    assert expected.norm() > 0
    assert float((moved - expected).norm() / expected.norm()) < 0.02
    # the padded batched form pads to the captured shapes: it replays the graph, not the eager step
    # (that both forms pad alike: test_train.py's test_pad_targets_against_numpy)
    images, targets = batches[0]
    padded = {"boxes": torch.nn.utils.rnn.pad_sequence([t["boxes"] for t in targets], batch_first=True),
              "labels": torch.nn.utils.rnn.pad_sequence([t["labels"] for t in targets], batch_first=True,
                                                        padding_value=-1)}
    graphed(images, padded)
    assert graphed.eager_steps == 1
