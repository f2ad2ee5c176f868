"""examples/torch_ddp_train.py across two "nodes" on one host: two torchrun launchers with
``--nnodes=2 --nproc-per-node=1`` meeting at a c10d rendezvous on localhost (gloo, CPU).

Each launcher is a node (``--node-rank`` 0 and 1); the world is their 2 processes, so the
loader must shard, pad and seed exactly as on one node. The dataset is generated once with
:mod:`detaug.synthetic` and both nodes read it at the same path (docs/distributed.md, "Several
nodes"). With 13 images, 2 ranks and batch 4: every rank holds ceil(13 / 2) = 7 samples per
epoch in 2 steps, and the union of an epoch is the whole dataset, one image repeated (padding
repeats the start of the epoch's order).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "torch_ddp_train.py"
NUM_IMAGES, NODES, BATCH, EPOCHS = 13, 2, 4, 2
PER_RANK = -(-NUM_IMAGES // NODES)  # 7
STEPS = -(-PER_RANK // BATCH)  # 2
TIMEOUT_S = 90

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()),
    reason="torch.distributed with the gloo backend is not available in this torch build",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_two_nodes(tmp: Path) -> list[dict]:
    """Start node 0 and node 1 (one process each), wait for both; returns the ranks' logs."""
    from detaug.synthetic import write_voc_dataset

    voc = tmp / "voc"
    write_voc_dataset(voc, num_images=NUM_IMAGES, size=((160, 320), (160, 320)), max_objects=4, seed=0)
    log_dir = tmp / "logs"
    endpoint, run_id = f"localhost:{free_port()}", f"detaug-test-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    env.pop("RANK", None), env.pop("WORLD_SIZE", None), env.pop("LOCAL_RANK", None)
    nodes = []
    for node_rank in range(NODES):
        command = [
            sys.executable, "-m", "torch.distributed.run", f"--nnodes={NODES}", f"--node-rank={node_rank}",
            "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={run_id}",
            "--max-restarts=0", str(EXAMPLE), "--model", "tiny", "--device", "cpu", "--backend", "gloo",
            "--size", "64", "--batch-size", str(BATCH), "--epochs", str(EPOCHS), "--voc", str(voc),
            "--log-dir", str(log_dir),
        ]
        nodes.append(subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outputs = []
    try:
        for node in nodes:
            out, _ = node.communicate(timeout=TIMEOUT_S)
            outputs.append(out)
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
                node.communicate()
    for node_rank, (node, out) in enumerate(zip(nodes, outputs)):
        assert node.returncode == 0, f"node {node_rank} exited {node.returncode}:\n{out[-6000:]}"
    return [json.loads((log_dir / f"rank{r}.json").read_text()) for r in range(NODES)]


def test_two_nodes_have_exact_epochs(tmp_path: Path) -> None:
    logs = run_two_nodes(tmp_path)
    assert [log["rank"] for log in logs] == [0, 1] and all(log["world_size"] == NODES for log in logs)
    dataset = logs[0]["dataset_image_ids"]
    assert len(set(dataset)) == NUM_IMAGES and all(log["dataset_image_ids"] == dataset for log in logs)
    assert all(log["batches_per_epoch"] == STEPS for log in logs)
    orders = []
    for e in range(EPOCHS):
        epochs = [log["epochs"][e] for log in logs]
        assert [ep["epoch"] for ep in epochs] == [e, e]
        assert [ep["steps"] for ep in epochs] == [STEPS, STEPS]  # the same steps on both nodes
        assert [len(ep["image_ids"]) for ep in epochs] == [PER_RANK, PER_RANK]
        seen = [i for ep in epochs for i in ep["image_ids"]]
        assert sorted(set(seen)) == sorted(dataset)  # every image, every epoch
        repeated = sorted(i for i in set(seen) if seen.count(i) > 1)
        # the documented padding: ceil(n / W) * W - n = 1 repeat, the first sample of the order
        assert len(seen) - NUM_IMAGES == PER_RANK * NODES - NUM_IMAGES == 1
        assert repeated == [epochs[0]["image_ids"][0]] and epochs[1]["image_ids"][-1] == repeated[0]
        # shards are positions r, r + W, ... of one padded order: interleaved, the ranks' samples
        # give a permutation of the dataset followed by the padding (the order's start)
        order = [i for pair in zip(*(ep["image_ids"] for ep in epochs)) for i in pair]
        assert sorted(order[:NUM_IMAGES]) == sorted(dataset) and order[NUM_IMAGES:] == order[:1]
        orders.append(order)
    assert orders[0] != orders[1]  # the same seed on both nodes, a new order each epoch
    assert all(log["skipped"] == [] for log in logs)
