"""examples/torch_ddp_train.py under torchrun: 2 gloo processes on the CPU, the tiny model.

The example runs as a real ``python -m torch.distributed.run`` subprocess; each rank writes the
steps and image ids of every epoch to ``LOG_DIR/rank<R>.json``. With 13 images, 2 ranks and
batch 4, every rank holds ceil(13 / 2) = 7 samples per epoch (one repeat), in 2 batches.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "torch_ddp_train.py"
NUM_IMAGES, WORLD, BATCH = 13, 2, 4
PER_RANK = -(-NUM_IMAGES // WORLD)  # 7
STEPS = -(-PER_RANK // BATCH)  # 2
TIMEOUT_S = 120

needs_gloo = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()),
    reason="torch.distributed with the gloo backend is not available in this torch build",
)
pytestmark = needs_gloo


def torchrun(tmp: Path, log_dir: Path, *args: str) -> list[dict]:
    """Run the example on 2 CPU ranks; returns the ranks' logs, rank 0 first."""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={WORLD}",
        str(EXAMPLE), "--model", "tiny", "--device", "cpu", "--size", "64", "--batch-size", str(BATCH),
        "--num-images", str(NUM_IMAGES), "--synthetic-dir", str(tmp / "voc"), "--log-dir", str(log_dir), *args,
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    run = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    ranks = "\n".join(line for line in run.stderr.splitlines() if line.startswith("[rank"))  # the ranks' tracebacks
    assert run.returncode == 0, f"exit {run.returncode}\n{run.stdout[-3000:]}\n{ranks[-6000:] or run.stderr[-6000:]}"
    logs = [json.loads((log_dir / f"rank{r}.json").read_text()) for r in range(WORLD)]
    assert [log["rank"] for log in logs] == [0, 1] and all(log["world_size"] == WORLD for log in logs)
    return logs


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp")
    return tmp, torchrun(tmp, tmp / "full", "--epochs", "2", "--max-steps", "3")


def check_exact_epochs(logs: list[dict], epochs: int) -> None:
    """The ranks' logs (rank 0 first) of ``epochs`` whole epochs: every rank sees the same dataset
    and takes the same steps; each epoch's shards are positions r, r + W, ... of one padded order
    (PER_RANK samples a rank; interleaved, a permutation of the dataset followed by the padding,
    one repeat of the order's first sample: rank 1's last is rank 0's first), shuffled anew each
    epoch; nothing skipped."""
    dataset = logs[0]["dataset_image_ids"]
    assert len(set(dataset)) == NUM_IMAGES and all(log["dataset_image_ids"] == dataset for log in logs)
    assert all(log["batches_per_epoch"] == STEPS for log in logs)
    orders = []
    for e in range(epochs):
        shards = [log["epochs"][e] for log in logs]
        assert [ep["epoch"] for ep in shards] == [e, e]
        assert [ep["steps"] for ep in shards] == [STEPS, STEPS]  # equal steps on both ranks
        assert [len(ep["image_ids"]) for ep in shards] == [PER_RANK, PER_RANK]
        seen = [i for ep in shards for i in ep["image_ids"]]
        assert sorted(set(seen)) == sorted(dataset)  # the union is the whole dataset
        repeated = [i for i in set(seen) if seen.count(i) > 1]
        # the documented padding: ceil(n / W) * W - n = 1 repeat, the first sample of the order
        assert len(seen) - NUM_IMAGES == PER_RANK * WORLD - NUM_IMAGES == 1
        assert len(repeated) == 1 and seen.count(repeated[0]) == 2
        assert shards[1]["image_ids"][-1] == shards[0]["image_ids"][0] == repeated[0]
        order = [i for pair in zip(*(ep["image_ids"] for ep in shards)) for i in pair]
        assert sorted(order[:NUM_IMAGES]) == sorted(dataset) and order[NUM_IMAGES:] == order[:1]
        orders.append(order)
    assert orders[0] != orders[1]  # shuffled anew each epoch (the same seed on every rank)
    assert all(log["skipped"] == [] for log in logs)


def test_equal_steps_and_whole_dataset_every_epoch(full_run):
    _, logs = full_run
    check_exact_epochs(logs, 2)


def test_resume_mid_epoch_gives_the_remaining_batches(full_run):
    tmp, full = full_run
    checkpoint = tmp / "ckpt.pt"
    # Run A stops epoch 0 after one step and checkpoints; run B resumes and finishes both epochs.
    first = torchrun(tmp, tmp / "a", "--epochs", "1", "--max-steps", "1", "--checkpoint", str(checkpoint))
    second = torchrun(tmp, tmp / "b", "--epochs", "2", "--resume", str(checkpoint))
    for rank in range(WORLD):
        a, b, ref = first[rank]["epochs"], second[rank]["epochs"], full[rank]["epochs"]
        assert [(ep["epoch"], ep["first_step"], ep["steps"]) for ep in a] == [(0, 0, 1)]
        assert [(ep["epoch"], ep["first_step"], ep["steps"]) for ep in b] == [(0, 1, STEPS - 1), (1, 0, STEPS)]
        assert a[0]["image_ids"] + b[0]["image_ids"] == ref[0]["image_ids"]  # same samples, same order
        assert b[1]["image_ids"] == ref[1]["image_ids"]
